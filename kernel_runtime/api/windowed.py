"""Windows and joins in the API: what ``window(...)``, ``window_all(...)``, ``interval_join(...)``,
``join(...)`` and ``temporal_join(...)`` build (Flink's WindowedStream, IntervalJoin, JoinedStreams).

Each checks on the spot what it can and says so at the user's line: an event-time window or join
over a stream without event time (no watermark strategy upstream), a function of the wrong
kind, a bad lateness. Windowed aggregations are pre-aggregated per key and window before the
exchange, inside the upstream Spark plan when there is one (ARCHITECTURE.md section 9).
"""
from __future__ import annotations

import math
from typing import Callable, Optional

from cluster.graph.aggregations import WINDOW_AGGREGATE_FUNCTIONS
from cluster.graph.chaining import StreamEdge, StreamNode
from cluster.graph.job_graph import GraphValidationError, OperatorSpec, ShipStrategy

from kernel_runtime.api.datastream import (DataStream, KeyedStream, aggregation_spec, call_site, check_parallelism, pickle_udf)
from kernel_runtime.api.time import WindowAssigner, to_ms

WINDOW_COLUMNS = ["window_start", "window_end"]


def _need_event_time(stream: DataStream, what: str, site: str) -> str:
    if stream.rowtime is None:
        raise GraphValidationError(
            f"{what} ({site}): it works in event time, and its input has none: give the source a watermark "
            "strategy (from_source(source, watermark_strategy=...), from_generator(..., watermark_strategy=...)) "
            "or call assign_timestamps_and_watermarks(...) before it")
    return stream.rowtime


def _assigner(assigner, what: str, site: str) -> WindowAssigner:
    if not isinstance(assigner, WindowAssigner):
        raise GraphValidationError(f"{what} ({site}): expected a window assigner such as "
                                   f"TumblingEventTimeWindows.of(Time.seconds(10)), got {assigner!r}")
    return assigner


class WindowedStream:
    def __init__(self, stream: DataStream, key: list[str], assigner, site: str):
        self.stream, self.key, self.site = stream, key, site
        self.assigner = _assigner(assigner, "window", site)
        self.rowtime = _need_event_time(stream, "an event-time window", site) if self.assigner.is_event_time else None
        self.lateness = 0
        self.late_tag: Optional[str] = None

    def allowed_lateness(self, lateness) -> "WindowedStream":
        """Rows up to ``lateness`` behind the watermark still count: their window fires again."""
        ms = to_ms(lateness, "allowed_lateness")
        if ms < 0:
            raise GraphValidationError(f"allowed_lateness ({call_site()}): must be >= 0, got {ms} ms")
        self.lateness = ms
        return self

    def side_output_late_data(self, tag: str) -> "WindowedStream":
        """Rows too late for their windows go to this side output (``get_side_output(tag)``)."""
        if not isinstance(tag, str) or not tag:
            raise GraphValidationError(f"side_output_late_data ({call_site()}): give a tag name, got {tag!r}")
        self.late_tag = tag
        return self

    # ------------------------------------------------------------------ window functions
    def aggregate(self, name: str = "window", parallelism: Optional[int] = None,
                  **aggregations: tuple[str, str]) -> DataStream:
        """Named aggregations per window, as the keyed aggregate's: ``aggregate(n=("v", "count"))``."""
        return self._build("aggregate", name, parallelism,
                           aggregations=aggregation_spec(aggregations, f"aggregate ({call_site()})",
                                                        WINDOW_AGGREGATE_FUNCTIONS))

    def count(self, name: str = "window", parallelism: Optional[int] = None) -> DataStream:
        """The rows per window, in a column ``count``."""
        return self._build("count", name, parallelism)

    def reduce(self, fn: Callable, name: str = "window", parallelism: Optional[int] = None) -> DataStream:
        """fn(accumulated, new) -> combined over aligned rows, as KeyedStream.reduce, per window."""
        return self._build("reduce", name, parallelism, fn=fn)

    def process(self, fn: Callable, name: str = "window", parallelism: Optional[int] = None) -> DataStream:
        """fn(key, window, rows: DataFrame) -> DataFrame or None, once per window firing, with all
        of the window's rows (``window.start``, ``window.end`` in epoch ms)."""
        return self._build("process", name, parallelism, fn=fn)

    def _build(self, function: str, name: str, parallelism: Optional[int], fn: Optional[Callable] = None,
               aggregations: Optional[dict] = None) -> DataStream:
        stream, key, assigner = self.stream, self.key, self.assigner
        if not key:  # window_all: one subtask sees every row
            if parallelism not in (None, 1):
                raise GraphValidationError(f"window_all ({self.site}): runs in one subtask, not {parallelism}")
            parallelism = 1
        params = {"key": key, "upsert_key": key + WINDOW_COLUMNS, "assigner": assigner.spec, "time": assigner.time,
                  "rowtime": self.rowtime, "function": function, "aggregations": aggregations,
                  "allowed_lateness": self.lateness, "late_tag": self.late_tag, "pre_aggregated": False}
        source = stream
        upstream = stream.node
        if (function in ("aggregate", "count") and assigner.is_event_time and assigner.spec["type"] != "session"
                and self.late_tag is None and upstream is not None and stream._partitioning is None
                and len(stream._upstreams) == 1 and stream._upstreams[0][1] is None):
            partial = {"key": key, "rowtime": self.rowtime, "assigner": assigner.spec, "aggregations": aggregations or {}}
            spec = assigner.spec
            if spec["type"] == "sliding" and spec["slide"] < spec["size"]:
                # Flink's slicing: partials per slice (a tumbling window of the gcd), merged per window as it fires
                slices = math.gcd(spec["size"], spec["slide"])
                partial["assigner"] = {"type": "tumbling", "size": slices, "offset": (spec.get("offset") or 0) % slices}
                params["slices"] = slices
            # After a Spark step too, by Arrow in the task: its partials as a step of the Spark plan
            # (an Aggregate) kept the step's projections and filters from running by Arrow, and
            # held a window's watermark behind Spark jobs. Measured (bench/windows.py's shapes, 3M
            # rows): tumbling 1 s after .sql 0.63-1.02M -> 1.75-1.85M rows/s, the highest bid
            # 1.78-1.92M -> 4.3-5.1M, sliding the same; after SQL that Spark must run, 0.47-0.72M ->
            # 0.47-0.98M; window results p99 640-1,400 ms -> 280 ms after the window could close.
            source = stream._then("window-partial", f"{name} (partial)", params=partial,
                                  parallelism=upstream.parallelism)
            params["pre_aggregated"] = True
        partitioning = (ShipStrategy.HASH, key) if key else (ShipStrategy.REBALANCE, [])
        out = source._then("window", name, fn, params, parallelism, partitioning)
        out.rowtime = None  # a window's rows are new rows: their time is their window's
        if self.late_tag is not None:
            out._side_rowtimes = {self.late_tag: self.rowtime}
        return out


# ---------------------------------------------------------------------- joins
def two_input(kind: str, name: str, left: list[StreamEdge], right: list[StreamEdge], env, params: dict,
               fn: Optional[Callable], parallelism: Optional[int], site: str) -> DataStream:
    where = f"operator '{name}' ({site})"
    edges = left + right
    spec = OperatorSpec(uid=env._operator_uid(kind, name, edges), kind=kind, name=name, call_site=site,
                        params={**params, "left_inputs": len(left)}, udf=pickle_udf(fn, where))
    node = StreamNode(spec, check_parallelism(parallelism, where) or env.parallelism, edges)
    env._nodes.append(node)
    return DataStream(env, node)


def keyed_edges(stream: KeyedStream) -> list[StreamEdge]:
    return stream.stream._edges((ShipStrategy.HASH, stream.key))


def _check_keys(left: list[str], right: list[str], what: str, site: str) -> None:
    if len(left) != len(right):
        raise GraphValidationError(f"{what} ({site}): the two sides' keys must have as many columns: "
                                   f"{left} and {right}")


def _same_env(left: DataStream, right, what: str, site: str) -> None:
    if not isinstance(right, DataStream) or right.env is not left.env:
        raise GraphValidationError(f"{what} ({site}): the other side must be a stream of the same environment")


class IntervalJoin:
    """``a.key_by(k).interval_join(b.key_by(k)).between(lower, upper).process(fn)``."""

    def __init__(self, left: KeyedStream, right: KeyedStream, site: str):
        if not isinstance(right, KeyedStream):
            raise GraphValidationError(f"interval_join ({site}): join a keyed stream: "
                                       "a.key_by(k).interval_join(b.key_by(k))")
        _same_env(left.stream, right.stream, "interval_join", site)
        _check_keys(left.key, right.key, "interval_join", site)
        self.left, self.right, self.site = left, right, site

    def between(self, lower, upper) -> "IntervalJoined":
        """Rows join when left.ts + lower <= right.ts <= left.ts + upper."""
        low, high = to_ms(lower, "between (lower)"), to_ms(upper, "between (upper)")
        if low > high:
            raise GraphValidationError(f"between ({call_site()}): the lower bound ({low} ms) is above the upper "
                                       f"bound ({high} ms)")
        return IntervalJoined(self, low, high)


class IntervalJoined:
    def __init__(self, join: IntervalJoin, lower: int, upper: int):
        self.join, self.lower, self.upper = join, lower, upper
        self.lower_inclusive = self.upper_inclusive = True

    def lower_bound_exclusive(self) -> "IntervalJoined":
        self.lower_inclusive = False
        return self

    def upper_bound_exclusive(self) -> "IntervalJoined":
        self.upper_inclusive = False
        return self

    def process(self, fn: Optional[Callable] = None, name: str = "interval join",
                parallelism: Optional[int] = None) -> DataStream:
        """The joined rows (both sides' columns; a right column whose name the left has gets the
        suffix "_right"), through fn(DataFrame) -> DataFrame when given."""
        site = call_site()
        left, right = self.join.left, self.join.right
        left_rowtime = _need_event_time(left.stream, "interval_join", site)
        params = {"key": left.key, "right_key": right.key, "left_rowtime": left_rowtime,
                  "right_rowtime": _need_event_time(right.stream, "interval_join", site),
                  "lower": self.lower, "upper": self.upper,
                  "lower_inclusive": self.lower_inclusive, "upper_inclusive": self.upper_inclusive}
        out = two_input("interval-join", name, keyed_edges(left), keyed_edges(right), left.stream.env, params,
                         fn, parallelism, site)
        out.rowtime = left_rowtime if fn is None else None
        return out


class JoinedStreams:
    """``a.join(b).where(k).equal_to(k).window(assigner).apply(fn)``: Flink's window join."""

    def __init__(self, left: DataStream, right: DataStream, site: str):
        _same_env(left, right, "join", site)
        self.left, self.right, self.site = left, right, site
        self.left_key: list[str] = []
        self.right_key: list[str] = []
        self.assigner: Optional[WindowAssigner] = None

    def where(self, *columns: str) -> "JoinedStreams":
        self.left_key = self.left.key_by(*columns).key
        return self

    def equal_to(self, *columns: str) -> "JoinedStreams":
        self.right_key = self.right.key_by(*columns).key
        return self

    def window(self, assigner) -> "JoinedStreams":
        site = call_site()
        self.assigner = _assigner(assigner, "join(...).window", site)
        if not self.assigner.is_event_time or self.assigner.spec["type"] == "session":
            raise GraphValidationError(f"join(...).window ({site}): a window join takes tumbling or sliding "
                                       "event-time windows")
        return self

    def apply(self, fn: Optional[Callable] = None, name: str = "window join",
              parallelism: Optional[int] = None) -> DataStream:
        """Every pair of rows of one key and window, both sides' columns and window_start,
        window_end; through fn(DataFrame) -> DataFrame when given."""
        site = call_site()
        if not self.left_key or not self.right_key or self.assigner is None:
            raise GraphValidationError(f"join ({site}): say .where(columns).equal_to(columns).window(assigner) "
                                       "before apply()")
        _check_keys(self.left_key, self.right_key, "join", site)
        params = {"key": self.left_key, "right_key": self.right_key, "assigner": self.assigner.spec,
                  "left_rowtime": _need_event_time(self.left, "a window join", site),
                  "right_rowtime": _need_event_time(self.right, "a window join", site)}
        left, right = KeyedStream(self.left, self.left_key), KeyedStream(self.right, self.right_key)
        return two_input("window-join", name, keyed_edges(left), keyed_edges(right), self.left.env, params,
                          fn, parallelism, site)


def temporal_join(left: KeyedStream, right: KeyedStream, how: str, name: str, parallelism: Optional[int],
                  site: str) -> DataStream:
    if not isinstance(right, KeyedStream):
        raise GraphValidationError(f"temporal_join ({site}): join a keyed stream: "
                                   "orders.key_by(k).temporal_join(rates.key_by(k))")
    _same_env(left.stream, right.stream, "temporal_join", site)
    _check_keys(left.key, right.key, "temporal_join", site)
    if how not in ("inner", "left"):
        raise GraphValidationError(f"temporal_join ({site}): how must be 'inner' or 'left', got {how!r}")
    event_time = left.stream.rowtime is not None and right.stream.rowtime is not None
    params = {"key": left.key, "right_key": right.key, "how": how,
              "left_rowtime": left.stream.rowtime if event_time else None,
              "right_rowtime": right.stream.rowtime if event_time else None}
    out = two_input("temporal-join", name, keyed_edges(left), keyed_edges(right), left.stream.env, params,
                     None, parallelism, site)
    out.rowtime = left.stream.rowtime
    return out


