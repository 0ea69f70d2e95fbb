"""Triggers, as Flink's: when a window's contents are emitted and when they are dropped.

A trigger is told of elements added to windows and of timers firing, and answers Flink's
TriggerResult per window: CONTINUE, FIRE (emit the window's result, keep its contents), PURGE (drop
its contents) or FIRE_AND_PURGE. It says which timers it wants, and the window operator registers
them (Flink's TriggerContext). Allowed lateness is the trigger's business here: the
EventTimeTrigger fires a window at its max timestamp, fires it again at once for each element that
comes within the lateness after that (an updated row), and purges it at max timestamp + lateness;
with no lateness the first firing also purges. Processing-time windows are never late, so the
ProcessingTimeTrigger has no lateness.

Pure and vectorised: the operator hands a batch's windows over as arrays of max timestamps (a
window [start, end) has ``end - 1``, Flink's TimeWindow.maxTimestamp); no state, no clock (event
time is the watermark the operator passes in, processing time only fires by timers).

Thread use: any (the owning operator's task thread in practice).
"""
from __future__ import annotations

import enum
from typing import NamedTuple, Optional

import numpy as np

from cluster.operators.timers import EVENT_TIME, PROCESSING_TIME


class TriggerResult(enum.IntFlag):
    """Flink's TriggerResult, as flags: FIRE_AND_PURGE is FIRE | PURGE."""
    CONTINUE = 0
    FIRE = 1
    PURGE = 2
    FIRE_AND_PURGE = 3


class OnElement(NamedTuple):
    """What a trigger answers to elements added to windows: a TriggerResult per window (an int8
    array) and the timers it wants, as (which windows, at what time) pairs in registration order."""
    results: np.ndarray
    timers: list[tuple[np.ndarray, np.ndarray]]


class Trigger:
    """A trigger in one time domain (EVENT_TIME or PROCESSING_TIME) that fires a window at its max
    timestamp and purges it ``lateness`` ms later (at once with none)."""

    domain: str = EVENT_TIME

    def __init__(self, lateness: int = 0):
        self.lateness = lateness

    def on_element(self, max_timestamps: np.ndarray, new: Optional[np.ndarray], watermark: int) -> OnElement:
        """Elements were added to the windows of ``max_timestamps``; ``new``: those that had no
        contents before, so no timers yet (None: all of them, registering again is harmless)."""
        raise NotImplementedError

    def on_timer(self, time: int, max_timestamp: int) -> TriggerResult:
        """A timer of the window of ``max_timestamp`` fired at ``time`` (Flink's onEventTime and
        onProcessingTime: one trigger is in one domain)."""
        result = TriggerResult.FIRE if time == max_timestamp else TriggerResult.CONTINUE
        if time == max_timestamp + self.lateness:
            result |= TriggerResult.PURGE
        return result

    def is_late(self, max_timestamps, watermark: int):
        """Whether a window is past its purge time (Flink's WindowOperator.isWindowLate): elements
        for it are dropped (or go to the late side output)."""
        return max_timestamps + self.lateness <= watermark

    def timer_times(self, max_timestamp: int) -> set[int]:
        """The times of the timers a window may hold (Flink's Trigger.clear deletes them: a session
        window merged away)."""
        return {max_timestamp, max_timestamp + self.lateness}

    def _timers(self, max_timestamps: np.ndarray, new: Optional[np.ndarray],
                due: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """The firing timer of each new window not due now and, with lateness, its purging one."""
        timed = np.ones(len(max_timestamps), dtype=bool) if new is None else new
        return [(timed & ~due, max_timestamps)] + ([(timed, max_timestamps + self.lateness)] if self.lateness else [])


class EventTimeTrigger(Trigger):
    """Flink's EventTimeTrigger with the window operator's allowed lateness: a window whose max
    timestamp the watermark already reached (an element within the lateness) fires at once."""

    domain = EVENT_TIME

    def on_element(self, max_timestamps: np.ndarray, new: Optional[np.ndarray], watermark: int) -> OnElement:
        due = max_timestamps <= watermark
        results = np.where(due, np.int8(TriggerResult.FIRE), np.int8(TriggerResult.CONTINUE))
        return OnElement(results, self._timers(max_timestamps, new, due))


class ProcessingTimeTrigger(Trigger):
    """Flink's ProcessingTimeTrigger: fires a window when the wall clock reaches its max timestamp,
    never on an element."""

    domain = PROCESSING_TIME

    def __init__(self) -> None:
        super().__init__(0)

    def on_element(self, max_timestamps: np.ndarray, new: Optional[np.ndarray], watermark: int) -> OnElement:
        due = np.zeros(len(max_timestamps), dtype=bool)
        return OnElement(np.zeros(len(max_timestamps), dtype=np.int8), self._timers(max_timestamps, new, due))
