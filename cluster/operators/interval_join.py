"""The interval join (Flink's IntervalJoinOperator) of two keyed streams in event time.

A left row l and a right row r of one key join when ``l.ts + lower <= r.ts <= l.ts + upper``,
emitted as soon as both are there; a row with ``ts < watermark`` is late: dropped and counted.
An outer join (how: left, right or full, as Flink SQL's outer interval join) also emits each row
of an outer side that met no row, with the other side's columns null, once the watermark says no
row to come can meet it: its rows wait with a flag that says whether they met one. The output
stays append-only. What the joins share is cluster.operators.joins. Thread use: the task thread only.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa

from cluster.graph.event_time import MAX_WATERMARK, NO_WATERMARK
from cluster.operators.join_state import Chunks
from cluster.operators.joins import LEFT, RIGHT, JoinOperator
from cluster.operators.timers import EVENT_TIME

MATCHED = "__matched"  # the flag of an outer side's waiting row: it met a row of the other side
OUTER = {"inner": (False, False), "left": (True, False), "right": (False, True), "full": (True, True)}


class IntervalJoin(JoinOperator, kind="interval-join"):
    """params: lower, upper (ms), lower_inclusive, upper_inclusive (default True); how (inner,
    left, right, full; default inner); side_schemas (for an outer join: each side's columns, so a
    side that sent no row can be padded).

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
        how = self.params.get("how", "inner")
        if how not in OUTER:
            raise ValueError(f"{where}: the interval join's how must be one of {', '.join(OUTER)}, got {how!r}")
        self.outer = OUTER[how]  # whether each side's rows without a match are emitted
        delay = self.params.get("output_watermark_delay", 0)
        if isinstance(delay, bool) or not isinstance(delay, (int, np.integer)) or delay < 0:
            raise ValueError(f"{where}: the interval join's output_watermark_delay must be a number of milliseconds, "
                             f"got {delay!r}")
        # a joined row carrying the left's time can be that far behind the input watermark (a left
        # row met by a later right row, or leaving alone when its bound passed): the output's
        # watermark waits for it, as Flink SQL's interval join holds its watermark back
        self.delay = int(delay)

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
        matched = np.zeros(table.num_rows, dtype=bool)
        out = self._match(side, table, ts, [group for group, _ in parts], matched)
        return out + self._keep(side, table, ts, parts, matched)

    def _match(self, side: int, table: pa.Table, ts: np.ndarray, key_groups: list[int],
               matched: np.ndarray) -> list[pa.Table]:
        """The pairs of the batch and the other side's waiting rows; sets ``matched`` of the batch's
        rows that met one, and the flags of the waiting rows of an outer side that met one."""
        other = 1 - side
        numbered = self.waiting[other].read_numbered(key_groups) if self.outer[other] else None
        chunks = [(g, chunk) for g, _, chunk in numbered] if numbered is not None else \
            self.waiting[other].read(key_groups)
        met = self._meet(side, table, ts, chunks)
        if met is None:
            return []
        at_mine, at_theirs, their_ts = met.mine, met.at_theirs, met.their_ts
        gap = their_ts[at_theirs] - ts[at_mine] if side == LEFT else ts[at_mine] - their_ts[at_theirs]
        joins = (gap >= self.lower) & (gap <= self.upper)
        if not joins.any():
            return []
        matched[at_mine[joins]] = True
        if numbered is not None:
            self._flag(other, numbered, at_theirs[joins])
        this_rows, other_rows = table.take(at_mine[joins]), _plain(met.theirs.take(at_theirs[joins]))
        return self._emit(*((this_rows, other_rows) if side == LEFT else (other_rows, this_rows)))

    def _flag(self, side: int, numbered: list[tuple[int, int, tuple]], positions: np.ndarray) -> None:
        """Marks the waiting rows at ``positions`` (of the chunks ``numbered``, as read) as met."""
        ends = np.cumsum([len(ts) for _, _, (ts, _) in numbered])
        starts = ends - np.array([len(ts) for _, _, (ts, _) in numbered])
        waiting = self.waiting[side]
        for (group, number, (ts, rows)), start, end in zip(numbered, starts, ends):
            mine = positions[(positions >= start) & (positions < end)] - start
            if len(mine) == 0:
                continue
            flags = rows.column(MATCHED).to_numpy(zero_copy_only=False).copy()
            if flags[mine].all():
                continue
            flags[mine] = True
            index = waiting.index(group)
            at = rows.schema.get_field_index(MATCHED)
            waiting.rewrite(group, index, {number: (ts, rows.set_column(at, MATCHED, pa.array(flags)))})

    def _unmatched(self, side: int, rows: pa.Table, matched: np.ndarray) -> list[pa.Table]:
        """The rows of an outer side that met no row, with the other side's columns null."""
        alone = _plain(rows).filter(pa.array(~matched))
        if not self.outer[side] or alone.num_rows == 0:
            return []
        return self._emit(alone, None) if side == LEFT else self._emit(None, alone)

    def _keep(self, side: int, table: pa.Table, ts: np.ndarray, parts: list, matched: np.ndarray) -> list[pa.Table]:
        """Keeps the rows that may still meet a row to come; an outer side's others that met none
        are emitted now."""
        expiry = self._expiry(side, ts)
        useful = expiry > self.watermark  # the others can meet no row to come
        if self.outer[side]:
            table = table.append_column(MATCHED, pa.array(matched))
        groups, chunks, times = [], [], []
        for group, rows in parts:
            rows = rows[useful[rows]]
            if len(rows):
                groups.append(group)
                chunks.append((ts[rows], table.take(rows)))
                times.append(int(expiry[rows].min()))
        if groups:
            self.waiting[side].add(groups, self._chunk_numbers(len(groups)), chunks, times)
            self.timers.register_many(EVENT_TIME, groups, [side] * len(groups), times, [None] * len(groups))
        gone = ~useful
        return self._unmatched(side, table.filter(pa.array(gone)), matched[gone]) if gone.any() else []

    def process_watermark(self, watermark: int) -> tuple[list[pa.Table], Optional[int]]:
        self.watermark = max(self.watermark, watermark)
        due = self.timers.pop_due(EVENT_TIME, watermark)
        out = []
        for side in (LEFT, RIGHT):
            for group in dict.fromkeys(t.key_group for t in due if t.key == side):
                out += self._expire(side, group, watermark)
        held = watermark if watermark in (NO_WATERMARK, MAX_WATERMARK) else watermark - self.delay
        return out, held

    def _expire(self, side: int, group: int, watermark: int) -> list[pa.Table]:
        """Drops the rows of ``group`` that can meet no row to come; those of an outer side that met
        none are emitted."""
        dropped = self._cut(self.waiting[side], group, watermark, lambda ts: self._expiry(side, ts), EVENT_TIME, side)
        if not self.outer[side] or not dropped:
            return []
        rows = pa.concat_tables(dropped)
        return self._unmatched(side, rows, rows.column(MATCHED).to_numpy(zero_copy_only=False))


def _plain(rows: pa.Table) -> pa.Table:
    """Waiting rows without the flag an outer side's rows carry."""
    return rows.drop_columns([MATCHED]) if MATCHED in rows.column_names else rows
