"""Time in a task: watermarks through its chain and out to its consumers, idleness, and the
processing-time clock of its operators.

Watermarks travel in-band, as barriers do: a watermark follows every row its producer sent before
it, so the task combines its input channels' watermarks (WatermarkValve: the minimum over active
channels) and passes the result through the chain, operator by operator (a window operator fires
the windows it closes and its output goes on first), then to every output channel. An operator
that makes watermarks (timestamps-watermarks) is asked for one every
``pipeline.auto-watermark-interval`` (0: after every batch the task reads), and at once when a
batch moved its watermark past the end of one of the job's windows. A source ends with
MAX_WATERMARK, which fires every event-time window downstream.

The Spark stage runs batches on threads of its own, so a watermark that comes while rows before
it are still in Spark waits (``held``) until their outputs went on, keeping its place behind them.

Thread use: the task thread only (checked), which owns the chain. Other threads read
``input_watermark`` and ``output_watermark`` (ints, swapped whole) for the metrics.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Optional

import pyarrow as pa

from cluster.graph.event_time import NO_WATERMARK
from cluster.operators.windowing.watermarks import WatermarkValve

TICK_S = 0.01  # how often processing-time timers are looked at


class TaskTime:
    def __init__(self, chain: list, push: Callable[[int, list[pa.Table]], None],
                 emit_watermark: Callable[[int], None], emit_status: Callable[[bool], None],
                 interval_ms: int, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time):
        self._owner = threading.get_ident()
        self.chain = chain
        self._push, self._emit_watermark, self._emit_status = push, emit_watermark, emit_status
        self._interval = interval_ms / 1000
        self._clock, self._wall_clock = clock, wall_clock
        self.valve: Optional[WatermarkValve] = None
        self.input_watermark = NO_WATERMARK
        self.output_watermark = NO_WATERMARK
        self.output_idle = False
        self.stage = None     # the task's SparkStage, if any, at chain index stage_at
        self.stage_at = -1
        self._held: deque[tuple[int, int]] = deque()  # (rows submitted to the stage before it, watermark)
        self._generators = [i for i, op in enumerate(chain) if op.generates_watermarks]
        self._timed = [i for i, op in enumerate(chain) if op.uses_processing_time]
        self._next_periodic = 0.0
        self._next_tick = 0.0

    def set_inputs(self, channels: list[str]) -> None:
        self.valve = WatermarkValve(channels)

    def set_stage(self, stage, index: int) -> None:
        self.stage, self.stage_at = stage, index

    # ------------------------------------------------------------------ from the inputs
    def on_watermark(self, channel: str, watermark: int) -> None:
        self._check_owner()
        if self.valve is None:
            raise RuntimeError("a watermark came to a task without inputs")
        advanced = self.valve.on_watermark(channel, watermark)
        if advanced is not None:
            self.input_watermark = advanced
            self.advance(0, advanced)

    def on_status(self, channel: str, idle: bool) -> None:
        self._check_owner()
        if self.valve is None:
            raise RuntimeError("a watermark status came to a task without inputs")
        if idle:
            advanced = self.valve.on_idle(channel)
            if advanced is not None:
                self.input_watermark = advanced
                self.advance(0, advanced)
            if self.valve.idle:
                self._set_idle(True)
        else:
            self.valve.on_active(channel)
            self._set_idle(False)

    # ------------------------------------------------------------------ through the chain
    def advance(self, start: int, watermark: int) -> None:
        """The watermark reached chain index ``start``: through the operators from there on, and
        out if it moved the task's output watermark."""
        self._check_owner()
        current: Optional[int] = watermark
        for index in range(start, len(self.chain)):
            if index == self.stage_at and self.stage is not None and (
                    self._held or self.stage.rows_through < self.stage.rows_submitted):
                self._held.append((self.stage.rows_submitted, watermark))
                return
            out, current = self.chain[index].process_watermark(watermark)
            if out:
                self._push(index + 1, out)
            if current is None:
                return
            watermark = current
        if watermark > self.output_watermark:
            self.output_watermark = watermark
            self._emit_watermark(watermark)

    def release_held(self) -> None:
        """After the Spark stage handed outputs on: the watermarks that waited for those rows."""
        while self._held and self.stage is not None and self._held[0][0] <= self.stage.rows_through:
            _, watermark = self._held.popleft()
            self.advance(self.stage_at + 1, watermark)

    # ------------------------------------------------------------------ made here
    def before_rows(self) -> None:
        """Rows are about to go out: a task that said it was idle says it is active first, so
        that its consumers count its watermark again before its rows reach them."""
        if self.output_idle and self._generators:
            self._set_idle(False)

    def periodic(self, read_rows: bool) -> None:
        """Ask the chain's watermark generators, when the interval passed (interval 0: whenever
        the task read rows), or sooner when rows moved a generator's watermark past a window's end."""
        if not self._generators:
            return
        now = self._clock()
        if self._interval > 0:
            if now < self._next_periodic:
                if not (read_rows and any(self.chain[i].window_end_passed() for i in self._generators)):
                    return
            else:
                self._next_periodic = now + self._interval
        elif not read_rows and now < self._next_periodic:
            return  # idle with interval 0: still look now and then, for idleness
        else:
            self._next_periodic = now + 0.2
        for index in self._generators:
            answer = self.chain[index].periodic_watermark()
            if answer is None:
                continue
            watermark, idle = answer
            if idle:
                self._set_idle(True)
                continue
            self._set_idle(False)
            if watermark > NO_WATERMARK:
                self.advance(index + 1, watermark)

    def tick(self) -> None:
        """Processing-time timers that are due, through the rest of the chain."""
        if not self._timed:
            return
        now = self._clock()
        if now < self._next_tick:
            return
        self._next_tick = now + TICK_S
        now_ms = int(self._wall_clock() * 1000)
        for index in self._timed:
            out = self.chain[index].on_processing_time(now_ms)
            if out:
                self._push(index + 1, out)

    def _set_idle(self, idle: bool) -> None:
        if idle != self.output_idle:
            self.output_idle = idle
            self._emit_status(idle)

    def _check_owner(self) -> None:
        if threading.get_ident() != self._owner:
            raise RuntimeError(f"TaskTime used from thread {threading.current_thread().name}, "
                               "not its task's thread")
