"""``.sql`` as the pipeline API builds it: the query screened, analysed over its input's schema
and planned (planner.py) into the DataStream API's own operators.

The input's schema is what the client knows before the job runs (kernel_runtime.api.schema: a
source's declared schema, a generator's sample, pandas steps applied to it); a per-batch ``.sql``
step before this one gives its analysed output schema. Where nothing is known, a query that may
span batches is refused with what to do, rather than run per batch.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Any, Iterator, Optional

import pyarrow as pa

from cluster.graph.job_graph import GraphValidationError, ShipStrategy
from cluster.conf.options import TableOptions
from cluster.graph.operator_kinds import KINDS, upsert_key as upsert_key_of
from cluster.graph.schema import schema_to_text

from kernel_runtime.api.datastream import DataStream, KeyedStream
from kernel_runtime.api.schema import input_samples
from kernel_runtime.api.time import (EventTimeSessionWindows, SlidingEventTimeWindows, TumblingEventTimeWindows,
                                     WindowAssigner)
from kernel_runtime.api.sql import analysis
from kernel_runtime.api.sql.dedup_planner import Deduplicate, find_window, plan_deduplicate, plan_distinct
from kernel_runtime.api.sql.join_planner import JoinedAggregate, StreamJoin, find_join, plan_join
from kernel_runtime.api.sql.nested_planner import NestedAggregate, inner_aggregation, plan_nested
from kernel_runtime.api.sql.result_query import aggregation_below, plan_over_aggregate
from kernel_runtime.api.sql.planner import ContinuousAggregate, PerBatch, UnsupportedQuery, per_batch_query, plan
from kernel_runtime.api.windowed import keyed_edges, two_input
from kernel_runtime.api.sql.screen import may_span_batches

log = logging.getLogger(__name__)


def planned(streams: dict[str, DataStream], query: str, where: str):
    """PerBatch, ContinuousAggregate or StreamJoin for ``query`` over the views ``streams`` (the
    stream before a ``.sql`` step is the view ``input``), and the text a per-batch plan runs (the
    batch is the view ``input`` on the TaskManager); GraphValidationError naming ``where`` (the
    operator and its line) if Spark refuses the query or streamlab cannot plan it."""
    view, stream = next(iter(streams.items()))
    if len(streams) == 1 and view == "input" and not may_span_batches(query):
        if analysis.analyses_every_query():
            _refuse_wrong_columns(query, stream, where)
        else:
            analysis.warm_up()
        return PerBatch(), query
    schemas = {v: _input_schema(s) for v, s in streams.items()}
    unknown = [v for v, schema in schemas.items() if schema is None]
    if unknown:
        if len(streams) > 1 or view == "input" or may_span_batches(query):
            raise GraphValidationError(
                f"{where}: the query may aggregate, join or sort across batches, which streamlab plans from "
                f"Spark's analysis of it over its input's schema, and the schema of {', '.join(unknown)} is not "
                "known before the job runs (a source without a declared schema, or a .spark()/.map_batches() step "
                "of unknown output): declare the source's schema (schema=...), or for Spark SQL over each batch on "
                "its own write .sql(query, per_batch=True)")
        return PerBatch(), per_batch_query(query, None, view)
    known = {v: s for v, s in schemas.items() if s is not None}
    try:
        root = analysis.analyse_views(query, known)
    except analysis.SqlAnalysisError as exc:
        if exc.condition == "TABLE_OR_VIEW_NOT_FOUND" and len(streams) == 1:
            # a table of the TaskManagers' sessions (a stream-static join): checked when the task opens
            return PerBatch(), per_batch_query(query, None, view)
        raise GraphValidationError(f"{where}: Spark refuses the query: {exc}") from None
    rowtimes = {v: s.rowtime for v, s in streams.items()}
    try:
        how: Any
        windows = analysis.window_calls(query) if "window" in query.lower() else []
        inner, join = inner_aggregation(root), find_join(root)
        only = next(iter(streams.values())) if len(streams) == 1 else None
        rowtime = only.rowtime if only is not None else None  # of the one view a query reads
        distinct = plan_distinct(query, root, rowtime)
        if distinct is not None:
            how = distinct
        elif inner is not None:
            how = plan_nested(query, root, inner, windows, lambda node, carry: plan_join(
                query, node, rowtimes, analysis.offset_us, carry, windows))
        elif join is None and find_window(root) is not None:
            how = plan_deduplicate(query, root, rowtime)
        elif join is not None:
            upserts = {v: upsert_key(s) if updates(s) else None for v, s in streams.items()}
            how = plan_join(query, root, rowtimes, analysis.offset_us, calls=windows, upserts=upserts)
            if isinstance(how, StreamJoin) and how.how != "inner":  # a side that sends no row is padded
                left, right = (schema_to_text(analysis.output_schema(pre, known[view]))
                               for view, pre in zip(how.views, how.pre))
                how = dataclasses.replace(how, side_schemas=(left, right))
        else:
            aggregation = aggregation_below(root)
            # a window's rows, grouped by their window's end: Flink's window aggregate after a window
            # TVF (any other GROUP BY of a time column is a running aggregate, as Flink's)
            window_rows = only is not None and isinstance(only.sql_plan, ContinuousAggregate) and \
                only.sql_plan.window is not None
            how = plan(query, root, windows, rowtime=rowtime if window_rows else None) if aggregation is None else \
                plan_over_aggregate(query, root, aggregation, windows)
    except analysis.SqlAnalysisError as exc:
        raise GraphValidationError(f"{where}: {exc}") from None
    except UnsupportedQuery as exc:
        raise GraphValidationError(f"{where}: {exc}") from None
    return how, per_batch_query(query, root, view) if isinstance(how, PerBatch) else query


def _refuse_wrong_columns(query: str, stream: DataStream, where: str) -> None:
    """A query over each batch, analysed by the planner's session when it is up already, over its
    input's schema when that is known: a column the input lacks (or any error Spark's analyser
    finds) raises here, in the cell, not in the job's first task seconds later."""
    schema = _input_schema(stream)
    if schema is None:
        return
    try:
        analysis.analyse_views(query, {"input": schema})
    except analysis.SqlAnalysisError as exc:
        # a table or a function of the TaskManagers' sessions is theirs to find when the task opens
        if not exc.condition.startswith(("TABLE_OR_VIEW_NOT_FOUND", "UNRESOLVED_ROUTINE")):
            raise GraphValidationError(f"{where}: Spark refuses the query: {exc}") from None


UPDATING = frozenset({"keyed-count", "keyed-aggregate", "keyed-reduce", "keyed-changelog-aggregate"})


def updates(stream: DataStream) -> bool:
    """Whether the stream's rows update earlier rows of their key: the nearest stateful operator
    above it (through per-row steps) keeps a running row or the latest row per key. A window's
    rows, a join's of append streams and a first-to-arrive deduplication's are each final."""
    for node in _steps_above(stream):
        kind = node.spec.kind
        if kind in UPDATING:
            return True
        if kind == "regular-join":  # of an updating view: its pairs are replaced as the view's rows are
            return any(node.spec.params.get("upsert_keys") or ())
        if kind == "keyed-deduplicate":
            return bool(node.spec.params.get("order") or node.spec.params.get("keep_latest"))
    return False


def upsert_key(stream: DataStream) -> list[str]:
    """The columns an updating stream's rows are keyed by: the nearest upsert step's above it,
    through per-row steps (a hidden one where the query that made it does not select its key)."""
    keys = (upsert_key_of(node.spec.kind, node.spec.params) for node in _steps_above(stream))
    return next((key for key in keys if key is not None), [])


def _steps_above(stream: DataStream) -> Iterator:
    """The stream's operator, then those above it through per-row steps, up to the first stateful
    or many-input one (included)."""
    nodes = {n.uid: n for n in stream.env._nodes}
    node = stream.node
    while node is not None:
        yield node
        if KINDS[node.spec.kind].stateful or len(node.inputs) != 1:
            return
        node = nodes.get(node.inputs[0].source)


def _input_schema(stream: DataStream) -> Optional[pa.Schema]:
    def spark_sample(node, table: Optional[pa.Table]) -> Optional[pa.Table]:
        query = node.spec.params.get("sql")
        if table is None or node.spec.udf is not None or not query or "upsert_key" in node.spec.params:
            return None
        return analysis.output_schema(query, table.schema).empty_table()
    if stream.known_schema is not None:
        return stream.known_schema
    table = input_samples(stream.env._nodes, stream._edges(), {"spark": spark_sample})
    return None if table is None else table.schema


def build(streams: dict[str, DataStream], query: str, name: str, parallelism: Optional[int],
          where: str) -> DataStream:
    """The operators of ``query`` over the views ``streams`` (the stream before a ``.sql`` step is
    the view ``input``): the stream of its result."""
    deleting = [view for view, s in streams.items() if s.deletes]
    if deleting:
        raise GraphValidationError(f"{where}: the rows of {', '.join(deleting)} are deleted when they leave its query's "
                                   "result (a HAVING or WHERE they stop passing, an aggregation over an aggregation "
                                   "whose rows all moved away), which a query over it would not see: put both in "
                                   "one query")
    how, text = planned(streams, query, where)
    updating = [view for view, s in streams.items() if updates(s)]
    if updating and not isinstance(how, (PerBatch, StreamJoin)):  # the join planner takes its updating sides
        raise GraphValidationError(f"{where}: the rows of {', '.join(updating)} update earlier rows of their key (an "
                                   "aggregation's running rows, or the latest row per key), and a join or aggregation "
                                   "over them would take each update as one more row: put both in one query (an "
                                   "aggregation over a grouped subquery takes each old row back), or aggregate per "
                                   "time window, whose rows are final")
    stream = next(iter(streams.values()))
    if isinstance(how, PerBatch):
        out = stream._then("spark", name, params={"sql": text}, parallelism=parallelism)
        out.sql_plan = how
        return out
    if isinstance(how, StreamJoin):
        out = _join(streams, how, name, parallelism, where)
    elif isinstance(how, NestedAggregate):
        if isinstance(how.inner, JoinedAggregate):
            joined = _join(streams, how.inner.join, f"{name} (inner)", parallelism, where, "joined rows")
            inner = _aggregation(joined, how.inner.aggregate, f"{name} (inner)", parallelism, where, changelog=True)
        else:
            inner = _aggregation(stream, how.inner, f"{name} (inner)", parallelism, where, changelog=how.retracting)
        out = _aggregation(inner, how.outer, name, parallelism, where, over_changelog=how.retracting)
        out.sql_plan = how
    elif isinstance(how, Deduplicate):
        out = _deduplication(stream, how, name, parallelism)
    elif isinstance(how, JoinedAggregate):
        joined = _join(streams, how.join, name, parallelism, where, "joined rows")
        out = _aggregation(joined, how.aggregate, name, parallelism, where)
        out.sql_plan = dataclasses.replace(how, join=joined.sql_plan)
    else:
        assert isinstance(how, ContinuousAggregate)
        out = _aggregation(stream, how, name, parallelism, where)
    # what keyed state emits is known only when it runs, but the query's columns are Spark's: a
    # view of the result can be queried in turn (a join with a window's rows, Nexmark q7)
    schemas = {v: _input_schema(s) for v, s in streams.items()}
    if all(schema is not None for schema in schemas.values()):
        try:
            out.known_schema = analysis.query_output_schema(query, schemas)
        except Exception:  # a column type Arrow has no twin of (PySpark's to_arrow_schema refuses it):
            log.debug("the columns of %s stay unknown", where, exc_info=True)  # the view is sampled as before
    return out


def _aggregation(stream: DataStream, how: ContinuousAggregate, name: str, parallelism: Optional[int],
                 where: str, changelog: bool = False, over_changelog: bool = False) -> DataStream:
    """The rows below the aggregation on Spark, the keyed (or windowed) aggregate, the result step.
    ``changelog``: the aggregate emits each key's old row marked -U before its update;
    ``over_changelog``: its rows are such a changelog, each -U taken back."""
    assigner = _assigner(stream, how, where) if how.window is not None else None  # checked before any node
    pre = stream._then("spark", name, params={"sql": how.pre}, parallelism=parallelism)
    aggregations = {out: (column, func) for out, (column, func) in how.aggregations.items()}
    if assigner is not None:
        windowed = KeyedStream(pre, how.keys).window(assigner) if how.keys else pre.window_all(assigner)
        merged = windowed.aggregate(name=f"{name}: {how.grouping}", parallelism=parallelism, **aggregations)
    elif over_changelog:  # no partial aggregates before the exchange: the row kinds are summed after it
        merged = pre._then("keyed-changelog-aggregate", f"{name}: {how.grouping}", parallelism=parallelism,
                           params={"key": how.keys, "aggregations": {k: list(v) for k, v in aggregations.items()}},
                           partitioning=(ShipStrategy.HASH, how.keys))
    else:
        merged = KeyedStream(pre, how.keys).aggregate(name=f"{name}: {how.grouping}", parallelism=parallelism,
                                                      **aggregations)
        if changelog:
            assert merged.node is not None
            merged.node.spec.params["changelog"] = True
    _pin_state_uid(merged, repr((how.pre, how.keys, how.aggregations, how.window)))
    out = merged
    if how.rowtime is not None:  # each window's row at its window's end, which the watermark has passed
        out.rowtime = how.rowtime
    if how.final is not None:
        assert merged.node is not None and KINDS[merged.node.spec.kind].upsert
        out = merged._then("spark", f"{name}: result", params={"sql": how.final, "upsert_key": how.upsert_key},
                           parallelism=merged.node.parallelism)
    out.sql_plan = how
    out.deletes = how.deletes
    return out


def _deduplication(stream: DataStream, how: Deduplicate, name: str, parallelism: Optional[int]) -> DataStream:
    """Each batch's first row per key on Spark, the keyed deduplicate, the result step."""
    pre = stream._then("spark", name, params={"sql": how.pre}, parallelism=parallelism)
    kept = pre._then("keyed-deduplicate", f"{name}: {how.clause}", parallelism=parallelism,
                     params={"key": how.keys, "order": [list(o) for o in how.order], "keep_latest": how.keep_latest,
                             "time_column": how.time_column},
                     partitioning=(ShipStrategy.HASH, how.keys))
    _pin_state_uid(kept, repr((how.pre, how.keys, how.order)))
    assert kept.node is not None
    out = kept._then("spark", f"{name}: result", params={"sql": how.final, "upsert_key": how.upsert_key},
                     parallelism=kept.node.parallelism)
    out.sql_plan = how
    return out


def _join(streams: dict[str, DataStream], how: StreamJoin, name: str, parallelism: Optional[int],
          where: str, result: str = "result") -> DataStream:
    """Each side's Spark step, the keyed join, and the result's Spark step."""
    sides = []
    for side, (view, pre) in enumerate(zip(how.views, how.pre)):
        stream = streams[view]
        out = stream._then("spark", f"{name}: {view}" if view != "input" else f"{name}: {('left', 'right')[side]}",
                           params={"sql": pre}, parallelism=parallelism)
        out.rowtime = how.rowtimes[side]
        sides.append(KeyedStream(out, how.keys[side]))
    env = sides[0].stream.env
    ttl = env._conf.get(TableOptions.STATE_TTL)
    params: dict = {"key": how.keys[0], "right_key": how.keys[1]}
    if how.bounds is not None:
        params.update(left_rowtime=how.rowtimes[0], right_rowtime=how.rowtimes[1], lower=how.bounds[0],
                      upper=how.bounds[1], lower_inclusive=how.inclusive[0], upper_inclusive=how.inclusive[1],
                      how=how.how)
        if how.rowtime is not None:  # a result row's time (the left's) trails the watermark by up to the upper bound
            params["output_watermark_delay"] = max(how.bounds[1], 0) + 1
    if how.how != "inner":  # a side that sends no row is padded with nulls: its columns, from Spark's analysis
        params["side_schemas"] = list(how.side_schemas)
    elif ttl:
        params["state_ttl_ms"] = ttl
    if how.result_key is not None:
        params.update(upsert_keys=list(how.upserts), row_ids=list(how.row_ids))
    joined = two_input(how.kind, f"{name}: {how.clause}", keyed_edges(sides[0]), keyed_edges(sides[1]), env, params,
                       None, parallelism, where)
    _pin_state_uid(joined, repr((how.pre, how.keys, how.bounds, how.how, how.inclusive, how.upserts)))
    assert joined.node is not None
    final: dict = {"sql": how.final} if how.result_key is None else {"sql": how.final, "upsert_key": how.result_key}
    out = joined._then("spark", f"{name}: {result}", params=final, parallelism=joined.node.parallelism)
    out.rowtime = how.rowtime
    out.deletes = how.deletes
    out.sql_plan = dataclasses.replace(how, state_ttl_ms=0 if how.bounds is not None else ttl)
    return out


def _assigner(stream: DataStream, how: ContinuousAggregate, where: str) -> WindowAssigner:
    """The window assigner of a GROUP BY window(...), on the stream's own event time."""
    window = how.window
    assert window is not None
    if stream.rowtime is None:
        raise GraphValidationError(
            f"{where}: {how.grouping} groups by event-time windows of {window.time_column!r}, and the stream has no "
            f"event time: give the source a watermark strategy on {window.time_column!r} (from_generator(..., "
            "watermark_strategy=WatermarkStrategy.for_bounded_out_of_orderness(...).with_timestamp_column(...))) "
            "or call assign_timestamps_and_watermarks(...) before the .sql step")
    if stream.rowtime != window.time_column:
        raise GraphValidationError(f"{where}: the window reads {window.time_column!r}, and the stream's event time "
                                   f"(its watermarks) is {stream.rowtime!r}: window over {stream.rowtime!r}")
    if window.kind == "session":
        assigner = EventTimeSessionWindows.with_gap(window.gap_ms)
    elif window.kind == "sliding":
        assigner = SlidingEventTimeWindows.of(window.size_ms, window.slide_ms, window.offset_ms)
    else:
        assigner = TumblingEventTimeWindows.of(window.size_ms, window.offset_ms)
    return assigner


def _pin_state_uid(merged: DataStream, holds: str) -> None:
    """The keyed state's uid from what it holds (the rows, keys, aggregates and window, or a join's
    sides), so that the same query run again (an upgraded cell) finds its state in the savepoint,
    and an edited query does not take state of another shape; the generated uid if a twin has it."""
    digest = hashlib.sha1(holds.encode()).hexdigest()[:20]
    uid = f"sql-{digest}"
    if merged.node is not None and not any(n.uid == uid for n in merged.env._nodes):
        merged.uid(uid)
