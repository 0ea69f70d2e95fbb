"""JobManager failover time with ZooKeeper HA: from the leader's SIGKILL to the job running again
under the new leader, and to the first checkpoint it completes (output committed again).

A local ZooKeeper (Debian's package), two JobManagers, two TaskManagers x 2 slots, the keyed
running total into the transactional Parquet sink with checkpoints every 500 ms; the leader is
killed ``--kills`` times, a replacement standby started each time. The ZooKeeper session timeout
bounds the first phase: a dead leader leads until its session expires.

    python bench/ha_failover.py [--kills 3] [--session-timeout "2 s"]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernel_runtime.deploy.ha import HaLocalCluster, LocalZooKeeper  # noqa: E402
from tests.e2e.test_exactly_once import run_job  # noqa: E402  the job of the exactly-once test


def answer(cluster: HaLocalCluster, path: str):
    assert cluster.info is not None
    req = urllib.request.Request(cluster.info.rest_address + path, headers=cluster.info.rest_headers)
    try:
        with urllib.request.urlopen(req, timeout=2) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


def until(predicate, timeout: float = 60.0) -> float:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the failover did not finish")
        time.sleep(0.02)
    return time.monotonic()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--session-timeout", default="2 s")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="ha-failover-")  # kept on a failure: its logs say why
    zk = LocalZooKeeper(Path(tmp) / "zookeeper").start()
    cluster = HaLocalCluster(Path(tmp) / "cluster", zk.quorum, {
        "heartbeat.interval": "200 ms", "heartbeat.timeout": "2 s",
        "high-availability.zookeeper.client.session-timeout": args.session_timeout})
    try:
        cluster.start_jobmanager()
        cluster.info = cluster.leader()
        cluster.start_jobmanager()
        cluster.start_taskmanager()
        cluster.start_taskmanager()
        until(lambda: (answer(cluster, "/overview") or {}).get("taskmanagers") == 2)
        client, handle = run_job(cluster, "hashmap", str(Path(tmp) / "out"))
        job = handle.job_id
        rows = []
        for _ in range(args.kills):
            until(lambda: ((answer(cluster, f"/jobs/{job}/checkpoints") or {}).get("counts") or {}).get(
                "completed", 0) >= 1)
            pid = json.loads((cluster.cluster_dir / "jobmanager.json").read_text())["pid"]
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            cluster.process_of(pid)[1].wait(5)
            cluster.start_jobmanager()
            cluster.info = cluster.leader(60, not_pid=pid)
            elected = time.monotonic()
            running = until(lambda: (j := answer(cluster, f"/jobs/{job}")) is not None
                            and all(v["status"] == "RUNNING" for v in j["vertices"]))
            try:
                committed = until(lambda: ((answer(cluster, f"/jobs/{job}/checkpoints") or {}).get("counts")
                                           or {}).get("completed", 0) >= 1)
            except TimeoutError:
                details = answer(cluster, f"/jobs/{job}")
                raise TimeoutError(f"no checkpoint under the new leader within 60 s; the job: "
                                   f"{details and details['state']}, "
                                   f"{details and [v['status'] for v in details['vertices']]}; "
                                   f"see {cluster.cluster_dir / 'log'}") from None
            rows.append((elected - killed, running - killed, committed - killed))
            print(f"kill {len(rows)}: new leader {rows[-1][0]:.2f} s, job RUNNING {rows[-1][1]:.2f} s, "
                  f"first checkpoint committed {rows[-1][2]:.2f} s after the kill")
        client.close()
        print(f"session timeout {args.session_timeout}: median to RUNNING "
              f"{statistics.median(r[1] for r in rows):.2f} s, to committed output "
              f"{statistics.median(r[2] for r in rows):.2f} s over {len(rows)} kills")
    except BaseException:
        print(f"failed: the logs are in {tmp}")
        raise
    finally:
        cluster.stop()
        zk.stop()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
