"""Frames on the wire: ``[mac, header, *payload]``.

``header`` is the msgpack of a Message (plus an optional correlation id ``cid`` for
request/reply); ``payload`` frames carry bulk bytes (Arrow IPC) untouched. ``mac`` is
HMAC-SHA256 over every other frame, length-prefixed so frames cannot be re-cut, keyed with the
cluster secret. A frame set that fails the MAC is refused before anything is unpacked.
"""
from __future__ import annotations

import hashlib
import hmac
from typing import Optional, Sequence

import msgpack

from .messages import MalformedMessage, Message

MAC_BYTES = 32
MAX_HEADER_BYTES = 64 * 1024 * 1024


class Codec:
    def __init__(self, secret: bytes):
        self._key = bytes(secret)

    def _mac(self, frames: Sequence) -> bytes:
        h = hmac.new(self._key, digestmod=hashlib.sha256)
        for frame in frames:
            view = memoryview(frame)
            h.update(view.nbytes.to_bytes(8, "big"))
            h.update(view)
        return h.digest()

    def encode(self, msg: Message, cid: Optional[int] = None, payload: Sequence = ()) -> list:
        wire = msg.to_wire()
        if cid is not None:
            wire["cid"] = cid
        header = msgpack.packb(wire, use_bin_type=True)
        frames = [header, *payload]
        return [self._mac(frames), *frames]

    def decode(self, frames: Sequence) -> tuple[Message, Optional[int], list]:
        """Verify and unpack; raises MalformedMessage for anything not ours."""
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
        cid = wire.pop("cid", None) if isinstance(wire, dict) else None
        if cid is not None and not isinstance(cid, int):
            raise MalformedMessage("correlation id is not an integer")
        return Message.from_wire(wire), cid, list(body[1:])
