"""The streaming SQL planner over Spark's analysed plans (the suite's SparkSession analyses; no
cluster): which queries stay per batch, how an aggregation splits, and what is refused, where."""
from __future__ import annotations

import re
import threading

import pyarrow as pa
import pytest

from cluster.graph.job_graph import GraphValidationError
from kernel_runtime import StreamEnvironment
from kernel_runtime.api.sql import analysis
from kernel_runtime.api.sql.dedup_planner import Deduplicate, find_window, plan_deduplicate
from kernel_runtime.api.sql.nested_planner import inner_aggregation, plan_nested
from kernel_runtime.api.sql.result_query import aggregation_below, plan_over_aggregate
from kernel_runtime.api.sql.planner import ContinuousAggregate, PerBatch, UnsupportedQuery, per_batch_query, plan
from kernel_runtime.api.sql.screen import AGGREGATE_FUNCTIONS, may_span_batches
from kernel_runtime.api.time import WatermarkStrategy

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("name", pa.string()), ("ts", pa.timestamp("ms"))])


@pytest.fixture(scope="module")
def planned(spark):
    def of(query: str):
        root = analysis.analyse(query, SCHEMA)
        if find_window(root) is not None:
            return plan_deduplicate(query, root)
        if inner_aggregation(root) is not None:
            return plan_nested(query, root, inner_aggregation(root), analysis.window_calls(query), None)
        return plan(query, root, analysis.window_calls(query))
    return of


@pytest.mark.parametrize("query", [
    "SELECT k, v * 2 AS w FROM input WHERE v > 0",
    "SELECT k, upper(name) AS name, explode(array(v, v + 1)) AS e FROM input",
    "SELECT * FROM (SELECT k, v FROM input WHERE v > 0) t WHERE k < 3",
    "SELECT k FROM input UNION ALL SELECT v FROM input",
])
def test_a_query_that_projects_and_filters_runs_per_batch(planned, query):
    assert planned(query) == PerBatch()


def test_a_group_by_splits_into_a_spark_step_keyed_state_and_a_result_step(planned):
    how = planned("SELECT upper(name) AS who, avg(v) / 2 AS half, count(*) AS n FROM input\n"
                  "WHERE v > 0 GROUP BY upper(name)")
    assert isinstance(how, ContinuousAggregate)
    assert how.keys == ["__sql_key0"] and how.upsert_key == ["who"]
    assert sorted(func for _, func in how.aggregations.values()) == ["count", "mean"]
    assert "WHERE (input.v > CAST(0 AS BIGINT))" in how.pre and "upper(input.name) AS `__sql_key0`" in how.pre
    assert how.final is not None and how.final.startswith("SELECT `__sql_key0` AS `who`")


def test_keys_then_aggregates_need_no_result_step(planned):
    how = planned("SELECT k, name, count(*) AS n, max(v) AS top FROM input GROUP BY k, name")
    assert isinstance(how, ContinuousAggregate) and how.final is None
    assert how.keys == ["k", "name"] and how.upsert_key == ["k", "name"]
    assert how.aggregations == {"n": ["__sql_arg0", "count"], "top": ["__sql_arg1", "max"]}


def test_a_key_the_query_does_not_select_keys_the_result_hidden(planned):
    how = planned("SELECT count(*) AS n FROM input GROUP BY k")
    assert how.upsert_key == ["__sql_key0"] and "`k` AS `__sql_key0`" in how.final


@pytest.mark.parametrize("query, clause, line, says", [
    ("SELECT k, count(*) AS n\nFROM input\nGROUP BY k\nORDER BY n DESC", "ORDER BY n DESC", 4, "sort"),
    ("SELECT k, v FROM input\nLIMIT 10", "LIMIT 10", 2, ".head(n)"),
    ("SELECT k, sum(v) OVER (PARTITION BY k) AS s FROM input", "", 1, "OVER"),
    ("SELECT a.k, count(*) AS n FROM input a\n  JOIN input b ON a.k = b.v GROUP BY a.k", "JOIN input b ON a.k = b.v", 2,
     "a subquery over a join is not planned yet"),
    ("SELECT k, percentile(v, 0.5) AS p FROM input\nGROUP BY k", "GROUP BY k", 2, "not merged across batches"),
    ("SELECT k, count(DISTINCT v, k) AS n FROM input GROUP BY k", "GROUP BY k", 1, "several columns"),
    ("SELECT k, sum(v) FILTER (WHERE v > 0) AS s FROM input GROUP BY k", "GROUP BY k", 1, "FILTER"),
    ("SELECT k, first(v) AS f, first(v, true) AS g FROM input GROUP BY k", "GROUP BY k", 1, "first(v, true)"),
    ("SELECT * FROM (SELECT k, rank() OVER (PARTITION BY k ORDER BY v) AS r FROM input) t\nWHERE r = 1", "", 1,
     "ROW_NUMBER(), one row per key"),
    ("SELECT * FROM (SELECT k, row_number() OVER (PARTITION BY k ORDER BY v) AS r FROM input) t\nWHERE r <= 3",
     "", 1, "(t.r <= 3): only the first row per key"),
    ("SELECT * FROM (SELECT k, row_number() OVER (ORDER BY v) AS r FROM input) t WHERE r = 1", "", 1,
     "without PARTITION BY"),
    ("SELECT * FROM (SELECT k, row_number() OVER (PARTITION BY k ORDER BY v) AS r FROM input) t\nWHERE r = 1 AND k > 2",
     "", 1, "AND (t.k > CAST(2 AS BIGINT))): only the first row per key"),
    ("SELECT name, count(DISTINCT n) AS c FROM (SELECT k, name, count(*) AS n FROM input GROUP BY k, name) t\n"
     "GROUP BY name", "GROUP BY name", 2, "count(DISTINCT t.n) over an aggregation's running rows is not planned yet"),
    ("SELECT k, count(DISTINCT v) AS n FROM input GROUP BY window(ts, '1 second'), k", "GROUP BY window(ts, '1 second'), k",
     1, "not yet per time window"),
])
def test_what_is_not_planned_is_refused_naming_the_clause_and_its_line(planned, query, clause, line, says):
    with pytest.raises(UnsupportedQuery) as refused:
        planned(query)
    text = str(refused.value)
    assert f"(line {line} of the query)" in text and says in text, text
    assert not clause or text.startswith(repr(clause)), text


def test_having_keeps_each_running_row_and_marks_whether_it_passes(spark):
    query = "SELECT count(*) AS n FROM input GROUP BY k HAVING sum(v) > 10"
    root = analysis.analyse(query, SCHEMA)
    how = plan_over_aggregate(query, root, aggregation_below(root), [])
    assert how.deletes and how.upsert_key == ["__sql_key_r0"]
    assert "CASE WHEN __sql_keep THEN '+U' ELSE '-D' END AS `__sql_op`" in how.final and " WHERE " not in how.final
    assert "a key deleted when its row leaves the result" in how.explain()
    shown = "SELECT k, count(*) AS n FROM input GROUP BY k HAVING sum(v) > 10"
    root = analysis.analyse(shown, SCHEMA)
    assert plan_over_aggregate(shown, root, aggregation_below(root), []).upsert_key == ["k"]


def test_a_stream_whose_keys_are_deleted_goes_to_a_collect_sink_only(spark, tmp_path):
    from kernel_runtime.api import DiscardingSink, FileSink
    import pandas as pd
    env = StreamEnvironment(parallelism=1)
    rows = env.from_generator(lambda s: pd.DataFrame({"k": s % 3, "v": s}), count=10)
    having = rows.sql("SELECT k, count(*) AS n FROM input GROUP BY k HAVING count(*) > 2")
    with pytest.raises(GraphValidationError, match="deleted when their row leaves its query's result \\(a HAVING or WHERE"):
        having.sink_to(FileSink.parquet(str(tmp_path / "out")))
    having.sink_to(DiscardingSink())  # drops every row: deletes too (a benchmark's sink)
    with pytest.raises(GraphValidationError, match="put both in one query"):
        having.sql("SELECT k FROM input WHERE n > 3")
    having.changelog().collect("changes")
    having.collect()


def test_a_filter_over_a_window_drops_its_final_rows(spark):
    query = "SELECT k, count(*) AS n FROM input GROUP BY window(ts, '1 second'), k HAVING count(*) > 2"
    root = analysis.analyse(query, SCHEMA)
    how = plan_over_aggregate(query, root, aggregation_below(root), analysis.window_calls(query))
    assert not how.deletes and "WHERE (n > CAST(2 AS BIGINT))" in how.final and "__sql_op" not in how.final


def test_row_number_one_per_key_is_a_deduplication_keyed_by_its_partition(planned):
    how = planned("SELECT v AS value, rn FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY ts DESC, v) AS rn "
                  "FROM input WHERE v > 0) t WHERE rn = 1")
    assert isinstance(how, Deduplicate) and how.keys == ["k"] and how.keep_latest
    assert how.order == [("ts", True, False), ("v", False, True)]
    assert how.upsert_key == ["__sql_key0"] and how.final == "SELECT t.v AS value, t.rn, `k` AS `__sql_key0` FROM input AS `t`"
    assert "WHERE `rn` = 1" in how.pre and "ORDER BY `ts` DESC NULLS LAST, `v` ASC NULLS FIRST" in how.pre


@pytest.mark.parametrize("call, kind, spec", [
    ("window(ts, '10 seconds')", "tumbling", {"size_ms": 10_000}),
    ("window(ts, '1 minute', '20 seconds', '5 seconds')", "sliding",
     {"size_ms": 60_000, "slide_ms": 20_000, "offset_ms": 5_000}),
    ("session_window(ts, '5 minutes')", "session", {"gap_ms": 300_000}),
])
def test_a_time_window_in_group_by_is_an_event_time_window_per_key(planned, call, kind, spec):
    query = f"SELECT {call} AS w, k, count(*) AS n FROM input WHERE v > 0 GROUP BY {call}, k"
    how = plan(query, analysis.analyse(query, SCHEMA), analysis.window_calls(query))
    assert how.window.kind == kind and how.window.time_column == "ts"
    assert all(getattr(how.window, name) == value for name, value in spec.items()), how.window
    assert how.keys == ["k"] and "input.ts AS `ts`" in how.pre and "WHERE (input.v > CAST(0 AS BIGINT))" in how.pre
    assert "named_struct('start', `window_start`, 'end', `window_end`) AS `w`" in how.final
    assert how.upsert_key == ["k", "__sql_key_window_start", "__sql_key_window_end"]  # no start selected
    query = query.replace(" AS w,", ".start AS ws,")
    how = plan(query, analysis.analyse(query, SCHEMA), analysis.window_calls(query))
    assert how.upsert_key == ["k", "ws"] and "__sql_key" not in how.final


def test_a_windows_result_keeps_its_event_time_in_the_column_of_its_end_and_can_be_a_view(planned, spark):
    query = "SELECT k, window.end AS closes, max(v) AS top FROM input GROUP BY window(ts, '10 seconds'), k"
    assert plan(query, analysis.analyse(query, SCHEMA), analysis.window_calls(query)).rowtime == "closes"
    query = query.replace("window.end AS closes", "window.start AS opens")
    assert plan(query, analysis.analyse(query, SCHEMA), analysis.window_calls(query)).rowtime is None
    env = StreamEnvironment(parallelism=1)
    rows = env.from_generator(lambda s: {"k": s % 3, "v": s, "ts": s.astype("datetime64[ms]")}, count=10,
                              watermark_strategy=WatermarkStrategy.for_bounded_out_of_orderness(0)
                              .with_timestamp_column("ts"))
    tops = rows.sql("SELECT k, window.end AS closes, max(v) AS top FROM input GROUP BY window(ts, '10 seconds'), k")
    assert tops.rowtime == "closes"
    assert tops.known_schema.names == ["k", "closes", "top"]
    assert pa.types.is_timestamp(tops.known_schema.field("closes").type)
    env.create_temporary_view("tops", tops)
    env.create_temporary_view("rows", rows)
    joined = env.sql_query("SELECT r.k, t.top FROM rows r JOIN tops t ON r.k = t.k AND r.v = t.top "
                           "WHERE r.ts BETWEEN t.closes - INTERVAL 10 SECONDS AND t.closes")
    assert "interval join" in joined.explain()


def test_a_time_window_needs_the_stream_s_event_time(spark):
    env = StreamEnvironment(parallelism=1)
    rows = env.from_generator(lambda s: {"k": s % 3, "ts": s.astype("datetime64[ms]"), "t2": s.astype("datetime64[ms]")},
                              count=10)
    with pytest.raises(GraphValidationError, match="has no event time: give the source a watermark strategy on 'ts'"):
        rows.sql("SELECT k, count(*) AS n FROM input GROUP BY window(ts, '1 second'), k")
    timed = rows.assign_timestamps_and_watermarks(
        WatermarkStrategy.for_bounded_out_of_orderness(0).with_timestamp_column("ts"))
    with pytest.raises(GraphValidationError, match="the window reads 't2'.* event time .* is 'ts'"):
        timed.sql("SELECT k, count(*) AS n FROM input GROUP BY window(t2, '1 second'), k")
    assert "tumbling windows (1000 ms)" in timed.sql(
        "SELECT k, count(*) AS n FROM input GROUP BY window(ts, '1 second'), k").explain()


def test_the_pipeline_refuses_at_the_line_of_the_sql_call_before_anything_runs(spark):
    env = StreamEnvironment(parallelism=1)
    stream = env.from_generator(lambda s: {"k": s % 3, "v": s}, count=10)
    with pytest.raises(GraphValidationError, match=r"operator 'top' \(test_sql_planner.py:\d+\): 'LIMIT 3' "
                                                   r"\(line 1 of the query\)"):
        stream.sql("SELECT k FROM input LIMIT 3", name="top")
    with pytest.raises(GraphValidationError, match=r"Spark refuses the query: .*`vv`.*Did you mean"):
        stream.sql("SELECT k, sum(vv) AS s FROM input GROUP BY k")


def test_a_query_over_an_input_of_unknown_schema_is_refused_with_what_to_do(spark):
    env = StreamEnvironment(parallelism=1)
    stream = env.from_generator(lambda s: {"k": s % 3, "v": s}, count=10).spark(lambda df: df, name="opaque")
    with pytest.raises(GraphValidationError, match="per_batch=True"):
        stream.sql("SELECT k, count(*) AS n FROM input GROUP BY k")
    stream.sql("SELECT k, v FROM input WHERE v > 1")  # per batch: nothing to plan


def test_a_per_batch_sql_step_gives_the_next_its_schema(spark):
    env = StreamEnvironment(parallelism=1)
    stream = (env.from_generator(lambda s: {"k": s % 3, "v": s}, count=10)
              .sql("SELECT k, v * 2 AS w FROM input").sql("SELECT k, sum(w) AS s FROM input GROUP BY k"))
    assert "keyed state by k: sum(__sql_arg0)" in stream.explain()


@pytest.mark.parametrize("query, spans", [
    ("SELECT k, v FROM input WHERE name = 'group by'", False),
    ("SELECT k, upper(name) FROM input -- order by k", False),
    ("SELECT order_id, `limit` FROM input", False),
    ("SELECT k, Count (*) FROM input", True),
    ("SELECT DISTINCT k FROM input", True),
    ("SELECT k FROM input a JOIN input b USING (k)", True),
])
def test_the_screen_sends_to_the_analyser_what_may_span_batches(query, spans):
    assert may_span_batches(query) is spans


def test_the_screen_knows_every_aggregate_function_of_this_spark(spark):
    jvm = spark._jvm
    aggregate = jvm.java.lang.Class.forName("org.apache.spark.sql.catalyst.expressions.aggregate.AggregateFunction")
    registry = spark._jsparkSession.sessionState().functionRegistry()
    names, ids = set(), registry.listFunction().iterator()
    while ids.hasNext():
        fid = ids.next()
        info = registry.lookupFunction(fid)
        if info.isDefined():
            try:
                if aggregate.isAssignableFrom(jvm.java.lang.Class.forName(info.get().getClassName())):
                    names.add(fid.funcName())
            except Exception:
                continue  # a class this JVM cannot load is no function a query can call
    assert "count" in names and names <= AGGREGATE_FUNCTIONS, sorted(names - AGGREGATE_FUNCTIONS)


def test_the_state_of_a_query_has_a_uid_of_what_it_holds(spark):
    def state_uid(query: str) -> str:
        env = StreamEnvironment(parallelism=1)
        env.from_generator(lambda s: {"k": s % 3, "v": s}, count=10).sql(query).collect()
        (node,) = [n for n in env._nodes if n.spec.kind == "keyed-aggregate"]
        return node.uid
    same = state_uid("SELECT k, sum(v) AS s FROM input GROUP BY k")
    assert same.startswith("sql-") and same == state_uid("SELECT k, sum(v) AS s FROM input GROUP BY k")
    assert same != state_uid("SELECT k, max(v) AS s FROM input GROUP BY k")


def test_a_refused_query_leaves_pyspark_s_own_error_log_as_it_was(tmp_path):
    """In a fresh process (a notebook's kernel) the planner's first refusal comes before any error
    of PySpark's own: the logger it quiets meanwhile must be PySpark's (a plain one of that name
    takes its place and fails its calls, which pass errorClass=) and log again afterwards."""
    script = tmp_path / "fresh.py"
    script.write_text(
        "import logging\n"
        "import pyarrow as pa\n"
        "from pyspark.logger import PySparkLogger\n"
        "from kernel_runtime.api.sql import analysis\n"
        "try:\n"
        "    analysis.analyse('SELECT nope FROM input', pa.schema([('k', pa.int64())]))\n"
        "except analysis.SqlAnalysisError as exc:\n"
        "    print('refused:', exc)\n"
        "log = logging.getLogger('SQLQueryContextLogger')\n"
        "print('pyspark logger:', isinstance(log, PySparkLogger), log.isEnabledFor(logging.ERROR))\n")
    import subprocess
    import sys
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert "refused: [UNRESOLVED_COLUMN" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "pyspark logger: True True" in done.stdout, done.stdout


@pytest.fixture
def notebook_planner(spark, monkeypatch):
    """The planner as a notebook has it: warmed up ahead of need (here at once), and up."""
    monkeypatch.setattr(analysis, "warm_up_after", lambda: None)
    analysis.planner_session()


def test_in_a_notebook_a_wrong_column_of_a_per_batch_query_is_refused_at_its_line(notebook_planner):
    env = StreamEnvironment(parallelism=1)
    stream = env.from_generator(lambda s: {"order_id": s, "amount": s % 7}, count=10)
    with pytest.raises(GraphValidationError) as info:
        stream.sql("SELECT order_id, amout * 2 AS twice FROM input", name="typo")
    text = str(info.value)
    assert re.search(r"operator 'typo' \(test_sql_planner.py:\d+\): Spark refuses the query: "
                     r"\[UNRESOLVED_COLUMN.WITH_SUGGESTION\] .*`amout`.* Did you mean .*`amount`", text), text
    # what only the TaskManagers' sessions may know is left to them: a table, a function
    stream.sql("SELECT i.order_id FROM input i JOIN dims d ON i.order_id = d.id", per_batch=True)
    stream.sql("SELECT order_id, their_udf(amount) AS x FROM input")
    assert len(env._nodes) == 3  # the source and the two steps just made


def test_a_script_leaves_a_per_batch_query_to_the_job_s_first_task(spark, monkeypatch):
    monkeypatch.setattr(analysis, "warm_up_after", None)
    analysis.planner_session()  # up, but a script does not analyse what only projects and filters
    env = StreamEnvironment(parallelism=1)
    env.from_generator(lambda s: {"order_id": s}, count=10).sql("SELECT amout FROM input", name="typo")


def test_the_warm_up_starts_the_session_only_after_its_gate(spark, monkeypatch):
    opened = threading.Event()
    monkeypatch.setattr(analysis, "_session", None)
    monkeypatch.setattr(analysis, "_warming", None)
    monkeypatch.setattr(analysis, "warm_up_after", opened.wait)
    analysis.warm_up()
    warming = analysis._warming
    assert warming is not None and warming.is_alive() and not analysis.analyses_every_query()
    analysis.warm_up()  # once
    assert analysis._warming is warming
    opened.set()
    warming.join()
    assert analysis.analyses_every_query()


def test_a_group_by_a_windows_end_is_final_per_instant_and_any_other_time_runs(spark):
    """Over a window's rows, grouping by the window's end (their event time) is Flink's window
    aggregate after a window TVF: a group per instant, final when the watermark passes it, and its
    rows keep that event time (Nexmark q5's highest count per window). Grouping a raw stream by
    its time stays a running aggregate, as in Flink."""
    env = StreamEnvironment(parallelism=1)
    rows = env.from_generator(lambda s: {"k": s % 3, "ts": s.astype("datetime64[ms]")}, count=10,
                              watermark_strategy=WatermarkStrategy.for_bounded_out_of_orderness(0)
                              .with_timestamp_column("ts"))
    env.create_temporary_view("counts", rows.sql(
        "SELECT k, count(*) AS n, window.end AS ends FROM input GROUP BY k, window(ts, '10 seconds', '2 seconds')"))
    top = env.sql_query("SELECT ends, max(n) AS most FROM counts GROUP BY ends")
    assert top.sql_plan.window.instant and "each instant of ends" in top.explain()
    assert top.rowtime == "ends" and top.sql_plan.upsert_key == ["ends"]
    assert "`window_start` AS `ends`" in top.sql_plan.final
    running = rows.sql("SELECT ts, count(*) AS n FROM input GROUP BY ts")
    assert running.sql_plan.window is None and running.rowtime is None


def test_an_aggregation_over_rows_that_update_their_key_is_refused(spark):
    """A view of a running aggregate or of the latest row per key updates its
    keys' rows: aggregated in another query, each update would count as one more row (a join takes
    each update's place: tests/kernel_runtime/test_sql_join_planner.py). A per-batch query over
    it, and anything over a window's final rows, stay planned."""
    env = StreamEnvironment(parallelism=1)
    rows = env.from_generator(lambda s: {"k": s % 3, "v": s, "ts": s.astype("datetime64[ms]")}, count=10,
                              watermark_strategy=WatermarkStrategy.for_bounded_out_of_orderness(0)
                              .with_timestamp_column("ts"))
    env.create_temporary_view("rows", rows)
    env.create_temporary_view("counts", env.sql_query("SELECT k, count(*) AS n FROM rows GROUP BY k"))
    env.create_temporary_view("latest", rows.drop_duplicates("k", keep="last").sql("SELECT k, v FROM input"))
    joined = env.sql_query("SELECT r.v, c.n FROM rows r JOIN counts c ON r.k = c.k")
    env.create_temporary_view("joined", joined)
    assert joined.sql_plan.result_key is not None
    for query in ["SELECT n, count(*) AS c FROM counts GROUP BY n", "SELECT count(*) AS c FROM latest",
                  "SELECT n, count(*) AS c FROM joined GROUP BY n", "SELECT l.v FROM latest l JOIN counts c ON l.k = c.k "
                  "GROUP BY l.v"]:
        with pytest.raises(GraphValidationError, match="update earlier rows of their key .* put both in one query"):
            env.sql_query(query)
    assert env.sql_query("SELECT k, n * 2 AS twice FROM counts").sql_plan.explain().startswith("per batch")
    env.create_temporary_view("per_window", env.sql_query(
        "SELECT k, count(*) AS n, window.end AS ends FROM rows GROUP BY k, window(ts, '1 second')"))
    assert "merged across batches" in env.sql_query("SELECT ends, max(n) AS most FROM per_window GROUP BY ends").explain()


@pytest.mark.parametrize("query, written", [
    ("SELECT k, v * 2 AS w FROM bids WHERE v > 0",
     "SELECT bids.k, (bids.v * CAST(2 AS BIGINT)) AS w FROM (SELECT * FROM input AS `bids` WHERE (bids.v > "),
    ("SELECT * FROM bids", "SELECT bids.k, bids.v, bids.name, bids.ts FROM input AS `bids`"),
])
def test_a_per_batch_query_over_a_named_view_is_written_back_over_the_batch(spark, query, written):
    """Without a CTE: the TaskManager's Arrow path runs projections and filters only when the plan
    is nothing else (a WithCTE sent Nexmark's q0-q2 through the JVM, at a sixteenth of the speed)."""
    root = analysis.analyse_views(query, {"bids": SCHEMA})
    assert per_batch_query(query, root, "bids").startswith(written)


def test_a_per_batch_query_with_rows_of_its_own_keeps_the_view_as_a_cte(spark):
    for query in ("SELECT k FROM bids WHERE k IN (SELECT col1 FROM VALUES (1), (2))",
                  "SELECT k, (SELECT max(col1) FROM VALUES (1)) AS m FROM bids",
                  "SELECT k FROM bids WHERE EXISTS (SELECT 1)"):
        root = analysis.analyse_views(query, {"bids": SCHEMA})
        assert per_batch_query(query, root, "bids").startswith("WITH `bids` AS (SELECT * FROM input) "), query
    values = "SELECT * FROM VALUES (1, 2) AS t(a, b)"
    assert per_batch_query(values, analysis.analyse_views(values, {"bids": SCHEMA}), "bids").startswith("WITH ")
