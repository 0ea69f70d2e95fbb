"""An aggregation over a changelog: rows that add (+I, +U) and rows that take back (-U, -D), as
an aggregation over another aggregation's running rows receives them (Flink's GroupAggregate
with retraction; the rows' kind is the column ROW_KIND_COLUMN).

A key keeps the number of rows it holds and, per aggregated column, the sum and the count of its
non-null values, each moved by +1 or -1 per row; count, sum and avg are read from them. A key
whose rows are all taken back is deleted: its last row comes marked '-D'. min and max cannot take
a value back from these alone (Flink keeps every value for them), so they are not offered here.

Thread use: the task thread only.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.common.frames import frame_to_table
from cluster.graph.operator_kinds import ROW_KIND_COLUMN
from cluster.operators.keyed import KeyedOperator

RETRACTABLE = ("count", "sum", "mean")
ROWS = "__rows__"


def _value(func: str, s, c):
    if func == "count":
        return int(c)
    if not c:
        return None  # no value left: Spark's sum and avg of nothing are null
    return s if func == "sum" else s / c


class KeyedChangelogAggregate(KeyedOperator, kind="keyed-changelog-aggregate"):
    """params: key, aggregations {out: [column, func]} (count, sum, mean)."""

    def open(self) -> None:
        super().open()
        self.aggregations = self.params["aggregations"]
        wrong = {out: func for out, (_, func) in self.aggregations.items() if func not in RETRACTABLE}
        if wrong:
            raise ValueError(f"{self.spec.where()}: {wrong} cannot take a value back; an aggregation over a "
                             f"changelog offers {', '.join(RETRACTABLE)}")
        self.columns = list(dict.fromkeys(column for column, _ in self.aggregations.values()))
        self.parts = [ROWS] + [f"{p}:{c}" for c in self.columns for p in ("s", "c")]
        self.at = {part: j for j, part in enumerate(self.parts)}  # a part's place in a key's state

    def process(self, table: pa.Table) -> list[pa.Table]:
        if table.num_rows == 0:
            return []
        frame = table.to_pandas()
        kinds = frame[ROW_KIND_COLUMN] if ROW_KIND_COLUMN in frame.columns else pd.Series("+I", index=frame.index)
        sign = np.where(kinds.isin(["-U", "-D"]).to_numpy(), -1, 1)
        deltas = {ROWS: sign}
        for column in self.columns:
            present = frame[column].notna().to_numpy()
            deltas[f"s:{column}"] = np.where(present, frame[column].where(present, 0).to_numpy(), 0) * sign
            deltas[f"c:{column}"] = present.astype(np.int64) * sign
        moved = pd.DataFrame(deltas).assign(**{k: frame[k] for k in self.key})
        moved = moved.groupby(self.key, sort=False, dropna=False)[self.parts].sum().reset_index()
        batch = self.group(frame_to_table(moved))
        olds = self.backend.get_many("changelog", batch.key_groups, batch.keys)
        news: list[Optional[tuple]] = []
        for old, delta in zip(olds, moved[self.parts].astype(object).values.tolist()):
            summed = tuple(delta) if old is None else tuple(a + b for a, b in zip(old, delta))
            news.append(summed if summed[0] > 0 else None)  # no row left: the key is gone
        self.backend.put_many("changelog", batch.key_groups, batch.keys, news)
        keys = moved[self.key]
        rows: list[tuple[int, tuple, str]] = []  # (position of the key, its state, kind)
        for i, (old, new) in enumerate(zip(olds, news)):
            if new is not None:
                rows.append((i, new, "+I" if old is None else "+U"))
            elif old is not None:
                rows.append((i, old, "-D"))
        if not rows:
            return []
        out = keys.iloc[[i for i, _, _ in rows]].reset_index(drop=True)
        for name, (column, func) in self.aggregations.items():
            out[name] = [_value(func, state[self.at[f"s:{column}"]], state[self.at[f"c:{column}"]])
                         for _, state, _ in rows]
        out[ROW_KIND_COLUMN] = [kind for _, _, kind in rows]
        return [frame_to_table(out)]
