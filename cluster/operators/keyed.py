"""Keyed operators. The running count emits, per batch, the new count of every key it touched
(an upsert stream: the latest row per key is the current value)."""
from __future__ import annotations

import pandas as pd
import pyarrow as pa

from .base import Operator


class KeyedCount(Operator):
    """params: key (list of column names)."""

    def open(self) -> None:
        self.key = list(self.params["key"])
        self.counts: dict = {}

    def process(self, table: pa.Table) -> list[pa.Table]:
        if table.num_rows == 0:
            return []
        missing = [k for k in self.key if k not in table.column_names]
        if missing:
            raise KeyError(f"{self.spec.where()}: key column(s) {missing} not in the input "
                           f"(columns: {table.column_names})")
        sizes = table.select(self.key).to_pandas().groupby(self.key, sort=False, dropna=False).size()
        totals = []
        for key, n in zip(sizes.index, sizes.to_numpy()):
            total = self.counts.get(key, 0) + int(n)
            self.counts[key] = total
            totals.append(total)
        out = sizes.index.to_frame(index=False)
        out["count"] = pd.Series(totals, dtype="int64")
        return [pa.Table.from_pandas(out, preserve_index=False)]
