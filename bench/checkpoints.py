"""What checkpoints cost, on a local 2 x 2 cluster.

1. Throughput of a keyed aggregation (generator -> key_by -> aggregate(sum, count, max) -> a
   discarding sink) with checkpoints off and every 1 s, same process: the ratio is the overhead.
2. Checkpoint duration with about 100 MB of keyed state, per backend: a process function keeps a
   ~100-byte value for each of 1M keys; the job's own checkpoint statistics (REST) give the
   end-to-end duration and size of the checkpoints taken once the state is loaded.
3. Recovery: the time from a TaskManager's SIGKILL to output flowing again (the first row
   written by the restarted attempt), with heartbeat.timeout at 2 s: detection is most of it.

    .venv/bin/python bench/checkpoints.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernel_runtime import JobClient, LocalCluster, StreamEnvironment  # noqa: E402


def rest(cluster, path):
    with urllib.request.urlopen(cluster.info.rest_address + path, timeout=10) as resp:
        return json.loads(resp.read())


def sales(seq):
    return pd.DataFrame({"shop": seq % 10_000, "price": (seq % 89).astype("float64")})


def aggregation_rows_per_s(cluster, client, n: int, interval: str) -> float:
    config = {"execution.checkpointing.interval": interval} if interval else {}
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir, config=config)
    (env.from_generator(sales, count=n, batch_size=10_000)
        .key_by("shop").aggregate(revenue=("price", "sum"), n=("price", "count"), top=("price", "max"))
        .filter(lambda df: df.n < 0, name="discard")  # no rows reach the sink: its cost is out of the way
        .print())
    handle = env.execute_async(f"aggregate ckpt={interval or 'off'}", client=client)
    handle.wait(600)
    ts = client.job_details(handle.job_id)["timestamps"]
    return n / ((ts["FINISHED"] - ts["RUNNING"]) / 1000)


def big_state_checkpoints(cluster, client, backend: str, keys: int, value_bytes: int) -> dict:
    payload = "x" * value_bytes

    def remember(key, rows, state):
        state.value_state("v").update(payload + str(key))
        return None

    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir, config={
        "execution.checkpointing.interval": "2 s", "state.backend.type": backend,
        "execution.checkpointing.timeout": "5 min"})
    (env.from_generator(lambda s: {"k": s}, count=keys, batch_size=20_000)
        .key_by("k").process(remember, name="remember").print())
    handle = env.execute_async(f"100 MB of state ({backend})", client=client)
    while handle.status not in ("FINISHED", "FAILED"):
        time.sleep(0.5)
    stats = rest(cluster, f"/jobs/{handle.job_id}/checkpoints")
    done = [c for c in stats["history"] if c["status"] == "COMPLETED"]
    biggest = max(done, key=lambda c: c["checkpointed_size"])
    return {"size_mb": biggest["checkpointed_size"] / 1e6, "duration_ms": biggest["end_to_end_duration"],
            "checkpoints": len(done)}


def kill_to_output(cluster, client) -> float:
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir, config={
        "execution.checkpointing.interval": "500 ms", "restart-strategy.fixed-delay.delay": "100 ms"})
    env.from_generator(sales, rate=20_000, batch_size=1_000).key_by("shop").count().collect()
    handle = env.execute_async("recovery", client=client)
    while handle.row_count() < 10_000:
        time.sleep(0.05)
    busy = {s["taskmanager_id"] for s in client.job_details(handle.job_id)["subtasks"]}
    pid = next(tm["pid"] for tm in rest(cluster, "/taskmanagers")["taskmanagers"] if tm["id"] in busy)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while handle.job_status().attempt < 2:
        time.sleep(0.01)
    detected = time.monotonic()
    before = handle.row_count()
    while handle.row_count() <= before:  # rows of the new attempt (the old ones past the checkpoint are dropped)
        time.sleep(0.01)
    flowing = time.monotonic()
    handle.cancel()
    cluster.start_taskmanager()
    return detected - killed, flowing - killed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="streamlab-bench-ckpt-"))
    n = 2_000_000 if args.quick else 6_000_000
    keys = 200_000 if args.quick else 1_000_000
    with LocalCluster(directory, taskmanagers=2, slots=2, embedded=True, config={
            "taskmanager.spark.startup": "lazy", "heartbeat.timeout": "2 s", "heartbeat.interval": "200 ms"}) as cluster:
        client = JobClient(cluster.info)
        aggregation_rows_per_s(cluster, client, 200_000, "")  # warm
        off = aggregation_rows_per_s(cluster, client, n, "")
        on = aggregation_rows_per_s(cluster, client, n, "1 s")
        print(f"keyed aggregation, {n:,} rows, 10,000 keys, parallelism 2: checkpoints off {off:,.0f} rows/s, "
              f"every 1 s {on:,.0f} rows/s, ratio {on / off:.2f}")
        for backend in ("hashmap", "rocksdb"):
            r = big_state_checkpoints(cluster, client, backend, keys, 100)
            print(f"{backend:8} state of {keys:,} keys x ~100 B: largest checkpoint {r['size_mb']:.0f} MB in "
                  f"{r['duration_ms']} ms end to end ({r['checkpoints']} completed)")
        detected, flowing = kill_to_output(cluster, client)
        print(f"TaskManager SIGKILL -> restart {detected:.2f} s (heartbeat.timeout 2 s) -> output flowing again "
              f"{flowing:.2f} s after the kill")
        client.close()


if __name__ == "__main__":
    main()
