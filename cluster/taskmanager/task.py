"""A Task: one subtask of one vertex (a chain of operators), run on its own thread in a slot.

The thread builds the chain from the deployment descriptor, grants credits on its inputs, then
loops: take a batch (from its source, or everything waiting on its input channels, up to
``execution.batch-size`` rows), push it through the chain, and hand the results to its record
writers, which close an output batch when it is full or ``execution.buffer-timeout`` old and
then wait for credit. So batches grow under load and stay small (and quick) when idle.

It measures where its time goes as Flink does (busy, back-pressured, idle, per second) and
counts records and bytes.
"""
from __future__ import annotations

import ctypes
import itertools
import logging
import queue
import sys
import threading
import time
import traceback
from concurrent.futures import Executor
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Protocol

import numpy as np
import pyarrow as pa

from cluster.common import failures
from cluster.checkpoint.barriers import Barrier, BarrierAligner
from cluster.checkpoint.coordinator import CheckpointKind
from cluster.conf import TaskConfig
from cluster.graph.deployment import OutputDescriptor, TaskDeploymentDescriptor
from cluster.graph.execution_graph import ExecutionState
from cluster.graph.job_graph import OperatorSpec, ShipStrategy
from cluster.graph.operator_kinds import KINDS
from cluster.taskmanager.operator_registry import OPERATORS
from cluster.operators.base import Operator, OperatorContext, SourceOperator, TaskCancelled, UserFunctionError
from cluster.spark.chain import SparkChain
from cluster.spark.fusion import FusionGroup
from cluster.operators.windowing.watermarks import MAX_WATERMARK
from cluster.protocol.messages import AddCredit, BufferResponse, EndOfPartition, Message, Watermark, WatermarkStatus
from cluster.protocol.metrics import (CHECKPOINTED_COUNTERS, CURRENT_INPUT_WATERMARK, CURRENT_OUTPUT_WATERMARK,
                                      NEWEST_EVENT_TIMESTAMP, NUM_LATE_RECORDS_DROPPED, restored_counters)
from cluster.protocol.serde import ipc_to_table, table_to_ipc
from cluster.state.key_groups import key_groups_of, operator_index_for_key_group

from cluster.taskmanager.network import END, WAIT_SLICE, ChannelSender, InputGate, NetworkEnvironment
from cluster.spark.stage import SparkStage
from cluster.taskmanager.task_time import TaskTime

log = logging.getLogger(__name__)
IDLE, BACKPRESSURED = "idle", "backpressured"
ENDING_KINDS = (CheckpointKind.FINAL, CheckpointKind.STOP)  # checkpoints after which the sources end


class CheckpointResponder(Protocol):
    """How a task reports checkpoint progress (Flink's CheckpointResponder); any thread may call."""

    def acknowledge_checkpoint(self, task: "Task", checkpoint_id: int, state: dict) -> None: ...
    def decline_checkpoint(self, task: "Task", checkpoint_id: int, reason: str) -> None: ...
    def end_of_input(self, task: "Task") -> None: ...


_CALL_USER = Operator.call.__code__  # the frame a task runs a user's function in

WINDOW_S = 1.0  # Flink's *TimeMsPerSecond: the shares of time in the last window, in ms per second


def time_shares(span: float, idle: float, backpressured: float) -> dict:
    """busy, back-pressured and idle milliseconds per second of a window of ``span`` seconds in
    which the task waited ``idle`` and ``backpressured`` seconds: they add up to 1000."""
    tenths = 10_000 / span if span > 0 else 0.0
    idle_t = min(10_000, max(0, round(idle * tenths)))
    bp_t = min(10_000 - idle_t, max(0, round(backpressured * tenths)))
    return {"busyTimeMsPerSecond": (10_000 - idle_t - bp_t) / 10, "backPressuredTimeMsPerSecond": bp_t / 10,
            "idleTimeMsPerSecond": idle_t / 10}


class _Published(NamedTuple):
    """What the task thread last published: immutable, swapped in as one reference."""
    at: float
    records_in: int
    records_out: int
    bytes_in: int
    bytes_out: int
    idle: float            # seconds of waits ended by ``at``
    backpressured: float
    waiting: Optional[tuple[str, float]]  # (kind, since): a wait in progress at ``at``
    window: tuple[float, float, float]    # (start, idle, backpressured) of the window in progress
    per_second: Optional[dict]            # the shares of the last completed window


def _spent_at(idle: float, backpressured: float, waiting: Optional[tuple[str, float]],
              now: float) -> tuple[float, float]:
    if waiting is not None:  # a long wait counts while it lasts, not only once it ends
        if waiting[0] == IDLE:
            idle += now - waiting[1]
        else:
            backpressured += now - waiting[1]
    return idle, backpressured


class TaskMetrics:
    """Counters and time accounting of one task, with one writer per field.

    The task thread owns every field. It counts (``records_in``... ``+=``), measures its waits
    (``wait_begin``/``wait_end``, ``add_idle``) and calls ``publish``, which rolls the per-second
    window once it is ``WINDOW_S`` old and swaps in an immutable ``_Published``; waits publish
    themselves. Any other thread (the TaskManager's loop, for heartbeats) calls only ``snapshot``,
    which reads that one reference and derives the figures at its own time, writing nothing: a
    wait in progress counts while it lasts, and a window the task thread has not rolled in time
    (a long user function or wait) is taken up to that moment."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.records_in = self.records_out = self.bytes_in = self.bytes_out = 0
        self._idle = self._backpressured = 0.0
        self._waiting: Optional[tuple[str, float]] = None
        self.started = clock()
        self._window = (self.started, 0.0, 0.0)
        self._per_second: Optional[dict] = None
        self._published = self._state(self.started)

    # ------------------------------------------------------------------ the task thread
    def wait_begin(self, kind: str) -> None:
        now = self._clock()
        self._waiting = (kind, now)
        self.publish(now)

    def wait_end(self) -> None:
        now = self._clock()
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            self._add(waiting[0], now - waiting[1])
        self.publish(now)

    def counters(self) -> dict[str, int]:
        """The counters now, as a checkpoint keeps them (cluster.protocol.metrics.COUNTERS)."""
        return {"records-in": self.records_in, "records-out": self.records_out,
                "bytes-in": self.bytes_in, "bytes-out": self.bytes_out}

    def restore_counters(self, counters: dict[str, int]) -> None:
        """Count on from a restored checkpoint's figures (before the task runs)."""
        self.records_in, self.records_out = counters["records-in"], counters["records-out"]
        self.bytes_in, self.bytes_out = counters["bytes-in"], counters["bytes-out"]
        self.publish()

    def add_idle(self, seconds: float) -> None:
        """Time found to have been idle after the fact (a source's poll that had nothing)."""
        self._add(IDLE, seconds)
        self.publish()

    def _add(self, kind: str, seconds: float) -> None:
        if kind == IDLE:
            self._idle += seconds
        else:
            self._backpressured += seconds

    def publish(self, now: Optional[float] = None) -> None:
        if now is None:
            now = self._clock()
        t0, idle0, bp0 = self._window
        if now - t0 >= WINDOW_S:
            idle, bp = _spent_at(self._idle, self._backpressured, self._waiting, now)
            self._per_second = time_shares(now - t0, idle - idle0, bp - bp0)
            self._window = (now, idle, bp)
        self._published = self._state(now)

    def _state(self, now: float) -> _Published:
        return _Published(now, self.records_in, self.records_out, self.bytes_in, self.bytes_out, self._idle,
                          self._backpressured, self._waiting, self._window, self._per_second)

    # ------------------------------------------------------------------ any thread
    def snapshot(self) -> dict:
        state = self._published
        now = max(self._clock(), state.at)
        idle, bp = _spent_at(state.idle, state.backpressured, state.waiting, now)
        t0, idle0, bp0 = state.window
        per_second = state.per_second
        if per_second is None or now - t0 >= WINDOW_S:
            per_second = time_shares(now - t0, idle - idle0, bp - bp0)
        busy = max(0.0, now - self.started - idle - bp)
        return {"records-in": state.records_in, "records-out": state.records_out,
                "bytes-in": state.bytes_in, "bytes-out": state.bytes_out,
                "backpressured-ms": int(bp * 1000), "idle-ms": int(idle * 1000),
                "busy-ms": int(busy * 1000)} | per_second


class RecordWriter:
    """Writes a task's output to the channels of one outgoing edge, a batch per channel at a time."""

    def __init__(self, desc: OutputDescriptor, subtask: int, network: NetworkEnvironment,
                 sender: ChannelSender, metrics: TaskMetrics, cancelled: threading.Event,
                 batch_size: int, buffer_timeout_s: float):
        self.desc = desc
        self.network, self.sender, self.metrics, self.cancelled = network, sender, metrics, cancelled
        self.batch_size, self.buffer_timeout_s = batch_size, buffer_timeout_s
        n = len(desc.channels)
        self.accounts = [network.credit_account(cid) for cid, _ in desc.channels]
        self._pending: list[list[pa.Table]] = [[] for _ in range(n)]
        self._pending_rows = [0] * n
        self._oldest: list[Optional[float]] = [None] * n
        self._round_robin = itertools.cycle(range(n))
        for _ in range(subtask % n):  # spread the first batches of each producer
            next(self._round_robin)
        self._sequence = itertools.count()

    def channel_ids(self) -> list[str]:
        return [cid for cid, _ in self.desc.channels]

    def emit(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        strategy = self.desc.ship_strategy
        if strategy == ShipStrategy.HASH:
            targets = operator_index_for_key_group(
                key_groups_of(table, self.desc.key, self.desc.max_parallelism),
                self.desc.max_parallelism, len(self.desc.channels))
            # which channels get rows: counted, not sorted (np.unique sorts every row's target)
            used = np.flatnonzero(np.bincount(targets, minlength=len(self.desc.channels)))
            if len(used) == 1:
                self._buffer(int(used[0]), table)
                return
            for channel in used:
                self._buffer(int(channel), table.take(pa.array(np.flatnonzero(targets == channel))))
        elif strategy == ShipStrategy.BROADCAST:
            for index in range(len(self.desc.channels)):
                self._buffer(index, table)
        elif strategy == ShipStrategy.REBALANCE:
            self._buffer(next(self._round_robin), table)
        else:  # FORWARD: the one channel to the same subtask index
            self._buffer(0, table)

    def _buffer(self, index: int, table: pa.Table) -> None:
        if self.buffer_timeout_s <= 0:
            self._send(index, table)
            return
        self._pending[index].append(table)
        self._pending_rows[index] += table.num_rows
        if self._oldest[index] is None:
            self._oldest[index] = time.monotonic()
        if self._pending_rows[index] >= self.batch_size:
            self._flush(index)

    def flush_due(self, now: float) -> Optional[float]:
        """Send the batches that waited out the buffer timeout; the next deadline, if any."""
        deadline = None
        for index, oldest in enumerate(self._oldest):
            if oldest is None:
                continue
            if now - oldest >= self.buffer_timeout_s:
                self._flush(index)
            else:
                due = oldest + self.buffer_timeout_s
                deadline = due if deadline is None else min(deadline, due)
        return deadline

    def flush_all(self) -> None:
        for index in range(len(self._pending)):
            self._flush(index)

    def _flush(self, index: int) -> None:
        tables = self._pending[index]
        if not tables:
            return
        self._pending[index], self._pending_rows[index], self._oldest[index] = [], 0, None
        self._send(index, concat(tables))

    def _send(self, index: int, table: pa.Table) -> None:
        channel, address = self.desc.channels[index]
        account = self.accounts[index]
        if account.credit <= 0:
            self.metrics.wait_begin(BACKPRESSURED)
            try:
                account.take(self.cancelled)
            finally:
                self.metrics.wait_end()
        else:
            account.take(self.cancelled)
        self.metrics.records_out += table.num_rows
        if self.network.is_local(address):
            self.metrics.bytes_out += table.nbytes
            self.network.deliver_local(channel, ("table", table))
        else:
            data = table_to_ipc(table)
            self.metrics.bytes_out += data.size
            self.sender.send(address, BufferResponse(channel, next(self._sequence)), [data])

    def end(self) -> None:
        self._event(END, EndOfPartition)

    def emit_watermark(self, watermark: int) -> None:
        """In-band on every channel (whatever the ship strategy), after every row before it."""
        self._event(("watermark", watermark), lambda channel: Watermark(channel, watermark))

    def emit_status(self, idle: bool) -> None:
        self._event(("status", idle), lambda channel: WatermarkStatus(channel, idle))

    def emit_barrier(self, barrier: Barrier) -> None:
        """In-band, after every row before it (the buffers are flushed first)."""
        self._event(("barrier", barrier), barrier.on_channel)

    def _event(self, local_item: tuple, remote: Callable[[str], Message]) -> None:
        self.flush_all()
        for (channel, address), account in zip(self.desc.channels, self.accounts):
            account.wait_announced(self.cancelled)
            if self.network.is_local(address):
                self.network.deliver_local(channel, local_item)
            else:
                self.sender.send(address, remote(channel))


def concat(tables: list[pa.Table]) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="default")


class Task:
    config: TaskConfig  # parsed first thing on the task thread, so a bad value fails the task

    def __init__(self, tdd: TaskDeploymentDescriptor, network: NetworkEnvironment,
                 report: Callable[["Task", str, Optional[str]], None], responder: CheckpointResponder,
                 snapshot_executor: Executor):
        self.tdd = tdd
        self.execution_id = tdd.execution_id
        self.network = network
        self.report = report
        self.responder = responder
        self.snapshot_executor = snapshot_executor
        self._control: queue.SimpleQueue = queue.SimpleQueue()  # triggers and notifications, from the TM
        self._ending_after: Optional[int] = None  # the final/stop checkpoint after which a source ends
        self._end_confirmed = False
        self.cancelled = threading.Event()
        self.metrics = TaskMetrics()
        self.state: str = ExecutionState.DEPLOYING
        self.detail = ""  # what an INITIALIZING task waits for, shown in the job's status
        self.name = f"{tdd.vertex['name']} ({tdd.subtask + 1}/{tdd.vertex['parallelism']})"
        self._thread = threading.Thread(target=self._run, name=f"task {self.name}", daemon=True)
        self._gate: Optional[InputGate] = None  # every channel of every input edge
        self._producer_address: dict[str, str] = {}
        self._writers: list[RecordWriter] = []        # the chain's main output
        self._side_writers: dict[tuple[str, str], list[RecordWriter]] = {}  # (operator uid, tag)
        self._chain: list = []
        self._stage: Optional[SparkStage] = None  # the chain's (first) Spark chain, run on threads of its own
        self._stage_at = -1                         # its index in the chain
        self._time: Optional[TaskTime] = None       # watermarks and processing time (task_time)
        self._sides: dict[str, int] = {}            # channel -> input side, for a two-input head (joins)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self.cancelled.set()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def interrupt(self) -> bool:
        """Flink's task interrupt, as far as Python allows: raise TaskCancelled in the task thread
        if it is inside a user's function now (a busy loop stops at its next bytecode; one blocked
        in time.sleep or C code only once that returns). Only there: raised anywhere else, it could
        break the task's own bookkeeping or cleanup. True if raised."""
        ident = self._thread.ident
        if ident is None:
            return False  # not started
        frame = sys._current_frames().get(ident)
        while frame is not None and frame.f_code is not _CALL_USER:
            frame = frame.f_back
        if frame is None:
            return False
        return ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(TaskCancelled)) == 1

    # called on the TaskManager's loop thread; the task thread acts on them between batches
    def trigger_checkpoint(self, barrier: Barrier) -> None:
        self._control.put(("trigger", barrier))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._control.put(("complete", checkpoint_id))

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._control.put(("aborted", checkpoint_id))

    def metrics_snapshot(self) -> dict:
        operator_metrics: dict = {}
        for op in self._chain:
            for name, value in op.metrics().items():
                # several operators of a chain may report one of these: the task's is their max / sum
                if name == NEWEST_EVENT_TIMESTAMP and name in operator_metrics:
                    value = max(value, operator_metrics[name])
                elif name == NUM_LATE_RECORDS_DROPPED and name in operator_metrics:
                    value += operator_metrics[name]
                operator_metrics[name] = value
        time_metrics = {} if self._time is None else {CURRENT_INPUT_WATERMARK: self._time.input_watermark,
                                                      CURRENT_OUTPUT_WATERMARK: self._time.output_watermark}
        return {"execution_id": self.execution_id, "job_id": self.tdd.job_id,
                "vertex_id": self.tdd.vertex["id"], "subtask": self.tdd.subtask, "detail": self.detail,
                "input-queue": self._gate.queued() if self._gate else 0} | self.metrics.snapshot() \
            | time_metrics | operator_metrics

    # ------------------------------------------------------------------ the thread
    def _set_state(self, state: str, error: Optional[str] = None) -> None:
        self.metrics.publish()  # the report carries the task's counters as of now
        self.state = state
        self.report(self, state, error)

    def _run(self) -> None:
        sender = ChannelSender(self.network.ctx, self.network.codec, self.cancelled)
        opened = []
        try:
            self._restore_counters()  # before the first report: a restored attempt never reads less
            self._set_state(ExecutionState.INITIALIZING)
            self.config = TaskConfig.from_dict(self.tdd.job_config, f"the configuration of job {self.tdd.job_id}")
            chain = self._chain = self._build_chain(sender)
            for op in chain:
                op.open()
                opened.append(op)
            self._restore(chain)
            self._start_time(chain)
            self._start_stage(chain)
            self._open_inputs(sender)
            self._set_state(ExecutionState.RUNNING)
            if isinstance(chain[0], SourceOperator):
                self._run_source(chain)
            else:
                self._run_inputs(chain, sender)
            self._process_control()  # notifications that came with the end of the input
            self._finish(chain)
            while opened:
                opened.pop(0).close()
            self._set_state(ExecutionState.FINISHED)
        except TaskCancelled:
            self._set_state(ExecutionState.CANCELED)
        except Exception as exc:
            if self.cancelled.is_set():
                self._set_state(ExecutionState.CANCELED)
            else:
                self._set_state(ExecutionState.FAILED, self._describe_failure(exc))
        finally:
            if self._stage is not None:
                self._stage.close()
            for op in opened:  # failed or cancelled: release what the operators hold (Flink's dispose)
                try:
                    op.close()
                except Exception:
                    log.exception("closing %s after a failure", op.spec.where())
            channels = list(self._producer_address)
            channels += [c for w in self._all_writers() for c in w.channel_ids()]
            self.network.unregister(channels)
            sender.close()

    def _describe_failure(self, exc: Exception) -> str:
        # the TaskManager's log keeps every frame; the job's failure shows the user's only
        log.info("%s failed", self.name, exc_info=exc)
        try:
            return failures.describe(exc, self.tdd.cells)
        except Exception:  # a failure must be reported even if describing it fails
            log.exception("%s: describing its failure failed", self.name)
            return "".join(traceback.format_exception(exc))

    def _set_detail(self, detail: str) -> None:
        self.detail = detail

    def _build_chain(self, sender: ChannelSender) -> list:
        tdd = self.tdd
        for desc in tdd.outputs:
            writer = RecordWriter(desc, tdd.subtask, self.network, sender, self.metrics, self.cancelled,
                                  self.config.batch_size, self.config.buffer_timeout_ms / 1000)
            if desc.side_output is None:
                self._writers.append(writer)
            else:
                uid, tag = desc.side_output
                self._side_writers.setdefault((uid, tag), []).append(writer)
        ctx = OperatorContext(
            job_id=tdd.job_id, job_name=tdd.job_name, attempt=tdd.attempt, subtask=tdd.subtask,
            parallelism=tdd.vertex["parallelism"], max_parallelism=tdd.vertex["max_parallelism"],
            config=self.config, result_address=tdd.result_address, cancelled=self.cancelled, sender=sender,
            side_outputs=frozenset(self._side_writers), emit_side=self._emit_side,
            execution_id=tdd.execution_id, task_name=self.name, set_detail=self._set_detail,
            restored_checkpoint=tdd.restore["checkpoint_id"] if tdd.restore else 0)
        chain = []
        specs = [OperatorSpec(**o) for o in tdd.vertex["operators"]]
        # consecutive operators of a Spark kind become one operator: one Spark plan per batch
        for _, group in itertools.groupby(specs, key=lambda s: s.kind if KINDS[s.kind].spark else s.uid):
            members = list(group)
            implementation = OPERATORS[members[0].kind]
            if KINDS[members[0].kind].spark and not issubclass(implementation, SparkChain):
                raise TypeError(f"{members[0].where()}: Spark kind {members[0].kind!r} is run by "
                                f"{implementation.__name__}, which is not a SparkChain")
            try:
                chain.append(implementation(members, ctx) if issubclass(implementation, SparkChain)
                             else implementation(members[0], ctx))
            except Exception as exc:
                raise UserFunctionError(f"{members[0].where()} could not be loaded on the TaskManager: "
                                        f"{type(exc).__name__}: {exc}") from exc
        self._producer_address = {c: a for desc in tdd.inputs for c, a in desc.channels}
        if self._producer_address:
            self._gate = InputGate(list(self._producer_address))
            self.network.register_gate(self._gate)
        if KINDS[chain[0].spec.kind].two_inputs:
            # the first params["left_inputs"] input edges are the left side (the JobGraph keeps
            # a node's input edges in the order the API gave them)
            left = int(chain[0].params["left_inputs"])
            self._sides = {c: int(i >= left) for i, desc in enumerate(tdd.inputs) for c, _ in desc.channels}
        return chain

    def _start_time(self, chain: list) -> None:
        """After the operators opened: what they say of time (processing-time windows) is known."""
        self._time = TaskTime(chain, lambda index, tables: self._push(chain, index, tables), self._emit_watermark,
                              self._emit_status, self.config.watermark_interval_ms)
        if self._producer_address:
            self._time.set_inputs(list(self._producer_address))

    def _start_stage(self, chain: list) -> None:
        index = next((i for i, op in enumerate(chain) if isinstance(op, SparkChain)), None)
        if index is None:
            return
        wake = self._gate.wake if self._gate is not None else (lambda: None)  # a source task looks often
        self._stage_at = index
        spark = chain[index]
        # no job takes more than the TaskManager's budget for batches in its Spark JVM (spark_memory)
        max_bytes = min(self.config.spark_max_batch_bytes, spark.memory.capacity)
        self._stage = SparkStage(spark.process, spark.cancel_jobs, spark.spec.where(),
                                 self.config.spark_max_batch_rows, max_bytes,
                                 self.config.spark_max_concurrent_batches, self.cancelled, wake)
        config = self.config
        if config.spark_fuse_subtasks and spark.ctx.parallelism > 1 and config.spark_max_concurrent_batches == 1:
            key = (spark.ctx.job_id, spark.ctx.attempt, spark.spec.uid)
            self._stage.group = FusionGroup.join(key, self._stage, spark)
        if self._time is not None:
            self._time.set_stage(self._stage, index)

    def _hand_on(self, results: Optional[list[pa.Table]] = None) -> None:
        """Push what the Spark stage has finished through the rest of the chain."""
        if self._stage is None:
            return
        if results is None:
            results = self._stage.take_results()
        if results:
            self._push(self._chain, self._stage_at + 1, results)
            # a Spark job's output is a batch already, paid for in latency: sent now, not after
            # waiting out the buffer timeout for rows to join it
            for writer in self._all_writers():
                writer.flush_all()
        if self._time is not None:
            self._time.release_held()

    def _flush_stage(self) -> None:
        """Every row handed to Spark through it and on (before a barrier, at the end)."""
        if self._stage is not None:
            self._hand_on(self._stage.flush())

    def _open_inputs(self, sender: ChannelSender) -> None:
        """Grant the first credits once every consumer of this task has opened (announced its
        channels): no producer sends, and so no source reads, before the whole job downstream of it
        has opened its operators, whose opening checks what it can (a Spark chain analyses its
        plan against its input schema). A failure there fails the job with no row read."""
        accounts = [a for w in self._all_writers() for a in w.accounts]
        if not all(a.announced for a in accounts):
            self._set_detail("waiting for the downstream tasks to open")
            for account in accounts:
                account.wait_announced(self.cancelled)
            self._set_detail("")
        for channel, address in self._producer_address.items():
            self._grant(sender, channel, address, self.network.buffers_per_channel)

    def _grant(self, sender: ChannelSender, channel: str, address: str, n: int) -> None:
        if self.network.is_local(address):
            self.network.credit_account(channel).add(n)
        else:
            sender.send(address, AddCredit(channel, n))

    def _flush_due(self) -> Optional[float]:
        now, deadline = time.monotonic(), None
        for writer in self._all_writers():
            due = writer.flush_due(now)
            if due is not None:
                deadline = due if deadline is None else min(deadline, due)
        return deadline

    def _emit_watermark(self, watermark: int) -> None:
        for writer in self._all_writers():
            writer.emit_watermark(watermark)

    def _emit_status(self, idle: bool) -> None:
        for writer in self._all_writers():
            writer.emit_status(idle)

    def _run_source(self, chain: list) -> None:
        source = chain[0]
        clock = self._task_time()
        exhausted = False
        while True:
            if self.cancelled.is_set():
                raise TaskCancelled()
            self._process_control()
            self._hand_on()
            clock.tick()
            if self._end_confirmed:
                return
            started = time.monotonic()
            if exhausted or self._ending_after is not None:
                # waiting for the checkpoint after which this source ends (all was read, or stop)
                time.sleep(0.005)
                self.metrics.add_idle(time.monotonic() - started)
                continue
            table = source.poll()
            if table is None:
                # the end of input: every event-time window downstream may fire (not at a stop,
                # whose savepoint keeps them for the job that resumes from it)
                clock.advance(0, MAX_WATERMARK)
                if not self.config.checkpointing:
                    return
                # With checkpoints a source ends only after a final checkpoint covers everything
                # it read, so a sink never commits at end of input what a restore would replay.
                exhausted = True
                self.responder.end_of_input(self)
            elif table.num_rows == 0:  # nothing ready: the source waited, and that is idle time
                self.metrics.add_idle(time.monotonic() - started)
            else:
                self.metrics.records_in += table.num_rows
                self.metrics.publish()  # rows taken in show at once, not after a long first (Spark) batch
                clock.before_rows()
                self._push(chain, 1, [table])
            clock.periodic(read_rows=table is not None and table.num_rows > 0)
            self._flush_due()
            self.metrics.publish()

    def _run_inputs(self, chain: list, sender: ChannelSender) -> None:
        gate = self._gate
        if gate is None:
            raise RuntimeError(f"task {self.name}: _run_inputs called before _build_chain made its input gate")
        aligner = BarrierAligner(list(self._producer_address), self.config.exactly_once)
        clock = self._task_time()
        while not gate.finished:
            self._process_control()
            self._hand_on()
            clock.tick()
            clock.periodic(read_rows=False)
            deadline = self._flush_due()
            timeout = WAIT_SLICE if deadline is None else max(0.0, min(WAIT_SLICE, deadline - time.monotonic()))
            self.metrics.wait_begin(IDLE)
            got = gate.poll(timeout, aligner.blocked)
            self.metrics.wait_end()
            if got is None:
                if self.cancelled.is_set():
                    raise TaskCancelled()
                continue
            # a busy task takes everything already waiting, up to one batch: batches grow under
            # load; a barrier, a watermark or an end of partition closes the batch
            tables: dict[int, list[pa.Table]] = {}  # by input side (only joins have two)
            rows = 0
            while got is not None and got[1][0] in ("ipc", "table"):
                channel, (kind, data) = got
                if kind == "ipc":
                    self.metrics.bytes_in += len(data)
                    data = ipc_to_table(data)
                tables.setdefault(self._sides.get(channel, 0), []).append(data)
                rows += data.num_rows
                self._grant(sender, channel, self._producer_address[channel], 1)
                got = gate.poll(0, aligner.blocked) if rows < self.config.batch_size else None
            if tables:
                self.metrics.records_in += rows
                self.metrics.publish()
                clock.periodic(read_rows=True)
                self._push_input(chain, tables)
            if got is not None:
                channel, (kind, data) = got
                if kind == "watermark":
                    clock.on_watermark(channel, data)
                    continue
                if kind == "status":
                    clock.on_status(channel, data)
                    continue
                result = aligner.on_barrier(channel, data) if kind == "barrier" else aligner.on_end_of_partition(channel)
                if result.aborted is not None:
                    self.responder.decline_checkpoint(self, result.aborted, "a newer barrier came before it aligned")
                if result.snapshot is not None:
                    self._perform_checkpoint(result.snapshot)

    # ------------------------------------------------------------------ checkpoints
    def _process_control(self) -> None:
        while True:
            try:
                kind, arg = self._control.get_nowait()
            except queue.Empty:
                return
            if kind == "trigger":
                self._perform_checkpoint(arg)
            elif kind == "complete":
                for op in self._chain:
                    op.notify_checkpoint_complete(arg)
                if self._ending_after is not None and arg >= self._ending_after:
                    self._end_confirmed = True
            elif kind == "aborted" and arg == self._ending_after:
                self._ending_after = None  # a stop that did not happen: go on reading

    def _perform_checkpoint(self, barrier: Barrier) -> None:
        """The synchronous part, on the task thread: flush, snapshot, forward the barrier. The
        state files are written on the snapshot executor while processing goes on."""
        cid = barrier.checkpoint_id
        self._flush_stage()
        for writer in self._all_writers():
            writer.flush_all()
        # every row before the barrier is counted now, none after it: the counters of this cut
        counters = self.metrics.counters()
        try:
            snapshots = {}
            for op in self._chain:
                snapshot = op.snapshot_state(cid)
                if snapshot is not None:
                    snapshots[op.spec.uid] = snapshot
        except Exception as exc:
            log.exception("%s: snapshot of checkpoint %d failed", self.name, cid)
            self.responder.decline_checkpoint(self, cid, f"snapshot failed in {self.name}: {type(exc).__name__}: {exc}")
            return
        if barrier.kind in ENDING_KINDS and isinstance(self._chain[0], SourceOperator):
            self._ending_after = cid
        for writer in self._all_writers():
            writer.emit_barrier(barrier)
        self.snapshot_executor.submit(self._write_snapshots, barrier, snapshots, counters)

    def _write_snapshots(self, barrier: Barrier, snapshots: dict, counters: dict[str, int]) -> None:
        try:
            directory = Path(barrier.directory)
            directory.mkdir(parents=True, exist_ok=True)
            state: dict = {CHECKPOINTED_COUNTERS: counters}
            for uid, snapshot in snapshots.items():
                handle = dict(snapshot.handle)
                if snapshot.keyed is not None:
                    name = f"{uid}-{self.tdd.subtask}.state"
                    handle.update(snapshot.keyed.write(directory / name), keyed_file=name)
                state[uid] = handle
            self.responder.acknowledge_checkpoint(self, barrier.checkpoint_id, state)
        except Exception as exc:
            log.exception("%s: writing checkpoint %d failed", self.name, barrier.checkpoint_id)
            self.responder.decline_checkpoint(self, barrier.checkpoint_id, f"{type(exc).__name__}: {exc}")

    def _restore_counters(self) -> None:
        counted = (self.tdd.restore or {}).get("counters", {}).get(self.tdd.vertex["id"])
        if counted:
            self.metrics.restore_counters(restored_counters(counted, self.tdd.subtask, self.tdd.vertex["parallelism"]))

    def _restore(self, chain: list) -> None:
        restore = self.tdd.restore
        if not restore:
            return
        for op in chain:
            handles = restore["operators"].get(op.spec.uid)
            if handles is not None:
                op.restore_state([dict(h, directory=restore["directory"]) for h in handles])

    def _task_time(self) -> TaskTime:
        if self._time is None:
            raise RuntimeError(f"task {self.name}: run before _build_chain made its TaskTime")
        return self._time

    def _push_input(self, chain: list, tables: dict[int, list[pa.Table]]) -> None:
        """What came on the inputs, into the chain: one batch, or one per side of a join."""
        if self._sides:
            for side in sorted(tables):
                self._push(chain, 1, chain[0].process_side(side, concat(tables[side])))
            return
        try:
            batches = [concat(tables[0])]
        except pa.ArrowInvalid:  # inputs of a union with schemas that do not merge
            batches = tables[0]
        self._push(chain, 0, batches)

    def _push(self, chain: list, start: int, tables: list[pa.Table]) -> None:
        for index in range(start, len(chain)):
            if index == self._stage_at and self._stage is not None:
                self._stage.submit(tables)  # on to the rest of the chain once Spark is done (_hand_on)
                self._hand_on()
                return
            op = chain[index]
            out = []
            for table in tables:
                out.extend(op.process(table))
            tables = out
            if not tables:
                return
        for table in tables:
            for writer in self._writers:
                writer.emit(table)

    def _all_writers(self) -> list[RecordWriter]:
        return self._writers + [w for ws in self._side_writers.values() for w in ws]

    def _emit_side(self, uid: str, tag: str, table: pa.Table) -> None:
        for writer in self._side_writers.get((uid, tag), ()):
            writer.emit(table)

    def _finish(self, chain: list) -> None:
        # Each operator's held-back output goes through the rest of the chain before it finishes.
        for index, op in enumerate(chain):
            if index == self._stage_at:
                self._flush_stage()  # what came before is in Spark: through it before the rest finish
            flushed = op.finish()
            if flushed:
                self._push(chain, index + 1, flushed)
        for writer in self._all_writers():
            writer.end()
