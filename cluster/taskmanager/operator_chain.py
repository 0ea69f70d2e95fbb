"""OperatorChain: the operators of one subtask, built from its vertex's specs, and their outputs.

A vertex of the JobGraph is a chain of operators; a task runs one subtask of it. The chain makes
the record writers of the vertex's outgoing edges (the main output, and the side outputs by
operator uid and tag), then each operator from its kind's implementation (OPERATORS, from
cluster.taskmanager.operator_registry), consecutive operators of a Spark kind as one SparkChain:
one Spark plan per batch.

Tables go through the operators one after the other, then to the writers. The chain's (first)
Spark chain runs on threads of its own (the SparkStage): the tables that reach it are handed to
the stage, and what the stage has finished is handed on through the rest of the chain whenever
the task thread looks (``hand_on``). Watermarks and processing time go through the chain with
TaskTime, which the chain makes once its operators have opened.

Thread use: the task thread only, which builds and owns the chain. Other threads read only
``operators`` (swapped in whole once built), through ``operator_metrics``, and ``time``'s
watermarks, for the task's metrics.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from typing import Callable, Optional

import pyarrow as pa

from cluster.checkpoint.barriers import Barrier
from cluster.common.clock import now_ms
from cluster.conf import TaskConfig
from cluster.graph.deployment import TaskDeploymentDescriptor
from cluster.graph.job_graph import OperatorSpec
from cluster.graph.operator_kinds import KINDS, Role
from cluster.operators.base import Operator, OperatorContext, UserFunctionError
from cluster.operators.windowing.watermarks import TimestampError, rowtime_ms
from cluster.protocol.latency import LatencyHistogram, oldest_of
from cluster.protocol.metrics import LATE_ROWS, NEWEST_EVENT_TIMESTAMP, NUM_LATE_RECORDS_DROPPED
from cluster.spark.chain import SparkChain
from cluster.spark.fusion import FusionGroup
from cluster.spark.stage import SparkStage
from cluster.taskmanager.network import ChannelSender, NetworkEnvironment
from cluster.taskmanager.operator_registry import OPERATORS
from cluster.taskmanager.output_types import OutputTypes
from cluster.taskmanager.record_writer import RecordWriter, concat
from cluster.taskmanager.task_metrics import TaskMetrics
from cluster.taskmanager.task_time import TaskTime


class OperatorChain:
    def __init__(self, tdd: TaskDeploymentDescriptor, task_name: str, config: TaskConfig,
                 network: NetworkEnvironment, sender: ChannelSender, metrics: TaskMetrics,
                 cancelled: threading.Event):
        """The outputs only: the operators come after (``create_operators``), so that a task whose
        operator cannot be loaded still has the writers whose channels it must release."""
        self.tdd, self.task_name, self.config = tdd, task_name, config
        self.sender, self.cancelled, self.metrics = sender, cancelled, metrics
        self.operators: list[Operator] = []
        self.sink_at = -1  # the index of the chain's sink, the last operator, if it ends in one
        self.output_types: list[OutputTypes] = []  # one per operator: its output's column types
        # those whose open() returned, closed or not (the task appends; any thread reads their metrics)
        self.opened: list[Operator] = []
        self.writers: list[RecordWriter] = []        # the chain's main output
        self.side_writers: dict[tuple[str, str], list[RecordWriter]] = {}  # (operator uid, tag)
        self.stage: Optional[SparkStage] = None  # the chain's (first) Spark chain, run on threads of its own
        self.stage_at = -1                         # its index in the chain
        self.time: Optional[TaskTime] = None       # watermarks and processing time (task_time)
        self.two_inputs = False                    # the head takes two inputs (a join): tables come by side
        # when the oldest rows of what the chain processes now were read by their source (epoch ms,
        # 0: unknown): the task sets it per input, its outputs carry it (cluster.protocol.latency)
        self.stamp = 0
        self._stage_stamps: deque[tuple[int, int]] = deque()  # (rows submitted to Spark up to them, stamp)
        self.latency = LatencyHistogram()  # ingestion to the chain's sink, of the rows it was given
        self.event_lag = LatencyHistogram()  # the wall clock minus their event time, where they have one
        for desc in tdd.outputs:
            writer = RecordWriter(desc, tdd.subtask, network, sender, metrics, cancelled,
                                  config.batch_size, config.buffer_timeout_ms / 1000)
            writer.ingested_of = lambda: self.stamp
            if desc.side_output is None:
                self.writers.append(writer)
            else:
                uid, tag = desc.side_output
                self.side_writers.setdefault((uid, tag), []).append(writer)

    def create_operators(self, set_detail: Callable[[str], None]) -> None:
        """``set_detail``: how an operator says what its task waits for (shown in the job's status)."""
        tdd = self.tdd
        ctx = OperatorContext(
            job_id=tdd.job_id, job_name=tdd.job_name, attempt=tdd.attempt, subtask=tdd.subtask,
            parallelism=tdd.vertex["parallelism"], max_parallelism=tdd.vertex["max_parallelism"],
            config=self.config, result_address=tdd.result_address, cancelled=self.cancelled, sender=self.sender,
            side_outputs=frozenset(self.side_writers), emit_side=self._emit_side,
            execution_id=tdd.execution_id, task_name=self.task_name, set_detail=set_detail,
            before_idle=self.flush_outputs,
            restored_checkpoint=tdd.restore["checkpoint_id"] if tdd.restore else 0)
        operators: list[Operator] = []
        specs = [OperatorSpec(**o) for o in tdd.vertex["operators"]]
        # consecutive operators of a Spark kind become one operator: one Spark plan per batch
        for _, group in itertools.groupby(specs, key=lambda s: s.kind if KINDS[s.kind].spark else s.uid):
            members = list(group)
            implementation = OPERATORS[members[0].kind]
            if KINDS[members[0].kind].spark and not issubclass(implementation, SparkChain):
                raise TypeError(f"{members[0].where()}: Spark kind {members[0].kind!r} is run by "
                                f"{implementation.__name__}, which is not a SparkChain")
            try:
                operators.append(implementation(members, ctx) if issubclass(implementation, SparkChain)
                                 else implementation(members[0], ctx))
            except Exception as exc:
                raise UserFunctionError(f"{members[0].where()} could not be loaded on the TaskManager: "
                                        f"{type(exc).__name__}: {exc}") from exc
        self.operators = operators
        if KINDS[operators[-1].spec.kind].role is Role.SINK:
            self.sink_at = len(operators) - 1
        self.output_types = [OutputTypes(op.spec.where()) for op in operators]
        self.two_inputs = KINDS[operators[0].spec.kind].two_inputs

    def start_time(self, inputs: list[str]) -> None:
        """After the operators opened: what they say of time (processing-time windows) is known.
        ``inputs``: the task's input channels, whose watermarks it combines."""
        self.time = TaskTime(self.operators, self.push, self.emit_watermark, self.emit_status,
                             self.config.watermark_interval_ms)
        if inputs:
            self.time.set_inputs(inputs)

    def start_stage(self, wake: Callable[[], None]) -> None:
        """The Spark hand-off, if the chain has a Spark chain: its batches run on the stage's
        threads, which call ``wake`` when one is done (so that the task thread hands it on)."""
        found = next(((i, op) for i, op in enumerate(self.operators) if isinstance(op, SparkChain)), None)
        if found is None:
            return
        index, spark = found
        self.stage_at = index
        config = self.config
        # no job takes more than the TaskManager's budget for batches in its Spark JVM (spark_memory)
        max_bytes = min(config.spark_max_batch_bytes, spark.memory.capacity)
        self.stage = SparkStage(spark.process, spark.cancel_jobs, spark.spec.where(),
                                config.spark_max_batch_rows, max_bytes,
                                config.spark_max_concurrent_batches, self.cancelled, wake)
        if config.spark_fuse_subtasks and spark.ctx.parallelism > 1 and config.spark_max_concurrent_batches == 1:
            key = (spark.ctx.job_id, spark.ctx.attempt, spark.spec.uid)
            self.stage.group = FusionGroup.join(key, self.stage, spark)
        if self.time is not None:
            self.time.set_stage(self.stage, index)

    def task_time(self) -> TaskTime:
        if self.time is None:
            raise RuntimeError(f"task {self.task_name}: run before start_time made its TaskTime")
        return self.time

    # ------------------------------------------------------------------ tables through the chain
    def push_input(self, tables: dict[int, list[pa.Table]]) -> None:
        """What came on the inputs, into the chain: one batch, or one per side of a join."""
        if self.two_inputs:
            head = self.operators[0]
            for side in sorted(tables):
                self.push(1, head.process_side(side, concat(tables[side])))
            return
        try:
            batches = [concat(tables[0])]
        except pa.ArrowInvalid:  # inputs of a union with schemas that do not merge
            batches = tables[0]
        self.push(0, batches)

    def push(self, start: int, tables: list[pa.Table]) -> None:
        """``tables`` (the output of operator ``start - 1``: a source's poll, Spark's results, a
        timer's firing) through the operators from index ``start`` on, then out."""
        if start > 0:
            for table in tables:
                self.output_types[start - 1].check(table)
        for index in range(start, len(self.operators)):
            op = self.operators[index]
            if index == self.stage_at and self.stage is not None:
                answered = self._answered_here(op, tables)
                if answered is None:
                    self.stage.submit(tables)  # on to the rest of the chain once Spark is done (hand_on)
                    self._stage_stamps.append((self.stage.rows_submitted, self.stamp))
                    self.hand_on()
                    return
                out = answered
            else:
                if index == self.sink_at:
                    self._delivered(op, tables)
                out = []
                for table in tables:
                    out.extend(op.process(table))
            for table in out:
                self.output_types[index].check(table)
            tables = out
            if not tables:
                return
        for table in tables:
            for writer in self.writers:
                writer.emit(table)

    @property
    def stage_busy(self) -> bool:
        """Whether the Spark stage holds batches whose outputs are not yet handed on."""
        return self.stage is not None and not self.stage.idle

    def _answered_here(self, spark: Operator, tables: list[pa.Table]) -> Optional[list[pa.Table]]:
        """The Spark chain's answer on this thread, when Arrow gives it (arrow_eval) and the stage
        has nothing in hand, whose outputs must go first; None: the stage's threads run it. The
        hand-off to a stage thread and back cost a slow stream a loop of the task or a source's
        wait for its next record (bench/kafka.py at 1,000 rows/s)."""
        if not isinstance(spark, SparkChain) or self.stage is None or not self.stage.idle:
            return None
        out = []
        for table in tables:
            if table.num_rows:
                answered = spark.answer_by_arrow(table)
                if answered is None:
                    return None
                out.append(answered)
        return out

    def _delivered(self, sink: Operator, tables: list[pa.Table]) -> None:
        """What the chain's sink is given: counted (Flink's numRecordsSend), with how long its rows
        took from their ingestion and, where they carry event time, how far that trails the clock."""
        rows = sum(table.num_rows for table in tables)
        self.metrics.records_sent += rows
        if not rows:
            return
        now = now_ms()
        if self.stamp:
            self.latency.record(max(0, now - self.stamp), rows)
        rowtime = sink.spec.params.get("rowtime")
        if not isinstance(rowtime, str):
            return
        for table in tables:
            try:
                self.event_lag.record_many(now - rowtime_ms(table, rowtime, sink.spec.where()))
            except TimestampError:  # a step before the sink dropped or changed the column: no lag to tell
                pass

    def hand_on(self, results: Optional[list[pa.Table]] = None) -> None:
        """Push what the Spark stage has finished through the rest of the chain."""
        if self.stage is None:
            return
        if results is None:
            results = self.stage.take_results()
        if results:
            # the outputs carry the ingestion of the oldest rows among the inputs that are through
            through, stamps = self.stage.rows_through, self._stage_stamps
            oldest = 0
            while stamps and stamps[0][0] <= through:  # submits now wholly through
                oldest = oldest_of(oldest, stamps.popleft()[1])
            if not oldest and stamps:  # only the first part of a submit is through (Spark cut it)
                oldest = stamps[0][1]
            current, self.stamp = self.stamp, oldest
            try:
                self.push(self.stage_at + 1, results)
            finally:
                self.stamp = current
            # a Spark job's output is a batch already, paid for in latency: sent now, not after
            # waiting out the buffer timeout for rows to join it
            self.flush_outputs()
        if self.time is not None:
            self.time.release_held()

    def flush_stage(self) -> None:
        """Every row handed to Spark through it and on (before a barrier, at the end)."""
        if self.stage is not None:
            self.hand_on(self.stage.flush())

    def finish(self) -> None:
        """The end of the input: each operator's held-back output goes through the rest of the
        chain before it finishes; then every output ends its partitions."""
        for index, op in enumerate(self.operators):
            if index == self.stage_at:
                self.flush_stage()  # what came before is in Spark: through it before the rest finish
            flushed = op.finish()
            if flushed:
                self.push(index + 1, flushed)
        for writer in self.all_writers():
            writer.end()

    def close_stage(self) -> None:
        if self.stage is not None:
            self.stage.close()

    # ------------------------------------------------------------------ the outputs
    def all_writers(self) -> list[RecordWriter]:
        return self.writers + [w for ws in self.side_writers.values() for w in ws]

    def channel_ids(self) -> list[str]:
        """The output channels, to release when the task ends."""
        return [c for w in self.all_writers() for c in w.channel_ids()]

    def _emit_side(self, uid: str, tag: str, table: pa.Table) -> None:
        for writer in self.side_writers.get((uid, tag), ()):
            writer.emit(table)

    def flush_outputs(self) -> None:
        for writer in self.all_writers():
            writer.flush_all()

    def flush_due(self) -> Optional[float]:
        """Send the batches that waited out the buffer timeout; the next deadline, if any."""
        now, deadline = time.monotonic(), None
        for writer in self.all_writers():
            due = writer.flush_due(now)
            if due is not None:
                deadline = due if deadline is None else min(deadline, due)
        return deadline

    def emit_watermark(self, watermark: int) -> None:
        for writer in self.all_writers():
            writer.emit_watermark(watermark)

    def emit_status(self, idle: bool) -> None:
        for writer in self.all_writers():
            writer.emit_status(idle)

    def emit_barrier(self, barrier: Barrier) -> None:
        for writer in self.all_writers():
            writer.emit_barrier(barrier)

    # ------------------------------------------------------------------ any thread
    def operator_metrics(self) -> dict:
        metrics: dict = {}
        for op in list(self.opened):  # an operator not yet open has nothing to tell
            for name, value in op.metrics().items():
                # several operators of a chain may report one of these: the task's is their max / sum
                if name == NEWEST_EVENT_TIMESTAMP and name in metrics:
                    value = max(value, metrics[name])
                elif name == NUM_LATE_RECORDS_DROPPED and name in metrics:
                    value += metrics[name]
                elif name == LATE_ROWS and name in metrics:
                    value = metrics[name] | value  # keyed by operator uid
                metrics[name] = value
        return metrics
