"""Spark beyond one machine: the TaskManager's SparkSession as the driver of a real Spark
standalone cluster (a master and a worker started from pyspark's own ``bin/spark-class``), whose
executor runs the per-batch plans; the results equal the local-mode run row for row."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
import pyspark
from pyspark.sql import functions as F

from kernel_runtime import JobClient, StreamEnvironment

from tests.conftest import start_cluster, wait_for
from tests.operators.harness import free_port

pytestmark = pytest.mark.slow  # three JVMs of a Spark cluster besides the streamlab cluster's

N = 12_000
CITIES = pd.DataFrame({"city_id": range(7), "city": ["Oslo", "Lima", "Pune", "Kyiv", "Quito", "Turin", "Accra"]})
# The command line of the JVM that evaluates the row: an executor's names its executor id, a
# local session's is the TaskManager's own (SparkSubmit). Evaluated per row on the executor: the
# expression is not deterministic, so Spark never folds it on the driver.
JVM_COMMAND = "java_method('java.lang.System', 'getProperty', 'sun.java.command')"


def orders(seq):
    return pd.DataFrame({"order_id": seq, "city_id": (seq * 13) % 7, "amount": (seq % 97).astype("float64"),
                         "status": pd.Series(seq % 4).map({0: "new", 1: "paid", 2: "paid", 3: "void"})})


def enrich(df):
    cities = df.sparkSession.createDataFrame(CITIES)
    return df.join(cities, "city_id").withColumn("big", F.col("amount") >= 50)


def run_pipeline(local, name: str) -> pd.DataFrame:
    client = JobClient(local.info)
    try:
        env = StreamEnvironment(parallelism=1, cluster=local.cluster_dir)
        (env.from_generator(orders, count=N, batch_size=2_000)
            .sql(f"SELECT order_id, city_id, amount * 1.1 AS amount, {JVM_COMMAND} AS jvm "
                 "FROM input WHERE status = 'paid'")
            .spark(enrich, name="enrich")
            .collect())
        table = env.execute_async(name, client=client).wait(240).to_pandas()
    finally:
        client.close()
    return table.sort_values("order_id").reset_index(drop=True)


def master_json(webui: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{webui}/json", timeout=5) as resp:
        return json.loads(resp.read())


class SparkStandalone:
    """A master and one worker (1 core, 1g) on 127.0.0.1, each in a process group of its own, so
    that the executors the worker starts are ended with it."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.port, self.webui, self.worker_webui = free_port(), free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        home = Path(pyspark.__file__).parent
        self.spark_class = str(home / "bin" / "spark-class")
        self.env = os.environ | {"SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
                                 "SPARK_DAEMON_MEMORY": "256m", "SPARK_LOG_DIR": str(directory)}
        self.processes: list[subprocess.Popen] = []

    def _start(self, name: str, *args: str) -> None:
        log = open(self.directory / f"{name}.out", "wb")
        self.processes.append(subprocess.Popen([self.spark_class, *args], env=self.env, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True))
        log.close()

    def start(self) -> "SparkStandalone":
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.webui))
        (self.directory / "work").mkdir()
        self._start("worker", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                    "--cores", "1", "--memory", "1g", "--webui-port", str(self.worker_webui),
                    "--work-dir", str(self.directory / "work"))
        try:
            wait_for(self._worker_alive, 90, f"the Spark worker registered with {self.url} ({self.directory})")
        except BaseException:
            self.stop()  # a fixture that fails to start is not torn down
            raise
        return self

    def _worker_alive(self) -> bool:
        for p in self.processes:
            if p.poll() is not None:
                raise AssertionError(f"{p.args[1]} exited with {p.returncode}: see {self.directory}")
        try:
            return any(w["state"] == "ALIVE" for w in master_json(self.webui)["workers"])
        except (OSError, ValueError):  # not listening yet, or an empty page while the UI starts
            return False

    def stop(self) -> None:
        # the worker first (it ends its executors), then the master; whatever is left of a
        # group after 20 s is killed
        for p in reversed(self.processes):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in reversed(self.processes):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            while _group_alive(p.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _group_alive(p.pid):
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.fixture(scope="module")
def spark_standalone(tmp_path_factory):
    cluster = SparkStandalone(tmp_path_factory.mktemp("spark-standalone")).start()
    yield cluster
    cluster.stop()
    assert not any(_group_alive(p.pid) for p in cluster.processes), "a Spark process outlived the cluster"


@pytest.fixture(scope="module")
def on_spark_cluster(spark_standalone, tmp_path_factory):
    """A streamlab cluster of 1 TaskManager whose SparkSession drives the standalone cluster."""
    local = start_cluster(tmp_path_factory.mktemp("on-spark"), taskmanagers=1, **{
        "taskmanager.spark.master": spark_standalone.url,
        "taskmanager.spark.executor-memory": "512m",
        "taskmanager.spark.executor-cores": 1,
        "taskmanager.spark.cores-max": 1,
        "taskmanager.spark.driver-memory": "512m",
    })
    yield local
    local.stop()


# 4-5 JVMs start before the first batch (master, worker, executor, the TaskManagers' drivers):
# setup alone took over 120 s at load average 14 here
@pytest.mark.timeout(600)
def test_batches_run_on_the_standalone_executor_with_the_local_results(spark_standalone, on_spark_cluster, cluster):
    started = time.monotonic()
    remote = run_pipeline(on_spark_cluster, "on a Spark cluster")
    remote_seconds = time.monotonic() - started

    # the TaskManager's session is one application of the Spark cluster, with its executor
    apps = master_json(spark_standalone.webui)["activeapps"]
    assert [(a["name"], a["state"], a["cores"]) for a in apps] == [("streamlab-taskmanager", "RUNNING", 1)], apps
    app_id = apps[0]["id"]
    # ... and every row was computed in that application's executor, not in the driver
    executors = {re.search(r"--executor-id (\S+)", jvm).group(1) if "CoarseGrainedExecutorBackend" in jvm else jvm
                 for jvm in remote["jvm"]}
    assert executors == {"0"}, executors
    assert all(f"--app-id {app_id}" in jvm for jvm in remote["jvm"])

    started = time.monotonic()
    local = run_pipeline(cluster, "on local Spark")
    local_seconds = time.monotonic() - started
    assert local["jvm"].str.contains("org.apache.spark.deploy.SparkSubmit").all()  # the check tells them apart
    assert len(remote) == N // 2
    pd.testing.assert_frame_equal(remote.drop(columns="jvm"), local.drop(columns="jvm"))
    print(f"Spark cluster run {remote_seconds:.1f} s (session start included), local run {local_seconds:.1f} s")
