"""Frames on the wire: ``[mac, header, *payload]``.

``header`` is the msgpack of a Message (plus an optional correlation id ``cid`` for
request/reply, and the replay guard below); ``payload`` frames carry bulk bytes (Arrow IPC)
untouched. ``mac`` is HMAC-SHA256 over every other frame, length-prefixed so frames cannot be
re-cut, keyed with the cluster secret. A frame set that fails the MAC is refused before anything
is unpacked.

Replay guard: the signature proves a frame was made by a holder of the secret, not that it is
fresh. So each signed header also carries ``sid`` (16 random bytes naming one sending stream),
``seq`` (that stream's counter, strictly increasing) and ``ts`` (wall-clock ms when it was
signed). A receiver drops a frame whose sequence is not above the last one it accepted from that
stream, or whose time is outside ``REPLAY_WINDOW_S``. The per-stream state is bounded (least
recently heard streams are forgotten); the time window, and a horizon raised on every
forgetting, make a forgotten stream's frames useless. A window starts with a floor at its own
creation: a frame signed before the receiver existed is refused, so bytes captured on their way
to a JobManager cannot be resent to the leader that replaces it (whose window never saw them),
nor to a TaskManager that restarted.

ZeroMQ keeps order per connection only, so one stream must be one socket: every socket that
sends gets its own ``Codec.for_socket()``, which shares the key and the receiving window.
"""
from __future__ import annotations

import copy
import hashlib
import hmac
import itertools
import os
import threading
import time
from collections import OrderedDict
from typing import Callable, Optional, Sequence

import msgpack

from cluster.protocol.messages import MalformedMessage, Message

MAC_BYTES = 32
MAX_HEADER_BYTES = 64 * 1024 * 1024
SENDER_ID_BYTES = 16
REPLAY_WINDOW_S = 60.0
MAX_SENDERS = 16_384  # streams remembered per receiving process (about 150 B each)
GUARD_KEYS = ("sid", "seq", "ts")


class ReplayedMessage(MalformedMessage):
    """A correctly signed frame that is not fresh: replayed, reordered, or too old."""


class ReplayWindow:
    """The last sequence accepted from each sending stream; thread-safe, bounded (LRU)."""

    def __init__(self, window_s: float = REPLAY_WINDOW_S, max_senders: int = MAX_SENDERS,
                 clock: Callable[[], float] = time.time):
        if window_s <= 0 or max_senders < 1:
            raise ValueError(f"replay window needs window_s > 0 and max_senders >= 1, got {window_s}, {max_senders}")
        self.window_ms = int(window_s * 1000)
        self.max_senders = max_senders
        self.clock = clock
        self._last: OrderedDict[bytes, tuple[int, int]] = OrderedDict()  # sid -> (seq, ts)
        self._horizon_ms = 0  # newest time of any forgotten stream: an unknown stream must be newer
        # this receiver's birth: a frame signed before it was made for another receiver (a failed
        # leader, this process's previous life) and is refused, as a forgotten stream's would be
        self.floor_ms = int(clock() * 1000)
        self._lock = threading.Lock()

    def admit(self, sid: bytes, seq: int, ts: int) -> None:
        """Accept the frame or raise ReplayedMessage saying why."""
        now = int(self.clock() * 1000)
        if ts < now - self.window_ms:
            raise ReplayedMessage(f"stale frame: signed {(now - ts) / 1000:.1f} s ago "
                                  f"(window {self.window_ms / 1000:g} s)")
        if ts > now + self.window_ms:
            raise ReplayedMessage(f"frame from the future: signed {(ts - now) / 1000:.1f} s ahead (clock skew?)")
        with self._lock:
            last = self._last.get(sid)
            if last is None:
                if ts <= self._horizon_ms:
                    raise ReplayedMessage("frame from a forgotten sender, older than its last accepted frame")
                if ts < self.floor_ms:
                    raise ReplayedMessage(f"frame signed {(self.floor_ms - ts) / 1000:.1f} s before this receiver "
                                          "started: made for another (a failed leader?)")
            elif seq <= last[0]:
                raise ReplayedMessage(f"replayed or reordered frame: sequence {seq} after {last[0]}")
            else:
                self._last.move_to_end(sid)
            self._last[sid] = (seq, ts)
            while len(self._last) > self.max_senders:
                _, (_, forgotten_ts) = self._last.popitem(last=False)
                self._horizon_ms = max(self._horizon_ms, forgotten_ts)

    def __len__(self) -> int:
        return len(self._last)


class Codec:
    """Signs and checks frames. ``encode`` is for one socket (see ``for_socket``); ``decode`` may
    be called from any thread."""

    def __init__(self, secret: bytes, window: Optional[ReplayWindow] = None, clock: Callable[[], float] = time.time,
                 curve=None):
        self._key = bytes(secret)
        # the cluster's CURVE keys (curve.py) when security.ssl.internal.enabled: the codec is
        # what every socket's owner holds, so the sockets take their keys from it
        self.curve = curve
        self.window = window if window is not None else ReplayWindow(clock=clock)
        self._clock = clock
        self._new_stream()

    @property
    def secret(self) -> bytes:
        """The cluster secret: what keys derived from it (curve.py) are made from."""
        return self._key

    def _new_stream(self) -> None:
        self.sender_id = os.urandom(SENDER_ID_BYTES)
        self._seq = itertools.count(1)  # next() on a count is atomic in CPython: no two frames share one

    def for_socket(self) -> "Codec":
        """A codec for one more sending socket: the same key and receiving window, its own stream."""
        twin = copy.copy(self)
        twin._new_stream()
        return twin

    def _mac(self, frames: Sequence) -> bytes:
        h = hmac.new(self._key, digestmod=hashlib.sha256)
        for frame in frames:
            view = memoryview(frame)
            h.update(view.nbytes.to_bytes(8, "big"))
            h.update(view)
        return h.digest()

    def encode(self, msg: Message, cid: Optional[int] = None, payload: Sequence = ()) -> list:
        """Sign ``msg``. Frames must leave their socket in the order they were encoded: a caller
        that encodes on several threads holds its send lock around encode and send."""
        wire = msg.to_wire()
        if cid is not None:
            wire["cid"] = cid
        wire["sid"] = self.sender_id
        wire["seq"] = next(self._seq)
        wire["ts"] = int(self._clock() * 1000)
        header = msgpack.packb(wire, use_bin_type=True)
        frames = [header, *payload]
        return [self._mac(frames), *frames]

    def decode(self, frames: Sequence) -> tuple[Message, Optional[int], list]:
        """Verify and unpack; raises MalformedMessage for anything not ours, ReplayedMessage (a
        MalformedMessage) for a frame of ours that is not fresh."""
        if len(frames) < 2:
            raise MalformedMessage(f"expected at least 2 frames, got {len(frames)}")
        mac = bytes(memoryview(frames[0]))
        body = frames[1:]
        if len(mac) != MAC_BYTES or not hmac.compare_digest(mac, self._mac(body)):
            raise MalformedMessage("bad or missing signature (wrong cluster secret?)")
        header = memoryview(body[0])
        if header.nbytes > MAX_HEADER_BYTES:
            raise MalformedMessage("header too large")
        try:
            wire = msgpack.unpackb(header, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise MalformedMessage(f"undecodable header: {exc}") from None
        cid = None
        if isinstance(wire, dict):
            cid = wire.pop("cid", None)
            if cid is not None and not isinstance(cid, int):
                raise MalformedMessage("correlation id is not an integer")
            sid, seq, ts = (wire.pop(k, None) for k in GUARD_KEYS)
            message = Message.from_wire(wire)
            if not (isinstance(sid, bytes) and len(sid) == SENDER_ID_BYTES and type(seq) is int
                    and type(ts) is int):
                raise MalformedMessage(f"{message.op}: missing or malformed replay guard (sid, seq, ts)")
            self.window.admit(sid, seq, ts)  # only a well-formed frame may move the window
            return message, cid, list(body[1:])
        return Message.from_wire(wire), cid, list(body[1:])  # raises: not a map
