"""Deduplication: one row kept per key, in keyed state (Flink's deduplicate operator of SQL's
``ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...) = 1``, Spark's ``dropDuplicates``).

The kept row is the first of its key by the order given, as Spark sorts (ascending: nulls first;
descending: nulls last); rows equal in that order go to the first to arrive when the first
column is ascending and to the latest when it is descending (Flink's keep-first and keep-last
rows). Without an order the first row to arrive is kept, or the latest (pandas' keep="last"). Each batch emits the keys whose kept
row it changed, with that row: an upsert stream keyed by the key (append-only when rows are kept
in arrival order, as no key's row ever changes).

Thread use: the task thread only.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.common.frames import frame_to_table
from cluster.operators.keyed import KeyedOperator

ARRIVAL = "__arrival__"  # a row's place in the arrival order: -1 for the row kept before this batch
SLOT = "__slot__"  # the place of a row's key among the batch's keys


class KeyedDeduplicate(KeyedOperator, kind="keyed-deduplicate"):
    """params: key, order: [[column, descending, nulls_first], ...] (empty: arrival order),
    keep_latest: rows equal in the order go to the latest to arrive (else the first)."""

    def open(self) -> None:
        super().open()
        self.order = [tuple(o) for o in self.params.get("order") or ()]
        self.latest_wins = bool(self.params.get("keep_latest"))

    def first_per_key(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The first row of each key in the order, ties by arrival (frame[ARRIVAL])."""
        ranked = frame.sort_values(ARRIVAL, ascending=not self.latest_wins, kind="stable")
        for column, descending, nulls_first in reversed(self.order):  # least significant first
            ranked = ranked.sort_values(column, ascending=not descending, kind="stable",
                                        na_position="first" if nulls_first else "last")
        return ranked.drop_duplicates(self.key, keep="first")

    def process(self, table: pa.Table) -> list[pa.Table]:
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
        return [frame_to_table(out)]
