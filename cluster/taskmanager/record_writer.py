"""RecordWriter: a task's output to the channels of one outgoing edge.

It partitions each output table by the edge's ship strategy (hash by key group, broadcast,
rebalance, forward) and keeps a batch per channel, sent when it holds ``execution.batch-size``
rows or is ``execution.buffer-timeout`` old: batches grow under load and stay small (and quick)
when idle. A batch goes out only on a credit from its consumer (credit-based flow control; the
wait for one is back-pressured time). To a consumer in this process it goes as the table itself,
to another over the network in Arrow IPC. Barriers, watermarks, watermark statuses and the end of
the partition go in-band on every channel, after every row before them (the batches are flushed
first).

Thread use: the task thread only, which owns the writer and its batches.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Callable, Optional

import numpy as np
import pyarrow as pa

from cluster.checkpoint.barriers import Barrier
from cluster.graph.deployment import OutputDescriptor
from cluster.graph.job_graph import ShipStrategy
from cluster.protocol.latency import oldest_of
from cluster.protocol.messages import BufferResponse, EndOfPartition, Message, Watermark, WatermarkStatus
from cluster.protocol.serde import table_to_ipc
from cluster.state.key_groups import key_groups_of, operator_index_for_key_group
from cluster.taskmanager.network import END, ChannelSender, NetworkEnvironment
from cluster.taskmanager.task_metrics import BACKPRESSURED, TaskMetrics


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
        # when the oldest rows waiting per channel were read by their source (0: unknown), and where
        # the task says what its current output's are (OperatorChain.stamp)
        self._ingested = [0] * n
        self.ingested_of: Callable[[], int] = lambda: 0
        self._round_robin = itertools.cycle(range(n))
        for _ in range(subtask % n):  # spread the first batches of each producer
            next(self._round_robin)
        self._sequence = itertools.count()
        # rows sent per key group on a hash edge: where a hot key lands (cluster.jobmanager.jobmaster.bottleneck)
        self.key_group_rows = np.zeros(desc.max_parallelism if desc.ship_strategy == ShipStrategy.HASH else 0,
                                       dtype=np.int64)

    def channel_ids(self) -> list[str]:
        return [cid for cid, _ in self.desc.channels]

    def emit(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        strategy = self.desc.ship_strategy
        if strategy == ShipStrategy.HASH:
            groups = key_groups_of(table, self.desc.key, self.desc.max_parallelism)
            self.key_group_rows += np.bincount(groups, minlength=self.desc.max_parallelism)
            targets = operator_index_for_key_group(groups, self.desc.max_parallelism, len(self.desc.channels))
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

    def hot_key_groups(self, n: int = 3) -> list:
        """[rows sent in all, [[key group, rows], ...]]: the ``n`` key groups this writer sent the
        most rows to, most first. Any thread: it reads a copy (a torn count is off by a batch at most)."""
        rows = self.key_group_rows.copy()
        top = np.argsort(rows)[::-1][:n]
        return [int(rows.sum()), [[int(group), int(rows[group])] for group in top if rows[group] > 0]]

    def _buffer(self, index: int, table: pa.Table) -> None:
        ingested = self.ingested_of()
        if self.buffer_timeout_s <= 0:
            self._send(index, table, ingested)
            return
        self._ingested[index] = oldest_of(self._ingested[index], ingested)
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
        ingested = self._ingested[index]
        self._pending[index], self._pending_rows[index], self._oldest[index], self._ingested[index] = [], 0, None, 0
        self._send(index, concat(tables), ingested)

    def _send(self, index: int, table: pa.Table, ingested: int) -> None:
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
            self.network.deliver_local(channel, ("table", (table, ingested)))
        else:
            data = table_to_ipc(table)
            self.metrics.bytes_out += data.size
            self.sender.send(address, BufferResponse(channel, next(self._sequence), ingested), [data])

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
    """Tables of one stream as one; differing schemas unified as far as Arrow's default promotion goes
    (else ArrowInvalid)."""
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="default")
