"""Spark operators on a real 2-TaskManager cluster, compared with the same query as a Spark batch job."""
from __future__ import annotations

import os
import re
import time

import pandas as pd
import pytest
from pyspark.sql import functions as F

from kernel_runtime import JobExecutionError, StreamEnvironment

N = 30_000
CITIES = pd.DataFrame({"city_id": range(7), "city": ["Oslo", "Lima", "Pune", "Kyiv", "Quito", "Turin", "Accra"]})


def orders(seq):
    return pd.DataFrame({"order_id": seq, "city_id": (seq * 13) % 7, "amount": (seq % 97).astype("float64"),
                         "status": pd.Series(seq % 4).map({0: "new", 1: "paid", 2: "paid", 3: "void"})})


def enrich(df):
    # a join with a static DataFrame, built on the TaskManager's own session
    cities = df.sparkSession.createDataFrame(CITIES)
    return df.join(cities, "city_id").withColumn("big", F.col("amount") >= 50)


def all_orders(spark):
    import numpy as np
    return spark.createDataFrame(orders(np.arange(N, dtype="int64")))


def test_spark_sql_key_by_count_equals_a_spark_batch_job(cluster, client, spark):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(orders, count=N, batch_size=3_000)
        .sql("SELECT order_id, city_id, amount * 1.1 AS amount FROM input WHERE status = 'paid'")
        .spark(enrich, name="enrich")
        .key_by("city", "big")
        .count()
        .collect())
    table = env.execute_async("spark keyed count", client=client).wait(180).to_pandas()
    streamed = table.sort_values(["city", "big"]).reset_index(drop=True)
    batch = all_orders(spark).createOrReplaceTempView("input")
    batch = enrich(spark.sql("SELECT order_id, city_id, amount * 1.1 AS amount FROM input WHERE status = 'paid'"))
    expected = (batch.groupBy("city", "big").count().toPandas()
                .sort_values(["city", "big"]).reset_index(drop=True))
    pd.testing.assert_frame_equal(streamed, expected, check_dtype=False)


def test_stateless_spark_rows_equal_the_batch_job_row_for_row(cluster, client, spark):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(orders, count=N, batch_size=4_000)
        .spark(enrich, name="enrich")
        .sql("SELECT order_id, city, upper(status) AS status FROM input WHERE big AND status <> 'void'")
        .rebalance()
        .collect())
    streamed = env.execute_async("spark rows", client=client).wait(180).to_pandas()
    all_orders(spark).createOrReplaceTempView("orders")
    enrich(spark.table("orders")).createOrReplaceTempView("input")
    expected = spark.sql("SELECT order_id, city, upper(status) AS status FROM input "
                         "WHERE big AND status <> 'void'").toPandas()
    key = ["order_id"]
    pd.testing.assert_frame_equal(streamed.sort_values(key).reset_index(drop=True),
                                  expected.sort_values(key).reset_index(drop=True), check_dtype=False)


def test_union_then_sql_equals_the_batch_job(cluster, client, spark):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    left = env.from_generator(lambda s: pd.DataFrame({"k": s % 10, "v": s}), count=5_000, name="left")
    right = env.from_generator(lambda s: pd.DataFrame({"k": s % 3, "v": -s}), count=3_000, name="right",
                               parallelism=1)
    (left.union(right).rebalance()
        .sql("SELECT k, v FROM input WHERE v % 2 = 0")
        .key_by("k").count().collect())
    table = env.execute_async("union sql", client=client).wait(180).to_pandas()
    streamed = table.sort_values("k").reset_index(drop=True)
    import numpy as np
    both = pd.concat([pd.DataFrame({"k": np.arange(5_000) % 10, "v": np.arange(5_000)}),
                      pd.DataFrame({"k": np.arange(3_000) % 3, "v": -np.arange(3_000)})])
    spark.createDataFrame(both).createOrReplaceTempView("input")
    expected = (spark.sql("SELECT k, count(*) AS count FROM input WHERE v % 2 = 0 GROUP BY k")
                .toPandas().sort_values("k").reset_index(drop=True))
    pd.testing.assert_frame_equal(streamed, expected, check_dtype=False)


def test_a_chain_of_three_spark_operators_is_one_spark_job_per_batch(cluster, client):
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    (env.from_generator(orders, count=12_000, batch_size=2_000)
        .sql("SELECT order_id, city_id, amount FROM input WHERE amount > 10")
        .spark(lambda df: df.withColumn("double", F.col("amount") * 2), name="double")
        .sql("SELECT city_id, count(*) AS n, sum(double) AS total FROM input GROUP BY city_id", per_batch=True)
        .collect())
    handle = env.execute_async("three spark steps", client=client)
    out = handle.wait(180).to_pandas()
    assert out["n"].sum() == sum(1 for i in range(12_000) if i % 97 > 10)
    (chain,) = [s for s in client.job_details(handle.job_id)["subtasks"]]
    assert chain["vertex"] == "Source: generator -> sql -> double -> sql -> collect"
    figures = chain["metrics"]
    # Spark's own status tracker, by the task's job group: one job per batch, not three
    assert figures["spark-jobs"] == figures["spark-batches"]
    assert figures["spark-rows"] == 12_000
    # the source's six batches of 2,000 did not make six jobs: what came while Spark was busy
    # with the first went in together (a job takes 50 ms or more here; the six batches are read in a few)
    assert 1 <= figures["spark-batches"] < 6


def test_schema_error_fails_before_the_first_batch_naming_the_operator(cluster, client):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(orders, count=1_000_000, rate=10)
        .sql("SELECT order_id, amount FROM input", name="project")
        .sql("SELECT order_id, amout * 2 AS twice FROM input", name="typo")
        .collect())
    handle = env.execute_async("schema error", client=client)
    with pytest.raises(JobExecutionError) as info:
        handle.wait(120)
    text = str(info.value)  # one line: Spark's first, the operator and its line
    assert text.startswith("AnalysisException: [UNRESOLVED_COLUMN.WITH_SUGGESTION]") and "`amout`" in text
    assert re.search(r"Did you mean .*`amount`.*, in operator 'typo' \(test_spark.py:\d+\)$", text), text
    assert "File " not in info.value.traceback  # no frame of PySpark, Py4J or streamlab: only Spark's message
    # the plan was analysed at deployment: no batch was read
    assert all(s["metrics"].get("records-in", 0) == 0 for s in client.job_details(handle.job_id)["subtasks"])


def test_a_spark_function_that_returns_something_else_is_named(cluster, client):
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    env.from_generator(count=10).spark(lambda df: df.toPandas(), name="to pandas").collect()
    with pytest.raises(JobExecutionError) as info:
        env.execute_async("bad spark fn", client=client).wait(120)
    # str() is the one line (pytest's match= would also read the notes below it)
    assert re.fullmatch(r"TypeError: the function must return a Spark DataFrame, got DataFrame, "
                        r"in operator 'to pandas' \(test_spark.py:\d+\)", str(info.value)), str(info.value)


def test_sql_needs_the_input_view(cluster):
    from kernel_runtime import GraphValidationError
    env = StreamEnvironment(cluster=cluster.cluster_dir)
    with pytest.raises(GraphValidationError, match=r"operator 'sql' \(test_spark.py:\d+\).*view 'input'"):
        env.from_generator(count=1).sql("SELECT 1")


@pytest.mark.slow
def test_a_job_deployed_before_spark_is_ready_waits_and_says_so(tmp_path):
    from kernel_runtime import JobClient
    from tests.conftest import start_cluster
    local = start_cluster(tmp_path / "fresh", taskmanagers=1, slots=1)  # Spark starts now, in the background
    client = JobClient(local.info)
    try:
        env = StreamEnvironment(parallelism=1, cluster=local.cluster_dir)
        env.from_generator(orders, count=1_000).sql("SELECT order_id FROM input WHERE amount > 50").collect()
        handle = env.execute_async("early", client=client)
        reasons = set()
        while handle.status not in ("FINISHED", "FAILED"):
            reasons.add(handle.job_status().reason)
            time.sleep(0.05)
        assert any(r and re.match(r"starting Spark \(\d+ s(; about \d+ s here)?\) \(TaskManager tm-", r) for r in reasons), reasons
        assert len(handle.wait(5).to_pandas()) == sum(1 for i in range(1_000) if i % 97 > 50)
    finally:
        client.close()
        local.stop()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_taskmanagers_start_spark_at_their_start_one_jvm_after_the_other(tmp_path):
    """... and a first job's tasks go to the TaskManager whose JVM starts first (slot_manager.SPARK_ORDER)."""
    import fcntl

    from kernel_runtime import JobClient
    from tests.conftest import rest, start_cluster, wait_for
    # one JVM start at a time per two cores: on a machine of more than 3, this process holds the
    # other start slots, so the two TaskManagers take turns there too (cluster/spark/chain.py)
    (tmp_path / "fresh").mkdir()
    held = [open(tmp_path / "fresh" / f"spark-start-{i}.lock", "a") for i in range(1, max(1, (os.cpu_count() or 1) // 2))]
    for f in held:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    local = start_cluster(tmp_path / "fresh", taskmanagers=2, slots=1)  # the default: eager
    try:
        def phases() -> dict[str, str]:
            return {tm["spark"]: tm["id"] for tm in rest(local, "/taskmanagers")[1]["taskmanagers"]}
        starting = wait_for(lambda: set(phases()) == {"starting", "queued"} and phases()["starting"], 120,
                            "one TaskManager's JVM starting, the other's queued")
        env = StreamEnvironment(parallelism=1, cluster=local.cluster_dir)
        (env.from_generator(lambda seq: pd.DataFrame({"v": seq}), count=6, batch_size=3)
            .sql("SELECT v + 1 AS w FROM input").collect())
        client = JobClient(local.info)
        try:
            handle = env.execute_async("first job", client=client)
            assert sorted(handle.wait(360).to_pandas().w) == [1, 2, 3, 4, 5, 6]
            (task,) = client.job_details(handle.job_id)["subtasks"]
        finally:
            client.close()
        assert task["taskmanager_id"] == starting  # one slot each: the other was free too

        logs = [local.cluster_dir / "log" / f"taskmanager-{i}.log" for i in range(2)]
        first = wait_for(lambda: [p for p in logs if "SparkSession ready in" in p.read_text()], 360,
                         "a SparkSession ready, no job submitted")[0]
        second = next(p for p in logs if p != first)
        wait_for(lambda: "starting the SparkSession" in second.read_text(), 30, "the other TaskManager's Spark start")

        def at(path, message):
            line = next(line for line in path.read_text().splitlines() if message in line)
            return line[:23]  # the log line's timestamp, which sorts as text
        assert "another TaskManager's JVM is starting" in second.read_text()
        assert at(second, "starting the SparkSession") >= at(first, "SparkSession ready in")
    finally:
        local.stop()
        for f in held:
            f.close()


def test_fused_sql_subtasks_are_exactly_once_through_a_restart(cluster, client, tmp_path):
    """Both subtasks of the .sql step in one TaskManager run fused Spark jobs
    (cluster/spark/fusion.py) while checkpoints cut the stream every 200 ms; an operator
    after it fails once past the middle, the job restarts from the last checkpoint, and the
    transactional sink's committed output is the pandas result exactly: each subtask got its own
    rows back, none twice, none lost."""
    import glob

    import numpy as np
    import pyarrow.parquet as pq

    from kernel_runtime.api import FileSink
    n, out, marker = 40_000, tmp_path / "out", tmp_path / "failed-once"

    def fail_once(df):
        if df["order_id"].max() > n // 2 and not marker.exists():
            marker.touch()
            raise RuntimeError("injected once, past the middle")
        return df
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir, config={
        # every batch a Spark job: at this rate the rounds are small enough to run in the driver
        # without one (spark_local), each subtask's own, not fused; and none by Arrow (arrow_eval)
        "execution.spark.local-batch-rows": 0, "execution.spark.arrow-projections": False,
        "execution.checkpointing.interval": "200 ms", "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": 3, "restart-strategy.fixed-delay.delay": "200 ms"})
    (env.from_generator(orders, count=n, rate=8_000)
        .sql("SELECT order_id, city_id, amount * 2 AS twice FROM input WHERE status <> 'void'")
        .map_batches(fail_once, name="fail once")
        .sink_to(FileSink.parquet(str(out), rows_per_file=2_000)))
    handle = env.execute_async("fused sql, exactly once", client=client)
    handle.wait(180)
    assert marker.exists() and handle.job_status().attempt >= 2
    files = sorted(glob.glob(str(out / "part-*.parquet")))
    got = pd.concat([pq.read_table(f).to_pandas() for f in files]).sort_values("order_id").reset_index(drop=True)
    source = orders(np.arange(n, dtype="int64"))
    expected = source[source.status != "void"].assign(twice=lambda d: d.amount * 2)[["order_id", "city_id", "twice"]]
    pd.testing.assert_frame_equal(got[["order_id", "city_id", "twice"]], expected.reset_index(drop=True),
                                  check_dtype=False)
    chain = [s["metrics"] for s in client.job_details(handle.job_id)["subtasks"] if s["vertex"].startswith("Source")]
    assert len(chain) == 2 and sum(m.get("spark-fused-jobs", 0) for m in chain) >= 1, chain
