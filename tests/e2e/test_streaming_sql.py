"""Spark SQL over a stream on a real cluster: every query's final table equals the same query run
by Spark as one batch job over all the rows (an oracle no streamlab code computes).

The rows are random (seeded, printed), and so are the batch sizes and the parallelism; each
query is a collect sink of its own over one source, so one job answers them all.
"""
from __future__ import annotations

import random
from typing import Optional

import numpy as np
import pandas as pd
import pytest

from kernel_runtime import StreamEnvironment
from kernel_runtime.api.time import WatermarkStrategy

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
    "distinct aggregates": "SELECT k, count(DISTINCT tag) AS tags, count(DISTINCT v % 40) AS nd, "
                           "sum(DISTINCT v % 40) AS sd, avg(DISTINCT v % 40) AS ad, max(DISTINCT x) AS top "
                           "FROM input GROUP BY k",
    "spread": "SELECT tag, stddev(v) AS sd, var_pop(v) AS vp, variance(x) AS vx, stddev_pop(x) AS sx "
              "FROM input GROUP BY tag",
    "collected": "SELECT k, concat_ws(',', sort_array(collect_set(tag))) AS tags, size(collect_list(v)) AS n, "
                 "array_max(collect_list(v)) AS hi, concat_ws(',', sort_array(collect_list(CAST(v % 3 AS STRING)))) "
                 "AS small FROM input GROUP BY k",
    "having": "SELECT k, count(*) AS n, sum(v) AS s FROM input GROUP BY k HAVING count(*) % 2 = 0",
    "having, unselected": "SELECT count(*) AS n FROM input GROUP BY tag, k HAVING min(x) > 0.001 AND n % 3 <> 1",
    "over a grouped subquery": "SELECT tag, n * 2 AS twice FROM (SELECT tag, count(*) AS n FROM input "
                               "WHERE v > 0 GROUP BY tag) t WHERE n % 3 <> 0",
    "first per key": "SELECT k, v, seq FROM (SELECT *, row_number() OVER (PARTITION BY k ORDER BY x) AS rn "
                     "FROM input) t WHERE rn = 1",
    "latest per key": "SELECT tag, x, rn FROM (SELECT k, tag, x, v, ROW_NUMBER() OVER (PARTITION BY tag, k % 2 "
                      "ORDER BY v DESC, x) AS rn FROM input WHERE x > 0.1) t WHERE rn <= 1",
    "nulls first": "SELECT * FROM (SELECT k, seq, nx, row_number() OVER (PARTITION BY k ORDER BY nx, seq) AS n "
                   "FROM (SELECT k, seq, CASE WHEN v % 7 = 0 THEN NULL ELSE x END AS nx FROM input)) WHERE n = 1",
}


def sizes(seed: int, counts: tuple[int, int], batches: list[int], parallelisms: list[int]) -> tuple[int, int, int]:
    """A random row count, batch size and parallelism for a seed (printed, to replay a failure)."""
    rng = random.Random(seed)
    count, batch, parallelism = rng.randint(*counts), rng.choice(batches), rng.choice(parallelisms)
    print(f"seed {seed}: {count} rows, batches of {batch}, parallelism {parallelism}")
    return count, batch, parallelism


def mix(seq: np.ndarray, salt: int) -> np.ndarray:
    """A random-looking uint64 per sequence number (splitmix64's finaliser): a row depends on its
    number alone, however the source's subtasks and batches split the sequence."""
    with np.errstate(over="ignore"):
        z = seq.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(salt * 0xBF58476D1CE4E5B9 % 2**64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def rows(seed: int):
    def make(seq):
        seq = np.asarray(seq, dtype=np.int64)
        return pd.DataFrame({"k": (mix(seq, seed) % np.uint64(7)).astype(np.int64),
                             "v": (mix(seq, seed + 1) % np.uint64(1050)).astype(np.int64) - 50,
                             "x": (mix(seq, seed + 2) >> np.uint64(11)).astype(np.float64) / 2.0 ** 53,
                             "tag": np.array(["a", "b", "c"])[(mix(seq, seed + 3) % np.uint64(3)).astype(np.int64)],
                             "seq": seq})
    return make


def timed_rows(seed: int):
    """Rows with event time: 100 ms apart, a second's pause every 50 rows (sessions), each up to
    300 ms late against its place (out of order, never past the watermark's 1 s bound)."""
    plain = rows(seed)

    def make(seq):
        frame = plain(seq)
        seq = np.asarray(seq, dtype=np.int64)
        ms = 1_700_000_000_000 + seq * 100 + (seq // 50) * 1_000 - (mix(seq, seed + 4) % np.uint64(300)).astype(np.int64)
        return frame.assign(ts=pd.to_datetime(ms, unit="ms"))
    return make


def oracle(spark, make, count: int, query: str) -> pd.DataFrame:
    """The query over every row at once."""
    spark.createDataFrame(make(np.arange(count, dtype=np.int64))).createOrReplaceTempView("input")
    return spark.sql(query).toPandas()


def naive_utc(frame: pd.DataFrame) -> pd.DataFrame:
    """Spark's Arrow times are UTC; toPandas gives them naive, in UTC here."""
    for column in frame.columns:
        if isinstance(frame[column].dtype, pd.DatetimeTZDtype):
            frame[column] = frame[column].dt.tz_convert("UTC").dt.tz_localize(None)
    return frame


def same_table(got: pd.DataFrame, expected: pd.DataFrame, what: str) -> None:
    assert list(got.columns) == list(expected.columns), (what, list(got.columns), list(expected.columns))
    order = list(expected.columns)
    got = got.sort_values(order).reset_index(drop=True)
    expected = expected.sort_values(order).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False, rtol=1e-9, obj=what)


def each_equals_spark(env: StreamEnvironment, client, job: str, queries: dict[str, str], stream_of, expected_of,
                      least_rows: int = 0):
    """Each query's stream (``stream_of(name, query)``) collected under its name, one job for all;
    each final table equals ``expected_of(query)``, Spark over all rows at once, of more than
    ``least_rows`` rows. The job's result."""
    for name, query in queries.items():
        stream_of(name, query).collect(name)
    result = env.execute_async(job, client=client).wait(240)
    for name, query in queries.items():
        expected = expected_of(query)
        assert len(expected) > least_rows, (name, len(expected))
        same_table(naive_utc(result.to_pandas(name)), expected, f"{name}: {query}")
    return result


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [1, 2])
def test_each_query_equals_spark_over_all_rows_at_once(cluster, client, spark, seed):
    count, batch, parallelism = sizes(seed, (3_000, 9_000), [97, 500, 2_000], [1, 2])
    make = rows(seed)
    env = StreamEnvironment(parallelism=parallelism, cluster=cluster.cluster_dir)
    source = env.from_generator(make, count=count, batch_size=batch)
    each_equals_spark(env, client, f"streaming SQL, seed {seed}", QUERIES,
                      lambda name, query: source.sql(query, name=name), lambda query: oracle(spark, make, count, query))


WINDOWED = {
    "tumbling": "SELECT window.start AS ws, window.end AS we, k, count(*) AS n, sum(v) AS s "
                "FROM input GROUP BY window(ts, '2 seconds'), k",
    "sliding": "SELECT window.start AS ws, max(v) AS top, avg(x) AS mean FROM input WHERE tag <> 'c' "
               "GROUP BY window(ts, '3 seconds', '1 second')",
    "having": "SELECT window.start AS ws, k, count(*) AS n FROM input GROUP BY window(ts, '2 seconds'), k "
              "HAVING count(*) > 2",
    "over windows": "SELECT n, count(*) AS windows FROM (SELECT window.start AS ws, k, count(*) AS n FROM input "
                    "GROUP BY window(ts, '2 seconds'), k) w GROUP BY n",
    "session": "SELECT session_window.start AS s0, session_window.end AS s1, tag, count(*) AS n, min(v) AS lo "
               "FROM input GROUP BY session_window(ts, '700 milliseconds'), tag",
}


@pytest.mark.timeout(300)
def test_each_windowed_query_equals_spark_over_all_rows_at_once(cluster, client, spark):
    count, batch, parallelism = sizes(3, (3_000, 6_000), [97, 500, 2_000], [2])
    make = timed_rows(3)
    env = StreamEnvironment(parallelism=parallelism, cluster=cluster.cluster_dir)
    source = env.from_generator(make, count=count, batch_size=batch, watermark_strategy=WatermarkStrategy
                                .for_bounded_out_of_orderness(1_000).with_timestamp_column("ts"))
    each_equals_spark(env, client, "windowed SQL", WINDOWED, lambda name, query: source.sql(query, name=name),
                      lambda query: oracle(spark, make, count, query))


NULLED = "(SELECT k, v, seq, CASE WHEN v % 3 = 0 THEN NULL ELSE v END AS w FROM input)"
NESTED = {  # an aggregation over another's running rows: each old row taken back (retraction)
    "histogram of running counts": "SELECT n, count(*) AS groups, sum(s) AS total, avg(s) AS mean FROM (SELECT k, tag, "
                                   "count(*) AS n, sum(v) AS s FROM input WHERE v % 4 = 0 GROUP BY k, tag) t GROUP BY n",
    "average of maxima (q4's shape)": "SELECT q.tag, avg(q.top) AS mean_top, count(*) AS c FROM (SELECT k, tag, "
                                      "max(v) AS top FROM input GROUP BY k, tag) q WHERE q.top > 0 GROUP BY q.tag",
    "lowest and highest of totals": "SELECT t.tag, min(t.s) AS low, max(t.s) AS high, max(t.x) AS top_x FROM (SELECT k, "
                                    "tag, sum(v) AS s, max(x) AS x FROM input GROUP BY k, tag) t GROUP BY t.tag",
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [6, 7])
def test_an_aggregation_over_an_aggregation_takes_back_each_old_row(cluster, client, spark, seed):
    count, batch, parallelism = sizes(seed, (2_000, 3_000), [40, 100], [1, 2])
    make = rows(seed)
    env = StreamEnvironment(parallelism=parallelism, cluster=cluster.cluster_dir)
    # at a rate, the batches reach the aggregations one by one: each inner key changes many times
    source = env.from_generator(make, count=count, batch_size=batch, rate=800)
    histogram = source.sql(NESTED["histogram of running counts"], name="changes")
    histogram.changelog().collect("changes")
    result = each_equals_spark(env, client, f"nested aggregations, seed {seed}", NESTED,
                               lambda name, query: source.sql(query, name=name),
                               lambda query: oracle(spark, make, count, query))
    kinds = result.to_pandas("changes")["__sql_op"].value_counts()
    assert kinds.get("-D", 0) > 0 and kinds.get("+U", 0) > 0, kinds  # counts left behind were deleted


ORDERED = {  # first and last in the stream's order: Spark's min_by and max_by of the row's number
    f"SELECT k, first(v) AS f, last(v) AS l, first(w) AS fw, last(w) AS lw, any_value(v) AS a FROM {NULLED} "
    "GROUP BY k":
    f"SELECT k, min_by(v, seq) AS f, max_by(v, seq) AS l, min_by(w, seq) AS fw, max_by(w, seq) AS lw, "
    f"min_by(v, seq) AS a FROM {NULLED} GROUP BY k",
    f"SELECT k, first(w, true) AS fv, last(w, true) AS lv FROM {NULLED} GROUP BY k":
    "SELECT k, min_by(w, CASE WHEN w IS NOT NULL THEN seq END) AS fv, "
    f"max_by(w, CASE WHEN w IS NOT NULL THEN seq END) AS lv FROM {NULLED} GROUP BY k",
}


@pytest.mark.timeout(300)
def test_first_and_last_follow_the_order_rows_arrive_in(cluster, client, spark):
    count, batch, _ = sizes(4, (2_000, 4_000), [97, 500], [1])
    make = rows(4)
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    source = env.from_generator(make, count=count, batch_size=batch)
    each_equals_spark(env, client, "first and last", {f"ordered {i}": q for i, q in enumerate(ORDERED)},
                      lambda name, query: source.sql(query, name=name),
                      lambda query: oracle(spark, make, count, ORDERED[query]))


def test_drop_duplicates_keeps_the_first_or_the_latest_to_arrive(cluster, client):
    count, batch, _ = sizes(5, (2_000, 4_000), [97, 500], [1])
    make = rows(5)
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    source = env.from_generator(make, count=count, batch_size=batch)
    firsts = source.drop_duplicates(["k", "tag"])
    firsts.collect("first")
    firsts.changelog().collect("every first")
    source.drop_duplicates("k", keep="last", parallelism=2).collect("last")
    result = env.execute_async("drop duplicates", client=client).wait(180)
    every = make(np.arange(count, dtype=np.int64))
    for name, expected in [("first", every.drop_duplicates(["k", "tag"])), ("last", every.drop_duplicates("k", keep="last"))]:
        same_table(result.to_pandas(name), expected.reset_index(drop=True), name)
    # keeping the first is an append stream: each key's row came once
    assert len(result.to_pandas("every first")) == len(every.drop_duplicates(["k", "tag"]))


def test_duplicates_by_event_time_are_kept_only_until_the_watermark_passes(cluster, client, spark):
    """SELECT DISTINCT with the stream's event time among its columns, and drop_duplicates by it:
    Spark's dropDuplicates with a watermark (a key's state ends when the watermark passes its time).
    Times in whole seconds repeat; none is behind the 2 s watermark, so each distinct row comes once."""
    timed = timed_rows(6)

    def make(seq):
        frame = timed(seq)
        return frame.assign(ts=frame["ts"].dt.floor("1s"))
    count, batch, _ = sizes(6, (1_500, 2_500), [97, 200], [1])
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    source = env.from_generator(make, count=count, batch_size=batch, rate=1_000, watermark_strategy=WatermarkStrategy
                                .for_bounded_out_of_orderness(2_000).with_timestamp_column("ts"))
    distinct = source.sql("SELECT DISTINCT k, ts FROM input", name="distinct")
    assert "until the watermark passes its ts" in distinct.explain()
    distinct.collect("distinct")
    firsts = source.drop_duplicates(["k", "ts"])
    assert firsts.rowtime == "ts"  # each row as it came: its time still the stream's
    firsts.collect("first")
    result = env.execute_async("duplicates by event time", client=client).wait(180)
    every = make(np.arange(count, dtype=np.int64))
    same_table(naive_utc(result.to_pandas("distinct")), oracle(spark, make, count, "SELECT DISTINCT k, ts FROM input"),
               "distinct")
    same_table(result.to_pandas("first"), every.drop_duplicates(["k", "ts"]).reset_index(drop=True), "first")
    assert len(every.drop_duplicates(["k", "ts"])) < 0.7 * len(every)  # many duplicates


def test_a_group_by_counts_across_batches_as_spark_and_flink_do(cluster, client):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(lambda s: pd.DataFrame({"k": s % 3, "v": s}), count=3000, batch_size=1000)
        .sql("SELECT k, count(*) AS n FROM input GROUP BY k").collect())
    table = env.execute_async("the six-row example", client=client).wait(180).to_pandas()
    assert table.sort_values("k").to_dict("list") == {"k": [0, 1, 2], "n": [1000, 1000, 1000]}


def test_a_per_batch_query_keeps_its_meaning_when_asked(cluster, client):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    # three splits: subtask 0 reads two, subtask 1 one, each through its own Spark step, so however
    # its batches meet, each subtask counts its own rows of every key
    (env.from_generator(lambda s: pd.DataFrame({"k": s % 3, "v": s}), count=3000, batch_size=1000, split_size=1000)
        .sql("SELECT k, count(*) AS n FROM input GROUP BY k", per_batch=True).collect())
    table = env.execute_async("per batch", client=client).wait(180).to_pandas()
    assert table.groupby("k")["n"].sum().to_dict() == {0: 1000, 1: 1000, 2: 1000}
    assert table.groupby("k").size().min() >= 2 and table["n"].max() < 1000


# ---------------------------------------------------------------------- joins of streams
def people(seed: int):
    """A second stream: ids 0..20 and a time 300 ms apart (the orders' span at a third of the rows),
    up to 300 ms out of order."""
    def make(seq):
        seq = np.asarray(seq, dtype=np.int64)
        late = (mix(seq, seed + 5) % np.uint64(300)).astype(np.int64)
        ms = 1_700_000_000_000 + seq * 300 + (seq // 17) * 1_000 - late
        return pd.DataFrame({"pk": (mix(seq, seed + 6) % np.uint64(21)).astype(np.int64),
                             "v": (mix(seq, seed + 7) % np.uint64(1000)).astype(np.int64),
                             "name": np.array(["ann", "bob", None, "cy"], dtype=object)[
                                 (mix(seq, seed + 8) % np.uint64(4)).astype(np.int64)],
                             "seq": seq, "ts": pd.to_datetime(ms, unit="ms")})
    return make


def two_views(env: StreamEnvironment, spark, seed: int, count: int, batch: int, rate: Optional[int] = None):
    """The views orders (``count`` rows) and people (a third as many) of ``env``, with event time;
    returns what registers the same rows as Spark's views of those names, for the oracle (the
    suite's session: a later test's views replace them). ``rate``: the orders' rows per second
    (watermarks come between batches, so rows wait for and leave keyed state as the stream goes)."""
    make_orders, make_people = timed_rows(seed), people(seed)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(1_000).with_timestamp_column("ts")
    env.create_temporary_view("orders", env.from_generator(make_orders, count=count, batch_size=batch, rate=rate,
                                                           watermark_strategy=strategy))
    env.create_temporary_view("people", env.from_generator(make_people, count=count // 3, batch_size=batch // 3,
                                                           rate=rate and rate // 3, watermark_strategy=strategy))

    def in_spark() -> None:
        spark.createDataFrame(make_orders(np.arange(count, dtype=np.int64))).createOrReplaceTempView("orders")
        spark.createDataFrame(make_people(np.arange(count // 3, dtype=np.int64))).createOrReplaceTempView("people")
    return in_spark


JOINS = {  # each over the views orders and people
    "regular": "SELECT o.seq AS o_seq, p.seq AS p_seq, o.v, p.name FROM orders o JOIN people p ON o.k = p.pk "
               "WHERE o.v > 600 AND p.name IS NOT NULL",
    "expression keys, a condition over both": "SELECT o.seq AS o_seq, p.seq AS p_seq, o.v + p.v AS total "
                                             "FROM orders o JOIN people p ON o.k = p.pk % 7 AND o.tag = 'a' "
                                             "AND o.v < p.v - 700",
    "interval": "SELECT o.seq AS o_seq, p.seq AS p_seq, o.ts, p.ts AS p_ts FROM orders o JOIN people p "
                "ON o.k = p.pk AND o.ts BETWEEN p.ts - INTERVAL '1' SECOND AND p.ts + INTERVAL 500 MILLISECONDS",
    "interval, strict and one-sided": "SELECT o.seq AS o_seq, p.seq AS p_seq FROM orders o JOIN people p "
                                      "ON o.k = p.pk WHERE p.ts > o.ts AND p.ts < o.ts + INTERVAL 2 SECONDS "
                                      "AND o.x < 0.5",
    "left outer": "SELECT o.seq AS o_seq, p.seq AS p_seq, p.name FROM orders o LEFT JOIN people p ON o.k = p.pk "
                  "AND p.name = 'bob' AND p.ts > o.ts AND p.ts <= o.ts + INTERVAL 700 MILLISECONDS",
    "full outer": "SELECT o.seq AS o_seq, p.seq AS p_seq FROM orders o FULL JOIN people p ON o.k = p.pk + 1 "
                  "AND o.ts BETWEEN p.ts - INTERVAL 1 SECOND AND p.ts WHERE o.v IS NULL OR o.v < 900",
}


@pytest.mark.timeout(300)
def test_each_join_of_two_streams_equals_spark_over_all_rows_at_once(cluster, client, spark):
    count, batch, parallelism = sizes(4, (2_000, 3_000), [97, 500], [2])
    # in two jobs of three joins: all six in one deployed 34 tasks at once, and a TaskManager busy
    # starting its share on a loaded two-core machine missed the suite's 2 s heartbeat.timeout
    names, joins = list(JOINS), []
    for part in (names[:3], names[3:]):
        env = StreamEnvironment(parallelism=parallelism, cluster=cluster.cluster_dir)
        views = two_views(env, spark, 4, count, batch)
        views()
        each_equals_spark(env, client, f"joins of streams: {part[0]}, ...", {n: JOINS[n] for n in part},
                          lambda name, query: env.sql_query(query, name=name),
                          lambda query: spark.sql(query).toPandas(), least_rows=100)
        joins += [n.spec.kind for n in env._nodes if n.spec.kind.endswith("-join")]
    assert joins == ["regular-join", "regular-join"] + ["interval-join"] * 4


WINDOW_JOINS = {  # each side computes its windows, as Spark's documentation joins on event-time windows
    "tumbling": "SELECT o.seq AS o_seq, p.seq AS p_seq, o.w.start AS ws FROM (SELECT *, window(ts, '2 seconds') AS w "
                "FROM orders) o JOIN (SELECT seq, pk, window(ts, '2 seconds') AS w FROM people) p "
                "ON o.k = p.pk % 7 AND o.w = p.w",
    "sliding, by the windows' end": "SELECT o.seq AS o_seq, p.seq AS p_seq, p.w.end AS we FROM (SELECT *, "
                                    "window(ts, '2 seconds', '500 milliseconds') AS w FROM orders WHERE x < 0.5) o "
                                    "JOIN (SELECT *, window(ts, '2 seconds', '500 milliseconds') AS w FROM people) p "
                                    "ON o.k = p.pk AND o.w.end = p.w.end",
    "left outer, by the windows' start": "SELECT o.seq AS o_seq, p.seq AS p_seq, o.w.start AS ws FROM (SELECT *, "
                                         "window(ts, '1 second') AS w FROM orders) o LEFT JOIN (SELECT *, "
                                         "window(ts, '1 second') AS w FROM people) p ON o.k = p.pk AND "
                                         "o.w.start = p.w.start AND p.name = 'bob'",
}


@pytest.mark.timeout(300)
def test_each_window_join_equals_spark_over_all_rows_at_once(cluster, client, spark):
    """Rows of one key and window meet; each side's rows wait only until the watermark passes
    their window's end (an interval join on the windows' ends, bound 0)."""
    count, batch, parallelism = sizes(8, (1_500, 2_500), [97, 200], [1, 2])
    env = StreamEnvironment(parallelism=parallelism, cluster=cluster.cluster_dir)
    views = two_views(env, spark, 8, count, batch, rate=1_000)
    views()
    each_equals_spark(env, client, "window joins", WINDOW_JOINS, lambda name, query: env.sql_query(query, name=name),
                      lambda query: spark.sql(query).toPandas(), least_rows=100)
    assert [n.spec.params.get("lower") for n in env._nodes if n.spec.kind == "interval-join"] == [0, 0, 0]


def test_a_stream_joined_with_itself_in_sql(cluster, client, spark):
    make = timed_rows(5)
    query = ("SELECT a.seq AS first, b.seq AS second FROM input a JOIN input b ON a.k = b.k AND a.tag = b.tag "
             "AND b.ts >= a.ts AND b.ts < a.ts + INTERVAL 400 MILLISECONDS AND a.seq <> b.seq")
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(make, count=3_000, batch_size=250, watermark_strategy=WatermarkStrategy
                        .for_bounded_out_of_orderness(1_000).with_timestamp_column("ts"))
        .sql(query, name="pairs").collect("pairs"))
    got = env.execute_async("a self join", client=client).wait(240).to_pandas("pairs")
    expected = oracle(spark, make, 3_000, query)
    assert len(expected) > 100
    same_table(got, expected, query)


AGGREGATED_JOINS = {
    "per name": "SELECT p.name, count(*) AS n, sum(o.v) AS s, max(p.v) AS top FROM orders o JOIN people p "
                "ON o.k = p.pk WHERE o.x > 0.3 GROUP BY p.name",
    "global, interval": "SELECT count(*) AS n, avg(o.v + p.v) AS mean FROM orders o JOIN people p ON o.k = p.pk "
                        "AND o.ts BETWEEN p.ts - INTERVAL 2 SECONDS AND p.ts",
}


def test_an_aggregation_over_a_join_equals_spark_over_all_rows_at_once(cluster, client, spark):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    views = two_views(env, spark, 6, 2_400, 300)
    views()
    each_equals_spark(env, client, "aggregations over joins", AGGREGATED_JOINS,
                      lambda name, query: env.sql_query(query, name=name), lambda query: spark.sql(query).toPandas())


RUNNING = {  # views whose rows update earlier rows of their key
    "counts": "SELECT k, count(*) AS n, sum(v) AS s FROM orders GROUP BY k",
    "tops": "SELECT pk, max(v) AS top, count(name) AS named FROM people GROUP BY pk",
}
UPDATING_JOINS = {  # each over orders, people and the running views
    "two running aggregates": "SELECT c.k, c.n, c.s, t.top, t.named FROM counts c JOIN tops t ON c.k = t.pk",
    "each order with its key's count": "SELECT o.seq, o.v, c.n FROM orders o JOIN counts c ON o.k = c.k "
                                       "WHERE o.tag = 'a'",
    "conditions a pair stops passing": "SELECT o.seq, c.k FROM orders o JOIN counts c ON o.k = c.k "
                                       "WHERE c.n % 3 <> 1 AND o.v * 3 < c.s / c.n",
}


def test_a_join_of_running_aggregates_replaces_its_pairs_as_they_update(cluster, client, spark):
    """Each view's new row for its key replaces the old one in the join, and its pairs the old
    pairs: the final table is Spark's join of the views' final rows."""
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    views = two_views(env, spark, 9, 2_100, 97, rate=500)  # the views update while orders come
    views()
    for view, query in RUNNING.items():
        env.create_temporary_view(view, env.sql_query(query, name=view))
        spark.sql(query).createOrReplaceTempView(view)
    each_equals_spark(env, client, "joins of running aggregates", UPDATING_JOINS,
                      lambda name, query: env.sql_query(query, name=name), lambda query: spark.sql(query).toPandas())
