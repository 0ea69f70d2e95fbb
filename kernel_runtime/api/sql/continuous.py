"""``.sql`` as the pipeline API builds it: the query screened, analysed over its input's schema
and planned (planner.py) into the DataStream API's own operators.

The input's schema is what the client knows before the job runs (kernel_runtime.api.schema: a
source's declared schema, a generator's sample, pandas steps applied to it); a per-batch ``.sql``
step before this one gives its analysed output schema. Where nothing is known, a query that may
span batches is refused with what to do, rather than run per batch.
"""
from __future__ import annotations

import hashlib
from typing import Optional

import pyarrow as pa

from cluster.graph.job_graph import GraphValidationError
from cluster.graph.operator_kinds import KINDS

from kernel_runtime.api.datastream import DataStream, KeyedStream
from kernel_runtime.api.schema import input_samples
from kernel_runtime.api.time import (EventTimeSessionWindows, SlidingEventTimeWindows, TumblingEventTimeWindows,
                                     WindowAssigner)
from kernel_runtime.api.sql import analysis
from kernel_runtime.api.sql.planner import ContinuousAggregate, PerBatch, UnsupportedQuery, per_batch_query, plan
from kernel_runtime.api.sql.screen import may_span_batches


def planned(stream: DataStream, query: str, where: str, view: str = "input"):
    """PerBatch or ContinuousAggregate for ``query`` over ``stream`` as the view ``view``, and the
    text a per-batch plan runs (the batch is the view ``input`` on the TaskManager);
    GraphValidationError naming ``where`` (the operator and its line) if Spark refuses the query or
    streamlab cannot plan it."""
    if view == "input" and not may_span_batches(query):
        return PerBatch(), query
    schema = _input_schema(stream)
    if schema is None:
        if view == "input" or may_span_batches(query):
            raise GraphValidationError(
                f"{where}: the query may aggregate, join or sort across batches, which streamlab plans from "
                "Spark's analysis of it over its input's schema, and that schema is not known before the job "
                "runs (a source without a declared schema, or a .spark()/.map_batches() step of unknown output): "
                "declare the source's schema (schema=...), or for Spark SQL over each batch on its own "
                "write .sql(query, per_batch=True)")
        return PerBatch(), per_batch_query(query, None, view)
    try:
        root = analysis.analyse(query, schema, view)
    except analysis.SqlAnalysisError as exc:
        if exc.condition == "TABLE_OR_VIEW_NOT_FOUND":
            # a table of the TaskManagers' sessions (a stream-static join): checked when the task opens
            return PerBatch(), per_batch_query(query, None, view)
        raise GraphValidationError(f"{where}: Spark refuses the query: {exc}") from None
    try:
        windows = analysis.window_calls(query) if "window" in query.lower() else []
        how = plan(query, root, windows)
    except analysis.SqlAnalysisError as exc:
        raise GraphValidationError(f"{where}: {exc}") from None
    except UnsupportedQuery as exc:
        raise GraphValidationError(f"{where}: {exc}") from None
    return how, per_batch_query(query, root, view) if isinstance(how, PerBatch) else query


def _input_schema(stream: DataStream) -> Optional[pa.Schema]:
    def spark_sample(node, table: Optional[pa.Table]) -> Optional[pa.Table]:
        query = node.spec.params.get("sql")
        if table is None or node.spec.udf is not None or not query or "upsert_key" in node.spec.params:
            return None
        return analysis.output_schema(query, table.schema).empty_table()
    table = input_samples(stream.env._nodes, stream._edges(), {"spark": spark_sample})
    return None if table is None else table.schema


def build(stream: DataStream, query: str, name: str, parallelism: Optional[int], where: str,
          view: str = "input") -> DataStream:
    """The operators of ``query`` after ``stream`` (which it reads as ``view``): the stream of its result."""
    how, text = planned(stream, query, where, view)
    if isinstance(how, PerBatch):
        out = stream._then("spark", name, params={"sql": text}, parallelism=parallelism)
        out.sql_plan = how
        return out
    assert isinstance(how, ContinuousAggregate)
    assigner = _assigner(stream, how, where) if how.window is not None else None  # checked before any node
    pre = stream._then("spark", name, params={"sql": how.pre}, parallelism=parallelism)
    aggregations = {out: (column, func) for out, (column, func) in how.aggregations.items()}
    if assigner is not None:
        windowed = KeyedStream(pre, how.keys).window(assigner) if how.keys else pre.window_all(assigner)
        merged = windowed.aggregate(name=f"{name}: {how.grouping}", parallelism=parallelism, **aggregations)
    else:
        merged = KeyedStream(pre, how.keys).aggregate(name=f"{name}: {how.grouping}", parallelism=parallelism,
                                                      **aggregations)
    _pin_state_uid(merged, how)
    out = merged
    if how.final is not None:
        assert merged.node is not None and KINDS[merged.node.spec.kind].upsert
        out = merged._then("spark", f"{name}: result", params={"sql": how.final, "upsert_key": how.upsert_key},
                           parallelism=merged.node.parallelism)
    out.sql_plan = how
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


def _pin_state_uid(merged: DataStream, how: ContinuousAggregate) -> None:
    """The keyed state's uid from what it holds (the rows, keys, aggregates and window), so that
    the same query run again (an upgraded cell) finds its state in the savepoint, and an edited
    aggregation does not take state of another shape; the generated uid if a twin has it."""
    digest = hashlib.sha1(repr((how.pre, how.keys, how.aggregations, how.window)).encode()).hexdigest()[:20]
    uid = f"sql-{digest}"
    if merged.node is not None and not any(n.uid == uid for n in merged.env._nodes):
        merged.uid(uid)
