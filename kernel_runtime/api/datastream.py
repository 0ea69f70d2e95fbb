"""DataStream and KeyedStream: the pipeline as the user writes it, one StreamNode per call.

Every call records where in the user's code it was made, and checks what it can on the spot
(parallelism, picklability of the function, key columns), so a mistake is reported at the line
that made it, before anything is submitted.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from cluster.conf import Configuration
from cluster.graph.aggregations import AGGREGATE_FUNCTIONS
from cluster.graph.chaining import StreamEdge, StreamNode
from cluster.graph.job_graph import GraphValidationError, OperatorSpec, ShipStrategy
from cluster.graph.operator_kinds import KINDS, Role

from kernel_runtime.api.checks import call_site, check_parallelism, pickle_udf, plays, require_parallelism

if TYPE_CHECKING:
    import pyarrow as pa

    from kernel_runtime.api.connectors import Connector


class StreamGraph(Protocol):
    """What a stream asks of its environment (kernel_runtime.api.environment.StreamEnvironment):
    the graph its operators join, and the windows, joins and watermark strategies. The modules of
    those (kernel_runtime.api.windowed, .time) are built on the streams, so a stream reaches them
    through its environment instead of importing them; they are typed here by what they are."""

    parallelism: int
    _nodes: list[StreamNode]
    _conf: Configuration  # the job's configuration (SQL reads table.exec.state.ttl)

    def _operator_uid(self, kind: str, name: str, inputs: list[StreamEdge]) -> str: ...

    def _rename(self, node: StreamNode, uid: str) -> None: ...

    def _watermark_strategy(self, strategy: Any, site: str) -> Any: ...

    def _sql(self, stream: DataStream, query: str, name: str, parallelism: Optional[int], where: str) -> DataStream: ...

    def _windowed(self, stream: DataStream, key: list[str], assigner: Any, site: str) -> Any: ...

    def _joined(self, left: DataStream, right: DataStream, site: str) -> Any: ...

    def _interval_join(self, left: KeyedStream, right: KeyedStream, site: str) -> Any: ...

    def _temporal_join(self, left: KeyedStream, right: KeyedStream, how: str, name: str,
                       parallelism: Optional[int], site: str) -> DataStream: ...


class DataStream:
    """A stream: the output of one operator (or of a side output, or a union of streams)."""

    def __init__(self, env: StreamGraph, node: Optional[StreamNode],
                 upstreams: Optional[list[tuple[str, Optional[str]]]] = None,
                 partitioning: Optional[tuple[str, list[str]]] = None):
        self.env = env
        self.node = node  # None for a union, which has no operator of its own
        # (node uid, side output tag)
        if upstreams:
            self._upstreams = upstreams
        elif node is not None:
            self._upstreams = [(node.uid, None)]
        else:
            raise ValueError("a DataStream needs its operator's node or, for a union, its upstreams")
        self._partitioning = partitioning  # (ship strategy, key) set by rebalance()/broadcast()/key_by
        # the column holding the rows' event time, set by a watermark strategy; kept through the
        # operators that keep the rows' columns (a keyed aggregate's rows have none)
        self.rowtime: Optional[str] = None

    # ------------------------------------------------------------------ building
    def _edges(self, partitioning: Optional[tuple[str, list[str]]] = None) -> list[StreamEdge]:
        strategy, key = partitioning or self._partitioning or ("DEFAULT", [])
        return [StreamEdge(uid, strategy, list(key), side) for uid, side in self._upstreams]

    def _add(self, kind: str, name: str, fn: Optional[Callable] = None, params: Optional[dict] = None,
             parallelism: Optional[int] = None, partitioning: Optional[tuple[str, list[str]]] = None) -> StreamNode:
        site = call_site()
        where = f"operator '{name}' ({site})"
        edges = self._edges(partitioning)
        spec = OperatorSpec(uid=self.env._operator_uid(kind, name, edges), kind=kind, name=name, call_site=site,
                            params=params or {}, udf=pickle_udf(fn, where))
        node = StreamNode(spec, check_parallelism(parallelism, where) or self.env.parallelism, edges)
        self.env._nodes.append(node)
        return node

    def _then(self, kind: str, name: str, fn=None, params=None, parallelism=None, partitioning=None) -> "DataStream":
        if KINDS[kind].is_sink and self.rowtime:  # the sink counts its rows' event-time lag (cluster.protocol.latency)
            params = dict(params or {}, rowtime=self.rowtime)
        out = DataStream(self.env, self._add(kind, name, fn, params, parallelism, partitioning))
        if not KINDS[kind].keyed:
            out.rowtime = self.rowtime
        return out

    # ------------------------------------------------------------------ time
    def assign_timestamps_and_watermarks(self, strategy) -> "DataStream":
        """Event time from a WatermarkStrategy (Flink's assignTimestampsAndWatermarks), chained
        to this operator, so the watermarks are made per subtask of it (per source split)."""
        site = call_site()
        strategy = self.env._watermark_strategy(strategy, site)
        name = "Timestamps/Watermarks"
        params = strategy.params(f"operator '{name}' ({site})")
        parallelism = self.node.parallelism if self.node is not None and len(self._upstreams) == 1 else None
        out = self._then("timestamps-watermarks", name, strategy.assigner, params, parallelism)
        out.rowtime = strategy.column
        return out

    def window_all(self, assigner) -> Any:
        """Windows over all rows, in one subtask (Flink's windowAll): a WindowedStream."""
        return self.env._windowed(self, [], assigner, call_site())

    def window(self, assigner) -> Any:
        raise GraphValidationError(f"window ({call_site()}): window() needs a keyed stream: "
                                   "key_by(...).window(...); for all rows in one window use window_all(...)")

    def join(self, other: "DataStream") -> Any:
        """A window join (Flink's join(...).where(...).equal_to(...).window(...).apply()): JoinedStreams."""
        return self.env._joined(self, other, call_site())

    def map_batches(self, fn: Callable, name: str = "map_batches", parallelism: Optional[int] = None) -> "DataStream":
        """fn(pandas.DataFrame) -> pandas.DataFrame, applied to every batch."""
        return self._then("map-batches", name, fn, parallelism=parallelism)

    def filter(self, fn: Callable, name: str = "filter", parallelism: Optional[int] = None) -> "DataStream":
        """fn(pandas.DataFrame) -> boolean mask; keeps the rows where it is True."""
        return self._then("filter", name, fn, parallelism=parallelism)

    def spark(self, fn: Callable, name: str = "spark", parallelism: Optional[int] = None) -> "DataStream":
        """fn(pyspark DataFrame) -> pyspark DataFrame, run on the TaskManager's SparkSession per batch.

        Consecutive .spark/.sql steps run as one Spark plan per batch."""
        return self._then("spark", name, fn, parallelism=parallelism)

    def sql(self, query: str, name: str = "sql", parallelism: Optional[int] = None,
            per_batch: bool = False) -> "DataStream":
        """Spark SQL over the stream, which is the view ``input``: ``SELECT ... FROM input``.

        It means what it means in Spark Structured Streaming and Flink SQL: a query that projects
        and filters runs on each batch; ``GROUP BY`` (or an aggregate over all rows, or ``SELECT
        DISTINCT``) is a continuous aggregation over all batches so far, an upsert stream keyed
        by the grouping columns (kernel_runtime.api.sql.planner); what cannot be planned over a
        stream is refused here. ``per_batch=True`` runs the query on each batch on its own, as
        Spark's foreachBatch would."""
        where = f"operator '{name}' ({call_site()})"
        if not isinstance(query, str) or not query.strip():
            raise GraphValidationError(f"{where}: sql() takes a SELECT ... FROM input query")
        if "input" not in query.lower():
            raise GraphValidationError(f"{where}: the query must read the batch "
                                       f"as the view 'input' (SELECT ... FROM input), got {query!r}")
        if per_batch:
            return self._then("spark", name, params={"sql": query}, parallelism=parallelism)
        return self.env._sql(self, query, name, parallelism, where)

    # how a .sql step was planned (kernel_runtime.api.sql.planner), for explain()
    sql_plan: Any = None
    # the columns of a SQL result that keyed state emits (unknown to sampling until it runs), from
    # Spark's analysis of the query: a view of it can be planned over
    known_schema: Optional[pa.Schema] = None

    def explain(self) -> str:
        """How the .sql step that made this stream runs: per batch on Spark, or which parts run
        per batch on Spark and which in keyed state, with the key and the output's kind."""
        return "not a .sql step's stream" if self.sql_plan is None else self.sql_plan.explain()

    def key_by(self, *columns: str) -> "KeyedStream":
        site = call_site()
        if not columns or not all(isinstance(c, str) and c for c in columns):
            raise GraphValidationError(f"key_by ({site}): give one or more column names, got {columns!r}")
        return KeyedStream(self, list(columns))

    def drop_duplicates(self, subset, keep: str = "first", name: str = "drop_duplicates",
                        parallelism: Optional[int] = None) -> "DataStream":
        """One row per value of the ``subset`` columns, as Spark's dropDuplicates and pandas'
        drop_duplicates: the first row to arrive (``keep="first"``: an append stream, each key
        once) or the latest (``keep="last"``: an upsert stream keyed by ``subset``). The kept
        rows live in keyed state, one per key, for as long as the job runs; with the stream's
        event-time column in ``subset``, until the watermark passes a key's time (Spark's
        dropDuplicates with a watermark: a row behind the watermark is late, dropped and counted)."""
        site = call_site()
        columns = [subset] if isinstance(subset, str) else list(subset or ())
        if not columns or not all(isinstance(c, str) and c for c in columns):
            raise GraphValidationError(f"drop_duplicates ({site}): give the column(s) a row is a duplicate by, "
                                       f"got {subset!r}")
        if keep not in ("first", "last"):
            raise GraphValidationError(f"drop_duplicates ({site}): keep must be 'first' or 'last', got {keep!r}")
        # with the event time among the columns, a key's row is kept until the watermark passes it
        time_column = self.rowtime if self.rowtime in columns else None
        out = self._then("keyed-deduplicate", name, params={"key": columns, "order": [], "keep_latest": keep == "last",
                                                            "time_column": time_column},
                         parallelism=parallelism, partitioning=(ShipStrategy.HASH, columns))
        out.rowtime = self.rowtime if time_column is not None and keep == "first" else None
        return out

    def rebalance(self) -> "DataStream":
        """Spread batches round-robin over the next operator's subtasks."""
        return self._view(DataStream(self.env, self.node, self._upstreams, (ShipStrategy.REBALANCE, [])))

    def broadcast(self) -> "DataStream":
        """Send every batch to every subtask of the next operator."""
        return self._view(DataStream(self.env, self.node, self._upstreams, (ShipStrategy.BROADCAST, [])))

    def union(self, *others: "DataStream") -> "DataStream":
        """One stream of the rows of all of them (their schemas should match)."""
        streams = [self, *others]
        if any(not isinstance(o, DataStream) or o.env is not self.env for o in others):
            raise GraphValidationError(f"union ({call_site()}): only streams of the same environment can be united")
        if any(o._partitioning for o in streams):
            raise GraphValidationError(f"union ({call_site()}): unite first, then rebalance()/broadcast()/key_by()")
        united = DataStream(self.env, None, [u for o in streams for u in o._upstreams])
        if len({o.rowtime for o in streams}) == 1:
            united.rowtime = self.rowtime
        return united

    def get_side_output(self, tag: str) -> "DataStream":
        """The rows this operator set aside under ``tag`` (e.g. "malformed", with their reason)."""
        if self.node is None or len(self._upstreams) != 1 or self._upstreams[0][1] is not None:
            raise GraphValidationError(f"get_side_output ({call_site()}): take side outputs of an operator's stream")
        side = DataStream(self.env, self.node, [(self.node.uid, tag)])
        side.rowtime = self._side_rowtimes.get(tag)
        return side

    def uid(self, uid: str) -> "DataStream":
        """Pin this operator's uid (Flink's SingleOutputStreamOperator.uid): a savepoint's state
        finds its operator by uid, and a generated one follows the operator's place in the
        pipeline, so an operator inserted before it would change it. Unique within the job."""
        site = call_site()
        if self.node is None or self._upstreams != [(self.node.uid, None)]:
            raise GraphValidationError(f"uid ({site}): a uid belongs to an operator; call it on the stream "
                                       "an operator returns (not a union or a side output)")
        if not isinstance(uid, str) or not uid.strip():
            raise GraphValidationError(f"uid ({site}): expected a non-empty string, got {uid!r}")
        if uid == self.node.uid:
            return self
        taken = next((n for n in self.env._nodes if n.uid == uid), None)
        if taken is not None:
            raise GraphValidationError(f"uid ({site}): {taken.spec.where()} has the uid {uid!r} already; "
                                       "each operator of a job needs its own")
        self.env._rename(self.node, uid)
        self._upstreams = [(uid, None)]
        return self

    def set_parallelism(self, parallelism: int) -> "DataStream":
        if self.node is None:
            raise GraphValidationError(f"set_parallelism ({call_site()}): a union has no operator of its own")
        self.node.parallelism = require_parallelism(parallelism, self.node.spec.where())
        return self

    _changelog = False  # set on the view changelog() returns
    # an upsert stream whose rows also delete keys (cluster.graph.operator_kinds.ROW_KIND_COLUMN)
    deletes = False

    def changelog(self) -> "DataStream":
        """This stream as its changelog, as Flink's toChangelogStream: a collect sink after it keeps
        every row, each update of a key included, where over an upsert stream (count, aggregate,
        reduce) it keeps by default the table: the latest row per key. Those operators only insert
        and update keys (no retractions, no deletes), so the changelog is their rows as emitted."""
        view = self._view(DataStream(self.env, self.node, self._upstreams, self._partitioning))
        view._changelog = True
        return view

    def _view(self, view: "DataStream") -> "DataStream":
        """Another view of this stream's rows: their event time is the same."""
        view.rowtime = self.rowtime
        view._side_rowtimes = self._side_rowtimes
        view.known_schema = self.known_schema
        view.deletes = self.deletes
        return view

    # the event time of side outputs that carry input rows (a window's late rows), by tag
    _side_rowtimes: dict[str, Optional[str]] = {}

    # ------------------------------------------------------------------ sinks
    def collect(self, name: str = "collect") -> "DataStream":
        """Stream this stream's batches back to the client; the job's result under ``name``: the
        table per key of an upsert stream, every row of any other or of a ``changelog()``."""
        if any(n.spec.kind == "collect-sink" and n.spec.name == name for n in self.env._nodes):
            raise GraphValidationError(f"collect ({call_site()}): a collect sink named {name!r} exists; "
                                       "give each a different name")
        return self._then("collect-sink", name, params={"changelog": True} if self._changelog else None)

    def print(self, name: str = "print") -> "DataStream":
        """Print rows on the TaskManagers' standard output (their log files)."""
        return self._then("print-sink", name)

    def sink_to(self, sink: "Connector", name: Optional[str] = None,
                parallelism: Optional[int] = None) -> "DataStream":
        """Write to a sink connector (Flink's sinkTo), e.g. a Parquet FileSink."""
        if not plays(sink, Role.SINK):
            raise GraphValidationError(f"sink_to ({call_site()}): {sink!r} is not a sink connector")
        if self.deletes and sink.kind != "discarding-sink":  # one that drops every row takes deletes too
            raise GraphValidationError(f"sink_to ({call_site()}): this stream's keys are deleted when their row leaves "
                                       "its query's result (a HAVING or WHERE it stops passing, an aggregation over "
                                       "an aggregation whose rows all moved away), and a sink connector only adds "
                                       "rows: collect() it, or filter the sink's rows downstream instead")
        return self._then(sink.kind, name or sink.name, sink.fn, dict(sink.params), parallelism)


def aggregation_spec(aggregations: dict, where: str, functions: tuple[str, ...] = AGGREGATE_FUNCTIONS) -> dict:
    """Named aggregations as pandas names them, checked: {out: [column, function]}."""
    if not aggregations:
        raise GraphValidationError(f"{where}: name at least one aggregation, e.g. aggregate(total=('amount', 'sum'))")
    spec = {}
    for out, agg in aggregations.items():
        if (not isinstance(agg, tuple) or len(agg) != 2 or not isinstance(agg[0], str)
                or agg[1] not in functions):
            raise GraphValidationError(f"{where}: {out}={agg!r} must be (column, function) with "
                                       f"function one of {', '.join(functions)}")
        spec[out] = [agg[0], agg[1]]
    return spec


class KeyedStream:
    def __init__(self, stream: DataStream, key: list[str]):
        self.stream = stream
        self.key = key

    def map_batches(self, fn: Callable, name: str = "map_batches", parallelism: Optional[int] = None) -> DataStream:
        """fn(pandas.DataFrame) -> pandas.DataFrame on hash-partitioned batches: all rows of a key
        reach the same subtask."""
        return self.stream._then("map-batches", name, fn, parallelism=parallelism, partitioning=(ShipStrategy.HASH, self.key))

    def window(self, assigner) -> Any:
        """Windows per key: ``window(TumblingEventTimeWindows.of(Time.seconds(10)))``: a WindowedStream."""
        return self.stream.env._windowed(self.stream, self.key, assigner, call_site())

    def interval_join(self, other: "KeyedStream") -> Any:
        """Rows of both streams with the same key and times within ``between(lower, upper)``: an IntervalJoin."""
        return self.stream.env._interval_join(self, other, call_site())

    def temporal_join(self, other: "KeyedStream", how: str = "inner", name: str = "temporal join",
                      parallelism: Optional[int] = None) -> DataStream:
        """Each row with the row of ``other`` valid for its key at its time (Flink's temporal
        join): as of its event time when both streams have one, else the latest row now."""
        return self.stream.env._temporal_join(self, other, how, name, parallelism, call_site())

    def count(self, name: str = "count", parallelism: Optional[int] = None) -> DataStream:
        """A running count per key: each batch emits the new count of every key it holds."""
        return self.stream._then("keyed-count", name, params={"key": self.key}, parallelism=parallelism,
                                 partitioning=(ShipStrategy.HASH, self.key))

    def aggregate(self, name: str = "aggregate", parallelism: Optional[int] = None,
                  **aggregations: tuple[str, str]) -> DataStream:
        """Running aggregates per key, named as pandas does: ``aggregate(total=("amount", "sum"),
        n=("amount", "count"), avg=("amount", "mean"))``; functions: sum, count, min, max, mean,
        nunique, first, last (the first and last non-null), std, var (of a sample), and as Spark
        names them: std_pop, var_pop, collect_list, collect_set, sum_distinct, mean_distinct,
        first_row, last_row (the first and last row's, null or not).

        Partial aggregates are computed per batch before the exchange, inside the upstream Spark
        plan when the upstream is a Spark step, and merged into keyed state after it."""
        spec = aggregation_spec(aggregations, f"aggregate ({call_site()})")
        upstream = self.stream.node
        pre = None
        if upstream is not None and self.stream._partitioning is None and len(self.stream._upstreams) == 1 \
                and self.stream._upstreams[0][1] is None:
            params = {"key": self.key, "partial_aggregate": spec} if upstream.spec.kind == "spark" \
                else {"key": self.key, "aggregations": spec}
            kind = "spark" if upstream.spec.kind == "spark" else "local-aggregate"
            pre = self.stream._then(kind, f"{name} (partial)", params=params, parallelism=upstream.parallelism)
        source = pre or self.stream
        return source._then("keyed-aggregate", name, params={"key": self.key, "aggregations": spec,
                                                              "pre_aggregated": pre is not None},
                            parallelism=parallelism, partitioning=(ShipStrategy.HASH, self.key))

    def reduce(self, fn: Callable, name: str = "reduce", parallelism: Optional[int] = None) -> DataStream:
        """fn(accumulated, new) -> combined, on DataFrames of aligned rows (one per key, all columns):
        folds each key's rows into one, kept in keyed state; emits each touched key's value."""
        return self.stream._then("keyed-reduce", name, fn, params={"key": self.key}, parallelism=parallelism,
                                 partitioning=(ShipStrategy.HASH, self.key))

    def process(self, fn: Callable, name: str = "process", parallelism: Optional[int] = None,
                on_timer: Optional[Callable] = None) -> DataStream:
        """fn(key, rows, state) -> DataFrame or None, per key and batch, with Flink's keyed state:
        ``state.value_state("n")`` (.value()/.update()), ``state.list_state(..)``, ``state.map_state(..)``,
        and timers: ``state.timer_service().register_event_time_timer(ms)`` (or processing time);
        each calls on_timer(key, timestamp, state) -> DataFrame or None when it fires."""
        params: dict = {"key": self.key}
        if on_timer is not None:
            params["on_timer"] = pickle_udf(on_timer, f"process ({call_site()}): on_timer")
        return self.stream._then("keyed-process", name, fn, params=params, parallelism=parallelism,
                                 partitioning=(ShipStrategy.HASH, self.key))
