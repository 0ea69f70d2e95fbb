"""A slow sink back-pressures its producers through credits, and memory stays bounded."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
import psutil
import pytest

from cluster.state.key_groups import key_groups_of_frame, operator_index_for_key_group
from kernel_runtime import StreamEnvironment
from tests.conftest import rest, wait_for

pytestmark = pytest.mark.slow

# Stated bounds (resident set size). The credits allow at most
# taskmanager.network.memory.buffers-per-channel batches queued per channel, so nothing of ours
# may grow with the run's length: after warm-up a JobManager or TaskManager may move by GROWTH at
# most. A Spark JVM grows its heap lazily up to its -Xmx (taskmanager.spark.driver-memory, 1g):
# it is held to the absolute bound only.
RSS_BOUND = {"jobmanager": 250 << 20, "taskmanager": 700 << 20, "spark-jvm": 2_000 << 20}
GROWTH = 80 << 20
RUN_SECONDS = 32


def _processes(cluster) -> dict[str, psutil.Process]:
    procs = {"jobmanager": psutil.Process(cluster.jobmanager.pid)}
    for i, tm in enumerate(cluster.taskmanagers):
        p = psutil.Process(tm.pid)
        procs[f"taskmanager-{i}"] = p
        for child in p.children(recursive=True):
            if _is_spark_jvm(child):
                procs[f"spark-jvm-{i}"] = child
    return procs


def _is_spark_jvm(proc: psutil.Process) -> bool:
    """The SparkSession's JVM, not the short-lived java that spark-class runs first to build its
    command line (seen here while a TaskManager was still starting Spark: it was gone a moment later)."""
    try:
        command = proc.cmdline()
    except psutil.NoSuchProcess:
        return False
    return "java" in proc.name() and "org.apache.spark.deploy.SparkSubmit" in command \
        and "org.apache.spark.launcher.Main" not in command


def _kind(name: str) -> str:
    return name.rsplit("-", 1)[0] if name[-1].isdigit() else name


def test_slow_sink_makes_upstream_report_high_backpressure_with_bounded_memory(cluster, client):
    def slow_sink(df):
        time.sleep(0.25)  # a sink that takes 250 ms per batch, however large
        return df.iloc[:1]

    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(lambda s: {"k": s % 100, "payload": s * 3}, batch_size=2_000, name="fast source")
        .map_batches(lambda df: df.assign(payload=df.payload + 1), name="transform")
        .rebalance()
        .map_batches(slow_sink, name="slow sink", parallelism=1)
        .collect())
    handle = env.execute_async("backpressure", client=client)
    try:
        wait_for(lambda: handle.status == "RUNNING", 120, "running")
        details = client.job_details(handle.job_id)
        source = next(v for v in details["vertices"] if v["name"].startswith("Source"))
        sink = next(v for v in details["vertices"] if "slow sink" in v["name"])
        path = f"/jobs/{handle.job_id}/vertices/{source['id']}/backpressure"
        def all_high():
            body = rest(cluster, path)[1]
            return all(s["backpressureLevel"] == "high" for s in body["subtasks"]) and body
        body = wait_for(all_high, 30, "every source subtask graded high")
        assert body["backpressureLevel"] == "high" and all(s["ratio"] > 0.5 for s in body["subtasks"])
        # and the slow one is busy, not back-pressured
        slow = rest(cluster, f"/jobs/{handle.job_id}/vertices/{sink['id']}/backpressure")[1]
        assert slow["backpressureLevel"] == "ok"
        sink_metrics = next(s["metrics"] for s in client.job_details(handle.job_id)["subtasks"]
                            if s["vertex_id"] == sink["id"])
        assert sink_metrics["busyTimeMsPerSecond"] > 500
        # named the bottleneck (a map step at parallelism 1, before the collect sink's own vertex)
        named = wait_for(lambda: (b := rest(cluster, f"/jobs/{handle.job_id}/bottleneck")[1])["vertex-id"] and b,
                         30, "a bottleneck named")
        assert (named["vertex-id"], named["sink"], named["skew"]) == (sink["id"], False, None)
        assert named["text"].startswith(f"'{sink['name']}' limits the job") and "More parallelism" in named["text"]

        procs = _processes(cluster)
        assert {"jobmanager", "taskmanager-0", "taskmanager-1"} <= set(procs)
        samples: dict[str, list[int]] = {name: [] for name in procs}
        started = time.monotonic()
        while time.monotonic() - started < RUN_SECONDS:
            for name, proc in procs.items():
                samples[name].append(proc.memory_info().rss)
            assert handle.status == "RUNNING"
            time.sleep(1)
        print({name: f"{min(rss) >> 20}-{max(rss) >> 20} MiB" for name, rss in samples.items()})
        for name, rss in samples.items():
            assert max(rss) < RSS_BOUND[_kind(name)], f"{name}: {max(rss) >> 20} MiB"
            settled = rss[len(rss) // 3:]  # after warm-up
            assert _kind(name) == "spark-jvm" or max(settled) - min(settled) < GROWTH, \
                f"{name} grew from {min(settled) >> 20} to {max(settled) >> 20} MiB"
        # still back-pressured at the end: the source is held back, not buffering
        assert rest(cluster, path)[1]["backpressureLevel"] == "high"
        queued = [s["metrics"]["input-queue"] for s in client.job_details(handle.job_id)["subtasks"]]
        assert max(queued) <= 2 * 2  # buffers-per-channel x channels into the slow sink
    finally:
        handle.cancel()
        wait_for(lambda: handle.status == "CANCELED", 30, "cancelled")


def test_a_skewed_key_is_named_with_its_key_group(cluster, client):
    """Nine rows in ten have one key: the subtask that owns it is busy, its sibling is not."""
    hot = 100
    group = int(key_groups_of_frame(pd.DataFrame({"k": [hot]}), 128)[0])
    owner = int(operator_index_for_key_group(group, 128, 2))

    def per_row(key, rows, state):
        time.sleep(len(rows) * 0.0005)  # half a millisecond a row, whatever the key
        return pd.DataFrame({"k": [key], "n": [len(rows)]})

    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(lambda s: pd.DataFrame({"k": np.where(s % 10 == 0, s % 7, hot)}), rate=4_000)
        .key_by("k").process(per_row, name="per row")
        .collect())
    handle = env.execute_async("skew", client=client)
    try:
        def skew_named():
            said = rest(cluster, f"/jobs/{handle.job_id}/bottleneck")[1]
            return said.get("skew") and said["skew"]["key-group"] is not None and said
        said = wait_for(skew_named, 60, "a skewed key named")
        assert said["name"].startswith("per row") and said["skew"]["subtask"] == owner
        assert said["skew"]["key-group"] == group and said["skew"]["key-group-share"] > 0.8
        assert f"key group {group} carries" in said["text"] and "salt the hot key" in said["text"]
    finally:
        handle.cancel()
