"""Watermarks as Flink's: how a source subtask makes them, and how a task combines its inputs'.

Pure, clock injected. ``BoundedOutOfOrderness`` is Flink's BoundedOutOfOrdernessWatermarks with
WatermarksWithIdleness around it: the watermark trails the largest timestamp seen by the bound
(and 1 ms: a watermark t says no row of timestamp <= t is to come), and a split that has had no
row for the idle timeout says so, so that it does not hold the others back. ``WatermarkValve`` is
Flink's StatusWatermarkValve: a task's watermark is the minimum over its input channels that are
active (not idle); a channel that comes back from idleness counts again only once it has caught
up with that minimum, so the output never goes back.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cluster.graph.event_time import NO_WATERMARK


class TimestampError(ValueError):
    """A rowtime column that is missing or holds no time."""


def rowtime_ms(table: pa.Table, column: str, where: str) -> np.ndarray:
    """The event time of each row, epoch milliseconds: the rowtime ``column`` of ``table``, an
    Arrow timestamp of any unit or an integer (already milliseconds). Nulls are an error: a row
    without a time cannot be placed in a window."""
    if column not in table.column_names:
        raise TimestampError(f"{where}: the timestamp column {column!r} is not in its input "
                             f"(columns: {table.column_names})")
    values = table.column(column)
    kind = values.type
    if pa.types.is_timestamp(kind):
        values = pc.cast(values, pa.timestamp("ms", kind.tz)).cast(pa.int64())
    elif pa.types.is_date(kind):
        values = pc.cast(pc.cast(values, pa.date64()), pa.int64())
    elif not pa.types.is_integer(kind):
        raise TimestampError(f"{where}: the timestamp column {column!r} is {kind}, not a time: give a "
                             "timestamp column or integer epoch milliseconds")
    if values.null_count:
        raise TimestampError(f"{where}: the timestamp column {column!r} has {values.null_count} null "
                             "value(s); every row needs an event time")
    return values.to_numpy().astype(np.int64, copy=False)


class BoundedOutOfOrderness:
    """Thread use: the source's task thread only. ``max_out_of_orderness`` 0 is Flink's
    forMonotonousTimestamps; ``idle_timeout`` None never marks the split idle."""

    def __init__(self, max_out_of_orderness: int, idle_timeout: Optional[float] = None,
                 clock: Callable[[], float] = lambda: 0.0):
        if max_out_of_orderness < 0:
            raise ValueError(f"the out-of-orderness bound must be >= 0 ms, got {max_out_of_orderness}")
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError(f"the idle timeout must be > 0 s, got {idle_timeout}")
        self.bound = max_out_of_orderness
        self.idle_timeout = idle_timeout
        self._clock = clock
        self.max_timestamp = NO_WATERMARK + max_out_of_orderness + 1
        self._last_row = clock()
        self.idle = False

    def on_batch(self, max_timestamp: int) -> None:
        """A batch of rows whose largest timestamp is ``max_timestamp``."""
        self.max_timestamp = max(self.max_timestamp, max_timestamp)
        self._last_row = self._clock()
        self.idle = False

    @property
    def watermark(self) -> int:
        """What it would emit now: the largest timestamp seen, less the bound and 1 ms."""
        return self.max_timestamp - self.bound - 1

    def on_periodic_emit(self) -> tuple[int, bool]:
        """(the watermark now, whether the split is idle), as the periodic emitter asks."""
        if self.idle_timeout is not None and self._clock() - self._last_row >= self.idle_timeout:
            self.idle = True
        return self.watermark, self.idle


class SplitWatermarks:
    """Flink's per-split watermarks: a BoundedOutOfOrderness per split, and the source's watermark
    the smallest of the splits that are not idle (idle when all are). A split announced before its
    first row holds the watermark back until it has rows or goes idle; a split no longer announced
    (read to its end) stops counting. Thread use: the source's task thread only."""

    def __init__(self, max_out_of_orderness: int, idle_timeout: Optional[float] = None,
                 clock: Callable[[], float] = lambda: 0.0):
        self._make = lambda: BoundedOutOfOrderness(max_out_of_orderness, idle_timeout, clock)
        self.splits: dict[str, BoundedOutOfOrderness] = {}

    def assigned(self, splits: list[str]) -> None:
        self.splits = {split: self.splits.get(split) or self._make() for split in splits}

    def on_batch(self, split: str, max_timestamp: int) -> None:
        self.splits.setdefault(split, self._make()).on_batch(max_timestamp)

    def states(self) -> dict[str, tuple[int, bool]]:
        """Each split's watermark and whether it is idle. Any thread: a copy of the dict, each
        generator's figures read once."""
        return {split: (g.watermark, g.idle) for split, g in dict(self.splits).items()}

    def on_periodic_emit(self) -> Optional[tuple[int, bool]]:
        if not self.splits:
            return None
        emitted = [generator.on_periodic_emit() for generator in self.splits.values()]
        active = [watermark for watermark, idle in emitted if not idle]
        if not active:
            return min(watermark for watermark, _ in emitted), True
        return min(active), False


class WatermarkValve:
    """Combines the watermarks of a task's input channels. Thread use: the task thread only.

    ``on_watermark`` and ``on_idle``/``on_active`` return the task's new input watermark when it
    advanced (None otherwise); ``idle`` is whether every channel is idle (then the task is idle
    downstream too)."""

    def __init__(self, channels: list[str]):
        self._watermark = {c: NO_WATERMARK for c in channels}
        self._active = {c: True for c in channels}
        self._aligned = {c: True for c in channels}  # counts toward the minimum
        self.current = NO_WATERMARK

    @property
    def idle(self) -> bool:
        return not any(self._active.values())

    def channels(self) -> dict[str, tuple[int, bool]]:
        """Each channel's watermark and whether it is idle. Any thread: it reads copies of the
        dicts (their keys never change after init; a copy is one step under the GIL)."""
        watermarks, active = dict(self._watermark), dict(self._active)
        return {c: (w, not active[c]) for c, w in watermarks.items()}

    def on_watermark(self, channel: str, watermark: int) -> Optional[int]:
        if not self._active[channel]:
            return None  # as Flink: an idle channel's watermarks count only once it says it is active
        if watermark > self._watermark[channel]:
            self._watermark[channel] = watermark
            if not self._aligned[channel] and watermark >= self.current:
                self._aligned[channel] = True
            return self._advance()
        return None

    def on_idle(self, channel: str) -> Optional[int]:
        if not self._active[channel]:
            return None
        self._active[channel] = False
        self._aligned[channel] = False
        if self._watermark[channel] != self.current:
            return None  # it was not what held the minimum back
        if self.idle:  # nothing will advance any more: all that was seen is final
            return self._raise_to(max(self._watermark.values()))
        return self._advance()

    def on_active(self, channel: str) -> Optional[int]:
        if not self._active[channel]:
            self._active[channel] = True
            self._aligned[channel] = self._watermark[channel] >= self.current
        return None

    def _advance(self) -> Optional[int]:
        counted = [self._watermark[c] for c in self._watermark if self._active[c] and self._aligned[c]]
        return self._raise_to(min(counted)) if counted else None

    def _raise_to(self, watermark: int) -> Optional[int]:
        if watermark > self.current:
            self.current = watermark
            return watermark
        return None
