"""The class data sharing archive of the TaskManagers' Spark JVM (cluster/spark/class_data.py): named
for the JVM and class path it fits, given to a driver only once made, and mapped by the JVMs of a real
cluster's TaskManagers (``make setup`` made it: ``python -m cluster.spark archive``)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import psutil

from cluster.conf import TaskConfig
from cluster.spark.class_data import JAVA_OPTIONS, archive_path, with_class_data
from cluster.spark.runner import session_conf
from kernel_runtime import StreamEnvironment
from tests.conftest import wait_for


def test_an_archive_is_named_for_its_class_path_and_given_to_the_driver_once_made(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    jar = tmp_path / "extra.jar"
    jar.write_bytes(b"one")
    conf = {JAVA_OPTIONS: "-XX:+UseParallelGC", "spark.driver.extraClassPath": str(jar)}
    archive = archive_path(conf)
    assert archive is not None and archive.parent == tmp_path / "cache" / "streamlab" / "jvm"
    assert with_class_data(conf) == conf  # none made: the JVM starts as before
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"")
    assert with_class_data(conf)[JAVA_OPTIONS] == f"-XX:+UseParallelGC -XX:SharedArchiveFile={archive}"
    # another class path, or the same jar rewritten, looks for an archive of its own
    assert archive_path({JAVA_OPTIONS: "-XX:+UseParallelGC"}) != archive
    jar.write_bytes(b"three")
    assert archive_path(conf) != archive
    assert with_class_data(conf) == conf


def test_spark_jars_installed_again_at_the_same_path_look_for_an_archive_of_their_own(monkeypatch, tmp_path: Path):
    # a venv made anew at the same path: the JVM refuses the old archive (its jars' times changed),
    # so the archive made for the old jars must not be named for the new ones (CI's clone of a path
    # used before mapped no archive at all)
    from cluster.spark import class_data
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "spark-core.jar").write_bytes(b"core")
    monkeypatch.setattr(class_data, "spark_jars", lambda: jars)
    before = archive_path({})
    os.utime(jars / "spark-core.jar", ns=(0, 10**9))  # the same bytes, installed at another time
    assert archive_path({}) != before


def mapped_archives(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as maps:
        return {line.split()[-1] for line in maps if line.rstrip().endswith(".jsa")}


def test_the_taskmanagers_spark_jvms_map_this_machines_archive(cluster, client):
    archive = archive_path(session_conf(TaskConfig.from_dict({})))
    assert archive is not None and archive.is_file(), f"no class data archive at {archive}: make setup makes it"
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(lambda seq: pd.DataFrame({"v": seq}), count=10, batch_size=5)
        .sql("SELECT v * 2 AS w FROM input")
        .collect())
    rows = env.execute_async("class data", client=client).wait(180).to_pandas()
    assert sorted(rows.w) == list(range(0, 20, 2))

    def drivers() -> list[psutil.Process]:
        # the drivers only: spark-submit first runs a short-lived JVM of its own (Spark's launcher,
        # which computes the driver's command), which maps the JDK's archive alone
        return [child for tm in cluster.taskmanagers for child in psutil.Process(tm.pid).children(recursive=True)
                if child.name() == "java" and "org.apache.spark.launcher.Main" not in child.cmdline()]
    found = wait_for(lambda: len(drivers()) == len(cluster.taskmanagers) and drivers(), 120,
                     "every TaskManager's Spark driver JVM")
    for jvm in found:
        # the JDK's own base archive, and ours on top of it
        assert str(archive) in mapped_archives(jvm.pid), (jvm.pid, os.readlink(f"/proc/{jvm.pid}/exe"))


PLANNER = """
import os, sys
import pyarrow as pa
from kernel_runtime.api.sql import analysis
analysis.analyse("SELECT v, count(*) AS n FROM input GROUP BY v", pa.schema([("v", pa.int64())]))
gateway = analysis.planner_session().sparkContext._gateway
print("JVM", gateway.jvm.ProcessHandle.current().pid())
"""


def test_the_client_sql_planners_jvm_maps_the_same_archive(tmp_path: Path):
    # a process of its own: the suite's planner is its own SparkSession (tests/conftest.py)
    archive = archive_path(session_conf(TaskConfig.from_dict({})))
    assert archive is not None and archive.is_file(), f"no class data archive at {archive}: make setup makes it"
    script = tmp_path / "planner.py"
    script.write_text(PLANNER + "sys.stdin.read()\n")  # alive until told: its JVM's maps are read meanwhile
    root = Path(__file__).resolve().parents[2]
    planner = subprocess.Popen([sys.executable, str(script)], cwd=root, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    try:
        line = planner.stdout.readline()
        assert line.startswith("JVM "), line
        assert str(archive) in mapped_archives(int(line.split()[1]))
    finally:
        planner.communicate("", timeout=60)
