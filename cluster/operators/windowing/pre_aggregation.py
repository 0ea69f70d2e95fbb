"""Window pre-aggregation in pandas: partial aggregates per key and window of each batch, computed
upstream of the exchange (the "window-partial" kind) so that the shuffle carries one row per key,
window and batch instead of the rows; the window operator merges them into its state
(params["pre_aggregated"]). After a Spark step too (kernel_runtime.api.windowed says why).

A partial row: the key, window_start, window_end, the partial columns of the aggregations
(cluster.operators.keyed.partial_columns), ``__rows__`` (the rows it stands for) and, for the
late-record count, ``__latest__`` (how many of them have this as their latest window: a row all
of whose windows are late counts once, in its latest).

Thread use: the task thread only.
"""
from __future__ import annotations

from math import gcd
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.graph.windows import SessionWindows, SlidingWindows, TumblingWindows, assigner_of, window_start
from cluster.common.frames import frame_to_table
from cluster.operators.base import Operator
from cluster.operators.aggregates import MERGE_IN_BATCH, partial_columns
from cluster.operators.windowing.arrow_groups import OVER_PARTIALS, OVER_ROWS, aggregate, groupable, missing_as_null
from cluster.operators.windowing.watermarks import rowtime_ms

ROWS, LATEST = "__rows__", "__latest__"


def assign(assigner, timestamps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row index, window start, whether it is the row's latest window) per window of a row."""
    rows, starts = assigner.assign(timestamps)
    if isinstance(assigner, SlidingWindows):
        latest = starts == (np.asarray(timestamps, dtype=np.int64)[rows]
                            - np.mod(timestamps[rows] - assigner.offset, assigner.slide))
    else:
        latest = np.ones(len(rows), dtype=bool)
    return rows, starts, latest


def window_partials(frame: pd.DataFrame, key: list[str], starts: np.ndarray, ends: np.ndarray,
                    latest: Optional[np.ndarray], aggregations: dict) -> pd.DataFrame:
    """One row per key and window: the key, window_start, window_end, the partial columns of
    ``aggregations`` (keyed.partial_columns), __rows__ and, given ``latest``, __latest__. ``frame``
    holds one row per (row, window) pair."""
    frame = frame.assign(window_start=starts, window_end=ends)
    columns = {}
    if latest is not None:
        frame[LATEST] = latest.astype(np.int64)
        columns[LATEST] = (LATEST, "sum")
    for name, kind, column in partial_columns(aggregations):
        columns[name] = (column, MERGE_IN_BATCH[kind] if kind != "c" else "count")
    grouped = frame.groupby(key + ["window_start", "window_end"], sort=False, dropna=False)
    out = grouped.agg(**columns) if columns else pd.DataFrame(index=grouped.size().index)
    out[ROWS] = grouped.size()
    order = [n for n, _, _ in partial_columns(aggregations)] + [ROWS] + ([LATEST] if latest is not None else [])
    return out[order].reset_index()


def arrow_window_partials(assigner, table: pa.Table, ts: np.ndarray, key: list[str],
                          aggregations: dict) -> pa.Table:
    """window_partials' rows (with __latest__) by Arrow, for a table arrow_groups.groupable takes.
    A sliding window's rows are aggregated once per pane (the gcd of size and slide: Flink's slices,
    each wholly inside or outside every window), and each pane's partial goes to its windows: a
    row is not copied once per window."""
    table = missing_as_null(table, [column for column, _ in aggregations.values()])
    outputs = [(name, column, *OVER_ROWS[kind]) for name, kind, column in partial_columns(aggregations)]
    sliding = isinstance(assigner, SlidingWindows)
    pane = gcd(assigner.size, assigner.slide) if sliding else assigner.size
    starts = window_start(ts, pane, assigner.offset)
    panes = aggregate(table.append_column("window_start", pa.array(starts)), key + ["window_start"], outputs, ROWS)
    rows = panes.column(ROWS).to_numpy()
    if not sliding:
        ends = pa.array(panes.column("window_start").to_numpy() + assigner.size)
        return panes.add_column(len(key) + 1, "window_end", ends).append_column(LATEST, pa.array(rows))
    pane_starts = panes.column("window_start").to_numpy()
    at, starts = assigner.assign(pane_starts)
    # a pane's rows have one latest window: the one that starts at the pane's slide
    latest = np.where(starts == window_start(pane_starts, assigner.slide, assigner.offset)[at], rows[at], 0)
    windows = (panes.take(pa.array(at)).set_column(len(key), "window_start", pa.array(starts))
               .add_column(len(key) + 1, "window_end", pa.array(starts + assigner.size))
               .append_column(LATEST, pa.array(latest.astype(np.int64))))
    # the panes of one batch that share a window: one row, as the rows' own would be
    merge = [(name, name, *OVER_PARTIALS[kind]) for name, kind, _ in partial_columns(aggregations)]
    merge += [(name, name, *OVER_PARTIALS["c"]) for name in (ROWS, LATEST)]
    return aggregate(windows, key + ["window_start", "window_end"], merge)


class WindowPartial(Operator, kind="window-partial"):
    """Partial aggregates per key and window of each batch, before the exchange (no state).
    params: key, rowtime, assigner, aggregations ({} for count)."""

    def open(self) -> None:
        assigner = assigner_of(self.params["assigner"], self.spec.where())
        if isinstance(assigner, SessionWindows):
            raise ValueError(f"{self.spec.where()}: session windows cannot be pre-aggregated (they merge)")
        self.assigner = assigner

    def process(self, table: pa.Table) -> list[pa.Table]:
        if table.num_rows == 0:
            return []
        key, aggregations = list(self.params["key"]), self.params["aggregations"]
        ts = rowtime_ms(table, self.params["rowtime"], self.spec.where())
        values = [column for column, _ in aggregations.values()]
        needed = table.select(list(dict.fromkeys(key + values)))
        if groupable(needed.schema, key, values):
            return [arrow_window_partials(self.assigner, needed, ts, key, aggregations)]
        rows, starts, latest = assign(self.assigner, ts)
        frame = needed.to_pandas()
        if not isinstance(self.assigner, TumblingWindows):  # a row in several windows: one row per window
            frame = frame.take(rows)
        partials = window_partials(frame, key, starts, starts + self.assigner.size, latest, aggregations)
        return [frame_to_table(partials)]
