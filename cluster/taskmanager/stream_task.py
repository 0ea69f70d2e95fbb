"""StreamTask: one subtask of one vertex (a chain of operators), run on its own thread in a slot.

The thread builds its OperatorChain from the deployment descriptor, restores it if the attempt
starts from a checkpoint, grants credits on its inputs, then loops (Flink's mailbox loop around
processInput): act on the checkpoint triggers and notifications the TaskManager put in its
mailbox, hand on what the Spark stage finished, fire processing-time timers, then take a batch
(from its source, or everything waiting on its input channels, up to ``execution.batch-size``
rows) and push it through the chain, whose record writers close an output batch when it is full
or ``execution.buffer-timeout`` old and then wait for credit. So batches grow under load and stay
small (and quick) when idle. Barriers are aligned here; the checkpoint itself is the
SubtaskCheckpointCoordinator's, the time and counts the TaskMetrics'.

It reports each state it enters to the TaskManager; a failure reads as the user's frames only
(cluster.common.failures), while the TaskManager's log keeps every frame. Cancelling sets a flag
the thread looks at between batches and while it waits; ``interrupt`` reaches into a user's
function.

Thread use: each public method says who may call it; everything else runs on the task thread.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import queue
import sys
import threading
import time
import traceback
from concurrent.futures import Executor
from typing import Callable, Optional, Protocol

import pyarrow as pa

from cluster.checkpoint.barriers import Barrier, BarrierAligner
from cluster.common import failures
from cluster.common.clock import now_ms
from cluster.conf import TaskConfig
from cluster.graph.deployment import TaskDeploymentDescriptor, channel_origin
from cluster.graph.event_time import MAX_WATERMARK
from cluster.graph.job_graph import ShipStrategy
from cluster.protocol.states import ExecutionState
from cluster.operators.base import Operator, SourceOperator, TaskCancelled
from cluster.protocol.messages import AddCredit
from cluster.protocol.latency import oldest_of
from cluster.protocol.metrics import (CURRENT_INPUT_WATERMARK, CURRENT_OUTPUT_WATERMARK, INPUT_WATERMARKS,
                                     EVENT_TIME_LAG, KEY_GROUP_ROWS_OUT, LATENCY, OUTPUT_IDLE)
from cluster.protocol.serde import ipc_to_table
from cluster.spark.runner import lost_jvm_behind
from cluster.taskmanager.network import WAIT_SLICE, ChannelSender, InputGate, NetworkEnvironment
from cluster.taskmanager.operator_chain import OperatorChain
from cluster.taskmanager.subtask_checkpoint_coordinator import SubtaskCheckpointCoordinator
from cluster.taskmanager.task_metrics import IDLE, TaskMetrics

log = logging.getLogger(__name__)


class CheckpointResponder(Protocol):
    """How a task reports checkpoint progress (Flink's CheckpointResponder); any thread may call."""

    def acknowledge_checkpoint(self, task: "StreamTask", checkpoint_id: int, state: dict) -> None: ...
    def decline_checkpoint(self, task: "StreamTask", checkpoint_id: int, reason: str) -> None: ...
    def end_of_input(self, task: "StreamTask") -> None: ...


# the longest a source's poll waits for input while the chain's Spark stage holds batches: their
# outputs are handed on between polls, and a slow stream's next record may be 100 ms away
STAGE_WAIT_S = 0.002
_CALL_USER = Operator.call.__code__  # the frame a task runs a user's function in


class StreamTask:
    config: TaskConfig  # parsed first thing on the task thread, so a bad value fails the task

    def __init__(self, tdd: TaskDeploymentDescriptor, network: NetworkEnvironment,
                 report: Callable[["StreamTask", ExecutionState, Optional[str]], None], responder: CheckpointResponder,
                 snapshot_executor: Executor):
        self.tdd = tdd
        self.execution_id = tdd.execution_id
        self.network = network
        self.report = report
        self.responder = responder
        self._control: queue.SimpleQueue = queue.SimpleQueue()  # triggers and notifications, from the TM
        self.cancelled = threading.Event()
        self.metrics = TaskMetrics()
        self.state: ExecutionState = ExecutionState.DEPLOYING
        self.detail = ""  # what an INITIALIZING task waits for, shown in the job's status
        self.name = f"{tdd.vertex['name']} ({tdd.subtask + 1}/{tdd.vertex['parallelism']})"
        self._thread = threading.Thread(target=self._run, name=f"task {self.name}", daemon=True)
        self._checkpoints = SubtaskCheckpointCoordinator(
            tdd, self.name, self.metrics, snapshot_executor,
            functools.partial(responder.acknowledge_checkpoint, self), functools.partial(responder.decline_checkpoint, self))
        self._chain: Optional[OperatorChain] = None  # made on the task thread, once the config is read
        self._gate: Optional[InputGate] = None  # every channel of every input edge
        self._producer_address: dict[str, str] = {}
        self._sides: dict[str, int] = {}            # channel -> input side, for a two-input head (joins)
        # the figures as last sampled (sample_metrics): the TaskManager's loop reads these for its
        # heartbeats, and those of a state change for its report, and never waits for a JVM
        self._sampling_failed = False
        self.last_metrics = self.reported_metrics = self.metrics_snapshot()  # no chain yet: no JVM

    # ------------------------------------------------------------------ the TaskManager's loop thread
    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        """Any thread."""
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

    def sample_metrics(self) -> dict:
        """Any thread but the TaskManager's loop (the metrics thread, and the task's own as it
        reports a state): a Spark chain's figures ask its JVM, which may be busy collecting its
        heap, or gone. What cannot be read keeps its last value."""
        try:
            self.last_metrics = self.metrics_snapshot()
        except Exception as exc:
            if not self._sampling_failed:
                log.warning("%s: its metrics could not be read (%s: %s); they keep their last values",
                            self.name, type(exc).__name__, exc)
            self._sampling_failed = True
        return self.last_metrics

    def metrics_snapshot(self) -> dict:
        """Any thread but the TaskManager's loop: see ``sample_metrics``."""
        chain = self._chain
        operator_metrics = {} if chain is None else chain.operator_metrics()
        clock = None if chain is None else chain.time
        time_metrics: dict = {} if clock is None else {CURRENT_INPUT_WATERMARK: clock.input_watermark,
                                                       CURRENT_OUTPUT_WATERMARK: clock.output_watermark,
                                                       OUTPUT_IDLE: clock.output_idle}
        if clock is not None and clock.valve is not None:
            # by edge and producer: the JobManager knows the edges
            time_metrics[INPUT_WATERMARKS] = {"%d/%d" % channel_origin(channel): [watermark, idle]
                                              for channel, (watermark, idle) in clock.valve.channels().items()}
        hashed = {} if chain is None else {str(w.desc.edge): w.hot_key_groups() for w in chain.all_writers()
                                           if w.desc.ship_strategy == ShipStrategy.HASH}
        if hashed:
            time_metrics[KEY_GROUP_ROWS_OUT] = hashed
        if chain is not None and chain.sink_at >= 0:
            time_metrics[LATENCY] = chain.latency.snapshot()
            time_metrics[EVENT_TIME_LAG] = chain.event_lag.snapshot()
        return {"execution_id": self.execution_id, "job_id": self.tdd.job_id,
                "vertex_id": self.tdd.vertex["id"], "subtask": self.tdd.subtask, "detail": self.detail,
                "input-queue": self._gate.queued() if self._gate else 0} | self.metrics.snapshot() \
            | time_metrics | operator_metrics

    # ------------------------------------------------------------------ the thread
    def _set_state(self, state: ExecutionState, error: Optional[str] = None) -> None:
        self.metrics.publish()  # the report carries the task's counters as of now
        self.state = state
        self.reported_metrics = self.sample_metrics()
        self.report(self, state, error)

    def _run(self) -> None:
        sender = ChannelSender(self.network.ctx, self.network.codec, self.cancelled)
        opened = []
        try:
            self._checkpoints.restore_counters()  # before the first report: a restored attempt never reads less
            self._set_state(ExecutionState.INITIALIZING)
            self.config = TaskConfig.from_dict(self.tdd.job_config, f"the configuration of job {self.tdd.job_id}")
            chain = self._chain = OperatorChain(self.tdd, self.name, self.config, self.network, sender,
                                                self.metrics, self.cancelled)
            chain.create_operators(self._set_detail)
            self._open_gate(chain)
            for op in chain.operators:
                op.open()
                opened.append(op)
                chain.opened.append(op)
            self._checkpoints.restore(chain)
            chain.start_time(list(self._producer_address))
            chain.start_stage(self._gate.wake if self._gate is not None else (lambda: None))  # a source task looks often
            self._open_inputs(chain, sender)
            self._set_state(ExecutionState.RUNNING)
            head = chain.operators[0]
            if isinstance(head, SourceOperator):
                self._run_source(chain, head)
            else:
                self._run_inputs(chain, sender)
            self._process_control(chain)  # notifications that came with the end of the input
            chain.finish()
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
            if self._chain is not None:
                self._chain.close_stage()
            for op in opened:  # failed or cancelled: release what the operators hold (Flink's dispose)
                try:
                    op.close()
                except Exception:
                    log.exception("closing %s after a failure", op.spec.where())
            channels = list(self._producer_address)
            channels += [] if self._chain is None else self._chain.channel_ids()
            self.network.unregister(channels)
            sender.close()

    def _describe_failure(self, exc: Exception) -> str:
        # the TaskManager's log keeps every frame; the job's failure shows the user's only
        log.info("%s failed", self.name, exc_info=exc)
        try:
            lost = lost_jvm_behind(exc)
            if lost is not None:
                return f"{lost}\n(the task's call into it broke off: {type(exc).__name__}: {exc})"
            return failures.describe(exc, self.tdd.cells)
        except Exception:  # a failure must be reported even if describing it fails
            log.exception("%s: describing its failure failed", self.name)
            return "".join(traceback.format_exception(exc))

    def _set_detail(self, detail: str) -> None:
        self.detail = detail

    def _open_gate(self, chain: OperatorChain) -> None:
        """The input side: one gate over every channel of every input edge."""
        tdd = self.tdd
        self._producer_address = {c: a for desc in tdd.inputs for c, a in desc.channels}
        if self._producer_address:
            self._gate = InputGate(list(self._producer_address))
            self.network.register_gate(self._gate)
        if chain.two_inputs:
            # the first params["left_inputs"] input edges are the left side (the JobGraph keeps
            # a node's input edges in the order the API gave them)
            left = int(chain.operators[0].params["left_inputs"])
            self._sides = {c: int(i >= left) for i, desc in enumerate(tdd.inputs) for c, _ in desc.channels}

    def _open_inputs(self, chain: OperatorChain, sender: ChannelSender) -> None:
        """Grant the first credits once every consumer of this task has opened (announced its
        channels): no producer sends, and so no source reads, before the whole job downstream of it
        has opened its operators, whose opening checks what it can (a Spark chain analyses its
        plan against its input schema). A failure there fails the job with no row read."""
        accounts = [a for w in chain.all_writers() for a in w.accounts]
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

    def _run_source(self, chain: OperatorChain, source: SourceOperator) -> None:
        clock = chain.task_time()
        exhausted = False
        while True:
            if self.cancelled.is_set():
                raise TaskCancelled()
            self._process_control(chain)
            chain.hand_on()
            clock.tick()
            if self._checkpoints.end_confirmed:
                return
            started, pressured = time.monotonic(), self.metrics.backpressured_s
            if exhausted or self._checkpoints.ending:
                # waiting for the checkpoint after which this source ends (all was read, or stop)
                chain.flush_outputs()
                time.sleep(0.005)
                self.metrics.add_idle(time.monotonic() - started, pressured)
                continue
            source.wait_limit_s = STAGE_WAIT_S if chain.stage_busy else float("inf")
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
                self.metrics.add_idle(time.monotonic() - started, pressured)
            else:
                self.metrics.records_in += table.num_rows
                self.metrics.publish()  # rows taken in show at once, not after a long first (Spark) batch
                clock.before_rows()
                chain.stamp = now_ms()  # their ingestion, which end-to-end latency counts from
                chain.push(1, [table])
            clock.periodic(read_rows=table is not None and table.num_rows > 0)
            chain.flush_due()
            self.metrics.publish()

    def _run_inputs(self, chain: OperatorChain, sender: ChannelSender) -> None:
        gate = self._gate
        if gate is None:
            raise RuntimeError(f"task {self.name}: _run_inputs called before _open_gate made its input gate")
        aligner = BarrierAligner(list(self._producer_address), self.config.exactly_once)
        clock = chain.task_time()
        while not gate.finished:
            self._process_control(chain)
            chain.hand_on()
            clock.tick()
            clock.periodic(read_rows=False)
            deadline = chain.flush_due()
            timeout = WAIT_SLICE if deadline is None else max(0.0, min(WAIT_SLICE, deadline - time.monotonic()))
            if not gate.ready(aligner.blocked):
                # the task idles: what its outputs hold leaves now, as a source's does before it
                # waits (SourceOperator.waiting); the buffer timeout only batches a busy task's rows
                chain.flush_outputs()
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
            rows = oldest = 0
            while got is not None and got[1][0] in ("ipc", "table"):
                channel, (kind, (data, ingested)) = got
                if kind == "ipc":
                    self.metrics.bytes_in += len(data)
                    data = ipc_to_table(data)
                tables.setdefault(self._sides.get(channel, 0), []).append(data)
                rows += data.num_rows
                oldest = oldest_of(oldest, ingested)
                self._grant(sender, channel, self._producer_address[channel], 1)
                got = gate.poll(0, aligner.blocked) if rows < self.config.batch_size else None
            if tables:
                self.metrics.records_in += rows
                self.metrics.publish()
                clock.periodic(read_rows=True)
                chain.stamp = oldest
                chain.push_input(tables)
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
                    self._checkpoints.decline(result.aborted, "a newer barrier came before it aligned")
                if result.snapshot is not None:
                    self._checkpoints.checkpoint(result.snapshot, chain)

    def _process_control(self, chain: OperatorChain) -> None:
        """The mailbox: what the TaskManager's loop thread asked of the task since it last looked."""
        while True:
            try:
                kind, arg = self._control.get_nowait()
            except queue.Empty:
                return
            if kind == "trigger":
                self._checkpoints.checkpoint(arg, chain)
            elif kind == "complete":
                self._checkpoints.notify_complete(arg, chain)
            elif kind == "aborted":
                self._checkpoints.notify_aborted(arg)
