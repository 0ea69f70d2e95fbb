"""A soak with mixed faults (issue 58): an HA cluster runs a Kafka-to-Kafka exactly-once job for
``--minutes`` while faults of every kind strike at random moments; at the end the committed
output is compared with the failure-free answer, row by row.

The cluster is a user's: ``streamlab cluster start --ha --jobmanagers 2 -n 3 -s 2`` (its own
ZooKeeper), replacements started with ``streamlab jobmanager|taskmanager start``, and
``streamlab cluster stop`` at the end, after which no process of it may be left (orphans).
The job: a Kafka topic of 4 partitions fed at ``--rate`` rows/s by a producer of this script ->
``key_by("k").process(running total)`` in keyed state -> a Kafka topic, exactly-once, with a
checkpoint every second kept on a small tmpfs of its own (so the disk can be filled).

The faults, one every 30-90 s, the kind drawn at random:

* ``taskmanager-kill``: SIGKILL a TaskManager, a new one started;
* ``leader-kill``: SIGKILL the leading JobManager, a new standby started;
* ``broker-restart``: the Kafka broker stopped and started again on its port and storage;
* ``taskmanager-cut-off``: a TaskManager's process stopped (SIGSTOP) for twice the heartbeat
  timeout, then resumed: to the JobManager a TaskManager behind a partition, which comes back
  (what tests/e2e/test_frozen_taskmanager.py checks once; the veth partition of
  tests/e2e/test_network_faults.py needs its processes started in a namespace, not a user's cluster);
* ``zookeeper-cut-off``: ZooKeeper stopped (SIGSTOP) for twice the session timeout, so the
  leader loses its session, steps down (exit 70) and a standby leads; a new standby started;
* ``disk-full``: the checkpoint storage filled for 5 s (checkpoints fail, the job goes on).

The RSS of every process of the cluster (JobManagers, TaskManagers, their Spark JVMs, ZooKeeper)
and of the broker is sampled every 15 s; the report gives, per role, the largest in the first
and in the last tenth of the run.

    sudo-less root, as the tests: python bench/soak.py [--minutes 60] [--rate 200] [--seed S]
"""
from __future__ import annotations

import argparse
import collections
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pandas as pd
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer  # noqa: E402
from kernel_runtime import JobClient, StreamEnvironment  # noqa: E402
from kernel_runtime.api import KafkaSink, KafkaSource  # noqa: E402
from kernel_runtime.client.cluster_info import ClusterInfo  # noqa: E402
from kernel_runtime.deploy.kafka_broker import KafkaBroker  # noqa: E402
from tests.connectors.kafka_topics import new_topic, read_committed  # noqa: E402
from tests.e2e.test_exactly_once import expected as running_totals, running_total  # noqa: E402  the exactly-once tests' job

STREAMLAB = str(Path(sys.executable).parent / "streamlab")
KEYS = 20
HEARTBEAT_TIMEOUT_S = 2.0
SESSION_TIMEOUT_S = 2.0
CLUSTER_CONFIG = {"heartbeat.interval": "200 ms", "heartbeat.timeout": f"{HEARTBEAT_TIMEOUT_S:g} s",
                  "high-availability.zookeeper.client.session-timeout": f"{SESSION_TIMEOUT_S:g} s",
                  "taskmanager.spark.startup": "lazy"}
SCHEMA = "k bigint, v bigint, seq bigint"


def cli(*args: str, timeout: float = 180) -> str:
    done = subprocess.run([STREAMLAB, *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"streamlab {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


class Soak:
    def __init__(self, root: Path, rate: int):
        self.root, self.rate = root, rate
        self.cluster_dir = root / "cluster"
        self.checkpoints = root / "checkpoints"
        self.broker = KafkaBroker(root / "kafka")
        self.produced = 0
        self.stopping = threading.Event()
        self.faults: collections.Counter = collections.Counter()
        self.rss: dict[tuple[str, int], list[tuple[float, int]]] = collections.defaultdict(list)
        self.started = time.monotonic()
        self.our_pids: set[int] = set()  # every process seen of the cluster, for the orphan count

    # ------------------------------------------------------------------ set up
    def start(self) -> None:
        self.checkpoints.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(self.checkpoints)], check=True)
        self.broker.start()
        self.servers = self.broker.bootstrap
        self.source, self.sink = new_topic(self.servers, 4, "soak-in"), new_topic(self.servers, 2, "soak-out")
        options = [f"-D{k}={v}" for k, v in CLUSTER_CONFIG.items()]
        cli("cluster", "start", "--ha", "--jobmanagers", "2", "-n", "3", "-s", "2", "--cluster-dir",
            str(self.cluster_dir), *options, timeout=300)
        self.producer = threading.Thread(target=self._produce, name="producer", daemon=True)
        self.producer.start()
        env = StreamEnvironment(parallelism=2, cluster=self.cluster_dir, config={
            "execution.checkpointing.interval": "1 s", "execution.checkpointing.dir": str(self.checkpoints),
            "state.backend.type": "rocksdb", "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": 100_000, "restart-strategy.fixed-delay.delay": "500 ms"})
        (env.from_source(KafkaSource.json(self.servers, self.source, schema=SCHEMA, batch_size=500))
            .key_by("k").process(running_total, name="running total")
            .sink_to(KafkaSink.json(self.servers, self.sink, delivery="exactly-once", key="k",
                                    transactional_id_prefix=f"soak-{uuid.uuid4().hex[:6]}")))
        self.client = JobClient(ClusterInfo.load(self.cluster_dir))
        self.handle = env.execute_async("soak", client=self.client)

    def _produce(self) -> None:
        """``rate`` rows a second, keyed by k: a key's rows stay in order in its partition."""
        producer = Producer({"bootstrap.servers": self.servers, "enable.idempotence": True, "linger.ms": 20,
                             "message.timeout.ms": 600_000, "log_level": 0})
        seq, next_at = 0, time.monotonic()
        while not self.stopping.is_set():
            for _ in range(max(1, self.rate // 10)):
                row = rows_of(seq)
                while True:
                    try:
                        producer.produce(self.source, json.dumps(row).encode(), str(row["k"]).encode())
                        break
                    except BufferError:
                        producer.poll(0.1)
                seq += 1
            producer.poll(0)
            next_at += 0.1
            time.sleep(max(0.0, next_at - time.monotonic()))
        if producer.flush(600) != 0:
            raise RuntimeError("the producer could not deliver every row within 10 min")
        self.produced = seq

    # ------------------------------------------------------------------ who is who
    def pids(self) -> dict:
        listed = json.loads((self.cluster_dir / "cluster.json").read_text())
        leader = json.loads((self.cluster_dir / "jobmanager.json").read_text())["pid"]
        alive = [p for p in listed.get("jobmanagers", []) if psutil.pid_exists(p)]
        return {"leader": leader, "jobmanagers": alive, "zookeeper": listed.get("zookeeper"),
                "taskmanagers": [p for p in listed.get("taskmanagers", []) if psutil.pid_exists(p)]}

    def sample(self) -> None:
        roles = {}
        try:
            pids = self.pids()
        except (OSError, ValueError, KeyError):
            return  # being replaced
        for pid in pids["jobmanagers"]:
            roles[pid] = "jobmanager"
        for pid in pids["taskmanagers"]:
            roles[pid] = "taskmanager"
        if pids["zookeeper"]:
            roles[pids["zookeeper"]] = "zookeeper"
        broker = self.broker.pid()
        if broker:
            roles[broker] = "kafka-broker"
        now = time.monotonic() - self.started
        for pid, role in list(roles.items()):
            try:
                proc = psutil.Process(pid)
                family = [(role, proc)] + [(f"{role}-jvm" if c.name() == "java" else role, c)
                                           for c in proc.children(recursive=True)]
                for name, member in family:
                    self.our_pids.add(member.pid)
                    self.rss[(name, member.pid)].append((now, member.memory_info().rss))
            except psutil.Error:
                pass

    # ------------------------------------------------------------------ faults
    def inject(self, kind: str) -> None:
        pids = self.pids()
        if kind == "taskmanager-kill":
            os.kill(random.choice(pids["taskmanagers"]), signal.SIGKILL)
            cli("taskmanager", "start", "--cluster-dir", str(self.cluster_dir))
        elif kind == "leader-kill":
            if pids["leader"] in pids["jobmanagers"]:
                os.kill(pids["leader"], signal.SIGKILL)
            cli("jobmanager", "start", "--cluster-dir", str(self.cluster_dir))
        elif kind == "broker-restart":
            self.broker.restart()
        elif kind == "taskmanager-cut-off":
            self._paused(random.choice(pids["taskmanagers"]), 2 * HEARTBEAT_TIMEOUT_S)
        elif kind == "zookeeper-cut-off":
            before = set(pids["jobmanagers"])
            self._paused(pids["zookeeper"], 2 * SESSION_TIMEOUT_S, group=True)
            # the leader steps down once it hears its session expired: a standby replaces it
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and set(self.pids()["jobmanagers"]) == before:
                time.sleep(0.5)
            for _ in range(2 - len(self.pids()["jobmanagers"])):
                cli("jobmanager", "start", "--cluster-dir", str(self.cluster_dir))
        elif kind == "disk-full":
            filler = self._fill()
            time.sleep(5)
            filler.unlink()
        self.faults[kind] += 1

    @staticmethod
    def _paused(pid: int, seconds: float, group: bool = False) -> None:
        send = os.killpg if group else os.kill
        send(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            send(pid, signal.SIGCONT)

    def _fill(self) -> Path:
        filler = self.checkpoints / "filler"
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        return filler

    def running_again(self, within: float = 180.0) -> float:
        """Seconds until every task of the job runs (again: a fault may not have stopped it)."""
        start = time.monotonic()
        while time.monotonic() - start < within:
            try:  # a JobManager between two leaders answers late or not at all: asked again
                status = self.handle.job_status()
                tasks = self.client.job_details(self.handle.job_id)["subtasks"]
            except Exception:
                time.sleep(0.5)
                continue
            if status.state in ("FAILED", "CANCELED", "FINISHED"):
                raise RuntimeError(f"the job is {status.state}: {status.failure}")
            if status.state == "RUNNING" and all(t["status"] == "RUNNING" for t in tasks):
                return time.monotonic() - start
            time.sleep(0.5)
        raise TimeoutError(f"the job did not run again within {within:g} s")

    # ------------------------------------------------------------------ the end
    def finish(self) -> pd.DataFrame:
        self.stopping.set()
        self.producer.join(660)
        want = self.produced
        deadline = time.monotonic() + 600
        got = pd.DataFrame()
        while time.monotonic() < deadline:
            got = pd.DataFrame([json.loads(m.value()) for m in read_committed(self.servers, self.sink)])
            if len(got) and got.seq.nunique() >= want:
                break
            time.sleep(5)
        self.handle.cancel()
        return got

    def stop(self) -> int:
        """``streamlab cluster stop``, the broker stopped; the processes of the run left (orphans)."""
        try:
            self.client.close()
            cli("cluster", "stop", "--cluster-dir", str(self.cluster_dir))
        finally:
            self.broker.stop()
            subprocess.run(["umount", "-l", str(self.checkpoints)], check=False)
        time.sleep(2)
        left = [p for p in self.our_pids if psutil.pid_exists(p) and _status(p) != psutil.STATUS_ZOMBIE]
        mentions = [p.pid for p in psutil.process_iter(["cmdline"])
                    if str(self.root) in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid()]
        orphans = sorted(set(left) | set(mentions))
        for pid in orphans:
            print(f"orphan: {pid} {' '.join(psutil.Process(pid).cmdline())[:200]}")
        return len(orphans)


def _status(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return psutil.STATUS_ZOMBIE


def rows_of(seq):
    """The input rows of sequence numbers ``seq`` (a scalar or an array), as the producer makes them."""
    return {"k": seq % KEYS, "v": seq % 97, "seq": seq}


def report_rss(soak: Soak, minutes: float) -> None:
    span = minutes * 60
    print("peak RSS per role, MB (first tenth of the run / last tenth):")
    for role in sorted({r for r, _ in soak.rss}):
        first = [rss for (r, _), samples in soak.rss.items() if r == role for t, rss in samples if t <= span / 10]
        last = [rss for (r, _), samples in soak.rss.items() if r == role for t, rss in samples if t >= span * 0.9]
        print(f"  {role:18s} {max(first, default=0) / 2**20:8.0f} / {max(last, default=0) / 2**20:8.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=int, default=200, help="rows a second into the input topic")
    parser.add_argument("--seed", default=None)
    parser.add_argument("--kinds", default="taskmanager-kill,leader-kill,broker-restart,taskmanager-cut-off,"
                                           "zookeeper-cut-off,disk-full")
    args = parser.parse_args()
    seed = args.seed or uuid.uuid4().hex[:8]
    random.seed(seed)
    print(f"soak: {args.minutes:g} min, {args.rate} rows/s, seed {seed}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="soak-"))
    soak = Soak(root, args.rate)
    kinds = args.kinds.split(",")
    recoveries: list[float] = []
    orphans = -1
    try:
        soak.start()
        soak.running_again(300)
        end = soak.started + args.minutes * 60
        next_fault, next_sample = time.monotonic() + random.uniform(30, 90), 0.0
        while time.monotonic() < end:
            if time.monotonic() >= next_sample:
                soak.sample()
                next_sample = time.monotonic() + 15
            if time.monotonic() >= next_fault:
                kind = random.choice(kinds)
                began = time.monotonic()
                soak.inject(kind)
                soak.running_again()
                recoveries.append(time.monotonic() - began)
                print(f"{(began - soak.started) / 60:6.1f} min  {kind:20s} every task running "
                      f"{recoveries[-1]:5.1f} s after the fault began", flush=True)
                next_fault = time.monotonic() + random.uniform(30, 90)
            time.sleep(1)
        got = soak.finish()
    except BaseException:
        print(f"failed: the logs are in {root}")
        raise
    finally:
        orphans = soak.stop()
    want = running_totals(lambda seq: pd.DataFrame(rows_of(seq)), soak.produced)
    lost = len(set(want.seq) - set(got.seq)) if len(got) else len(want)
    doubled = int(got.seq.duplicated().sum()) if len(got) else 0
    merged = want.merge(got.drop_duplicates("seq"), on="seq", suffixes=("", "_got")) if len(got) else want.iloc[:0]
    wrong = int((merged.total != merged.total_got).sum()) if len(merged) else 0
    print(f"faults injected: {dict(soak.faults)} ({sum(soak.faults.values())} in all); "
          f"longest recovery {max(recoveries, default=0):.1f} s")
    print(f"rows produced {soak.produced}, committed {len(got)}, lost {lost}, duplicated {doubled}, "
          f"wrong totals {wrong}")
    report_rss(soak, args.minutes)
    print(f"orphans after `streamlab cluster stop`: {orphans}")
    if lost or doubled or wrong or orphans:
        print(f"FAILED: the logs are in {root}")
        raise SystemExit(1)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
