"""A Task: one subtask of one vertex (a chain of operators), run on its own thread in a slot.

The thread builds the chain from the deployment descriptor, grants credits on its inputs, then
loops: take a batch (from its source, or from an input channel), push it through the chain, and
write the results to its output channels, which wait for credit. It measures where its time goes
(busy, back-pressured, idle) and counts records and bytes, as Flink's task metrics do.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
import traceback
from typing import Callable, Optional

import numpy as np
import pyarrow as pa

from cluster.graph.deployment import OutputDescriptor, TaskDeploymentDescriptor
from cluster.graph.execution_graph import ExecutionState
from cluster.graph.job_graph import OperatorSpec
from cluster.operators import OPERATORS
from cluster.operators.base import OperatorContext, SourceOperator, TaskCancelled, UserFunctionError
from cluster.protocol.messages import AddCredit, BufferResponse, EndOfPartition
from cluster.protocol.serde import ipc_to_table, table_to_ipc
from cluster.state.key_groups import key_groups_of, operator_index_for_key_group

from .network import END, WAIT_SLICE, ChannelSender, InputGate, NetworkEnvironment

log = logging.getLogger(__name__)


class TaskMetrics:
    def __init__(self):
        self.records_in = self.records_out = self.bytes_in = self.bytes_out = 0
        self.backpressured_s = 0.0
        self.idle_s = 0.0
        self.started = time.monotonic()

    def snapshot(self) -> dict:
        elapsed = time.monotonic() - self.started
        busy = max(0.0, elapsed - self.idle_s - self.backpressured_s)
        return {"records-in": self.records_in, "records-out": self.records_out,
                "bytes-in": self.bytes_in, "bytes-out": self.bytes_out,
                "backpressured-ms": int(self.backpressured_s * 1000), "idle-ms": int(self.idle_s * 1000),
                "busy-ms": int(busy * 1000)}


class RecordWriter:
    """Writes a task's output batches to the channels of one outgoing edge."""

    def __init__(self, desc: OutputDescriptor, subtask: int, network: NetworkEnvironment,
                 sender: ChannelSender, metrics: TaskMetrics, cancelled: threading.Event):
        self.desc = desc
        self.network, self.sender, self.metrics, self.cancelled = network, sender, metrics, cancelled
        self.accounts = [network.credit_account(cid) for cid, _ in desc.channels]
        self._round_robin = itertools.cycle(range(len(desc.channels)))
        for _ in range(subtask % len(desc.channels)):  # spread the first batches of each producer
            next(self._round_robin)
        self._sequence = itertools.count()

    def channel_ids(self) -> list[str]:
        return [cid for cid, _ in self.desc.channels]

    def emit(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        strategy = self.desc.ship_strategy
        if strategy == "HASH":
            targets = operator_index_for_key_group(
                key_groups_of(table, self.desc.key, self.desc.max_parallelism),
                self.desc.max_parallelism, len(self.desc.channels))
            for index in np.unique(targets):
                self._send(int(index), table.take(pa.array(np.flatnonzero(targets == index))))
        elif strategy == "BROADCAST":
            for index in range(len(self.desc.channels)):
                self._send(index, table)
        elif strategy == "REBALANCE":
            self._send(next(self._round_robin), table)
        else:  # FORWARD: the one channel to the same subtask index
            self._send(0, table)

    def _send(self, index: int, table: pa.Table) -> None:
        channel, address = self.desc.channels[index]
        self.metrics.backpressured_s += self.accounts[index].take(self.cancelled)
        self.metrics.records_out += table.num_rows
        if self.network.is_local(address):
            self.metrics.bytes_out += table.nbytes
            self.network.deliver_local(channel, ("table", table))
        else:
            data = table_to_ipc(table)
            self.metrics.bytes_out += data.size
            self.sender.send(address, BufferResponse(channel, next(self._sequence)), [data])

    def end(self) -> None:
        for channel, address in self.desc.channels:
            if self.network.is_local(address):
                self.network.deliver_local(channel, END)
            else:
                self.sender.send(address, EndOfPartition(channel))


class Task:
    def __init__(self, tdd: TaskDeploymentDescriptor, network: NetworkEnvironment,
                 report: Callable[["Task", str, Optional[str]], None]):
        self.tdd = tdd
        self.execution_id = tdd.execution_id
        self.network = network
        self.report = report
        self.cancelled = threading.Event()
        self.metrics = TaskMetrics()
        self.state = ExecutionState.DEPLOYING
        self.name = f"{tdd.vertex['name']} ({tdd.subtask + 1}/{tdd.vertex['parallelism']})"
        self._thread = threading.Thread(target=self._run, name=f"task {self.name}", daemon=True)
        self._gate: Optional[InputGate] = None  # every channel of every input edge
        self._producer_address: dict[str, str] = {}
        self._writers: list[RecordWriter] = []        # the chain's main output
        self._side_writers: dict[tuple[str, str], list[RecordWriter]] = {}  # (operator uid, tag)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self.cancelled.set()

    def metrics_snapshot(self) -> dict:
        return {"execution_id": self.execution_id, "job_id": self.tdd.job_id,
                "vertex_id": self.tdd.vertex["id"], "subtask": self.tdd.subtask,
                "input-queue": self._gate.queued() if self._gate else 0} | self.metrics.snapshot()

    # ------------------------------------------------------------------ the thread
    def _set_state(self, state: str, error: Optional[str] = None) -> None:
        self.state = state
        self.report(self, state, error)

    def _run(self) -> None:
        sender = ChannelSender(self.network.ctx, self.network.codec, self.cancelled)
        try:
            self._set_state(ExecutionState.INITIALIZING)
            chain = self._build_chain(sender)
            for op in chain:
                op.open()
            self._set_state(ExecutionState.RUNNING)
            if isinstance(chain[0], SourceOperator):
                self._run_source(chain)
            else:
                self._run_inputs(chain, sender)
            self._finish(chain)
            for op in chain:
                op.close()
            self._set_state(ExecutionState.FINISHED)
        except TaskCancelled:
            self._set_state(ExecutionState.CANCELED)
        except Exception as exc:
            if self.cancelled.is_set():
                self._set_state(ExecutionState.CANCELED)
            else:
                self._set_state(ExecutionState.FAILED, self._describe_failure(exc))
        finally:
            channels = list(self._producer_address)
            channels += [c for w in self._all_writers() for c in w.channel_ids()]
            self.network.unregister(channels)
            sender.close()

    def _describe_failure(self, exc: Exception) -> str:
        text = "".join(traceback.format_exception(exc))
        if isinstance(exc, UserFunctionError):
            return f"{exc}\n{text}"
        return text

    def _build_chain(self, sender: ChannelSender) -> list:
        tdd = self.tdd
        for desc in tdd.outputs:
            writer = RecordWriter(desc, tdd.subtask, self.network, sender, self.metrics, self.cancelled)
            if desc.side_output is None:
                self._writers.append(writer)
            else:
                self._side_writers.setdefault(tuple(desc.side_output), []).append(writer)
        ctx = OperatorContext(
            job_id=tdd.job_id, job_name=tdd.job_name, attempt=tdd.attempt, subtask=tdd.subtask,
            parallelism=tdd.vertex["parallelism"], max_parallelism=tdd.vertex["max_parallelism"],
            config=tdd.job_config, result_address=tdd.result_address, cancelled=self.cancelled, sender=sender,
            side_outputs=frozenset(self._side_writers), emit_side=self._emit_side)
        chain = []
        for o in tdd.vertex["operators"]:
            spec = OperatorSpec(**o)
            try:
                chain.append(OPERATORS[spec.kind](spec, ctx))
            except Exception as exc:
                raise UserFunctionError(f"{spec.where()} could not be loaded on the TaskManager: "
                                        f"{type(exc).__name__}: {exc}") from exc
        self._producer_address = {c: a for desc in tdd.inputs for c, a in desc.channels}
        if self._producer_address:
            self._gate = InputGate(list(self._producer_address))
            self.network.register_gate(self._gate)
            for channel, address in self._producer_address.items():
                self._grant(sender, channel, address, self.network.buffers_per_channel)
        return chain

    def _grant(self, sender: ChannelSender, channel: str, address: str, n: int) -> None:
        if self.network.is_local(address):
            self.network.credit_account(channel).add(n)
        else:
            sender.send(address, AddCredit(channel, n))

    def _run_source(self, chain: list) -> None:
        source = chain[0]
        while True:
            if self.cancelled.is_set():
                raise TaskCancelled()
            table = source.poll()
            if table is None:
                return
            if table.num_rows == 0:
                continue
            self.metrics.records_in += table.num_rows
            self._push(chain, 1, [table])

    def _run_inputs(self, chain: list, sender: ChannelSender) -> None:
        gate = self._gate
        while not gate.finished:
            waited = time.monotonic()
            got = gate.poll(WAIT_SLICE)
            self.metrics.idle_s += time.monotonic() - waited
            if got is None:
                if self.cancelled.is_set():
                    raise TaskCancelled()
                continue
            channel, (kind, data) = got
            if kind == "end":
                continue
            if kind == "ipc":
                self.metrics.bytes_in += len(data)
                table = ipc_to_table(data)
            else:
                table = data
            self.metrics.records_in += table.num_rows
            self._grant(sender, channel, self._producer_address[channel], 1)
            self._push(chain, 0, [table])

    def _push(self, chain: list, start: int, tables: list[pa.Table]) -> None:
        for op in chain[start:]:
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
            flushed = op.finish()
            if flushed:
                self._push(chain, index + 1, flushed)
        for writer in self._all_writers():
            writer.end()
