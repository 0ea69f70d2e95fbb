"""StreamEnvironment: where a pipeline starts and how it is executed.

As in Flink, ``get_execution_environment()`` gives the context's environment: inside
``streamlab run`` it submits to that command's cluster (attached or detached); elsewhere
``execute()`` starts an embedded local cluster for the job and stops it afterwards.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional

import pandas as pd

from cluster.checkpoint.savepoint_fit import PREVIEW_COLUMNS, upgrade_preview
from cluster.conf import Configuration, ConfigError
from cluster.graph.chaining import StreamEdge, StreamNode, build_job_graph
from cluster.graph.job_graph import GraphValidationError, JobGraph, OperatorSpec, ShipStrategy
from cluster.graph.operator_kinds import KINDS, Role, upsert_key
from cluster.protocol.job_context import (CONTEXT_ALLOW_NON_RESTORED, CONTEXT_CLUSTER_DIR, CONTEXT_DETACHED,
                                          CONTEXT_DRY_RUN, CONTEXT_SAVEPOINT, CONTEXT_VERBOSE)
from cluster.conf.options import CoreOptions, PipelineOptions

from kernel_runtime.client.job_client import JobClient
from kernel_runtime.client.job_handle import JobExecutionResult, JobHandle
from kernel_runtime.client.cluster_info import ClusterInfo
from kernel_runtime.deploy.local import LocalCluster
from kernel_runtime.api.checks import call_site, check_parallelism, pickle_udf, plays, require_parallelism
from kernel_runtime.api.connectors import Connector
from kernel_runtime.api.datastream import DataStream, KeyedStream
from kernel_runtime.api.schema import check_columns
from kernel_runtime.api.sql import analysis, views
from kernel_runtime.api.sql.continuous import build as build_sql
from kernel_runtime.api.time import WatermarkStrategy
from kernel_runtime.api.windowed import IntervalJoin, JoinedStreams, WindowedStream, temporal_join


class StreamEnvironment:
    def __init__(self, parallelism: Optional[int] = None, config: Optional[dict[str, Any]] = None,
                 cluster: Optional[Path] = None):
        self.config: dict[str, Any] = dict(config or {})
        try:
            self._conf = Configuration(self.config, "the job configuration")
        except ConfigError as exc:
            raise GraphValidationError(str(exc)) from None
        self.parallelism = check_parallelism(parallelism, "StreamEnvironment") or self._conf.get(CoreOptions.DEFAULT_PARALLELISM)
        self.max_parallelism = self._conf.get(PipelineOptions.MAX_PARALLELISM)
        self.cluster_dir = Path(cluster) if cluster else None
        self._nodes: list[StreamNode] = []
        self._uids: dict[str, int] = {}
        self._renamed: dict[str, str] = {}  # generated uid -> the uid the user gave (DataStream.uid)
        self._views: dict[str, DataStream] = {}  # temporary views of this environment's streams

    @classmethod
    def get_execution_environment(cls, **kwargs) -> "StreamEnvironment":
        return cls(**kwargs)

    def set_parallelism(self, parallelism: int) -> "StreamEnvironment":
        self.parallelism = require_parallelism(parallelism, "set_parallelism")
        return self

    # ------------------------------------------------------------------ sources
    def from_generator(self, fn: Optional[Callable] = None, *, count: Optional[int] = None,
                       rate: Optional[float] = None, batch_size: Optional[int] = None, name: str = "generator",
                       parallelism: Optional[int] = None, split_size: Optional[int] = None,
                       watermark_strategy: Optional[WatermarkStrategy] = None) -> DataStream:
        """Deterministic rows from sequence numbers 0, 1, 2, ... (``count`` of them, or unbounded).

        ``fn(seq)`` turns a numpy array of sequence numbers into a DataFrame with one row each;
        without it the rows have one column ``seq``. ``rate`` limits rows per second (all
        subtasks together). ``batch_size`` fixes the rows per call of ``fn``; without it each call
        takes what is due (large batches as fast as possible, the rows due at a rate). The sequence
        is cut into splits of ``split_size`` numbers (default 16 batches, of 1,000 rows when no
        batch_size is given), which the subtasks take in turn: subtask i of p reads splits i, i+p, ...
        ``watermark_strategy`` gives the rows event time (see assign_timestamps_and_watermarks)."""
        return self._generator("generator-source", call_site(), fn, {}, count=count, rate=rate,
                               batch_size=batch_size, name=name, parallelism=parallelism, split_size=split_size,
                               watermark_strategy=watermark_strategy)

    def from_testing(self, fn: Optional[Callable] = None, *, count: Optional[int] = None,
                     fail_at: Sentinels = None, kill_at: Sentinels = None, rate: Optional[float] = None,
                     batch_size: Optional[int] = None, name: str = "testing", parallelism: Optional[int] = None,
                     split_size: Optional[int] = None,
                     watermark_strategy: Optional[WatermarkStrategy] = None) -> DataStream:
        """A generator (the same rows, splits and checkpointed position as ``from_generator``) that
        fails as planned, for recovery tests (bytewax's TestingSource): ``fail_at=(row, attempt)``
        raises PlannedFailure, ``kill_at=(row, attempt)`` SIGKILLs the TaskManager, when the subtask
        reading sequence number ``row`` reaches it in job attempt ``attempt`` (1: the first run;
        each restart is one more). The rows before it are emitted first; with checkpointing on, the
        subtask holds at the row until a checkpoint of the attempt has completed, so that the
        restart restores one. Either takes one ``(row, attempt)`` pair or a list of them."""
        site = call_site()
        where = f"operator '{name}' ({site})"
        planned = {"fail_at": _sentinels(fail_at, "fail_at", count, where),
                   "kill_at": _sentinels(kill_at, "kill_at", count, where)}
        return self._generator("testing-source", site, fn, planned, count=count, rate=rate, batch_size=batch_size,
                               name=name, parallelism=parallelism, split_size=split_size,
                               watermark_strategy=watermark_strategy)

    def _generator(self, kind: str, site: str, fn: Optional[Callable], extra: dict, *, count: Optional[int],
                   rate: Optional[float], batch_size: Optional[int], name: str, parallelism: Optional[int],
                   split_size: Optional[int], watermark_strategy: Optional[WatermarkStrategy]) -> DataStream:
        where = f"operator '{name}' ({site})"
        for label, value, low in (("count", count, 0), ("batch_size", batch_size, 1), ("split_size", split_size, 1)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
                raise GraphValidationError(f"{where}: {label} must be an integer >= {low}, got {value!r}")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0):
            raise GraphValidationError(f"{where}: rate must be a positive number of rows per second, got {rate!r}")
        stream = self._source(kind, name, site, {"count": count, "rate": rate, "batch_size": batch_size,
                                                 "split_size": split_size} | extra, fn, parallelism)
        return stream if watermark_strategy is None else stream.assign_timestamps_and_watermarks(watermark_strategy)

    def from_source(self, source: "Connector", watermark_strategy: Optional[WatermarkStrategy] = None,
                    name: Optional[str] = None, parallelism: Optional[int] = None) -> DataStream:
        """Read from a source connector (Flink's fromSource(source, watermarkStrategy, name)), e.g.
        a FileSource or RedisStreamSource; the strategy, if any, makes watermarks per source subtask."""
        site = call_site()
        if not plays(source, Role.SOURCE):
            raise GraphValidationError(f"from_source ({site}): {source!r} is not a source connector")
        if isinstance(watermark_strategy, str) and name is None:  # from_source(source, "name"), as before
            watermark_strategy, name = None, watermark_strategy
        params = dict(source.params)
        if watermark_strategy is not None and "split_watermarks" in params:
            params["split_watermarks"] = True  # a source of several splits at once: a watermark per split
        stream = self._source(source.kind, name or source.name, site, params, source.fn, parallelism)
        return stream if watermark_strategy is None else stream.assign_timestamps_and_watermarks(watermark_strategy)

    def _operator_uid(self, kind: str, name: str, inputs: list[StreamEdge]) -> str:
        """Where the operator stands in the pipeline, hashed (as Flink's generated uids): the same
        script gives the same uids, whatever the parallelism, so its state is found in a savepoint."""
        basis = f"{kind}|{name}|" + ",".join(f"{e.source}/{e.side_output}" for e in inputs)
        self._uids[basis] = self._uids.get(basis, 0) + 1
        return hashlib.sha1(f"{basis}|{self._uids[basis]}".encode()).hexdigest()[:32]

    def _rename(self, node: StreamNode, uid: str) -> None:
        """Give ``node`` the user's uid (DataStream.uid). Streams already made from the operator
        (a side output, a consumer) still name the old one: get_job_graph follows the renaming."""
        self._renamed[node.uid] = uid
        node.spec = dataclasses.replace(node.spec, uid=uid)

    # ------------------------------------------------------------------ what the streams build through it
    # (kernel_runtime.api.datastream.StreamGraph: windowed and time build on the streams, so the
    # streams do not import them)
    def _watermark_strategy(self, strategy, site: str) -> WatermarkStrategy:
        if not isinstance(strategy, WatermarkStrategy):
            raise GraphValidationError(f"assign_timestamps_and_watermarks ({site}): expected a WatermarkStrategy, "
                                       f"got {type(strategy).__name__}")
        return strategy

    def _sql(self, stream: DataStream, query: str, name: str, parallelism: Optional[int], where: str) -> DataStream:
        return build_sql({"input": stream}, query, name, parallelism, where)

    def _windowed(self, stream: DataStream, key: list[str], assigner, site: str) -> WindowedStream:
        return WindowedStream(stream, key, assigner, site)

    def _joined(self, left: DataStream, right: DataStream, site: str) -> JoinedStreams:
        return JoinedStreams(left, right, site)

    def _interval_join(self, left: KeyedStream, right: KeyedStream, site: str) -> IntervalJoin:
        return IntervalJoin(left, right, site)

    def _temporal_join(self, left: KeyedStream, right: KeyedStream, how: str, name: str,
                       parallelism: Optional[int], site: str) -> DataStream:
        return temporal_join(left, right, how, name, parallelism, site)

    def _source(self, kind: str, name: str, site: str, params: dict, fn, parallelism) -> DataStream:
        where = f"operator '{name}' ({site})"
        spec = OperatorSpec(uid=self._operator_uid(kind, name, []), kind=kind, name=name, call_site=site,
                            params=params, udf=pickle_udf(fn, where))
        node = StreamNode(spec, check_parallelism(parallelism, where) or self.parallelism)
        self._nodes.append(node)
        return DataStream(self, node)

    def from_sequence(self, start: int, end: int, name: str = "sequence", **kwargs) -> DataStream:
        """The numbers start..end inclusive, in a column ``value`` (Flink's fromSequence)."""
        return self.from_generator(lambda seq, _s=start: {"value": seq + _s}, count=end - start + 1,
                                   name=name, **kwargs)

    # ------------------------------------------------------------------ SQL over named streams
    def create_temporary_view(self, name: str, stream) -> None:
        """Name a stream for ``sql_query`` (Flink's createTemporaryView): a DataStream of this
        environment, or a function ``env -> DataStream`` that defines the view for every
        environment of the process (each ``%%stream_sql`` cell's too), as CREATE TABLE does."""
        where = f"create_temporary_view ({call_site()})"
        key = views.check_name(name, where)
        if isinstance(stream, DataStream):
            if stream.env is not self:
                raise GraphValidationError(f"{where}: the stream belongs to another environment; give a "
                                           "function env -> DataStream to define a view for every environment")
            self._views[key] = stream
        elif callable(stream):
            views.create_temporary_view(name, stream)
            self._views.pop(key, None)
        else:
            raise GraphValidationError(f"{where}: expected a DataStream or a function env -> DataStream, "
                                       f"got {type(stream).__name__}")

    def sql_query(self, query: str, name: str = "sql", parallelism: Optional[int] = None,
                  site: Optional[str] = None) -> DataStream:
        """Spark SQL over the temporary views (Flink's TableEnvironment.sqlQuery, Spark's spark.sql
        over streaming views): the stream of its result, with what ``.sql`` means over a stream."""
        where = f"operator '{name}' ({site or call_site()})"
        if not isinstance(query, str) or not query.strip():
            raise GraphValidationError(f"{where}: sql_query() takes a SELECT query over temporary views")
        try:
            read = analysis.relations(query)
        except analysis.SqlAnalysisError as exc:
            raise GraphValidationError(f"{where}: Spark refuses the query: {exc}") from None
        defined = views.definitions()
        streams = [r for r in read if r in self._views or r in defined]
        if not streams:
            known = sorted(set(self._views) | set(defined))
            raise GraphValidationError(f"{where}: the query reads {', '.join(read) or 'no table'}, and no temporary "
                                       f"view of that name exists (views: {', '.join(known) or 'none'}); "
                                       "create one with create_temporary_view(name, stream)")
        for view in streams:
            if view not in self._views:
                built = defined[view](self)
                if not isinstance(built, DataStream) or built.env is not self:
                    raise GraphValidationError(f"{where}: the view {view!r}'s definition must return a DataStream "
                                               f"of the environment it is given, got {type(built).__name__}")
                self._views[view] = built
        return build_sql({view: self._views[view] for view in streams}, query, name, parallelism, where)

    # ------------------------------------------------------------------ graph
    def get_job_graph(self, name: str = "streamlab job") -> JobGraph:
        if not any(KINDS[n.spec.kind].is_sink for n in self._nodes):
            raise GraphValidationError("the pipeline has no sink: end it with .collect() or .print()")
        for node in self._nodes:
            for edge in node.inputs:
                while edge.source in self._renamed:  # .uid("a").uid("b") renamed it twice
                    edge.source = self._renamed[edge.source]
        nodes = self._read_by_sinks()
        for node in nodes:
            for edge in node.inputs:
                if edge.ship_strategy == "DEFAULT":  # Flink's rule: forward if it can, else rebalance
                    upstream = next(n for n in self._nodes if n.uid == edge.source)
                    upserts_by = upsert_key(upstream.spec.kind, upstream.spec.params)
                    if upstream.parallelism == node.parallelism:
                        edge.ship_strategy = ShipStrategy.FORWARD
                    elif upserts_by and KINDS[node.spec.kind].is_sink and edge.side_output is None:
                        # a sink gets each key's updates in order (Flink's table.exec.sink.keyed-shuffle):
                        # rebalanced, an older update of a key could overtake a newer one
                        edge.ship_strategy, edge.key = ShipStrategy.HASH, upserts_by
                    else:
                        edge.ship_strategy = ShipStrategy.REBALANCE
                if node.parallelism > self.max_parallelism:
                    raise GraphValidationError(
                        f"{node.spec.where()}: parallelism {node.parallelism} exceeds pipeline.max-parallelism "
                        f"{self.max_parallelism}")
        check_columns(nodes)
        config = dict(self.config)
        if os.environ.get(CONTEXT_SAVEPOINT):  # streamlab run -s PATH
            config.setdefault("execution.savepoint.path", os.environ[CONTEXT_SAVEPOINT])
            if os.environ.get(CONTEXT_ALLOW_NON_RESTORED) == "1":  # streamlab run -s PATH -n
                config.setdefault("execution.savepoint.ignore-unclaimed-state", True)
        return build_job_graph(nodes, name, self.max_parallelism, config)

    def _read_by_sinks(self) -> list:
        """The operators some sink reads from, in the order they were made: as Flink translates only
        what its sinks read, a view's source that no query of the job uses does not run."""
        by_uid = {n.uid: n for n in self._nodes}
        read: set[str] = set()
        stack = [n.uid for n in self._nodes if KINDS[n.spec.kind].is_sink]
        while stack:
            uid = stack.pop()
            if uid not in read:
                read.add(uid)
                stack.extend(edge.source for edge in by_uid[uid].inputs)
        return [n for n in self._nodes if n.uid in read]

    # ------------------------------------------------------------------ execution
    def _given_cluster_dir(self) -> Optional[Path]:
        """The cluster to submit to: the environment's own, else `streamlab run`'s (None: an embedded one)."""
        given = self.cluster_dir or os.environ.get(CONTEXT_CLUSTER_DIR)
        return Path(given) if given else None

    def execute_async(self, name: str = "streamlab job", client: Optional[JobClient] = None,
                      detached: bool = False) -> JobHandle:
        graph = self.get_job_graph(name)
        client = client or JobClient(ClusterInfo.load(self._given_cluster_dir()))
        return client.submit(graph, detached=detached)

    def execute(self, name: str = "streamlab job") -> JobExecutionResult | JobHandle:
        """Run the job and wait for it; inside `streamlab run -d`, submit it and return its handle;
        inside `streamlab run --dry-run -s PATH`, print what starting from the savepoint would do
        with each operator's state and exit (1 if the start would be refused), submitting nothing."""
        graph = self.get_job_graph(name)
        if os.environ.get(CONTEXT_DRY_RUN) == "1":
            _print_preview(graph)
        cluster_dir = self._given_cluster_dir()
        if cluster_dir is not None:
            client = JobClient(ClusterInfo.load(cluster_dir))
            return _run(client, graph, detached=os.environ.get(CONTEXT_DETACHED) == "1",
                        verbose=os.environ.get(CONTEXT_VERBOSE) == "1")
        slots = max(1, math.ceil(max(n.parallelism for n in self._nodes) / 2))
        with _embedded_cluster(taskmanagers=2, slots=slots) as cluster:
            client = JobClient(cluster.info)
            try:
                return _run(client, graph, detached=False, verbose=False)
            finally:
                client.close()


def _print_preview(graph: JobGraph) -> NoReturn:
    location = graph.config["execution.savepoint.path"]
    rows, refusal = upgrade_preview(location, graph, bool(graph.config.get("execution.savepoint.ignore-unclaimed-state")))
    print(f"Dry run of job {graph.name!r} from the savepoint {location}: nothing submitted.")
    print(pd.DataFrame(rows, columns=PREVIEW_COLUMNS).to_string(index=False))
    if refusal is not None:
        print(f"The start would be refused: {refusal}.")
        raise SystemExit(1)
    raise SystemExit(0)


Sentinels = Optional[tuple[int, int] | list[tuple[int, int]]]


def _sentinels(given: Sentinels, label: str, count: Optional[int], where: str) -> list[list[int]]:
    """``(row, attempt)`` or a list of them, checked, as lists (the job graph's plain data)."""
    if given is None:
        return []
    pairs = [given] if isinstance(given, tuple) else list(given) if isinstance(given, list) else [given]
    for pair in pairs:
        ok = isinstance(pair, (tuple, list)) and len(pair) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in pair)
        if not ok or pair[0] < 0 or pair[1] < 1 or (count is not None and pair[0] >= count):
            raise GraphValidationError(f"{where}: {label} takes (row, attempt) pairs with 0 <= row < count and "
                                       f"attempt >= 1, got {pair!r}")
    return [[int(row), int(attempt)] for row, attempt in pairs]


def _embedded_cluster(taskmanagers: int, slots: int) -> LocalCluster:
    import tempfile
    directory = Path(tempfile.mkdtemp(prefix="streamlab-embedded-"))
    return LocalCluster(directory, taskmanagers=taskmanagers, slots=slots, embedded=True)


def _run(client: JobClient, graph: JobGraph, detached: bool, verbose: bool):
    handle = client.submit(graph, detached=detached)
    if detached:
        print(f"Job has been submitted with JobID {handle.job_id}")
        return handle
    if verbose:
        print(f"Job has been submitted with JobID {handle.job_id}")
    on_status = (lambda s: print(f"{s.name}: {s.state}" + (f" ({s.reason})" if s.reason else ""))) \
        if verbose else None
    result = handle.wait(on_status=on_status)
    if verbose:
        for sink, frame in result.results.items():
            print(f"\n{sink}: {len(frame)} rows")
            print(frame.to_string(index=False, max_rows=60))
        print(f"\nJob '{result.name}' {result.state} in {result.duration_ms / 1000:.1f} s")
    return result
