"""Kafka -> filter/project -> Kafka: streamlab beside PyFlink 2.3 and Spark Structured Streaming
(micro-batch and Real-Time Mode), one peer after the other, against one Kafka broker (4.1.1, KRaft)
that this script starts and stops.

Records: {"seq": i, "user": "u<i%100>", "amount": i % 50, "price": i % 7 + 0.5, "ts": ...} (JSON);
every peer keeps amount > 2 (47 in 50) and writes {"seq", "user", "total": amount * price} as JSON
to an output topic, at-least-once, parallelism 1, no checkpoints. client-loop is the same work as
a plain Python loop over confluent-kafka, no engine: the floor that the Python peers stand on here.

* throughput: --records pre-loaded records in an input topic of 1 partition (on 2 cores, one
  partition, as the issue says for Spark's Real-Time Mode); rows/s = records / wall time from the
  job's submission until the output topic's end offsets hold every output record (nothing is read
  back). Each peer first runs the same job over a warm-up topic (--records / 5) in the same engine.
  --two-partitions adds streamlab at parallelism 2 over a 2-partition copy of the input.
* latency: a producer process offers R records/s (1,000 and 100,000) for --warmup-seconds +
  --latency-seconds into a fresh topic once a probe record came through the running job; a record's
  latency = its output record's Kafka timestamp (CreateTime: when the peer's producer took it) minus
  its input record's (when the bench's producer took it), matched by seq; records produced in the
  warm-up are left out. Timestamps are milliseconds.

    .venv/bin/python bench/kafka.py [--records N] [--latency-seconds S] [--peers client-loop,streamlab,flink,spark,spark-rtm]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Optional

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
import kafka_io  # noqa: E402
from kafka_io import Offsets, new_topic, passes, preload  # noqa: E402
from peers import pyflink_python  # noqa: E402

from kernel_runtime import JobClient, LocalCluster, StreamEnvironment  # noqa: E402
from kernel_runtime.api import KafkaSink, KafkaSource  # noqa: E402
from kernel_runtime.deploy import kafka_broker  # noqa: E402

FLINK_CONNECTORS = ("5.0.0-2.2", "4.0.1-2.0")  # newest first: the first that runs a job is used
PEERS = ("client-loop", "streamlab", "streamlab-pandas", "flink", "spark", "spark-rtm")
QUERY = "SELECT seq, `user`, amount * price AS total FROM input WHERE amount > 2"
# the broker's own JVM options are for tests (C1 only, a quick start): a benchmark wants the full JIT
BROKER_JVM = ("-Xms512m", "-Xmx1g", "-XX:+UseG1GC")


def expected_out(first: int, n: int) -> int:
    return int(passes(np.arange(first, first + n)).sum())


# ---------------------------------------------------------------------- peers
class Streamlab:
    """An embedded LocalCluster (1 TaskManager x 2 slots); .sql (Spark SQL per batch) or pandas
    .filter + .map_batches between KafkaSource.json and KafkaSink.json."""

    def __init__(self, step: str, delivery: str, parallelism: int = 1, cluster: Optional[LocalCluster] = None):
        """``cluster``: one that runs already (bench/guard.py's), left running at ``close``; None:
        one of its own."""
        self.step, self.delivery, self.parallelism = step, delivery, parallelism
        self.owns_cluster = cluster is None
        self.cluster = cluster or LocalCluster(Path(tempfile.mkdtemp(prefix="bench-kafka-streamlab-")),
                                               taskmanagers=1, slots=2, embedded=True).__enter__()
        self.client = JobClient(self.cluster.info)
        self.handle = None

    def describe(self) -> str:
        step = f".sql({QUERY!r})" if self.step == "sql" else ".filter(amount > 2).map_batches(project) (pandas)"
        return (f"streamlab {metadata.version('streamlab')}: embedded LocalCluster 1 TaskManager x 2 slots, "
                f"parallelism {self.parallelism}, KafkaSource.json(schema) -> {step} -> "
                f"KafkaSink.json(delivery={self.delivery!r}), default settings")

    def start(self, servers: str, topic: str, out: str) -> None:
        env = StreamEnvironment(parallelism=self.parallelism, cluster=self.cluster.cluster_dir)
        rows = env.from_source(KafkaSource.json(servers, topic, schema=kafka_io.SCHEMA))
        if self.step == "sql":
            rows = rows.sql(QUERY)
        else:
            rows = (rows.filter(lambda df: df.amount > 2)
                    .map_batches(lambda df: df.assign(total=df.amount * df.price)[["seq", "user", "total"]]))
        rows.sink_to(KafkaSink.json(servers, out, delivery=self.delivery))
        self.handle = env.execute_async(f"kafka bench {topic}", client=self.client)
        self.attempt = None

    def failed(self) -> Optional[str]:
        status = self.handle.job_status()
        if status.state in ("FAILED", "CANCELED", "FINISHED"):
            return f"streamlab job {status.state}: {(status.failure or '')[-3000:]}"
        if self.attempt is None:
            self.attempt = status.attempt
        if status.attempt > self.attempt or status.state == "RESTARTING":  # a restart replays: not the job's figures
            return f"streamlab job restarted (attempt {status.attempt}): {(status.failure or status.reason or '')[-3000:]}"
        return None

    def stop(self) -> None:
        self.handle.cancel()
        deadline = time.monotonic() + 120
        while self.handle.status not in ("FAILED", "CANCELED", "FINISHED") and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self.client.close()
        if self.owns_cluster:
            self.cluster.__exit__(None, None, None)


class ClientLoop:
    """kafka_io.client_loop in a process of its own: no engine, the floor the others stand on."""

    def __init__(self):
        self.proc: Optional[subprocess.Popen] = None

    def describe(self) -> str:
        return ("a Python loop over confluent-kafka (no engine): consume, json.loads, filter, project, json.dumps, "
                "produce")

    def start(self, servers: str, topic: str, out: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(BENCH / "kafka_io.py"), "loop", servers, topic, out])

    def failed(self) -> Optional[str]:
        code = None if self.proc is None else self.proc.poll()
        return None if code is None else f"the client loop ended (exit {code})"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def close(self) -> None:
        self.stop()


class Flink:
    """bench/kafka_flink.py in PyFlink's venv, driven by JSON lines."""

    def __init__(self, venv: Path, jar: str):
        python = pyflink_python(venv)
        self.proc = subprocess.Popen([str(python), str(BENCH / "kafka_flink.py"), "--jar", jar], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.setup = self.ask(None)["ready"]

    def ask(self, command: Optional[dict]) -> dict:
        if command is not None:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("BENCH "):
                answer = json.loads(line[6:])
                if "error" in answer:
                    raise RuntimeError(f"bench/kafka_flink.py: {answer['error']}")
                return answer
        raise RuntimeError(f"bench/kafka_flink.py ended (exit {self.proc.wait()})")

    def describe(self) -> str:
        s = self.setup
        return (f"PyFlink {s['pyflink']} (Flink {s['flink']}, Java {s['java']}): Flink SQL, MiniCluster 1 TaskManager "
                f"x 1 slot, parallelism 1, {s['jar']}, format json, sink.delivery-guarantee at-least-once")

    def start(self, servers: str, topic: str, out: str) -> None:
        self.ask({"cmd": "start", "servers": servers, "in": topic, "out": out})

    def failed(self) -> Optional[str]:
        state = self.ask({"cmd": "state"})["state"]
        return state if state.startswith("FAILED") or state in ("CANCELED", "FINISHED") else None

    def stop(self) -> None:
        self.ask({"cmd": "stop"})

    def close(self) -> None:
        try:
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def make_flink(args, servers: str, probe_topic: str, offsets: Offsets):
    """The first Flink Kafka connector (newest first) whose job writes the probe topic's output."""
    errors = []
    for version in FLINK_CONNECTORS:
        try:
            jar = next(kafka_io.jars("flink", version).glob("*.jar"))
            peer = Flink(args.pyflink_venv, str(jar))
        except Exception as exc:
            errors.append(f"{version}: {exc}")
            continue
        out = new_topic(servers, "flink-check")
        try:
            peer.start(servers, probe_topic, out)
            offsets.wait(out, 1, args.timeout, peer.failed, every=0.2)
            peer.stop()
            return peer, errors
        except Exception as exc:
            errors.append(f"flink-sql-connector-kafka {version} on {peer.setup['flink']}: {str(exc)[:1500]}")
            peer.close()
    raise RuntimeError("no Flink Kafka connector runs here:\n" + "\n".join(errors))


# ---------------------------------------------------------------------- measurements
def throughput(peer, servers: str, offsets: Offsets, topic: str, records: int, timeout: float) -> dict:
    out = new_topic(servers, "out")
    started = time.perf_counter()
    peer.start(servers, topic, out)
    first, done = offsets.wait(out, expected_out(0, records), timeout, peer.failed, every=0.02)
    peer.stop()
    return {"rows_per_s": records / (done - started), "first_s": first - started, "seconds": done - started}


def latency(peer, servers: str, offsets: Offsets, rate: int, warm_s: float, run_s: float, timeout: float) -> dict:
    topic, out = new_topic(servers, f"lat{rate}-in"), new_topic(servers, f"lat{rate}-out")
    peer.start(servers, topic, out)
    preload(servers, topic, 1, first=10)  # a probe that passes the filter: the job reads and writes
    offsets.wait(out, 1, timeout, peer.failed, every=0.05)
    first_seq = 1_000
    with tempfile.TemporaryDirectory() as tmp:
        stamps_file = Path(tmp) / "ts.npy"
        producer = kafka_io.start_producer(servers, topic, rate, warm_s + run_s, first_seq, stamps_file)
        report = json.loads(producer.communicate()[0].strip().splitlines()[-1])
        stamps = np.load(stamps_file)
    sent = report["sent"]
    want = 1 + expected_out(first_seq, sent)
    try:
        offsets.wait(out, want, max(30.0, run_s), peer.failed, every=0.05)
    except TimeoutError:
        pass  # fell behind: what arrived is measured, "delivered" says how much
    peer.stop()
    seqs, out_ts = kafka_io.output_timestamps(servers, out, want)
    keep = seqs >= first_seq
    seqs, out_ts = seqs[keep], out_ts[keep]
    in_ts = stamps[seqs - first_seq]
    measured = in_ts >= stamps[0] + warm_s * 1000
    lat = (out_ts - in_ts)[measured]
    p50, p90, p99 = np.percentile(lat, [50, 90, 99]) if len(lat) else (float("nan"),) * 3
    return {"p50": p50, "p90": p90, "p99": p99, "rows": int(len(lat)), "delivered": len(seqs) / (want - 1),
            "offered": sent / report["seconds"],
            "samples": lat[np.argsort(in_ts[measured], kind="stable")]}  # in the order the rows were made


def measure(name: str, peer, args, servers: str, offsets: Offsets, topics: dict) -> dict:
    print(f"{name}: {peer.describe()}", flush=True)
    result: dict = {}
    warm = throughput(peer, servers, offsets, topics["warm"], args.warmup_records, args.timeout)
    result["cold"] = warm["rows_per_s"]
    print(f"  warm-up {args.warmup_records:,} records: {warm['rows_per_s']:,.0f} rows/s", flush=True)
    result["throughput"] = throughput(peer, servers, offsets, topics["in"], args.records, args.timeout)
    t = result["throughput"]
    print(f"  {args.records:,} records: {t['rows_per_s']:,.0f} rows/s ({t['seconds']:.1f} s, first output "
          f"after {t['first_s']:.1f} s)", flush=True)
    for rate in args.rates:
        lat = latency(peer, servers, offsets, rate, args.warmup_seconds, args.latency_seconds, args.timeout)
        result[rate] = lat
        print(f"  {rate:,} rows/s offered ({lat['offered']:,.0f} achieved): p50 {lat['p50']:.0f} ms, p90 "
              f"{lat['p90']:.0f} ms, p99 {lat['p99']:.0f} ms over {lat['rows']:,} rows, delivered "
              f"{lat['delivered']:.0%}", flush=True)
    return result


def run_peer(name: str, make, args, servers, offsets, topics, results: dict, errors: dict) -> None:
    """Measure one peer; a peer that cannot run is reported with its error, the others go on."""
    peer = None
    try:
        peer = make()
        results[name] = measure(name, peer, args, servers, offsets, topics)
    except Exception as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"
        print(f"{name}: cannot run: {errors[name][:3000]}", flush=True)
    finally:
        if peer is not None:
            try:
                peer.close()
            except Exception as exc:  # a close that fails does not hide the figures
                print(f"{name}: closing: {exc}", flush=True)


# ---------------------------------------------------------------------- report
def report(results: dict, errors: dict, args) -> None:
    print()
    print(f"Kafka -> filter/project -> Kafka, {args.records:,} records, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    head = f"{'peer':<22} {'rows/s':>10} {'cold rows/s':>12}"
    for rate in args.rates:
        head += f"  {f'p50/p90/p99 ms @{rate:,}/s':>26} {'deliv':>5}"
    print(head)
    for name, r in results.items():
        cold = f"{r['cold']:,.0f}" if r.get("cold") else "-"
        line = f"{name:<22} {r['throughput']['rows_per_s']:>10,.0f} {cold:>12}"
        for rate in args.rates:
            lat = r.get(rate)
            figures = f"{lat['p50']:.0f}/{lat['p90']:.0f}/{lat['p99']:.0f}" if lat else "-"
            delivered = f"{lat['delivered']:.0%}" if lat else "-"
            line += f"  {figures:>26} {delivered:>5}"
        print(line)
    for name, error in errors.items():
        print(f"{name:<22} cannot run here: {error.splitlines()[0][:200]}")
    ours = results.get("streamlab")
    if ours:
        print()
        for peer in [p for p in results if not p.startswith("streamlab")]:
            theirs = results[peer]
            parts = [f"rows/s {ours['throughput']['rows_per_s'] / theirs['throughput']['rows_per_s']:.2f}"]
            for rate in args.rates:
                if rate in ours and rate in theirs:
                    parts.append(f"p99 @{rate:,}/s {ours[rate]['p99'] / max(theirs[rate]['p99'], 1):.2f}")
            print(f"streamlab/{peer}: " + ", ".join(parts))
        flink, rtm = results.get("flink"), results.get("spark-rtm")
        if flink:
            ok = ours["throughput"]["rows_per_s"] >= flink["throughput"]["rows_per_s"]
            print(f"goal, throughput at least Flink's: {'met' if ok else 'NOT met'}")
        if rtm:
            ok = all(ours[r]["p99"] <= rtm[r]["p99"] for r in args.rates if r in ours and r in rtm)
            print(f"goal, p99 at or below Spark Real-Time Mode's: {'met' if ok else 'NOT met'}")
    print("rows/s: records in / (output topic complete - job submitted); cold: the same job over the warm-up "
          "topic first, in the same engine; deliv: output records that arrived within the wait over those expected")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=5_000_000, help="pre-loaded records (default 5M)")
    parser.add_argument("--warmup-records", type=int, help="records of each peer's warm-up job (default records/5)")
    parser.add_argument("--latency-seconds", type=float, default=20, help="measured seconds per latency run")
    parser.add_argument("--warmup-seconds", type=float, default=5, help="seconds produced before the measured ones")
    parser.add_argument("--rate", type=int, action="append", help="offered rows/s (default 1,000 and 100,000)")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)}")
    parser.add_argument("--delivery", default="at-least-once", choices=("none", "at-least-once"),
                        help="streamlab's KafkaSink delivery")
    parser.add_argument("--two-partitions", action="store_true",
                        help="also streamlab at parallelism 2 over a 2-partition input (throughput only)")
    parser.add_argument("--real-time", default="5 minutes", help="Spark RTM's batch duration")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a run may take before it is a failure")
    parser.add_argument("--pyflink-venv", type=Path, default=Path.home() / ".cache/streamlab/pyflink-venv")
    args = parser.parse_args()
    args.warmup_records = args.warmup_records or max(1, args.records // 5)
    args.rates = sorted(set(args.rate or (1_000, 100_000)))
    peers = [p for p in args.peers.split(",") if p]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        parser.error(f"unknown peer(s) {unknown}: choose from {', '.join(PEERS)}")

    kafka_broker.JVM_OPTIONS = BROKER_JVM
    broker = kafka_broker.KafkaBroker(Path(tempfile.mkdtemp(prefix="bench-kafka-broker-"))).start()
    servers = broker.bootstrap
    offsets = Offsets(servers)
    results: dict = {}
    errors: dict = {}
    try:
        topics = {"in": new_topic(servers, "in"), "warm": new_topic(servers, "warm")}
        took = preload(servers, topics["in"], args.records)
        preload(servers, topics["warm"], args.warmup_records)
        print(f"Kafka 4.1.1 broker at {servers} ({' '.join(BROKER_JVM)}); {args.records:,} records pre-loaded into "
              f"1 partition in {took:.1f} s; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}", flush=True)
        for name in peers:
            if name.startswith("streamlab"):
                step = "sql" if name == "streamlab" else "pandas"
                run_peer(name, lambda: Streamlab(step, args.delivery), args, servers, offsets, topics, results, errors)
            elif name == "client-loop":
                run_peer(name, ClientLoop, args, servers, offsets, topics, results, errors)
            elif name == "flink":
                run_peer(name, lambda: make_flink(args, servers, topics["warm"], offsets)[0], args, servers, offsets,
                         topics, results, errors)
            else:
                from kafka_spark import SparkPeer
                run_peer(name, lambda: SparkPeer("rtm" if name == "spark-rtm" else "mb", args.real_time), args,
                         servers, offsets, topics, results, errors)
        if args.two_partitions:
            two_partitions(args, servers, offsets, results, errors)
    finally:
        offsets.close()
        broker.stop()
    report(results, errors, args)


def two_partitions(args, servers: str, offsets: Offsets, results: dict, errors: dict) -> None:
    topic = new_topic(servers, "in2", partitions=2)
    preload(servers, topic, args.records)
    peer = None
    try:
        peer = Streamlab("sql", args.delivery, parallelism=2)
        print(f"streamlab p2: {peer.describe()}, 2 input partitions", flush=True)
        throughput(peer, servers, offsets, topic, args.warmup_records, args.timeout)
        t = throughput(peer, servers, offsets, topic, args.records, args.timeout)
        results["streamlab p2 (2 parts)"] = {"throughput": t, "cold": None}
        print(f"  {args.records:,} records: {t['rows_per_s']:,.0f} rows/s", flush=True)
    except Exception as exc:
        errors["streamlab p2"] = f"{type(exc).__name__}: {exc}"
    finally:
        if peer is not None:
            peer.close()


if __name__ == "__main__":
    main()
