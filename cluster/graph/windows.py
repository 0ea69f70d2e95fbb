"""Window assignment, as Flink's assigners, over whole batches (numpy arrays of epoch milliseconds).

Pure: timestamps in, window starts out. A window is ``[start, start + size)`` and its last
timestamp is ``end - 1`` (Flink's TimeWindow.maxTimestamp), so an event-time window fires once the
watermark reaches ``end - 1``. Session windows start as ``[ts, ts + gap)`` per row and merge when
they overlap or touch (Flink's TimeWindow.intersects), as MergingWindowAssigner does.

They are part of the job's description (``params["assigner"]`` of a window, a window join or a
window pre-aggregation): the client builds them from ``TumblingEventTimeWindows.of(...)`` and
friends, and the window operator (cluster.operators.windowing, the runtime of
``key_by(...).window(...)``) assigns rows with them; see ../shared/design/ARCHITECTURE.md section 9.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple, Union

import numpy as np


class TimeWindow(NamedTuple):
    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        return self.end - 1

    def intersects(self, other: "TimeWindow") -> bool:
        return self.start <= other.end and self.end >= other.start

    def cover(self, other: "TimeWindow") -> "TimeWindow":
        return TimeWindow(min(self.start, other.start), max(self.end, other.end))


def window_start(timestamps: np.ndarray, size: int, offset: int = 0) -> np.ndarray:
    """Flink's TimeWindow.getWindowStartWithOffset, for every timestamp at once (negative ones too)."""
    ts = np.asarray(timestamps, dtype=np.int64)
    return ts - np.mod(ts - offset, size)


def _positive(where: str, name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{where}: {name} must be a positive number of milliseconds, got {value!r}")
    return int(value)


def _check(where: str, offset: int, **lengths: int) -> None:
    """Every length positive, and the offset within the last one (the period windows start at)."""
    for name, value in lengths.items():
        _positive(where, name, value)
    name, period = list(lengths.items())[-1]
    if abs(offset) >= period:
        raise ValueError(f"{where}: the offset ({offset} ms) must be smaller than the {name} ({period} ms)")


@dataclass(frozen=True)
class TumblingWindows:
    """Fixed windows of ``size`` ms, aligned to the epoch plus ``offset``."""
    size: int
    offset: int = 0

    def __post_init__(self):
        _check("a tumbling window", self.offset, size=self.size)

    def assign(self, timestamps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row index, window start) per window a row belongs to: one each here."""
        ts = np.asarray(timestamps, dtype=np.int64)
        return np.arange(len(ts)), window_start(ts, self.size, self.offset)


@dataclass(frozen=True)
class SlidingWindows:
    """Windows of ``size`` ms starting every ``slide`` ms: each row is in ceil(size / slide) of them
    (fewer where size is not a multiple of slide)."""
    size: int
    slide: int
    offset: int = 0

    def __post_init__(self):
        _check("a sliding window", self.offset, size=self.size, slide=self.slide)

    def assign(self, timestamps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ts = np.asarray(timestamps, dtype=np.int64)
        last = window_start(ts, self.slide, self.offset)  # the latest window that holds each row
        rows, starts = [], []
        for k in range(-(-self.size // self.slide)):
            start = last - k * self.slide
            inside = start > ts - self.size
            rows.append(np.flatnonzero(inside))
            starts.append(start[inside])
        order = np.concatenate(rows)
        return order, np.concatenate(starts)


@dataclass(frozen=True)
class SessionWindows:
    """A window per row, ``[ts, ts + gap)``, merged with every window it overlaps or touches."""
    gap: int

    def __post_init__(self):
        _positive("a session window", "gap", self.gap)

    def assign(self, timestamps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ts = np.asarray(timestamps, dtype=np.int64)
        return np.arange(len(ts)), ts


def merge_windows(windows: Iterable[TimeWindow]) -> list[tuple[TimeWindow, list[TimeWindow]]]:
    """Flink's TimeWindow.mergeWindows: the windows sorted by start and folded while they
    intersect; each result is the covering window and the windows merged into it."""
    merged: list[tuple[TimeWindow, list[TimeWindow]]] = []
    for window in sorted(windows):
        if merged and merged[-1][0].intersects(window):
            cover, members = merged[-1]
            merged[-1] = (cover.cover(window), members + [window])
        else:
            merged.append((window, [window]))
    return merged


Assigner = Union[TumblingWindows, SlidingWindows, SessionWindows]


def assigner_of(spec: object, where: str) -> Assigner:
    """The window assigner of a params["assigner"] ({"type", "size", "slide", "gap", "offset"}, ms)."""
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: the window assigner must be a dict with a \"type\" "
                         f"(tumbling, sliding or session), got {spec!r}")
    kind = spec.get("type")
    try:
        if kind == "tumbling":
            return TumblingWindows(spec["size"], spec.get("offset", 0) or 0)
        if kind == "sliding":
            return SlidingWindows(spec["size"], spec["slide"], spec.get("offset", 0) or 0)
        if kind == "session":
            return SessionWindows(spec["gap"])
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    except KeyError as exc:
        raise ValueError(f"{where}: a {kind} window needs its {exc.args[0]!r} (ms)") from None
    raise ValueError(f"{where}: unknown window assigner {kind!r} (tumbling, sliding or session)")
