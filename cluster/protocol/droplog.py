"""Warnings about dropped input, rate-limited: garbage must not flood the log.

Within each ``interval`` the first ``first`` drops of a kind, from a peer, for one reason (the
detail up to its first colon: "bad or missing signature", "unknown op 'x'") are logged in full; the
rest are counted and summed up in one line when the interval is over (on the next drop or the
next ``flush``). The counters are bounded: past ``max_keys`` distinct keys in an interval, drops
count under one catch-all key, so an attacker inventing peer ids cannot grow them.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from cluster.protocol.codec import ReplayedMessage

OTHER = ("other drops", "other peers", "")


class DropLog:
    def __init__(self, logger: logging.Logger, what: str, first: int = 5, interval: float = 10.0,
                 max_keys: int = 64, clock: Callable[[], float] = time.monotonic):
        self.log, self.what = logger, what
        self.first, self.interval, self.max_keys, self.clock = first, interval, max_keys, clock
        self.dropped = 0  # all drops, ever
        self._counts: dict[tuple[str, str, str], int] = {}
        self._since = clock()
        self._lock = threading.Lock()  # drops may be reported from several threads

    def drop(self, kind: str, peer: object, detail: str) -> None:
        """Count one dropped message; log it if it is among the first of its kind this interval."""
        with self._lock:
            self.dropped += 1
            self._flush_if_due()
            key = (kind, repr(peer), detail.split(":", 1)[0][:80])
            if key not in self._counts and len(self._counts) >= self.max_keys:
                key = OTHER
            n = self._counts[key] = self._counts.get(key, 0) + 1
        if n <= self.first:
            self.log.warning("%s: dropped %s from %s: %s%s", self.what, kind, key[1], detail,
                             " (further ones are counted)" if n == self.first else "")

    def flush(self) -> None:
        with self._lock:
            self._flush_if_due()

    def _flush_if_due(self) -> None:
        now = self.clock()
        if now - self._since < self.interval:
            return
        suppressed: dict[tuple[str, str], int] = {}
        for (kind, peer, _), n in self._counts.items():
            if n > self.first:
                suppressed[kind, peer] = suppressed.get((kind, peer), 0) + n - self.first
        if suppressed:
            self.log.warning("%s: %d more dropped in the last %.0f s (not logged one by one): %s", self.what,
                             sum(suppressed.values()), now - self._since,
                             "; ".join(f"{n} {kind} from {peer}" for (kind, peer), n in
                                       sorted(suppressed.items(), key=lambda kv: -kv[1])[:10]))
        self._counts.clear()
        self._since = now


def drop_kind(exc: Exception) -> str:
    """How a refused frame is named in the log."""
    return "replayed message" if isinstance(exc, ReplayedMessage) else "malformed message"
