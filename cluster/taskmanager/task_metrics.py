"""TaskMetrics: where a task's time goes and how much it moved, as Flink measures it.

The task thread counts records and bytes in and out and times its waits: idle (waiting for input)
and back-pressured (waiting for credit downstream); the rest is busy. Over the last second the three
add up to 1000 ms (Flink's busyTimeMsPerSecond, backPressuredTimeMsPerSecond,
idleTimeMsPerSecond). The TaskManager's loop thread reads the figures for its heartbeats while the
task thread writes them, so the task thread publishes an immutable copy that readers take whole.

Thread use: every writer is the task thread's; ``snapshot`` is for any thread (see TaskMetrics).
"""
from __future__ import annotations

import time
from typing import Callable, NamedTuple, Optional

IDLE, BACKPRESSURED = "idle", "backpressured"

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
    records_sent: int
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
        self.records_in = self.records_out = self.records_sent = self.bytes_in = self.bytes_out = 0
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
                "bytes-in": self.bytes_in, "bytes-out": self.bytes_out, "records-sent": self.records_sent}

    def restore_counters(self, counters: dict[str, int]) -> None:
        """Count on from a restored checkpoint's figures (before the task runs)."""
        self.records_in, self.records_out = counters["records-in"], counters["records-out"]
        self.bytes_in, self.bytes_out = counters["bytes-in"], counters["bytes-out"]
        self.records_sent = counters.get("records-sent", 0)  # a checkpoint from before it was counted
        self.publish()

    @property
    def backpressured_s(self) -> float:
        """The back-pressured seconds of the waits ended so far (a mark for ``add_idle``)."""
        return self._backpressured

    def add_idle(self, seconds: float, backpressured_mark: Optional[float] = None) -> None:
        """Time found to have been idle after the fact (a source's poll that had nothing), less
        the back pressure measured within it since ``backpressured_mark`` (``backpressured_s``
        when it began): a source sends what its outputs hold before it waits for input, and a
        wait for credit there is back pressure, not idleness."""
        if backpressured_mark is not None:
            seconds -= self._backpressured - backpressured_mark
        self._add(IDLE, max(0.0, seconds))
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
        return _Published(now, self.records_in, self.records_out, self.records_sent, self.bytes_in, self.bytes_out,
                          self._idle, self._backpressured, self._waiting, self._window, self._per_second)

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
                "records-sent": state.records_sent, "bytes-in": state.bytes_in, "bytes-out": state.bytes_out,
                "backpressured-ms": int(bp * 1000), "idle-ms": int(idle * 1000),
                "busy-ms": int(busy * 1000)} | per_second

