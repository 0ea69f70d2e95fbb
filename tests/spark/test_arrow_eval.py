"""A per-batch query's projections and filters by Arrow (cluster.spark.arrow_eval) answer as Spark
does: each query's Arrow program, run over a random batch with nulls, equals Spark's own answer
to the query over that batch (the suite's SparkSession, ANSI mode as Spark 4's default), types
included once cast to Spark's; what it cannot translate it says, and Spark runs."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cluster.spark.arrow_eval import ArrowPath, Untranslatable, compile_plan, same_rows

TRANSLATED = [
    "SELECT auction, price FROM input WHERE MOD(auction, 123) = 0",
    "SELECT auction, 0.908 * price AS price, t FROM input WHERE s IN ('a', 'x') AND d > 0.5",
    "SELECT auction % 7 AS m, -auction AS neg, price * 2 + 1 AS p2, d / 2.0 AS half, auction IS NULL AS n, "
    "s IN ('a', 'b') AS i, i32 - 3 AS small FROM input",
    "SELECT * FROM input WHERE NOT (auction > 10 OR s = 'a')",
    "SELECT CAST(auction AS double) AS x, CAST(price AS int) AS y FROM (SELECT * FROM input WHERE price < 5000) t "
    "WHERE auction IS NOT NULL",
    "SELECT s, d FROM input WHERE d <= 0 OR s IS NULL",
    "SELECT auction, price + 1 AS next FROM input WHERE price >= 0",  # every row kept: the filter is skipped
    "SELECT price - auction AS gap, price >= 500000 AS big, TRUE AS yes, NULL AS nothing FROM input",
    # Spark's NaN: equal to itself, above every number
    "SELECT d, d = d AS same, d > 1.0 AS above, d <= -1.0 AS below, d < d + 1.0 AS rising, d >= d * 2.0 AS halved "
    "FROM input WHERE d >= 0.0 OR d <> d OR d IS NULL",
]
UNTRANSLATED = {
    "SELECT upper(s) AS u FROM input": "Upper",
    "SELECT s, count(*) AS n FROM input GROUP BY s": "Aggregate",
    "SELECT * FROM input ORDER BY price": "Sort",
    "SELECT t + INTERVAL 1 SECOND AS later FROM input": "TimestampAddInterval",
    "SELECT CAST(0.908 * price AS double) AS euros FROM input": "a cast",
    "SELECT 1 AS one": "not the batch",
    "SELECT auction, auction FROM input": "two columns named auction",
    "SELECT * FROM input WHERE array(auction) = array(1)": "nested type",
}


@pytest.fixture(scope="module")
def batch() -> pa.Table:
    rng = np.random.default_rng(39)
    n = 2_000
    frame = pd.DataFrame({"auction": pd.array(rng.integers(-500, 500, n), dtype="Int64"),
                          "price": rng.integers(0, 10**6, n), "s": rng.choice(np.array(["a", "b", "x", None]), n),
                          "d": rng.normal(size=n), "i32": rng.integers(-100, 100, n).astype(np.int32),
                          "t": pd.to_datetime(1_767_225_600_000 + rng.integers(0, 10**6, n), unit="ms")})
    frame.loc[::17, "auction"] = pd.NA
    table = pa.Table.from_pandas(frame, preserve_index=False)
    # NaNs and nulls apart (pandas would make both one): Spark's NaN is not IEEE's
    d = pc.if_else(pa.array(np.arange(n) % 13 == 0), pa.scalar(np.nan, pa.float64()), table["d"])
    return table.set_column(3, "d", pc.if_else(pa.array(np.arange(n) % 29 == 5), pa.scalar(None, pa.float64()), d))


def spark_answer(spark, batch: pa.Table, query: str):
    spark.createDataFrame(batch).createOrReplaceTempView("input")  # the Arrow table as it is: NaN and null apart
    frame = spark.sql(query)
    return frame._jdf.queryExecution().analyzed().toJSON(), frame.toArrow()


@pytest.mark.parametrize("eager", [False, True], ids=["acero", "eager"])
@pytest.mark.parametrize("query", TRANSLATED)
def test_arrow_answers_as_spark(spark, batch, query, eager):
    """By an Acero plan (a large batch's way) and eagerly over the columns (a small one's)."""
    plan, expected = spark_answer(spark, batch, query)
    got = compile_plan(plan, batch.column_names).run(batch, eager=eager)
    assert expected.num_rows > 0
    got = got.cast(expected.schema)
    assert got.schema == expected.schema and same_rows(got, expected), query
    # and as pandas sees them, NaN for NaN (an oracle that is not the module's own comparison)
    pd.testing.assert_frame_equal(got.to_pandas(), expected.to_pandas(), check_exact=True)


@pytest.mark.parametrize("query, says", UNTRANSLATED.items())
def test_what_arrow_cannot_do_is_left_to_spark(spark, batch, query, says):
    plan, _ = spark_answer(spark, batch, query)
    with pytest.raises(Untranslatable, match=says):
        compile_plan(plan, batch.column_names)


def test_the_path_is_taken_only_after_an_equal_answer_and_hands_back_what_arrow_fails_on(spark, batch):
    query = "SELECT auction, price * 3 AS triple FROM input WHERE auction > 0"
    plan, expected = spark_answer(spark, batch, query)
    path = ArrowPath(True, "test", lambda schema: ("differs", query))
    path.trial(lambda: plan, batch, expected.slice(0, 0))  # no row: proves nothing, tried again later
    assert not path.tried
    wrong = expected.set_column(1, "triple", pa.array(np.zeros(expected.num_rows, dtype=np.int64)))
    path.trial(lambda: plan, batch, wrong)
    assert path.tried and path.translation is None and path.run(batch) is None
    path = ArrowPath(True, "test", lambda schema: ("equal", query))
    path.trial(lambda: plan, batch, expected)
    assert same_rows(path.run(batch), expected)
    # an overflow: Spark (ANSI mode) fails or answers it, not Arrow
    huge = batch.set_column(1, "price", pa.array(np.full(batch.num_rows, 2**62, dtype=np.int64)))
    assert path.run(huge) is None and path.handed_back == 1
    assert path.run(huge.slice(0, 5)) is None and path.handed_back == 2  # eagerly too
    # a batch of another schema is Spark's; a later chain of the query takes the translation untried
    assert path.run(batch.drop_columns(["s"])) is None
    later = ArrowPath(True, "test", lambda schema: ("equal", query))
    assert same_rows(later.run(batch), expected) and later.batches == 1
