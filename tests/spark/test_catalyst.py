"""Spark's internals behind one seam (cluster/spark/catalyst.py): a fast path broken on purpose is
turned off at the session's start with a warning that names it, or sends its chain to PySpark's
public path when it breaks while a batch runs; either way the chain gives exactly the rows the
working paths give. A failure of the user's own query is not mistaken for a broken path."""
from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cluster.conf import TaskConfig
from cluster.operators.base import UserFunctionError
from cluster.spark import catalyst
from cluster.spark.runner import SparkRunner
from tests.operators.harness import spark_chains

QUERY = "SELECT id, v * 10 AS w FROM input WHERE v <> 3"


def batch(i: int, n: int = 300) -> pa.Table:
    seq = np.arange(n, dtype=np.int64) + 1_000 * i
    return pa.table({"id": seq, "v": (seq * (i + 3)) % 11})


def expected(table: pa.Table) -> dict:
    kept = table.filter(pc.not_equal(table["v"], 3))
    return {"id": kept["id"].to_pylist(), "w": [v * 10 for v in kept["v"].to_pylist()]}


def run(job: str, config: dict | None = None, tables: int = 4, query: str = QUERY) -> tuple[list[dict], object]:
    """The batches' outputs through a one-step chain on the runner in place, and the chain."""
    chain, = spark_chains(query, job, parallelism=1, config=config)
    try:
        return [chain.process(batch(i))[0].to_pydict() for i in range(tables)], chain
    finally:
        chain.close()


@pytest.fixture
def runner(spark) -> SparkRunner:
    started = SparkRunner.get(TaskConfig.from_dict({}))
    started.ready.wait()
    assert started.error is None
    return started


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_every_fast_path_works_on_the_pinned_spark(runner):
    assert runner.fast_paths == frozenset(catalyst.FAST_PATHS)
    # a query no other test runs: the runner keeps plans for every later chain of the process
    outputs, chain = run("working paths", query=QUERY + " AND id >= 0")
    assert outputs == [expected(batch(i)) for i in range(4)]
    assert not chain.public and chain.local_batch_count == 3  # the first batch's plan kept, then in the driver


def test_a_fast_path_broken_at_start_is_off_with_a_warning_and_gives_the_same_rows(runner, monkeypatch, caplog):
    working, _ = run("before the break")

    def misnamed(session):  # a Spark whose PythonSQLUtils lost the method the Arrow bridge reads files by
        utils = session._jvm.PythonSQLUtils
        return utils.readArrowStreamFromFiles, utils.toDataFrame
    monkeypatch.setattr(catalyst, "arrow_reader", misnamed)
    broken = SparkRunner(TaskConfig.from_dict({}))
    with caplog.at_level(logging.WARNING):
        broken._start()  # the test process's session again, probed on this thread
    assert broken.error is None and broken.fast_paths == frozenset()
    said = warnings(caplog)
    assert any("fast path 'Arrow bridge' is off: its probe failed: Py4JError" in w for w in said), said
    for name in ("kept plan", "local batch", "BatchJob"):
        assert any(f"fast path '{name}' is off: it needs the" in w for w in said), (name, said)
    assert broken.local_batches is None and broken.batch_jobs is None

    monkeypatch.setattr(SparkRunner, "_instance", broken)
    outputs, chain = run("broken at start")
    assert outputs == working == [expected(batch(i)) for i in range(4)]
    assert chain.public and chain.plans_reused == 0 and chain.local_batch_count == 0


def test_a_fast_path_failing_inside_spark_while_a_batch_runs_falls_back_for_its_chain(runner, monkeypatch, caplog):
    config = {"execution.spark.local-batch-rows": 0}  # each batch a Spark job: the kept plan's by BatchJob
    working, _ = run("before the break", config)
    assert runner.batch_jobs is not None
    real = runner.batch_jobs._run
    # a Spark whose signature of a method the helper calls changed: py4j finds no such method
    monkeypatch.setattr(runner.batch_jobs, "_run", lambda session, root, *rest: real(root, session, *rest))
    with caplog.at_level(logging.WARNING):
        outputs, chain = run("broken at run time", config)
    assert outputs == working == [expected(batch(i)) for i in range(4)]
    said = [w for w in warnings(caplog) if "failed inside Spark's internals" in w]
    assert len(said) == 1 and "Py4JError" in said[0] and "PySpark's public path" in said[0], said
    assert chain.public and chain.plans_reused == 0  # the first batch kept the plan; the second broke


def test_an_error_of_the_users_query_still_fails_the_chain(runner):
    chain, = spark_chains("SELECT id, 100 DIV v AS q FROM input", "users error", parallelism=1,
                          config={"execution.spark.local-batch-rows": 0})
    try:
        good = batch(0).filter(pc.not_equal(batch(0)["v"], 0))
        chain.process(good)
        chain.process(good)
        with pytest.raises(UserFunctionError, match="DIVIDE_BY_ZERO"):
            chain.process(batch(1))  # v = 0 in some rows: Spark's ANSI division by zero
        with pytest.raises(UserFunctionError, match="UNRESOLVED_COLUMN"):
            spark_chains("SELECT nope FROM input", "users error 2", parallelism=1,
                         params={"input_schema": good.schema.serialize().to_pybytes()})
        assert not chain.public
    finally:
        chain.close()


def test_the_probe_turns_off_what_fails_or_differs_and_what_stands_on_it(caplog):
    rows = pa.table({"id": [2, 3]})
    with caplog.at_level(logging.WARNING):
        working = catalyst.probe("3.5.1", {catalyst.ARROW_BRIDGE: lambda: rows,
                                           catalyst.KEPT_PLAN: lambda: pa.table({"id": [3, 2]}),
                                           catalyst.LOCAL_BATCH: lambda: rows, catalyst.BATCH_JOB: None}, rows)
    assert working == {catalyst.ARROW_BRIDGE}
    said = warnings(caplog)
    assert "Spark 3.5.1 is not the Spark 4.3" in said[0]
    assert "'kept plan' is off: its probe gave {'id': [3, 2]} where PySpark gives {'id': [2, 3]}" in said[1]
    assert "'local batch' is off: it needs the kept plan, which is off" in said[2]
    assert "'BatchJob' is off: it needs the kept plan, which is off" in said[3]
