"""An aggregation over a changelog: rows that add (+I, +U) and rows that take back (-U, -D), as
an aggregation over another aggregation's running rows receives them (Flink's GroupAggregate
with retraction; the rows' kind is the column ROW_KIND_COLUMN).

A key keeps the number of rows it holds and, per aggregated column, the sum and the count of its
non-null values, each moved by +1 or -1 per row; count, sum and avg are read from them. min and
max need every value to take one back: a column they read keeps its values with their counts (a
multiset, as Flink's MinWithRetract keeps a map of them), a value leaving once its count is 0. A
key whose rows are all taken back is deleted: its last row comes marked '-D'.

Thread use: the task thread only.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.common.frames import frame_to_table
from cluster.graph.operator_kinds import ROW_KIND_COLUMN
from cluster.operators.keyed import KeyedOperator, state_key_values

RETRACTABLE = ("count", "sum", "mean", "min", "max")
MULTISET = ("min", "max")  # read from the values with their counts
ROWS = "__rows__"
VALUE = "__value__"


def _value(func: str, s, c, values: Optional[dict] = None):
    if func == "count":
        return int(c)
    if not c:
        return None  # no value left: Spark's sum, avg, min and max of nothing are null
    if func in MULTISET:
        assert values is not None
        return (min if func == "min" else max)(values)
    return s if func == "sum" else s / c


class KeyedChangelogAggregate(KeyedOperator, kind="keyed-changelog-aggregate"):
    """params: key, aggregations {out: [column, func]} (count, sum, mean, min, max). State per key:
    the numbers (rows, then per column its sum and count), then per column min or max reads its
    {value: count}."""

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
        self.summed = {column for column, func in self.aggregations.values() if func in ("sum", "mean")}
        self.kept = list(dict.fromkeys(column for column, func in self.aggregations.values() if func in MULTISET))
        self.times: dict[str, Optional[str]] = {}  # a time column min/max reads: its zone (values kept as ns)

    def process(self, table: pa.Table) -> list[pa.Table]:
        if table.num_rows == 0:
            return []
        frame = table.to_pandas()
        kinds = frame[ROW_KIND_COLUMN] if ROW_KIND_COLUMN in frame.columns else pd.Series("+I", index=frame.index)
        sign = np.where(kinds.isin(["-U", "-D"]).to_numpy(), -1, 1)
        deltas = {ROWS: sign}
        for column in self.columns:
            present = frame[column].notna().to_numpy()
            numeric = column in self.summed  # a column only min or max reads may be no number
            deltas[f"s:{column}"] = (np.where(present, frame[column].where(present, 0).to_numpy(), 0) * sign
                                     if numeric else np.zeros(len(frame), dtype=np.int64))
            deltas[f"c:{column}"] = present.astype(np.int64) * sign
        moved = pd.DataFrame(deltas).assign(**{k: frame[k] for k in self.key})
        moved = moved.groupby(self.key, sort=False, dropna=False)[self.parts].sum().reset_index()
        changes = [self._value_changes(frame, sign, column, moved) for column in self.kept]
        batch = self.group(frame_to_table(moved))
        olds = self.backend.get_many("changelog", batch.key_groups, batch.keys)
        news: list[Optional[tuple]] = []
        numbers = len(self.parts)
        for i, (old, delta) in enumerate(zip(olds, moved[self.parts].astype(object).values.tolist())):
            summed = tuple(delta) if old is None else tuple(a + b for a, b in zip(old[:numbers], delta))
            kept = tuple(_moved(dict(old[numbers + j]) if old is not None else {}, changed.get(i, ()))
                         for j, changed in enumerate(changes))
            news.append(summed + kept if summed[0] > 0 else None)  # no row left: the key is gone
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
        at_values = {column: len(self.parts) + j for j, column in enumerate(self.kept)}
        for name, (column, func) in self.aggregations.items():
            out[name] = [_value(func, state[self.at[f"s:{column}"]], state[self.at[f"c:{column}"]],
                                state[at_values[column]] if func in MULTISET else None) for _, state, _ in rows]
            if func in MULTISET and column in self.times:
                out[name] = pd.to_datetime(out[name], unit="ns", utc=self.times[column] is not None)
                if self.times[column] is not None:
                    out[name] = out[name].dt.tz_convert(self.times[column])
        out[ROW_KIND_COLUMN] = [kind for _, _, kind in rows]
        return [frame_to_table(out)]

    def _value_changes(self, frame: pd.DataFrame, sign: np.ndarray, column: str,
                       moved: pd.DataFrame) -> dict[int, list]:
        """Per key (its place in ``moved``), how the count of each of its values of ``column`` moved."""
        if pd.api.types.is_datetime64_any_dtype(frame[column]):
            self.times[column] = str(frame[column].dt.tz) if frame[column].dt.tz is not None else None
        present = frame[column].notna().to_numpy()
        rows = frame[present]
        # kept as keyed state keeps a key (a time as its int64 nanoseconds): a map's keys are plain values
        values = pd.DataFrame({VALUE: state_key_values(rows[column]), "__sign__": sign[present]},
                              index=rows.index).assign(**{k: rows[k] for k in self.key})
        counted = values.groupby(self.key + [VALUE], sort=False, dropna=False)["__sign__"].sum().reset_index()
        places = moved[self.key].assign(__place__=np.arange(len(moved)))
        counted = counted.merge(places, on=self.key, how="left")
        changes: dict[int, list] = {}
        for place, value, n in zip(counted["__place__"].tolist(), counted[VALUE].tolist(),
                                   counted["__sign__"].tolist()):
            changes.setdefault(place, []).append((value, n))
        return changes


def _moved(values: dict, changes) -> dict:
    """The multiset ``values`` ({value: count}) with each (value, by) of ``changes`` moved."""
    for value, by in changes:
        count = values.get(value, 0) + by
        if count > 0:
            values[value] = count
        else:
            values.pop(value, None)
    return values
