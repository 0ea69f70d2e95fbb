"""RpcEndpoint: one loop thread that owns a component's sockets and all of its state changes.

As Flink's RpcEndpoint promises, every handler of an endpoint runs on the same thread, so the
components behind it need no locks. Other threads (the REST server, task threads, executors)
hand work to the loop with ``call_soon``/``call`` instead of touching state themselves.

Handlers are looked up in ``self.handlers`` (message class -> callable(msg, peer)); a handler
may return a reply, which goes back to the sender with the request's correlation id. A frame
that fails authentication, decoding or the replay check, or a handler that raises, is logged
(rate-limited) and dropped: the loop never dies of its input.

ROUTER sockets do not hand a routing id over: a second connection that claims the id of a
connected peer (a TaskManager's id is public) is refused by ZeroMQ and never receives or steals
the first one's traffic. Each process makes fresh ids, so a restart never needs the handover.
"""
from __future__ import annotations

import functools
import heapq
import itertools
import logging
import threading
import time
import traceback
from collections import deque
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

import zmq

from cluster.protocol.codec import Codec
from cluster.protocol.droplog import DropLog, drop_kind
from cluster.protocol.messages import ErrorResponse, MalformedMessage, Message
from cluster.protocol.sockets import bind_socket, connect_socket, inproc_pair, make_socket

log = logging.getLogger(__name__)
R = TypeVar("R", bound=Message)

# A loop step this long, or a timer this late, is logged: heartbeats wait behind it, and a peer's
# heartbeat.timeout may judge this process lost though it lives. The log tells which it was: one
# step that took the time, or a process that got no CPU (or no GIL) at all.
STALL_WARN_S = 1.0


class RpcError(Exception):
    """An expected failure of a request (unknown job, bad argument): answered, not logged as a bug."""


class RpcBusy(RpcError):
    """A request refused for now because a limit is reached: the same request may succeed later
    (REST answers 429 Too Many Requests)."""


class DeferredReply:
    """Returned by a handler whose answer comes later (e.g. when a savepoint completes)."""

    def __init__(self):
        self._target = None
        self._early: Optional[Message] = None  # resolved before the handler returned
        self._done = False

    def _bind(self, endpoint: "RpcEndpoint", peer: "Peer", cid: Optional[int]) -> None:
        self._target = (endpoint, peer, cid)
        if self._early is not None:
            early, self._early, self._done = self._early, None, False
            self.resolve(early)

    def resolve(self, reply: Message) -> None:
        """Send the answer (loop thread only); once, the first answer wins."""
        if self._done:
            return
        self._done = True
        if self._target is None:
            self._early, self._done = reply, False
            return
        endpoint, peer, cid = self._target
        if cid is not None:
            endpoint.send(peer, reply, cid)

    def fail(self, message: str) -> None:
        self.resolve(ErrorResponse(message))


@dataclass(frozen=True)
class Peer:
    """Where a message came from, and so where its reply goes."""

    socket: zmq.Socket
    identity: Optional[bytes]  # ROUTER peers have one; a DEALER's single peer has none

    @property
    def key(self) -> bytes:
        return self.identity or b""


class RpcEndpoint:
    def __init__(self, name: str, codec: Codec, ctx: Optional[zmq.Context] = None):
        self.name = name
        self.codec = codec
        self.ctx = ctx or zmq.Context.instance()
        self.handlers: dict[type, Callable[[Message, Peer], Optional[Message]]] = {}
        self._sockets: list[zmq.Socket] = []
        self._routers: set[zmq.Socket] = set()
        self._codecs: dict[zmq.Socket, Codec] = {}  # a sending stream per socket (see codec.py)
        self._timers: list = []
        self._timer_seq = itertools.count()
        self._calls: deque = deque()
        self._calls_lock = threading.Lock()
        # Other threads wake the loop through this pair; the lock makes the shared PUSH safe.
        self._wake_recv, self._wake_send = inproc_pair(self.ctx, f"wake-{name}")
        self._running = False
        self._thread: Optional[threading.Thread] = None
        self.drops = DropLog(log, name)
        self.call_every(self.drops.interval, self.drops.flush)

    # ------------------------------------------------------------------ sockets
    def bind_router(self, address: str) -> str:
        sock = make_socket(self.ctx, zmq.ROUTER)
        bound = bind_socket(sock, address, self.codec)
        self._add(sock)
        self._routers.add(sock)
        return bound

    def connect_dealer(self, address: str, identity: bytes) -> Peer:
        sock = make_socket(self.ctx, zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        connect_socket(sock, address, self.codec)
        self._add(sock)
        return Peer(sock, None)

    def _add(self, sock: zmq.Socket) -> None:
        self._sockets.append(sock)
        self._codecs[sock] = self.codec.for_socket()

    def send(self, peer: Peer, msg: Message, cid: Optional[int] = None, payload=()) -> bool:
        """Send from the loop thread; never blocks (a full or vanished peer drops the message)."""
        frames = self._codecs[peer.socket].encode(msg, cid, payload)
        if peer.identity is not None:
            frames = [peer.identity, *frames]
        try:
            peer.socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            log.warning("%s: peer %r not ready, dropped %s", self.name, peer.identity, msg.op)
            return False

    # ------------------------------------------------------------------ scheduling
    def call_soon(self, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` on the loop thread (safe from any thread)."""
        with self._calls_lock:
            self._calls.append((fn, args))
            try:
                self._wake_send.send(b"", flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # already a wake-up pending, or closing

    def call(self, fn: Callable, *args, timeout: float = 10.0) -> Any:
        """Run ``fn(*args)`` on the loop thread and wait for its result (not from the loop)."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        fut: Future = Future()

        def run():
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # handed to the caller
                fut.set_exception(exc)

        self.call_soon(run)
        return fut.result(timeout)

    def assert_loop_thread(self) -> None:
        """Flink's validateRunsInMainThread: the endpoint's state belongs to its loop thread (once
        the loop runs). Off with ``python -O``."""
        if __debug__ and self._thread is not None and threading.current_thread() is not self._thread:
            raise AssertionError(f"{self.name}: called from thread {threading.current_thread().name!r}, "
                                 f"not from the endpoint's loop thread")

    def run_blocking(self, executor: Executor, fn: Callable, *args,
                     then: Callable[[Any, Optional[BaseException]], None]) -> None:
        """Run blocking work (disk) on ``executor`` and hand its result, or its exception, to
        ``then(result, error)`` back on the loop thread, so the loop never waits for a disk."""
        def done(fut: Future) -> None:
            error = fut.exception()
            self.call_soon(then, None if error else fut.result(), error)
        executor.submit(fn, *args).add_done_callback(done)

    def call_later(self, delay: float, fn: Callable, *args) -> list:
        """Schedule on the loop; returns a handle for ``cancel_timer``. Loop thread only."""
        entry = [time.monotonic() + delay, next(self._timer_seq), fn, args, True]
        heapq.heappush(self._timers, entry)
        return entry

    @staticmethod
    def cancel_timer(entry: Optional[list]) -> None:
        if entry is not None:
            entry[4] = False

    def call_every(self, interval: float, fn: Callable) -> None:
        @functools.wraps(fn)  # a late or slow tick is logged by the name of what it runs
        def tick():
            try:
                fn()
            finally:
                if self._running:
                    self.call_later(interval, tick)

        self.call_later(interval, tick)

    # ------------------------------------------------------------------ loop
    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._running = False
        self.call_soon(lambda: None)
        if self._thread and threading.current_thread() is not self._thread:
            self._thread.join(5)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_recv, zmq.POLLIN)
        registered: set = set()
        try:
            while self._running:
                for sock in self._sockets:
                    if sock not in registered:
                        poller.register(sock, zmq.POLLIN)
                        registered.add(sock)
                # Sockets before timers: messages that arrived during a long step (heartbeats)
                # are handled before a timer (heartbeat expiry) judges their senders.
                events = dict(poller.poll(self._next_timer_ms()))
                if self._wake_recv in events:
                    while True:
                        try:
                            self._wake_recv.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                self._run_calls()
                self._drain_ready(events)
                if self._timers and self._timers[0][0] <= time.monotonic():
                    # what arrived while those messages were handled (a long step: many tasks
                    # deployed at once) goes before the timers too, or a heartbeat waiting in a
                    # socket would be judged missing
                    self._drain_ready(dict(poller.poll(0)))
                self._run_due_timers()
        finally:
            for sock in self._sockets:
                sock.close(0)
            self._wake_recv.close(0)
            self._wake_send.close(0)

    def _drain_ready(self, events: dict) -> None:
        for sock in list(events):
            if sock is not self._wake_recv:
                self._drain(sock)

    def _run_due_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            due, _, fn, args, live = heapq.heappop(self._timers)
            if live:
                late = time.monotonic() - due
                if late > STALL_WARN_S:
                    log.warning("%s: a timer (%s) ran %.0f ms late", self.name, _name(fn), late * 1000)
                self._guard(fn, *args)

    def _next_timer_ms(self) -> int:
        if not self._timers:
            return 1000
        return max(0, int((self._timers[0][0] - time.monotonic()) * 1000) + 1)

    def _run_calls(self) -> None:
        while True:
            with self._calls_lock:
                if not self._calls:
                    return
                fn, args = self._calls.popleft()
            self._guard(fn, *args)

    def _guard(self, fn, *args) -> None:
        started = time.monotonic()
        try:
            fn(*args)
        except Exception:
            log.exception("%s: error in %s", self.name, _name(fn))
        self._took(_name(fn), started)

    def _took(self, step: str, started: float) -> None:
        took = time.monotonic() - started
        if took > STALL_WARN_S:
            log.warning("%s: %s took %.0f ms on the loop thread; timers and messages waited", self.name,
                        step, took * 1000)

    def _drain(self, sock: zmq.Socket) -> None:
        # Bounded so one busy socket cannot starve timers and the others.
        for _ in range(256):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity = None
            if sock in self._routers:
                identity, frames = frames[0].bytes, frames[1:]
            self._dispatch(Peer(sock, identity), frames)

    def _dispatch(self, peer: Peer, frames) -> None:
        try:
            msg, cid, _payload = self.codec.decode(frames)
        except MalformedMessage as exc:
            self.drops.drop(drop_kind(exc), peer.identity, str(exc))
            return
        handler = self.handlers.get(type(msg))
        if handler is None:
            self.drops.drop("unhandled message", peer.identity, f"no handler for {msg.op}")
            if cid is not None:
                self.send(peer, ErrorResponse(f"{self.name} does not handle {msg.op}"), cid)
            return
        started = time.monotonic()
        try:
            reply = handler(msg, peer)
        except RpcError as exc:
            reply = ErrorResponse(str(exc))
        except Exception as exc:
            log.error("%s: handler for %s failed:\n%s", self.name, msg.op, traceback.format_exc())
            reply = ErrorResponse(f"internal error handling {msg.op}: {exc}")
        self._took(msg.op, started)
        if isinstance(reply, DeferredReply):
            reply._bind(self, peer, cid)
        elif reply is not None and cid is not None:
            self.send(peer, reply, cid)


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", repr(fn))
