"""The temporal (versioned table) join of two keyed streams (Flink's temporal table join).

In event time the right side is a versioned table and a left row joins the version valid at its
rowtime, once the watermark says no older version can still come; in processing time (no left
rowtime) a left row joins its key's latest right row. What the joins share is
cluster.operators.joins. Thread use: the task thread only.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.operators.join_state import Chunks, by_key_group, concat
from cluster.operators.joins import LEFT, RIGHT, JoinOperator, SideBatch
from cluster.operators.timers import EVENT_TIME


def row_tuples(table: pa.Table) -> list[tuple]:
    """The rows as tuples of python values (immutable, picklable): a processing-time temporal
    join's latest right row per key."""
    return list(zip(*(column.to_pylist() for column in table.columns)))


def table_of(schema: pa.Schema, rows: Sequence[tuple]) -> pa.Table:
    columns = list(zip(*rows)) if rows else [()] * len(schema)
    return pa.Table.from_arrays([pa.array(list(values), type=field.type) for values, field in zip(columns, schema)],
                                schema=schema)


class TemporalJoin(JoinOperator, kind="temporal-join"):
    """params: how "inner"|"left". With left_rowtime and right_rowtime (event time), state in Chunks
    per key group: the right side's versions, the left rows waiting for the watermark; a key
    group's timer is the earliest time a waiting left row can go, or an old version be dropped.
    Without left_rowtime (processing time): the latest right row per key."""

    LATEST = "latest"

    def open(self) -> None:
        super().open()
        self.how = self.params.get("how", "inner")
        if self.how not in ("inner", "left"):
            raise ValueError(f"{self.spec.where()}: a temporal join is \"inner\" or \"left\", not {self.how!r}")
        self.event_time = self.rowtimes[LEFT] is not None
        if self.event_time:
            self._need_rowtimes("a temporal join with a left rowtime")
        self.pending, self.versions = Chunks(self.backend, "left-pending"), Chunks(self.backend, "right-versions")

    def process_side(self, side: int, table: pa.Table) -> list[pa.Table]:
        if not self.event_time:
            ts = self._read(side, table)
            if table.num_rows == 0:
                return []
            batch = self._by_key(side, table, ts)
            return self._join_latest(batch) if side == LEFT else self._update_latest(batch)
        ts = self._event_times(side, table)
        if side == LEFT:
            table, ts = self._drop_late(side, table, ts, ts < self.watermark)
        if table.num_rows == 0:
            return []
        table = table.replace_schema_metadata(None)
        parts = self._by_key_group(side, table)
        groups = [group for group, _ in parts]
        # a left row goes at its time; a version makes older ones of its key droppable from its time
        times = [int(ts[rows].min()) for _, rows in parts]
        (self.pending if side == LEFT else self.versions).add(
            groups, self._chunk_numbers(len(groups)), [(ts[rows], table.take(rows)) for _, rows in parts], times)
        self.timers.register_many(EVENT_TIME, groups, [0] * len(groups), times, [None] * len(groups))
        return []

    def process_watermark(self, watermark: int) -> tuple[list[pa.Table], Optional[int]]:
        """Joins the left rows up to the watermark, of the key groups whose timer is due, with the
        versions valid at their times; keeps the later left rows, and of the versions each key's
        last one at or before the watermark and the later ones: all key groups at once."""
        self.watermark = max(self.watermark, watermark)
        if not self.event_time:
            return [], watermark
        groups = list(dict.fromkeys(t.key_group for t in self.timers.pop_due(EVENT_TIME, watermark)))
        if not groups:
            return [], watermark
        out: list[pa.Table] = []
        rest: Optional[tuple] = None
        kept: Optional[tuple] = None
        v_rows: Optional[pa.Table] = None
        v_ts = np.empty(0, np.int64)
        pending, versions = self.pending.read(groups), self.versions.read(groups)
        if versions:
            v_groups, v_ts, v_rows = concat(versions)
            # versions by time, stably: of two of one time the later one wins
            frame = self._key_frame(RIGHT, v_rows, v_ts, "__at").sort_values("__ts", kind="stable")
            old = frame["__ts"].to_numpy() <= watermark
            superseded = np.zeros(len(frame), dtype=bool)
            superseded[old] = frame[old].duplicated(self._key_names, keep="last").to_numpy()
            keep = np.sort(frame["__at"].to_numpy()[~superseded])
            kept = (v_groups[keep], v_ts[keep], v_rows.take(keep))
        if pending:
            l_groups, l_ts, l_rows = concat(pending)
            due = l_ts <= watermark
            if due.any():
                out = self._join_versions(l_rows.filter(pa.array(due)), l_ts[due], v_rows, v_ts)
            if not due.all():
                rest = (l_groups[~due], l_ts[~due], l_rows.filter(pa.array(~due)))
        left_times = self._replace(self.pending, groups, rest, lambda ts: int(ts.min()))
        version_times = self._replace(self.versions, groups, kept,
                                      lambda ts: int(ts[ts > watermark].min()) if (ts > watermark).any() else None)
        wake = [(g, min(t for t in times if t is not None)) for g, times in
                zip(groups, zip(left_times, version_times)) if any(t is not None for t in times)]
        self.timers.register_many(EVENT_TIME, [g for g, _ in wake], [0] * len(wake), [t for _, t in wake],
                                  [None] * len(wake))
        return out, watermark

    def _join_versions(self, lefts: pa.Table, l_ts: np.ndarray, versions: Optional[pa.Table],
                       v_ts: np.ndarray) -> list[pa.Table]:
        if versions is None:
            return [] if self.how == "inner" else self._emit(lefts, None)
        names = self._key_names
        met = pd.merge_asof(self._key_frame(LEFT, lefts, l_ts, "__left").sort_values("__ts", kind="stable"),
                            self._key_frame(RIGHT, versions, v_ts, "__right").sort_values("__ts", kind="stable"),
                            on="__ts", by=names, direction="backward", allow_exact_matches=True)
        matched = met["__right"].notna().to_numpy()
        at_left = met["__left"].to_numpy()
        at_right = met["__right"].fillna(-1).to_numpy().astype(np.int64)
        if self.how == "inner":
            at_left, index = at_left[matched], pa.array(at_right[matched])
        else:
            index = pa.array(at_right, mask=~matched)
        return self._emit(lefts.take(at_left), versions.take(index))

    def _update_latest(self, batch: SideBatch) -> list[pa.Table]:
        # of several rows of a key in one batch, the last one is the latest
        last = [int(rows[-1]) for _, rows in by_key_group(batch.ids)]
        rows = row_tuples(batch.table.take(last))
        kids = [int(batch.ids[i]) for i in last]
        self.backend.put_many(self.LATEST, [batch.key_groups[k] for k in kids], [batch.keys[k] for k in kids], rows)
        return []

    def _join_latest(self, batch: SideBatch) -> list[pa.Table]:
        latest = self.backend.get_many(self.LATEST, batch.key_groups, batch.keys)
        found = [row for row in latest if row is not None]
        if not found and self.how == "inner":
            return []
        position = np.full(len(latest), -1, dtype=np.int64)
        position[np.flatnonzero([row is not None for row in latest])] = np.arange(len(found))
        at = position[batch.ids]
        matched = at >= 0
        left = batch.table
        if self.how == "inner":
            left, at = left.filter(pa.array(matched)), at[matched]
            index = pa.array(at)
        else:
            index = pa.array(at, mask=~matched)
        right = table_of(self.schemas[RIGHT], found).take(index) if self.schemas[RIGHT] is not None else None
        return self._emit(left, right)
