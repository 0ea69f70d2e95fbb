"""The interval join (Flink's IntervalJoinOperator) of two keyed streams in event time.

A left row l and a right row r of one key join when ``l.ts + lower <= r.ts <= l.ts + upper``,
emitted as soon as both are there; a row with ``ts < watermark`` is late: dropped and counted.
What the joins share is cluster.operators.joins. Thread use: the task thread only.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa

from cluster.operators.join_state import Chunks
from cluster.operators.joins import LEFT, RIGHT, JoinOperator
from cluster.operators.timers import EVENT_TIME


class IntervalJoin(JoinOperator, kind="interval-join"):
    """params: lower, upper (ms), lower_inclusive, upper_inclusive (default True).

    State: each side's waiting rows in Chunks, a chunk's time its earliest expiry. A batch meets the
    other side's chunks of its key groups in one vectorised equi-join, so the work per batch is a
    few calls per key group, none per key or row; a chunk is cut down, or dropped, when the
    watermark passes its time."""

    def open(self) -> None:
        super().open()
        self._need_rowtimes("an interval join")
        where = self.spec.where()
        bounds: dict[str, int] = {}
        for name in ("lower", "upper"):
            value = self.params.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{where}: the interval join's {name} bound must be a number of milliseconds, "
                                 f"got {value!r}")
            bounds[name] = int(value)
        if bounds["lower"] > bounds["upper"]:
            raise ValueError(f"{where}: the interval join's lower bound ({bounds['lower']} ms) is above its upper "
                             f"bound ({bounds['upper']} ms)")
        # the closed range of r.ts - l.ts that joins
        self.lower = bounds["lower"] + (0 if self.params.get("lower_inclusive", True) else 1)
        self.upper = bounds["upper"] - (0 if self.params.get("upper_inclusive", True) else 1)
        self.waiting = (Chunks(self.backend, "left"), Chunks(self.backend, "right"))

    def _expiry(self, side: int, ts: np.ndarray) -> np.ndarray:
        """The first watermark from which a row of ``side`` at ``ts`` can meet no row to come (those
        have ts >= the watermark)."""
        return ts + self.upper + 1 if side == LEFT else ts - self.lower + 1

    def process_side(self, side: int, table: pa.Table) -> list[pa.Table]:
        ts = self._event_times(side, table)
        table, ts = self._drop_late(side, table, ts, ts < self.watermark)
        if table.num_rows == 0:
            return []
        table = table.replace_schema_metadata(None)
        parts = self._by_key_group(side, table)
        out = self._match(side, table, ts, [group for group, _ in parts])
        self._keep(side, table, ts, parts)
        return out

    def _match(self, side: int, table: pa.Table, ts: np.ndarray, key_groups: list[int]) -> list[pa.Table]:
        met = self._meet(side, table, ts, self.waiting[1 - side], key_groups)
        if met is None:
            return []
        at_mine, at_theirs, their_ts = met.mine, met.at_theirs, met.their_ts
        gap = their_ts[at_theirs] - ts[at_mine] if side == LEFT else ts[at_mine] - their_ts[at_theirs]
        joins = (gap >= self.lower) & (gap <= self.upper)
        if not joins.any():
            return []
        this_rows, other_rows = table.take(at_mine[joins]), met.theirs.take(at_theirs[joins])
        return self._emit(*((this_rows, other_rows) if side == LEFT else (other_rows, this_rows)))

    def _keep(self, side: int, table: pa.Table, ts: np.ndarray, parts: list) -> None:
        expiry = self._expiry(side, ts)
        groups, chunks, times = [], [], []
        for group, rows in parts:
            rows = rows[expiry[rows] > self.watermark]  # the others can meet no row to come
            if len(rows):
                groups.append(group)
                chunks.append((ts[rows], table.take(rows)))
                times.append(int(expiry[rows].min()))
        if groups:
            self.waiting[side].add(groups, self._chunk_numbers(len(groups)), chunks, times)
            self.timers.register_many(EVENT_TIME, groups, [side] * len(groups), times, [None] * len(groups))

    def process_watermark(self, watermark: int) -> tuple[list[pa.Table], Optional[int]]:
        self.watermark = max(self.watermark, watermark)
        due = self.timers.pop_due(EVENT_TIME, watermark)
        for side in (LEFT, RIGHT):
            for group in dict.fromkeys(t.key_group for t in due if t.key == side):
                self._expire(side, group, watermark)
        return [], watermark

    def _expire(self, side: int, group: int, watermark: int) -> None:
        waiting = self.waiting[side]
        self._cut(waiting, group, watermark, lambda ts: self._expiry(side, ts))
        times = [time for time in waiting.index(group).values() if time is not None]
        if times:
            self.timers.register(EVENT_TIME, group, side, min(times))
