"""The data plane: credit-based channels between producer and consumer subtasks.

Every channel (one producer subtask -> one consumer subtask of one edge) works as Flink's
credit-based flow control: the consumer grants credits (free buffers), the producer sends a batch
only when it holds a credit, and the consumer returns the credit once it has taken the batch. A
slow consumer therefore stalls its producers, and no queue anywhere holds more than the credits
granted (``taskmanager.network.memory.buffers-per-channel``) plus one end-of-partition marker.

Channels inside one TaskManager hand tables over by reference; channels between TaskManagers
carry Arrow IPC over ZeroMQ straight to the other TaskManager's data socket, never through the
JobManager. One receiving thread per TaskManager owns that socket; each task thread sends
through sockets of its own (ZeroMQ sockets are not thread-safe).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Optional

import zmq

from cluster.protocol.codec import Codec
from cluster.protocol.droplog import DropLog, drop_kind
from cluster.checkpoint.barriers import Barrier
from cluster.protocol.messages import (AddCredit, BufferResponse, CheckpointBarrier, EndOfPartition, MalformedMessage,
                                       Message, Watermark, WatermarkStatus)
from cluster.protocol.sockets import advertised_address, bind_socket, connect_socket, make_socket

from cluster.operators.base import TaskCancelled

log = logging.getLogger(__name__)

END = ("end", None)
WAIT_SLICE = 0.05  # how often a blocked task looks at its cancel flag


class CreditAccount:
    """The producer's side of one channel: how many batches it may still send."""

    def __init__(self):
        self.credit = 0
        self.announced = False  # the consumer registered the channel (its first credit came)
        self._cond = threading.Condition()

    def add(self, n: int) -> None:
        with self._cond:
            self.credit += n
            self.announced = True
            self._cond.notify_all()

    def wait_announced(self, cancelled: threading.Event) -> None:
        """Events (end of partition, barriers) take no credit, but must not reach a consumer that
        has not registered the channel yet, or they would be dropped there."""
        with self._cond:
            while not self.announced:
                if cancelled.is_set():
                    raise TaskCancelled()
                self._cond.wait(WAIT_SLICE)

    def take(self, cancelled: threading.Event) -> float:
        """Take one credit, waiting as long as needed; returns the seconds spent back-pressured."""
        with self._cond:
            if self.credit > 0:
                self.credit -= 1
                return 0.0
            start = time.monotonic()
            while self.credit <= 0:
                if cancelled.is_set():
                    raise TaskCancelled()
                self._cond.wait(WAIT_SLICE)
            self.credit -= 1
            return time.monotonic() - start


class InputGate:
    """The consumer's side of every channel of one input edge of a task."""

    def __init__(self, channel_ids: list[str]):
        self.channel_ids = list(channel_ids)
        self._queues: dict[str, deque] = {c: deque() for c in channel_ids}
        self._open = set(channel_ids)
        self._cond = threading.Condition()
        self._next = 0
        self._woken = False

    def wake(self) -> None:
        """Any thread: end the task thread's current ``poll`` early (its Spark stage has output)."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def push(self, channel: str, item: tuple) -> None:
        with self._cond:
            self._queues[channel].append(item)
            self._cond.notify_all()

    def queued(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._queues.values())

    def ready(self, blocked: frozenset = frozenset()) -> bool:
        """Whether a ``poll`` would return at once: an item on a channel not blocked, or a wake-up."""
        with self._cond:
            return self._woken or any(q for c, q in self._queues.items() if c not in blocked)

    @property
    def finished(self) -> bool:
        return not self._open

    def poll(self, timeout: float, blocked: frozenset = frozenset()) -> Optional[tuple[str, tuple]]:
        """The next (channel, item) in round-robin order, or None if nothing came within timeout.
        Blocked channels (aligning a checkpoint barrier) are left alone."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                n = len(self.channel_ids)
                for k in range(n):
                    channel = self.channel_ids[(self._next + k) % n]
                    if channel in blocked:
                        continue
                    queue = self._queues[channel]
                    if queue:
                        self._next = (self._next + k + 1) % n
                        item = queue.popleft()
                        if item is END:
                            self._open.discard(channel)
                        return channel, item
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._woken:
                    self._woken = False
                    return None
                self._cond.wait(remaining)


class ChannelSender:
    """A task thread's own outgoing sockets, one per remote address."""

    def __init__(self, ctx: zmq.Context, codec: Codec, cancelled: threading.Event):
        self.ctx, self.codec, self.cancelled = ctx, codec, cancelled
        self._sockets: dict[str, zmq.Socket] = {}
        self._codecs: dict[str, Codec] = {}  # a sending stream per socket, as the replay guard needs

    def send(self, address: str, msg: Message, payload=()) -> None:
        sock = self._sockets.get(address)
        if sock is None:
            sock = make_socket(self.ctx, zmq.DEALER)
            sock.setsockopt(zmq.SNDHWM, 64)  # bounded even when the peer is slow or gone
            connect_socket(sock, address, self.codec)
            self._sockets[address] = sock
            self._codecs[address] = self.codec.for_socket()
        frames = self._codecs[address].encode(msg, None, payload)
        while True:
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                if self.cancelled.is_set():
                    raise TaskCancelled() from None
                sock.poll(int(WAIT_SLICE * 1000), zmq.POLLOUT)

    def close(self) -> None:
        # A finished task's last messages (end-of-partition, the last results) may still sit in
        # the socket's queue: let them go out. A cancelled task's need not.
        linger = 0 if self.cancelled.is_set() else 10_000
        for sock in self._sockets.values():
            sock.close(linger)
        self._sockets.clear()
        self._codecs.clear()


class NetworkEnvironment:
    """One per TaskManager: the data socket, its receiving thread, and the channel registry."""

    def __init__(self, host: str, port: int, codec: Codec, buffers_per_channel: int,
                 ctx: Optional[zmq.Context] = None, bind_host: str = ""):
        self.ctx = ctx or zmq.Context.instance()
        self.codec = codec
        self.buffers_per_channel = buffers_per_channel
        self._socket = make_socket(self.ctx, zmq.ROUTER)
        bind_socket(self._socket, f"tcp://{bind_host or host}:{port}", codec)
        self.data_address = advertised_address(self._socket, host)  # what other TaskManagers dial
        self._lock = threading.Lock()
        self._credits: dict[str, CreditAccount] = {}
        self._gates: dict[str, InputGate] = {}
        self._running = True
        self.drops = DropLog(log, "data socket")
        self._thread = threading.Thread(target=self._receive_loop, name="network", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._running = False
        self._thread.join(2)

    # ------------------------------------------------------------------ registry
    def credit_account(self, channel: str) -> CreditAccount:
        # Credit may arrive before the producer task is deployed: the account waits for it.
        with self._lock:
            account = self._credits.get(channel)
            if account is None:
                account = self._credits[channel] = CreditAccount()
            return account

    def register_gate(self, gate: InputGate) -> None:
        with self._lock:
            for channel in gate.channel_ids:
                self._gates[channel] = gate

    def unregister(self, channels: list[str]) -> None:
        with self._lock:
            for channel in channels:
                self._gates.pop(channel, None)
                self._credits.pop(channel, None)

    def release_job(self, job_id: str) -> None:
        prefix = job_id + "/"
        with self._lock:
            for table in (self._gates, self._credits):
                for channel in [c for c in table if c.startswith(prefix)]:
                    del table[channel]

    def deliver_local(self, channel: str, item: tuple) -> None:
        with self._lock:
            gate = self._gates.get(channel)
        if gate is None:
            log.debug("local item for closed channel %s dropped", channel)
        else:
            gate.push(channel, item)

    def is_local(self, address: str) -> bool:
        return address == self.data_address

    # ------------------------------------------------------------------ receiving
    def _receive_loop(self) -> None:
        try:
            while self._running:
                self.drops.flush()
                if not self._socket.poll(100):
                    continue
                for _ in range(256):
                    try:
                        frames = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._handle(frames[0].bytes, frames[1:])
        finally:
            self._socket.close(0)

    def _handle(self, peer: bytes, frames) -> None:
        try:
            msg, _, payload = self.codec.decode(frames)
        except MalformedMessage as exc:
            self.drops.drop(drop_kind(exc), peer, str(exc))
            return
        if isinstance(msg, AddCredit):
            if msg.credit > 0:
                self.credit_account(msg.channel).add(msg.credit)
            return
        if isinstance(msg, (BufferResponse, EndOfPartition, CheckpointBarrier, Watermark, WatermarkStatus)):
            with self._lock:
                gate = self._gates.get(msg.channel)
            if gate is None:
                log.debug("%s for unknown channel %s dropped", msg.op, msg.channel)
            elif isinstance(msg, EndOfPartition):
                gate.push(msg.channel, END)
            elif isinstance(msg, CheckpointBarrier):
                gate.push(msg.channel, ("barrier", Barrier.of(msg)))
            elif isinstance(msg, Watermark):
                gate.push(msg.channel, ("watermark", msg.timestamp))
            elif isinstance(msg, WatermarkStatus):
                gate.push(msg.channel, ("status", msg.idle))
            elif len(payload) == 1:
                gate.push(msg.channel, ("ipc", (payload[0].buffer, msg.ingested_ms)))
            else:
                log.warning("buffer-response without exactly one payload frame dropped")
            return
        self.drops.drop("not a data-plane message", peer, msg.op)
