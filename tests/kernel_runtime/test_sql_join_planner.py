"""Joins of streams in SQL, planned from Spark's analysed plans (the suite's SparkSession analyses
and does the bounds' arithmetic; no cluster): the sides' steps, the keys, an interval join's
bounds, the result step, and what is refused, where. Results are checked against Spark in
tests/e2e/test_streaming_sql.py."""
from __future__ import annotations

import pyarrow as pa
import pytest

from cluster.graph.job_graph import GraphValidationError
from kernel_runtime import StreamEnvironment
from kernel_runtime.api.sql import analysis
from kernel_runtime.api.sql.join_planner import plan_join
from kernel_runtime.api.sql.planner import UnsupportedQuery
from kernel_runtime.api.time import WatermarkStrategy

BIDS = pa.schema([("auction", pa.int64()), ("price", pa.int64()), ("ts", pa.timestamp("ms"))])
AUCTIONS = pa.schema([("id", pa.int64()), ("seller", pa.int64()), ("category", pa.int64()),
                      ("ts", pa.timestamp("ms", tz="UTC"))])


@pytest.fixture(scope="module")
def joined(spark):
    def of(query: str, rowtimes=None):
        root = analysis.analyse_views(query, {"bids": BIDS, "auctions": AUCTIONS})
        return plan_join(query, root, rowtimes or {"bids": "ts", "auctions": "ts"}, analysis.offset_us,
                         calls=analysis.window_calls(query))
    return of


@pytest.mark.parametrize("condition, bounds", [
    # bounds on right.ts - left.ts (the auction's time less the bid's), in ms
    ("b.ts BETWEEN a.ts - INTERVAL '5' SECOND AND a.ts + INTERVAL 2 MINUTES", (-120_000, 5_000)),
    ("a.ts >= b.ts AND a.ts < b.ts + INTERVAL 1 SECOND", (0, 1_000)),
    ("b.ts - INTERVAL 1 HOUR <= a.ts AND a.ts + INTERVAL '0.5' SECOND <= b.ts", (-3_600_000, -500)),
])
def test_a_bound_on_both_times_is_an_interval_join(joined, condition, bounds):
    how = joined(f"SELECT b.price, a.seller FROM bids b JOIN auctions a ON b.auction = a.id AND {condition}")
    assert how.kind == "interval-join" and how.bounds == bounds
    assert how.rowtimes == ("__sql_l1", "__sql_r1")  # each side's time travels to the join, as a column
    assert how.pre[0].startswith("SELECT b.price AS `__sql_l0`, b.ts AS `__sql_l1`, b.auction AS `__sql_lk0` FROM ")
    # the result step checks the exact condition again (the operator's bounds are whole ms)
    assert how.final.startswith("SELECT `__sql_l0` AS `price`, `__sql_r0` AS `seller` FROM input WHERE ")


def test_without_a_bound_on_both_sides_it_is_a_regular_join_with_each_side_s_conditions_pushed_down(joined):
    how = joined("SELECT a.seller, b.price FROM bids b JOIN auctions a ON b.auction = a.id + 1\n"
                 "WHERE a.category = 10 AND b.price > 5 AND b.ts > a.ts")
    assert how.kind == "regular-join" and how.bounds is None and how.rowtimes == (None, None)
    assert how.pre[0].endswith("WHERE (b.auction) IS NOT NULL AND (b.price > CAST(5 AS BIGINT))")
    assert how.pre[1].endswith("WHERE ((a.id + CAST(1 AS BIGINT))) IS NOT NULL AND (a.category = CAST(10 AS BIGINT))")
    assert "(a.id + CAST(1 AS BIGINT)) AS `__sql_rk0`" in how.pre[1]
    assert how.keys == (["__sql_lk0"], ["__sql_rk0"])
    # the one-sided bound stays a condition (Spark compares the bids' local time as the session's zone's)
    assert how.final.endswith("WHERE (CAST(`__sql_l1` AS TIMESTAMP) > `__sql_r1`)")
    assert "kept for ever" in how.explain()


@pytest.mark.parametrize("condition", [
    "a.ts BETWEEN date_trunc('MINUTE', b.ts) AND b.ts + INTERVAL 2 SECONDS",  # a function of the time
    "a.ts BETWEEN b.ts AND b.ts + INTERVAL 2 MONTHS",                         # a month has no fixed length
])
def test_a_comparison_that_is_no_fixed_distance_is_no_bound(joined, condition):
    how = joined(f"SELECT b.price FROM bids b JOIN auctions a ON b.auction = a.id AND {condition}")
    assert how.kind == "regular-join" and "a.ts" in condition  # it is checked in the result step instead
    with pytest.raises(UnsupportedQuery, match="in ON of an outer join of streams is not planned yet"):
        joined(f"SELECT b.price FROM bids b LEFT JOIN auctions a ON b.auction = a.id AND {condition}")


def test_an_empty_bound_is_refused_and_a_literal_is_left_as_written(joined):
    with pytest.raises(UnsupportedQuery, match="the join's time bound is empty"):
        joined("SELECT b.price FROM bids b JOIN auctions a ON b.auction = a.id "
               "AND a.ts BETWEEN b.ts + INTERVAL 5 SECONDS AND b.ts + INTERVAL 2 SECONDS")
    how = joined("SELECT b.price, 'b.price' AS text FROM bids b JOIN auctions a ON b.auction = a.id")
    assert how.final == "SELECT `__sql_l0` AS `price`, 'b.price' AS `text` FROM input"


def test_an_outer_join_with_a_bound_is_an_outer_interval_join_with_exact_bounds(joined):
    how = joined("SELECT b.price, a.seller FROM bids b LEFT JOIN auctions a ON b.auction = a.id AND a.category = 3 "
                 "AND a.ts > b.ts AND a.ts <= b.ts + INTERVAL 2 SECONDS WHERE a.seller IS NULL OR b.price > 1")
    assert (how.kind, how.how, how.bounds, how.inclusive) == ("interval-join", "left", (0, 2_000), (False, True))
    assert how.pre[1].endswith("AND (a.category = CAST(3 AS BIGINT))")  # the right side's own ON condition
    # WHERE is checked after the join, the bounds are not (they would drop the rows without a match)
    assert how.final.endswith("WHERE ((`__sql_r0` IS NULL) OR (`__sql_l0` > CAST(1 AS BIGINT)))")
    assert "a left outer interval join" in how.explain() and "a left row that met none" in how.explain()
    assert "IS NOT NULL" not in how.pre[0]  # a bid with a null key leaves alone, as Spark's outer join keeps it
    right = joined("SELECT b.ts, a.seller FROM bids b RIGHT JOIN auctions a ON b.auction = a.id "
                   "AND a.ts BETWEEN b.ts AND b.ts + INTERVAL 1 SECOND")
    assert right.rowtime is None  # the left's time is null in a right row that met none


@pytest.mark.parametrize("query, clause, says", [
    ("SELECT b.price FROM bids b\nLEFT JOIN auctions a ON b.auction = a.id", "LEFT JOIN auctions a ON b.auction = a.id",
     "an outer join of streams needs a bound on both sides' event times"),
    ("SELECT b.price FROM bids b\nLEFT JOIN auctions a ON b.auction = a.id AND b.price > 3 AND a.ts BETWEEN b.ts AND "
     "b.ts + INTERVAL 1 SECOND", "LEFT JOIN auctions a ON b.auction = a.id AND b.price > 3 ...",
     "(b.price > CAST(3 AS BIGINT)) in ON of an outer join"),
    ("SELECT b.price FROM bids b\nFULL JOIN auctions a ON b.auction = a.id AND a.ts BETWEEN b.ts AND "
     "b.ts + INTERVAL '0.0005' SECOND", "FULL JOIN auctions a ON b.auction = a.id AND a.ts BETWEEN...",
     "whole milliseconds"),
    ("SELECT b.price FROM bids b\nJOIN auctions a ON b.ts < a.ts", "JOIN auctions a ON b.ts < a.ts",
     "needs an equality of the two sides' columns"),
    ("SELECT b.price FROM bids b JOIN auctions a ON b.auction = a.id\nJOIN bids c ON c.auction = a.id",
     "JOIN bids c ON c.auction = a.id", "more than two streams"),
])
def test_what_is_not_planned_is_refused_naming_the_join_and_its_line(joined, query, clause, says):
    with pytest.raises(UnsupportedQuery) as refused:
        joined(query)
    text = str(refused.value)
    assert text.startswith(f"{clause!r} (line 2 of the query)") and says in text, text


def test_sql_query_joins_two_views_and_explains_the_plan(spark):
    env = StreamEnvironment(parallelism=2, config={"table.exec.state.ttl": "1 h"})
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(1_000).with_timestamp_column("ts")
    env.create_temporary_view("bids", env.from_generator(
        lambda s: {"auction": s % 5, "price": s, "ts": s.astype("datetime64[ms]")}, count=10,
        watermark_strategy=strategy))
    env.create_temporary_view("auctions", env.from_generator(
        lambda s: {"id": s, "seller": s % 3, "ts": s.astype("datetime64[ms]")}, count=10))
    regular = env.sql_query("SELECT a.seller, b.price FROM bids b JOIN auctions a ON b.auction = a.id", name="q")
    assert "kept for 3600000 ms after they arrive (table.exec.state.ttl)" in regular.explain()
    (join,) = [n for n in env._nodes if n.spec.kind == "regular-join"]
    assert join.spec.params["state_ttl_ms"] == 3_600_000 and join.uid.startswith("sql-")
    assert join.spec.name == "q: JOIN auctions a ON b.auction = a.id"
    # the auctions have no event time: a bound on their time cannot make an interval join
    bounded = env.sql_query("SELECT b.price FROM bids b JOIN auctions a ON b.auction = a.id "
                            "AND b.ts BETWEEN a.ts AND a.ts + INTERVAL 1 SECOND")
    assert "a regular join" in bounded.explain()
    with pytest.raises(GraphValidationError, match=r"operator 'sql' \(test_sql_join_planner.py:\d+\): .*needs an "
                                                   r"equality"):
        env.sql_query("SELECT b.price FROM bids b JOIN auctions a ON b.price > a.seller")


def test_an_aggregation_over_a_join_reads_each_side_as_a_struct_of_its_columns(joined):
    how = joined("SELECT a.category, count(*) AS n, max(b.price) AS top FROM bids b JOIN auctions a\n"
                 "ON b.auction = a.id WHERE b.price > a.seller GROUP BY a.category")
    assert how.join.final == ("SELECT named_struct('price', `__sql_l0`) AS `b`, named_struct('seller', `__sql_r0`, "
                              "'category', `__sql_r1`) AS `a` FROM input WHERE (`__sql_l0` > `__sql_r0`)")
    assert how.aggregate.pre.startswith("SELECT a.category AS `category`") and how.aggregate.keys == ["category"]
    assert "the joined rows, then:" in how.explain()
    with pytest.raises(UnsupportedQuery, match="a time window over a join"):
        joined("SELECT count(*) AS n FROM bids b JOIN auctions a ON b.auction = a.id GROUP BY window(b.ts, '1 minute')")


@pytest.mark.parametrize("on, end", [
    ("b.w = c.w", 2),  # a window is keyed by its start and end
    ("b.w.end = c.w.end", 1),
    ("c.w.start = b.w.start", 2),  # windows of one size: equal starts are equal ends
])
def test_a_join_on_the_windows_each_side_computes_is_a_window_join_on_their_ends(joined, on, end):
    how = joined("SELECT b.price, c.ts FROM (SELECT *, window(ts, '10 seconds', '5 seconds') AS w FROM bids) b\n"
                 f"JOIN (SELECT auction, ts, window(ts, '10 seconds', '5 seconds') AS w FROM bids) c "
                 f"ON b.auction = c.auction AND {on}")
    assert how.windowed and how.kind == "interval-join" and how.bounds == (0, 0)
    assert how.rowtimes == (f"__sql_lk{end}", f"__sql_rk{end}")  # each row's window's end
    assert how.keys == ([f"__sql_lk{i}" for i in range(end + 1)], [f"__sql_rk{i}" for i in range(end + 1)])
    # a side is taken as written: Spark's analysed plan has its window() rewritten into arithmetic
    assert how.pre[0].startswith("WITH `bids` AS (SELECT * FROM input) SELECT b.price AS `__sql_l0`, ")
    assert "FROM (SELECT *, window(ts, '10 seconds', '5 seconds') AS w FROM bids) AS `b` WHERE (b.auction) IS NOT " \
        "NULL AND (b.w." in how.pre[0]
    assert how.rowtime is None  # a pair's time is its window's, not a column selected
    assert "a window join, rows of one window meeting" in how.explain()


def test_two_windowed_views_joined_on_their_event_times_are_a_window_join(joined):
    """Nexmark q8's shape: each view's event time is its window's end (window.end AS ...)."""
    how = joined("SELECT b.price FROM bids b JOIN bids c ON b.auction = c.price AND b.ts = c.ts")
    assert how.windowed and how.bounds == (0, 0) and how.rowtimes == ("__sql_lk1", "__sql_rk1")


@pytest.mark.parametrize("query, rowtimes, says", [
    ("SELECT b.price FROM (SELECT *, window(ts, '1 second') AS w FROM bids) b\nJOIN (SELECT *, window(ts, '1 second') "
     "AS w FROM bids) c ON b.auction = c.auction AND b.w = c.w", {"bids": "price"},
     "takes window() on each side's event time (price, whose watermarks the stream carries), not window(ts, ...)"),
    ("SELECT b.price FROM (SELECT *, window(ts, '1 second') AS w FROM bids) b\nJOIN (SELECT *, window(ts, '1 second') "
     "AS w FROM bids) c ON b.auction = c.auction AND b.w = c.w", {"bids": None},
     "a join on time windows needs each side's event time"),
])
def test_windows_that_are_not_on_the_event_time_are_refused(joined, query, rowtimes, says):
    with pytest.raises(UnsupportedQuery) as refused:
        joined(query, rowtimes)
    assert says in str(refused.value) and "(line 2 of the query)" in str(refused.value), str(refused.value)


def test_windows_a_view_computed_per_batch_are_not_joined_as_windows(spark):
    env = StreamEnvironment(parallelism=1)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(1_000).with_timestamp_column("ts")
    bids = env.from_generator(lambda s: {"auction": s % 5, "ts": s.astype("datetime64[ms]")}, count=10,
                              watermark_strategy=strategy)
    env.create_temporary_view("windowed", bids.sql("SELECT *, window(ts, '1 second') AS w FROM input"))
    with pytest.raises(GraphValidationError, match="a join on time windows equates windows that each side computes"):
        env.sql_query("SELECT b.auction FROM windowed b JOIN windowed c ON b.auction = c.auction AND b.w = c.w")


# ---------------------------------------------------------------------- updating sides
MAX_BIDS = pa.schema([("auction", pa.int64()), ("top", pa.int64()), ("n", pa.int64())])


@pytest.fixture(scope="module")
def over_running(spark):
    """Plans over bids (append), auctions and max_bids, whose rows update by ``auction``."""
    def of(query: str, upserts=None):
        root = analysis.analyse_views(query, {"bids": BIDS, "auctions": AUCTIONS, "max_bids": MAX_BIDS})
        return plan_join(query, root, {"bids": "ts", "auctions": "ts", "max_bids": None}, analysis.offset_us,
                         upserts={"max_bids": ["auction"]} if upserts is None else upserts)
    return of


def test_a_join_with_an_updating_side_is_an_upsert_stream_keyed_by_both_sides(over_running):
    how = over_running("SELECT b.price, m.top FROM bids b JOIN max_bids m ON b.auction = m.auction\n"
                       "WHERE m.n > 2 AND b.price * 2 > m.top AND b.price > 10")
    assert how.kind == "regular-join"
    assert how.upserts == (None, ["__sql_rk0"]) and how.row_ids == ("__sql_lrow", None)
    assert how.result_key == ["__sql_key0", "__sql_key1"] and how.deletes
    # the append side's own condition is pushed down; the updating side's is judged on each version
    assert how.pre[0].endswith("AND (b.price > CAST(10 AS BIGINT))") and "m.n" not in how.pre[1].split("WHERE")[1]
    assert how.final.startswith("SELECT `__sql_l0` AS `price`, `__sql_r0` AS `top`, `__sql_lrow` AS `__sql_key0`, "
                                "`__sql_rk0` AS `__sql_key1`, CASE WHEN ")
    assert how.final.endswith("THEN '+U' ELSE '-D' END AS `__sql_op` FROM input") and "WHERE" not in how.final
    assert "an upsert stream keyed by each side's key" in how.explain()


def test_two_updating_sides_key_the_result_by_both_keys_and_delete_nothing(over_running):
    how = over_running("SELECT m.auction, m.top, x.n FROM max_bids m JOIN max_bids x ON m.auction = x.auction",
                       upserts={"max_bids": ["auction"]})
    assert how.upserts == (["__sql_lk0"], ["__sql_rk0"]) and how.row_ids == (None, None)
    assert not how.deletes and "-D" not in how.final


@pytest.mark.parametrize("query, upserts, says", [
    ("SELECT b.price FROM bids b\nJOIN max_bids m ON b.price = m.top", None,
     "ON must equate it with the other side (m.auction = ...)"),
    ("SELECT b.price FROM bids b\nJOIN max_bids m ON b.auction = m.auction", {"max_bids": ["__sql_key0"]},
     "which its query does not select: select the key"),
    ("SELECT b.price FROM bids b\nJOIN auctions a ON b.auction = a.id AND a.ts BETWEEN b.ts AND b.ts + INTERVAL 1 "
     "SECOND", {"auctions": ["id"]}, "a time-bounded or outer join of them is not planned"),
])
def test_an_updating_side_the_join_cannot_follow_is_refused(over_running, query, upserts, says):
    with pytest.raises(UnsupportedQuery) as refused:
        over_running(query, upserts)
    text = str(refused.value)
    assert "(line 2 of the query)" in text and says in text, text


def test_a_view_of_the_latest_row_per_key_joins_on_the_key_its_deduplication_keeps(spark):
    env = StreamEnvironment(parallelism=1)
    rows = env.from_generator(lambda s: {"k": s % 3, "v": s}, count=10)
    env.create_temporary_view("rows", rows)
    env.create_temporary_view("latest", rows.drop_duplicates("k", keep="last").sql("SELECT k, v FROM input"))
    joined = env.sql_query("SELECT r.v, l.v AS latest FROM rows r JOIN latest l ON r.k = l.k")
    assert joined.sql_plan.upserts == (None, ["__sql_rk0"]) and joined.deletes is False
    (join,) = [n for n in env._nodes if n.spec.kind == "regular-join"]
    assert join.spec.params["upsert_keys"] == [None, ["__sql_rk0"]]
    assert join.spec.params["row_ids"] == ["__sql_lrow", None]
