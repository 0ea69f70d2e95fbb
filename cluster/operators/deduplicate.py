"""Deduplication: one row kept per key, in keyed state (Flink's deduplicate operator of SQL's
``ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...) = 1``, Spark's ``dropDuplicates``).

The kept row is the first of its key by the order given, as Spark sorts (ascending: nulls first;
descending: nulls last); rows equal in that order go to the first to arrive when the first
column is ascending and to the latest when it is descending (Flink's keep-first and keep-last
rows). Without an order the first row to arrive is kept, or the latest (pandas' keep="last"). Each batch emits the keys whose kept
row it changed, with that row: an upsert stream keyed by the key (append-only when rows are kept
in arrival order, as no key's row ever changes).

With the stream's event-time column among the key's (``time_column``), a key's row is kept only
until the watermark passes its time, as Spark's dropDuplicates with a watermark: a later row of
that time would be late, and a late row is dropped and counted (numLateRecordsDropped).

Thread use: the task thread only.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.common.frames import frame_to_table
from cluster.graph.event_time import NO_WATERMARK
from cluster.operators.base import OperatorSnapshot
from cluster.operators.keyed import KeyedOperator
from cluster.operators.late_rows import LateRows
from cluster.operators.timers import EVENT_TIME, TimerService
from cluster.operators.windowing.watermarks import rowtime_ms
from cluster.protocol.metrics import LATE_ROWS, NUM_LATE_RECORDS_DROPPED

ARRIVAL = "__arrival__"  # a row's place in the arrival order: -1 for the row kept before this batch
SLOT = "__slot__"  # the place of a row's key among the batch's keys


class KeyedDeduplicate(KeyedOperator, kind="keyed-deduplicate"):
    """params: key, order: [[column, descending, nulls_first], ...] (empty: arrival order),
    keep_latest: rows equal in the order go to the latest to arrive (else the first), time_column:
    the key's event-time column, whose watermark ends a key's state (None: kept for ever)."""

    def open(self) -> None:
        super().open()
        self.order = [tuple(o) for o in self.params.get("order") or ()]
        self.latest_wins = bool(self.params.get("keep_latest"))
        self.time_column: Optional[str] = self.params.get("time_column")
        if self.time_column is not None and self.time_column not in self.key:
            raise ValueError(f"{self.spec.where()}: the time column {self.time_column!r} bounds a key's state only "
                             f"as one of the key's columns {self.key}")
        self.timers = TimerService(self.backend)
        self.watermark = NO_WATERMARK
        self.late = LateRows(self.spec.uid, self.spec.name, None)

    def first_per_key(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The first row of each key in the order, ties by arrival (frame[ARRIVAL])."""
        ranked = frame.sort_values(ARRIVAL, ascending=not self.latest_wins, kind="stable")
        for column, descending, nulls_first in reversed(self.order):  # least significant first
            ranked = ranked.sort_values(column, ascending=not descending, kind="stable",
                                        na_position="first" if nulls_first else "last")
        return ranked.drop_duplicates(self.key, keep="first")

    def process(self, table: pa.Table) -> list[pa.Table]:
        if self.time_column is not None and table.num_rows:
            ts = rowtime_ms(table, self.time_column, self.spec.where())
            late = ts < self.watermark
            if late.any():
                self.late.record(table.filter(pa.array(late)), ts[late], self.watermark, False)
                table = table.filter(pa.array(~late))
        if table.num_rows == 0:
            return []
        frame = table.to_pandas()
        columns = list(frame.columns)
        best = self.first_per_key(frame.assign(**{ARRIVAL: np.arange(len(frame))}))
        batch = self.group(frame_to_table(best.drop(columns=[ARRIVAL])), key=self.key)
        best = best.assign(**{SLOT: np.arange(len(best))})  # one row per key, in the order of batch.keys
        kept = self.backend.get_many("kept", batch.key_groups, batch.keys)
        if self.order and any(row is not None for row in kept):  # this batch's best against the kept
            slots = [i for i, row in enumerate(kept) if row is not None]
            before = pd.DataFrame([kept[i] for i in slots], columns=columns)  # the same columns
            candidates = pd.concat([best, before.assign(**{ARRIVAL: -1, SLOT: slots})], ignore_index=True)
            best = self.first_per_key(candidates)
        if self.order or self.latest_wins:
            winners = best[best[ARRIVAL] >= 0]
        else:  # the first to arrive: only a key seen for the first time
            winners = best.iloc[[i for i, row in enumerate(kept) if row is None]]
        if winners.empty:
            return []
        slots = winners[SLOT].tolist()
        out = winners.drop(columns=[ARRIVAL, SLOT]).reset_index(drop=True)
        # a row by its column names: the state's inspection shows them (handle.state(...))
        self.backend.put_many("kept", [batch.key_groups[i] for i in slots], [batch.keys[i] for i in slots],
                              out.astype(object).to_dict("records"))
        result = frame_to_table(out)
        if self.time_column is not None:  # a new key's row is useless once the watermark passes its time
            new = [j for j, i in enumerate(slots) if kept[i] is None]
            times = rowtime_ms(result, self.time_column, self.spec.where())[new] + 1
            self.timers.register_many(EVENT_TIME, [batch.key_groups[slots[j]] for j in new],
                                      [batch.keys[slots[j]] for j in new], times.tolist(), [None] * len(new))
        return [result]

    def process_watermark(self, watermark: int) -> tuple[list[pa.Table], Optional[int]]:
        self.watermark = max(self.watermark, watermark)
        for timer in self.timers.pop_due(EVENT_TIME, watermark):
            self.backend.delete("kept", timer.key_group, timer.key)
        return [], watermark

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        snapshot = super().snapshot_state(checkpoint_id)
        snapshot.handle["watermark"] = self.watermark
        return snapshot

    def restore_state(self, handles: list[dict]) -> None:
        super().restore_state(handles)
        self.timers.restore()
        # the minimum: whatever any subtask had not yet seen may still come to this one
        self.watermark = min((h.get("watermark", NO_WATERMARK) for h in handles), default=NO_WATERMARK)

    def metrics(self) -> dict:
        return {NUM_LATE_RECORDS_DROPPED: self.late.dropped, LATE_ROWS: self.late.report()} \
            if self.time_column is not None else {}
