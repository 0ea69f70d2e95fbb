"""RpcClient: request/reply over one DEALER to an RpcEndpoint, for clients and the CLI."""
from __future__ import annotations

import itertools
import logging
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Optional

import zmq

from cluster.protocol.codec import Codec
from cluster.protocol.droplog import DropLog, drop_kind
from cluster.protocol.endpoint import R, RpcError
from cluster.protocol.messages import ErrorResponse, MalformedMessage, Message
from cluster.protocol.sockets import connect_socket, inproc_pair, make_socket

log = logging.getLogger(__name__)


class RpcClient:
    """Request/reply over one DEALER, for clients and the CLI; any thread may call ``request``.

    One I/O thread owns the socket (ZeroMQ sockets are not thread-safe). A request hands its
    frames to that thread and waits on a future of its own; replies are matched to requests by
    correlation id, so a request that waits long (a savepoint) never holds up another (the
    collect acknowledgement that savepoint waits for). The lock covers only the hand-over.
    """

    def __init__(self, address: str, codec: Codec, timeout: float = 10.0, ctx=None):
        self.address = address
        self.codec = codec.for_socket()
        self.drops = DropLog(log, f"client of {address}")
        self.timeout = timeout
        self.ctx = ctx or zmq.Context.instance()
        self._cids = itertools.count(1)
        self._pending: dict[int, Future] = {}
        self._pending_lock = threading.Lock()
        self._outbox_recv, self._outbox = inproc_pair(self.ctx, "rpc-client")
        self._send_lock = threading.Lock()
        self._sock = make_socket(self.ctx, zmq.DEALER)
        connect_socket(self._sock, address, codec)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rpc {address}", daemon=True)
        self._thread.start()

    def request(self, msg: Message, *, expect: type[R], timeout: Optional[float] = None) -> R:
        """Send ``msg`` and wait for its reply, which must be an ``expect`` (an RpcError says so
        otherwise; an ErrorResponse is raised as RpcError with its message)."""
        timeout = self.timeout if timeout is None else timeout
        if self._closed.is_set():
            raise RpcError("the client is closed")
        cid = next(self._cids)
        fut: Future = Future()
        with self._pending_lock:
            self._pending[cid] = fut
        if self._closed.is_set():  # closed meanwhile: close() may not have seen this future
            with self._pending_lock:
                self._pending.pop(cid, None)
            raise RpcError("the client is closed")
        try:
            with self._send_lock:  # frames leave in the order of their sequence numbers
                self._outbox.send_multipart(self.codec.encode(msg, cid))
            try:
                reply = fut.result(timeout)
            except FutureTimeout:
                raise TimeoutError(f"no answer from the JobManager at {self.address} within {timeout:g} s "
                                   f"to {msg.op} (is the cluster running?)") from None
        finally:
            with self._pending_lock:
                self._pending.pop(cid, None)
        if isinstance(reply, ErrorResponse):
            raise RpcError(reply.message)
        if not isinstance(reply, expect):
            raise RpcError(f"the JobManager answered {msg.op} with {reply.op}, not {expect.__name__}")
        return reply

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._outbox_recv, zmq.POLLIN)
        try:
            while not self._closed.is_set():
                events = dict(poller.poll(200))
                if self._outbox_recv in events:
                    self._forward_requests()
                if self._sock in events:
                    self._deliver_replies()
        finally:
            self._sock.close(0)
            self._outbox_recv.close(0)
            with self._send_lock:
                self._outbox.close(0)

    def _forward_requests(self) -> None:
        while True:
            try:
                frames = self._outbox_recv.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._sock.send_multipart(frames, copy=False)

    def _deliver_replies(self) -> None:
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                reply, cid, _ = self.codec.decode(frames)
            except MalformedMessage as exc:
                self.drops.drop(drop_kind(exc), "the JobManager", str(exc))
                continue
            with self._pending_lock:
                fut = self._pending.pop(cid, None) if cid is not None else None
            if fut is not None:  # else a late answer to a request that timed out
                fut.set_result(reply)

    def close(self) -> None:
        """Close the socket; a request still waiting fails now (RpcError) rather than at its
        timeout, so its caller may ask elsewhere (a client following a new leader does)."""
        self._closed.set()
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(RpcError(f"the connection to the JobManager at {self.address} was closed "
                                           "before it answered"))
        if threading.current_thread() is not self._thread:
            self._thread.join(2)
