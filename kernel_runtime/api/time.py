"""Time in the API, with Flink's names: durations, watermark strategies and window assigners.

Durations are ``datetime.timedelta``s (``Time.seconds(1)``, ``Duration.of_millis(200)``); a
plain int is milliseconds and a string is Flink's notation ("200 ms", "10 s"). Event time lives in
a column of the rows, the rowtime column: a watermark strategy names it
(``with_timestamp_column``) or computes it (``with_timestamp_assigner``, written to ``rowtime``).
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass, replace
from typing import Callable, Optional

from cluster.conf import parse_duration_ms
from cluster.graph.job_graph import GraphValidationError
from cluster.graph.windows import SessionWindows, SlidingWindows, TumblingWindows

from kernel_runtime.api.datastream import call_site

ASSIGNED_ROWTIME = "rowtime"  # where with_timestamp_assigner puts its timestamps (Flink SQL's name)


def to_ms(value, what: str) -> int:
    """A duration as whole milliseconds; ``what`` names it in the error."""
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    try:
        return parse_duration_ms(value)
    except (ValueError, TypeError) as exc:
        raise GraphValidationError(f"{what} ({call_site()}): {value!r} is not a duration: give a timedelta "
                                   f"(Time.seconds(1)), milliseconds or {exc}") from None


class Time:
    """Flink's window sizes: ``Time.seconds(10)``."""

    @staticmethod
    def milliseconds(n: float) -> datetime.timedelta:
        return datetime.timedelta(milliseconds=n)

    @staticmethod
    def seconds(n: float) -> datetime.timedelta:
        return datetime.timedelta(seconds=n)

    @staticmethod
    def minutes(n: float) -> datetime.timedelta:
        return datetime.timedelta(minutes=n)

    @staticmethod
    def hours(n: float) -> datetime.timedelta:
        return datetime.timedelta(hours=n)


class Duration:
    """Flink's java.time.Duration factories, as PyFlink spells them."""

    of_millis = staticmethod(Time.milliseconds)
    of_seconds = staticmethod(Time.seconds)
    of_minutes = staticmethod(Time.minutes)
    of_hours = staticmethod(Time.hours)


@dataclass(frozen=True)
class WatermarkStrategy:
    """How a stream's rows get their event time and its watermarks (Flink's WatermarkStrategy)."""

    bound_ms: Optional[int]            # the out-of-orderness bound; None: no watermarks
    idle_ms: Optional[int] = None
    column: Optional[str] = None       # the rowtime column
    assigner: Optional[Callable] = None  # fn(DataFrame) -> timestamps, written to ``column``

    @staticmethod
    def for_bounded_out_of_orderness(max_out_of_orderness) -> "WatermarkStrategy":
        bound = to_ms(max_out_of_orderness, "for_bounded_out_of_orderness")
        if bound < 0:
            raise GraphValidationError(f"for_bounded_out_of_orderness ({call_site()}): the bound must be >= 0, "
                                       f"got {bound} ms")
        return WatermarkStrategy(bound)

    @staticmethod
    def for_monotonous_timestamps() -> "WatermarkStrategy":
        return WatermarkStrategy(0)

    @staticmethod
    def no_watermarks() -> "WatermarkStrategy":
        return WatermarkStrategy(None)

    def with_timestamp_column(self, column: str) -> "WatermarkStrategy":
        """The rows' event time is this column: a timestamp, or integer epoch milliseconds."""
        if not isinstance(column, str) or not column:
            raise GraphValidationError(f"with_timestamp_column ({call_site()}): give a column name, got {column!r}")
        return replace(self, column=column, assigner=None)

    def with_timestamp_assigner(self, fn: Callable, column: str = ASSIGNED_ROWTIME) -> "WatermarkStrategy":
        """fn(DataFrame) -> one timestamp per row (datetimes or epoch ms), kept in ``column``."""
        if not callable(fn):
            raise GraphValidationError(f"with_timestamp_assigner ({call_site()}): expected a function, "
                                       f"got {type(fn).__name__}")
        return replace(self, column=column, assigner=fn)

    def with_idleness(self, timeout) -> "WatermarkStrategy":
        """A split with no row for ``timeout`` is idle: it holds no watermark back until it has rows again."""
        idle = to_ms(timeout, "with_idleness")
        if idle <= 0:
            raise GraphValidationError(f"with_idleness ({call_site()}): the timeout must be > 0, got {idle} ms")
        return replace(self, idle_ms=idle)

    def params(self, where: str) -> dict:
        if self.column is None:
            raise GraphValidationError(f"{where}: the watermark strategy does not say where the event time is: "
                                       "add .with_timestamp_column(name) or .with_timestamp_assigner(fn)")
        return {"column": self.column, "bound_ms": self.bound_ms, "idle_ms": self.idle_ms,
                "assigner": self.assigner is not None}


# ---------------------------------------------------------------------- window assigners
@dataclass(frozen=True)
class WindowAssigner:
    """What ``window(...)`` takes: its kind and lengths (ms) and its time (event or processing)."""

    spec: dict
    time: str  # "event" | "processing"

    @property
    def is_event_time(self) -> bool:
        return self.time == "event"


def _assigner(kind: str, time: str, **lengths) -> WindowAssigner:
    ms = {name: to_ms(value, f"{kind} window {name}") if name != "offset" or value else 0
          for name, value in lengths.items()}
    try:  # the assigners' own checks: lengths > 0, offset within the period
        if kind == "tumbling":
            TumblingWindows(ms["size"], ms["offset"])
        elif kind == "sliding":
            SlidingWindows(ms["size"], ms["slide"], ms["offset"])
        else:
            SessionWindows(ms["gap"])
    except ValueError as exc:
        raise GraphValidationError(f"{exc} ({call_site()})") from None
    return WindowAssigner({"type": kind, **ms}, time)


def _tumbling(time: str):
    def of(size, offset=0) -> WindowAssigner:
        """Windows of ``size`` one after the other, aligned to the epoch (plus ``offset``)."""
        return _assigner("tumbling", time, size=size, offset=offset)
    return staticmethod(of)


def _sliding(time: str):
    def of(size, slide, offset=0) -> WindowAssigner:
        """Windows of ``size`` starting every ``slide``."""
        return _assigner("sliding", time, size=size, slide=slide, offset=offset)
    return staticmethod(of)


def _sessions(time: str):
    def with_gap(gap) -> WindowAssigner:
        """A window per burst of a key's rows: rows closer than ``gap`` to each other."""
        return _assigner("session", time, gap=gap)
    return staticmethod(with_gap)


class TumblingEventTimeWindows:
    of = _tumbling("event")


class SlidingEventTimeWindows:
    of = _sliding("event")


class EventTimeSessionWindows:
    with_gap = _sessions("event")


class TumblingProcessingTimeWindows:
    of = _tumbling("processing")


class SlidingProcessingTimeWindows:
    of = _sliding("processing")


class ProcessingTimeSessionWindows:
    with_gap = _sessions("processing")
