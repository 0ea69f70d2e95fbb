"""The Spark oracle cases of tests/operators/test_spark_oracle.py on a TaskManager session whose
master is a real Spark standalone cluster (spark://, a master and a worker from pyspark's own
``bin/spark-class``, as test_spark_standalone.py starts them): BatchJob's non-local branch (the
batch as PySpark's toDataFrame makes it, tasks on the executor, their Arrow collected), the driver's
LocalBatch, fused rounds, a table split into several partitions and timestamp inputs, in a session
whose time zone (Asia/Kolkata, set by taskmanager.spark.conf) is not UTC.

A process has one SparkContext, and the test process's is local[1] (the ``spark`` fixture): the
chains run in a driver process of their own (``drive``, through the same ``run_path`` as the
in-process tests), which writes each batch's output as an Arrow file; the oracle is computed here,
by PySpark's public API in the test process's session, in the same time zone."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from tests.e2e.test_spark_standalone import spark_standalone  # noqa: F401  (a fixture: the cluster, once per module)
from tests.operators.test_spark_oracle import (AGGREGATE, AGGREGATED, BATCHES, KOLKATA, PROJECT, SPLIT, TIMES_QUERY,
                                               assert_as_oracle, assert_project_by_python, ids, oracle, times, typed)

pytestmark = pytest.mark.slow  # four JVMs: the Spark master, worker and executor, and the chains' driver

REPO = Path(__file__).resolve().parents[2]

# case -> (path, query, the batches' inputs)
CASES = {
    "project-kept": ("kept", PROJECT, lambda: [typed(i) for i in BATCHES]),
    "project-local": ("local", PROJECT, lambda: [typed(i) for i in BATCHES]),
    "project-fused": ("fused", PROJECT, lambda: [typed(i) for i in BATCHES]),
    "aggregate-kept": ("kept", AGGREGATE, lambda: [typed(BATCHES[i]) for i in AGGREGATED]),
    "times-python": ("python", TIMES_QUERY, lambda: [times(i) for i in BATCHES]),
    # cut into partitions of SPLIT rows (spark_arrow's constants set so in the driver)
    "split-kept": ("kept", PROJECT, lambda: [typed(ids(0, 300)), typed(ids(1, 4_500)), typed(ids(2, 2_001))]),
    "split-aggregate": ("kept", AGGREGATE, lambda: [typed(ids(0, 300)), typed(ids(1, 4_500))]),
}


def drive(master: str, out: str) -> None:
    """The driver process: every case through its path on a session of ``master``, each batch's
    output written to ``out``/<case>-<n>.arrow; what Spark says of itself to ``out``/driver.json."""
    from cluster.conf import TaskConfig
    from cluster.spark import arrow as spark_arrow
    from cluster.spark.runner import SparkRunner
    from cluster.spark.plans import PlanCache
    from tests.operators.test_spark_oracle import run_path
    config = TaskConfig.from_dict({
        "taskmanager.host": "127.0.0.1", "taskmanager.spark.master": master,
        "taskmanager.spark.executor-memory": "512m", "taskmanager.spark.executor-cores": 1,
        "taskmanager.spark.cores-max": 1, "taskmanager.spark.driver-memory": "512m",
        "taskmanager.spark.conf": {"spark.sql.session.timeZone": KOLKATA}})
    SparkRunner.taskmanager_config = config
    runner = SparkRunner.get(config)
    runner.ready.wait()
    if runner.error:
        raise RuntimeError(runner.error)
    context = runner.session.sparkContext
    for case, (path, query, inputs) in CASES.items():
        runner.plans = PlanCache()  # each case analyses its own plan first
        if case.startswith("split"):
            spark_arrow.SPLIT_ROWS = spark_arrow.MAX_PARTITION_ROWS = SPLIT
        outputs = run_path(path, query, inputs(), case)  # checks the path each batch took
        for n, table in enumerate(outputs):
            with pa.ipc.new_file(f"{out}/{case}-{n}.arrow", table.schema) as writer:
                writer.write_table(table)
    executors = context._jsc.sc().getExecutorMemoryStatus().size() - 1  # without the driver's block manager
    Path(out, "driver.json").write_text(json.dumps({
        "master": context.master, "local": context._jsc.sc().isLocal(), "executors": executors,
        "timezone": runner.session.conf.get("spark.sql.session.timeZone"),
        "held": context._jvm.streamlab.BatchJob.held()}))
    runner.stop()


@pytest.fixture(scope="module")
def driven(spark_standalone, tmp_path_factory) -> Path:  # noqa: F811
    """Every case run once in a driver process on the standalone cluster: the directory of its outputs."""
    out = tmp_path_factory.mktemp("oracle-standalone")
    env = os.environ | {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    code = f"from tests.e2e.test_spark_oracle_standalone import drive; drive({spark_standalone.url!r}, {str(out)!r})"
    # a generous bound against a hang only: the 4 JVMs' start took up to 2 minutes on a loaded machine
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, f"the driver failed:\n{done.stderr[-6000:]}"
    return out


@pytest.mark.timeout(1200)
def test_the_driver_ran_on_the_standalone_cluster(driven):
    facts = json.loads((driven / "driver.json").read_text())
    assert facts["master"].startswith("spark://") and facts["local"] is False
    assert facts["executors"] == 1  # the batches' tasks ran there: a standalone driver runs none itself
    assert facts["timezone"] == KOLKATA
    assert facts["held"] == 0  # the non-local branch never uses the local maps


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("case", list(CASES))
def test_a_case_on_the_standalone_cluster_gives_the_oracles_rows(driven, spark, case):
    path, query, inputs = CASES[case]
    tables = inputs()
    for n, table in enumerate(tables):
        got = pa.ipc.open_file(driven / f"{case}-{n}.arrow").read_all()
        assert_as_oracle(got, oracle(spark, query, table, KOLKATA), KOLKATA, f"{case}, batch {n}")
        if query == PROJECT:
            assert_project_by_python(got, table, KOLKATA)
    assert not (driven / f"{case}-{len(tables)}.arrow").exists()
