"""A pre-aggregated sliding window's contents kept per slice (Flink's slicing window aggregation):
blocks per (key group, slice), a slice being the gcd of size and slide, so each slice lies wholly
inside or outside every window. The partials upstream are made per slice (a tumbling window of the
slice's length), so a row is aggregated once rather than once per window it falls in; a batch
rewrites the blocks of the one or two slices it touches, not of the size / slide windows; a window
merges its slices' blocks when it fires.

Timers stay per (key group, window), registered for every window of a slice when rows reach it.
A window's clean-up drops the slices between its start and the next window's start: no later
window holds them, and every earlier one was cleaned before it.

Thread use: the owning operator's task thread only.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.graph.windows import SlidingWindows, window_start
from cluster.operators.windowing.blocks import BlockContents
from cluster.operators.windowing.contents import BLOCK, WINDOW_STATE, WindowScope, block_keys


class SliceContents(BlockContents):
    def __init__(self, scope: WindowScope, aggregations: dict, count: bool, assigner: SlidingWindows, slice_ms: int):
        super().__init__(scope, aggregations, count)
        if slice_ms <= 0 or assigner.size % slice_ms or assigner.slide % slice_ms:
            raise ValueError(f"{scope.where()}: slices of {slice_ms} ms do not divide the window's size "
                             f"({assigner.size} ms) and slide ({assigner.slide} ms)")
        self.assigner, self.slices = assigner, slice_ms

    def last_instants(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """A slice's rows are late once the latest window holding it is: the one starting at the
        slide the slice begins in."""
        return window_start(starts, self.assigner.slide, self.assigner.offset) + self.assigner.size - 1

    def add_partials(self, partials: pd.DataFrame) -> list[pa.Table]:
        """Partial rows of slices into their blocks; the windows of those slices get their timers,
        and those past the watermark but not late fire again at once with the keys this batch touched."""
        merged = self.merge_blocks(partials)
        at, starts = self.assigner.assign(merged.starts)
        ends = starts + self.assigner.size
        live = ~self.scope.is_late(ends - 1)  # a window cleaned up before this slice was made stays so
        at, starts, ends = at[live], starts[live], ends[live]
        groups = merged.groups[at]
        fire = self.scope.added(groups.tolist(), [BLOCK] * len(at), starts, ends, None)
        if not fire.any():
            return []
        # the windows to fire again, each with its keys that a new partial row reached
        windows = pd.DataFrame({"__group__": groups[fire], "window_start": starts[fire], "window_end": ends[fire]})
        windows = windows.drop_duplicates(ignore_index=True)
        rows = self._window_rows(windows["__group__"].to_numpy(), windows["window_start"].to_numpy(),
                                 windows["window_end"].to_numpy())
        if rows is None:
            return []
        columns, window_index = rows
        touched = pd.DataFrame({**{k: v[merged.new] for k, v in merged.columns.items() if k in self.scope.key},
                                "__slice__": merged.row_starts[merged.new],
                                "__group__": np.repeat(merged.groups, np.diff(merged.bounds))[merged.new]})
        result = pd.DataFrame({**{k: columns[k] for k in self.scope.key},
                               "__group__": windows["__group__"].to_numpy()[window_index],
                               "window_start": windows["window_start"].to_numpy()[window_index],
                               "window_end": windows["window_end"].to_numpy()[window_index]})
        pairs = result.reset_index().merge(touched, on=self.scope.key + ["__group__"], how="inner")
        pairs = pairs[(pairs["__slice__"] >= pairs["window_start"]) & (pairs["__slice__"] < pairs["window_end"])]
        emit = np.zeros(len(result), dtype=bool)
        emit[pairs["index"].to_numpy()] = True
        return self.result_columns({name: a[emit] for name, a in columns.items()},
                                   result["window_start"].to_numpy()[emit], result["window_end"].to_numpy()[emit])

    def _window_rows(self, groups: np.ndarray, starts: np.ndarray, ends: np.ndarray):
        """The key and state columns of windows (one row per key of each window: its slices merged)
        and, per row, the window it belongs to; None when none of their slices holds a row."""
        per = self.assigner.size // self.slices
        slice_groups, slice_keys = self._slices(groups, starts, per)
        window_of = np.repeat(np.arange(len(starts)), per)
        blocks = self.scope.backend.get_many(WINDOW_STATE, slice_groups, slice_keys)
        live = [i for i, b in enumerate(blocks) if b is not None]
        if not live:
            return None
        names = self.scope.key + self.state_columns
        columns = {name: np.concatenate([blocks[i][j] for i in live]) for j, name in enumerate(names)}
        columns["__window__"] = np.repeat(window_of[live], [len(blocks[i][0]) for i in live])
        merged = self._merged(columns, ["__window__"] + self.scope.key)
        return {name: merged[name] for name in names}, merged["__window__"].astype(np.int64)

    def fire(self, groups: list, keys: list, starts: list, ends: list) -> list[pa.Table]:
        """The rows of the windows of (key group, BLOCK, window) timers, from their slices."""
        rows = self._window_rows(np.asarray(groups), np.asarray(starts), np.asarray(ends))
        if rows is None:
            return []
        columns, window_index = rows
        return self.result_columns(columns, np.asarray(starts, dtype=np.int64)[window_index],
                                   np.asarray(ends, dtype=np.int64)[window_index])

    def clear(self, groups: list, keys: list, starts: list, ends: list) -> None:
        """A window cleaned up: the slices before the next window's start go."""
        slice_groups, slice_keys = self._slices(groups, starts, self.assigner.slide // self.slices)
        self.scope.backend.put_many(WINDOW_STATE, slice_groups, slice_keys, [None] * len(slice_groups))

    def _slices(self, groups, starts, per: int) -> tuple[list, list]:
        """The key groups and state keys of the first ``per`` slices from each window start."""
        slice_starts = (np.asarray(starts, dtype=np.int64)[:, None] + np.arange(per) * self.slices).ravel()
        slice_groups = np.repeat(np.asarray(groups, dtype=np.int64), per).tolist()
        return slice_groups, block_keys(slice_starts, slice_starts + self.slices)
