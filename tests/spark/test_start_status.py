"""What a task waiting for its TaskManager's SparkSession says (SparkRunner.status): how long it
waited, after another TaskManager's JVM start or, once its own began, what the last start of a
local session took on this machine (kept in the helpers' cache; none for a cluster master)."""
from __future__ import annotations

from pathlib import Path

from cluster.conf import TaskConfig
from cluster.spark.runner import SparkRunner, read_start_seconds, write_start_seconds

LOCAL = TaskConfig.from_dict({"taskmanager.spark.master": "local[1]"})
CLUSTER = TaskConfig.from_dict({"taskmanager.spark.master": "spark://127.0.0.1:7077"})


def test_a_start_says_what_the_last_local_start_took_here(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = SparkRunner(LOCAL)  # not started: its status is read as a waiting task reads it
    assert first.phase == "queued" and first.status().endswith(", after another TaskManager's)")
    first.phase = "starting"
    assert first.status().startswith("starting Spark (") and first.status().endswith(" s)")  # no figure yet

    write_start_seconds(LOCAL, 7.64)
    assert read_start_seconds(LOCAL) == 7.6
    later = SparkRunner(LOCAL)
    later.phase = "starting"
    assert later.status().endswith(" s; about 8 s here)")
    later.phase = "queued"
    assert later.status().endswith(", after another TaskManager's)")


def test_a_cluster_masters_start_keeps_no_figure(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    write_start_seconds(LOCAL, 5.0)
    write_start_seconds(CLUSTER, 60.0)
    assert read_start_seconds(CLUSTER) is None and read_start_seconds(LOCAL) == 5.0
    (tmp_path / "streamlab" / "jvm" / "spark-start-seconds").write_text("garbage")
    assert read_start_seconds(LOCAL) is None
