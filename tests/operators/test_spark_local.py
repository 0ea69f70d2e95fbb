"""Small batches of a .sql chain of projections and filters run in the Spark driver without a
Spark job (cluster/spark/local.py, jvm/LocalBatch.java), on the test process's
TaskManager SparkSession: the same rows as a Spark job gives, Spark's errors as a job raises
them, and a job after all when the plan needs one."""
from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from cluster.operators.base import UserFunctionError
from cluster.spark import helpers as spark_jvm

from .harness import spark_chains

AS_JOBS = {"execution.spark.local-batch-rows": 0}


def batch(i: int, n: int = 500) -> pa.Table:
    seq = np.arange(n, dtype=np.int64) + 10_000 * i
    names = pa.array([None if s % 13 == 0 else f"name-{s % 17}" for s in seq], pa.string())
    return pa.table({"id": seq, "v": (seq * 7) % 11, "x": seq / 4.0, "name": names})


def run(chain, tables: list[pa.Table]) -> list[pa.Table]:
    return [pa.concat_tables(chain.process(t)) if t.num_rows else t for t in tables]


QUERY = ("SELECT id, v * 10 AS w, x / 3 AS third, upper(name) AS name, "
         "CASE WHEN v > 5 THEN 'high' ELSE NULL END AS band, length(name) + v AS mixed, "
         "timestamp_millis(id) AS at, CAST(x AS DECIMAL(12, 2)) AS money, date_add(DATE'2026-01-01', CAST(v AS INT)) AS day, "
         "array(v, v + 1) AS pair, named_struct('a', v, 'b', name) AS both "
         "FROM input WHERE v <> 3 AND (name IS NULL OR name <> 'name-4')")


def test_small_batches_run_in_the_driver_and_give_what_a_spark_job_gives(spark):
    local, = spark_chains(QUERY, "local rows", parallelism=1)
    jobs, = spark_chains(QUERY, "job rows", parallelism=1, config=AS_JOBS)
    tables = [batch(i, n) for i, n in enumerate((500, 1, 2_000, 37, 20_000, 20_001))]
    try:
        for i, (got, expected) in enumerate(zip(run(local, tables), run(jobs, tables))):
            assert got.schema == expected.schema, i
            assert got.equals(expected), i
        # the first analyses the plan in a job; the rest but the one over the threshold run locally
        assert local.local_batch_count == 4 and jobs.local_batch_count == 0
        figures = local.metrics()
        assert figures["spark-local-batches"] == 4 and figures["spark-batches"] == 6
        assert figures["spark-jobs"] == 2  # Spark's own count: the first batch and the 20,001 rows
    finally:
        local.close()
        jobs.close()


def test_a_batch_that_keeps_no_row_gives_an_empty_table_of_the_output_schema(spark):
    chain, = spark_chains("SELECT id, name FROM input WHERE v > 100", "local empty", parallelism=1)
    try:
        chain.process(batch(0))
        (out,) = chain.process(batch(1))
        assert out.num_rows == 0 and out.column_names == ["id", "name"] and chain.local_batch_count == 1
        assert out.schema.field("name").type == pa.string()
    finally:
        chain.close()


@pytest.mark.parametrize("query", ["SELECT id, v FROM input ORDER BY v DESC, id",
                                   "SELECT v, count(*) AS n FROM input GROUP BY v ORDER BY v"])
def test_a_plan_that_still_needs_a_job_runs_as_one_from_then_on(spark, query):
    """A sort or an aggregation is one node over the input like a filter, but Spark's optimiser
    leaves it to execute: the batch runs as a job, and so do the plan's later batches."""
    chain, = spark_chains(query, "local needs a job", parallelism=1)
    reference, = spark_chains(query, "needs a job, as jobs", parallelism=1, config=AS_JOBS)
    try:
        for i in range(3):
            assert run(chain, [batch(i)]) == run(reference, [batch(i)])
        template = chain.paths.cached(batch(0).schema, False)
        assert template is not None and template.local is False
        assert chain.local_batch_count == 0
        assert chain.metrics()["spark-jobs"] == reference.metrics()["spark-jobs"] >= 3
    finally:
        chain.close()
        reference.close()


def test_a_runtime_error_in_a_local_batch_fails_the_chain_naming_it(spark):
    chain, = spark_chains("SELECT id, 100 DIV v AS q FROM input", "local error", parallelism=1)
    try:
        good = batch(0).filter(pa.compute.not_equal(batch(0)["v"], 0))
        chain.process(good)
        chain.process(good)
        assert chain.local_batch_count == 1
        with pytest.raises(UserFunctionError) as failure:
            chain.process(batch(1))  # v = 0 in some rows: Spark's ANSI division by zero
        message = str(failure.value)
        assert "operator chain [sql] (test.py:1) failed in Spark" in message and "DIVIDE_BY_ZERO" in message
        assert chain.local_batch_count == 1
    finally:
        chain.close()


def test_the_helpers_compile_once_per_machine_and_are_not_needed(monkeypatch, tmp_path: Path):
    """Compiled into the cache on first use, found there later; with no JDK compiler on a machine
    that has not compiled them, none (batches take the Python way)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    entry = spark_jvm.classpath_entry()
    assert entry is not None and entry.endswith(".jar")
    with zipfile.ZipFile(entry) as jar:
        assert {"streamlab/LocalBatch.class", "streamlab/BatchJob.class"} <= set(jar.namelist())
    compiled = os.stat(entry).st_mtime_ns
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "no-jdk"))
    assert spark_jvm.javac() is None
    assert spark_jvm.classpath_entry() == entry  # no compiler needed: the classes are there
    assert os.stat(entry).st_mtime_ns == compiled
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))
    assert spark_jvm.classpath_entry() is None
    assert not [p for p in (tmp_path / "elsewhere").rglob("*") if p.is_file()]
    assert os.listdir(Path(entry).parent) == [Path(entry).name]  # no staging directory left


def test_a_subtask_takes_the_arrow_path_its_fellow_subtask_found_for_its_fused_rounds(spark):
    """A fused round (fusion.py) asks its leader's chain whether the batches run without Spark: a
    chain whose fellow subtask tried the Arrow path takes it untried, as its own batches do (when it
    did not, every round that chain led went to Spark: most of a cold job's batches)."""
    query = "SELECT id, v * 10 AS w FROM input WHERE v <> 3"
    first, second = spark_chains(query, "fellow subtasks", config={
        "execution.spark.arrow-projections": True, "execution.spark.local-batch-rows": 0})
    big = batch(0, 20_000)
    try:
        assert not second.runs_locally(big.schema, big.num_rows)  # nothing tried yet: Spark's
        expected = run(first, [big])[0]
        assert first.arrow.translation is not None
        assert second.runs_locally(big.schema, big.num_rows)
        assert run(second, [big])[0].equals(expected) and second.arrow.batches == 1
    finally:
        first.close()
        second.close()
