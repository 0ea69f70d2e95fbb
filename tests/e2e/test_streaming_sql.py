"""Spark SQL over a stream on a real cluster: every query's final table equals the same query run
by Spark as one batch job over all the rows (an oracle no streamlab code computes).

The rows are random (seeded, printed), and so are the batch sizes and the parallelism; each
query is a collect sink of its own over one source, so one job answers them all.
"""
from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from kernel_runtime import StreamEnvironment
from kernel_runtime.api.schema import SAMPLE_ROWS

QUERIES = {
    "count": "SELECT k, count(*) AS n FROM input GROUP BY k",
    "each aggregate": "SELECT k, count(v) AS c, sum(v) AS s, min(v) AS lo, max(v) AS hi, avg(x) AS mean "
                      "FROM input GROUP BY k",
    "filtered, reordered": "SELECT sum(v) AS total, k FROM input WHERE x > 0.25 GROUP BY k",
    "by an expression": "SELECT k % 3 AS bucket, round(avg(x), 6) AS a, sum(v) / count(*) AS per_row "
                        "FROM (SELECT k, v, x FROM input WHERE v % 5 <> 0) t GROUP BY k % 3",
    "two keys": "SELECT k, tag, max(x) AS top FROM input GROUP BY k, tag",
    "unselected key": "SELECT count(*) AS n, min(v) AS lo FROM input GROUP BY tag",
    "global": "SELECT count(*) AS n, sum(v) AS s, max(x) AS top FROM input",
    "distinct": "SELECT DISTINCT tag, k % 2 AS parity FROM input",
}


def rows(seed: int):
    def make(seq):
        rng = np.random.default_rng(seed * 1_000_003 + int(seq[0]) if len(seq) else seed)
        n = len(seq)
        return pd.DataFrame({"k": rng.integers(0, 7, n), "v": rng.integers(-50, 1000, n),
                             "x": rng.random(n), "tag": rng.choice(["a", "b", "c"], n), "seq": seq})
    return make


def oracle(spark, make, count: int, batch: int, query: str) -> pd.DataFrame:
    """The query over every row at once, the rows made batch by batch as the source makes them."""
    frames = [make(np.arange(start, min(start + batch, count), dtype=np.int64)) for start in range(0, count, batch)]
    spark.createDataFrame(pd.concat(frames, ignore_index=True)).createOrReplaceTempView("input")
    return spark.sql(query).toPandas()


def same_table(got: pd.DataFrame, expected: pd.DataFrame, what: str) -> None:
    assert list(got.columns) == list(expected.columns), (what, list(got.columns), list(expected.columns))
    order = list(expected.columns)
    got = got.sort_values(order).reset_index(drop=True)
    expected = expected.sort_values(order).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False, rtol=1e-9, obj=what)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [1, 2])
def test_each_query_equals_spark_over_all_rows_at_once(cluster, client, spark, seed):
    rng = random.Random(seed)
    count, batch, parallelism = rng.randint(3_000, 9_000), rng.choice([97, 500, 2_000]), rng.choice([1, 2])
    print(f"seed {seed}: {count} rows, batches of {batch}, parallelism {parallelism}")
    # the source's rows are a function of their sequence numbers, batch by batch: the client's
    # sample is made as one batch of SAMPLE_ROWS, which only needs the same columns
    assert SAMPLE_ROWS < batch
    make = rows(seed)
    env = StreamEnvironment(parallelism=parallelism, cluster=cluster.cluster_dir)
    source = env.from_generator(make, count=count, batch_size=batch)
    for name, query in QUERIES.items():
        source.sql(query, name=name).collect(name)
    result = env.execute_async(f"streaming SQL, seed {seed}", client=client).wait(240)
    for name, query in QUERIES.items():
        same_table(result.to_pandas(name), oracle(spark, make, count, batch, query), f"{name}: {query}")


def test_a_group_by_counts_across_batches_as_spark_and_flink_do(cluster, client):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(lambda s: pd.DataFrame({"k": s % 3, "v": s}), count=3000, batch_size=1000)
        .sql("SELECT k, count(*) AS n FROM input GROUP BY k").collect())
    table = env.execute_async("the six-row example", client=client).wait(180).to_pandas()
    assert table.sort_values("k").to_dict("list") == {"k": [0, 1, 2], "n": [1000, 1000, 1000]}


def test_a_per_batch_query_keeps_its_meaning_when_asked(cluster, client):
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    (env.from_generator(lambda s: pd.DataFrame({"k": s % 3, "v": s}), count=3000, batch_size=1000)
        .sql("SELECT k, count(*) AS n FROM input GROUP BY k", per_batch=True).collect())
    table = env.execute_async("per batch", client=client).wait(180).to_pandas()
    # a count per key in each Spark batch: the first batch of 1,000 runs alone (the later ones may
    # go together while Spark is busy), so some key has more than one row, none the whole 1,000
    assert table.groupby("k")["n"].sum().to_dict() == {0: 1000, 1: 1000, 2: 1000}
    assert len(table) > 3 and table["n"].max() < 1000
