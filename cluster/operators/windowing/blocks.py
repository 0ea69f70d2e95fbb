"""Aggregate and count contents of tumbling and sliding windows kept as blocks: one immutable
entry per (key group, window), key ``(BLOCK, start, end)`` in WINDOW_STATE, a tuple of numpy
arrays (the key columns, then the partial columns and the row count), one element per key of the
window in that key group, with one pair of timers per block (key BLOCK, namespace the window).

Per-key entries and timers cost Python work per (key, window), which the pre-aggregated path (10k
keys x 10 windows per batch) cannot afford; blocks merge and fire vectorised. They are still per
key group, so a restore at another parallelism splits them as any keyed state. Session windows
merge per key, so they keep AggregateContents.

Thread use: the owning operator's task thread only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.operators.aggregates import MERGE_IN_BATCH
from cluster.operators.windowing.arrow_groups import OVER_PARTIALS, aggregate, groupable
from cluster.operators.windowing.contents import (BLOCK, WINDOW_STATE, AggregateContents, block_keys,
                                                  run_starts)
from cluster.operators.windowing.pre_aggregation import window_partials


@dataclass
class MergedBlocks:
    """What merge_blocks touched: per block (key group, start, end, whether it existed before) and
    per row of the merged blocks (the key and state ``columns``, their bounds, whether a new partial
    row went into it); ``bounds`` cut the rows into the blocks."""
    groups: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    had: np.ndarray
    bounds: np.ndarray
    columns: dict
    row_starts: np.ndarray
    row_ends: np.ndarray
    new: np.ndarray


class BlockContents(AggregateContents):
    blocks = True
    slices = 0  # the length of the slices blocks are kept per (slices.py); 0: per window

    def snapshot(self, handle: dict) -> None:
        handle["slices"] = self.slices

    def restore(self, handles: list[dict]) -> None:
        kept = {int(h.get("slices", 0)) for h in handles} - {self.slices}
        if kept:
            def layout(slices: int) -> str:
                return f"per slice of {slices} ms" if slices else "per window"
            raise ValueError(f"{self.scope.where()}: the restored window state is kept {layout(kept.pop())}, and "
                             f"this window keeps it {layout(self.slices)} (a window pre-aggregated in another way, "
                             "or written by another version)")

    def add(self, pairs: pd.DataFrame, starts: np.ndarray, ends: np.ndarray) -> list[pa.Table]:
        return self.add_partials(window_partials(pairs, self.scope.key, starts, ends, None, self.aggregations))

    def add_partials(self, partials: pd.DataFrame) -> list[pa.Table]:
        """Merges partial rows (key, window_start, window_end, state columns; several rows of one
        key and window allowed: one per producer) into the blocks of their (key group, window)s,
        and fires those the trigger says fire at once."""
        merged = self.merge_blocks(partials)
        fire = self.scope.added(merged.groups.tolist(), [BLOCK] * len(merged.groups), merged.starts, merged.ends,
                                ~merged.had)
        if not fire.any():
            return []
        # late rows within the lateness: the updated rows of the keys this batch touched
        emit = np.repeat(fire, np.diff(merged.bounds)) & merged.new
        return self.result_columns({name: a[emit] for name, a in merged.columns.items()},
                                   merged.row_starts[emit], merged.row_ends[emit])

    def last_instants(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The last instant of the latest window that partial rows of these bounds go to: a row
        is late once that window is (the trigger's is_late)."""
        return ends - 1

    def merge_blocks(self, partials: pd.DataFrame) -> "MergedBlocks":
        """Partial rows merged into the blocks of their (key group, start, end): the old blocks and
        the new rows aggregated in one groupby, split back into blocks and stored."""
        key, backend = self.scope.key, self.scope.backend
        n = len(partials)
        starts = partials["window_start"].to_numpy(np.int64)
        ends = partials["window_end"].to_numpy(np.int64)
        groups = self.scope.key_groups_of(partials[key])
        order = np.lexsort((ends, starts, groups))
        firsts = order[run_starts(groups[order], starts[order], ends[order])]
        touched_groups, touched_starts, touched_ends = groups[firsts], starts[firsts], ends[firsts]
        old = backend.get_many(WINDOW_STATE, touched_groups.tolist(), block_keys(touched_starts, touched_ends))
        had = np.fromiter((o is not None for o in old), dtype=bool, count=len(old))
        names = key + self.state_columns
        columns = {name: [partials[name].to_numpy()] for name in names}
        where = {"__group__": [groups], "window_start": [starts], "window_end": [ends],
                 "__new__": [np.ones(n, dtype=np.int8)]}
        for i in np.flatnonzero(had).tolist():
            block = old[i]
            size = len(block[0])
            for name, values in zip(names, block):
                columns[name].append(values)
            for name, value in (("__group__", touched_groups[i]), ("window_start", touched_starts[i]),
                                ("window_end", touched_ends[i])):
                where[name].append(np.full(size, value, dtype=np.int64))
            where["__new__"].append(np.zeros(size, dtype=np.int8))
        # sorted by key group and window: each block is one run of rows
        merged = self._merged({name: np.concatenate(parts) for name, parts in {**where, **columns}.items()},
                              ["__group__", "window_start", "window_end"] + key)
        m_groups = merged["__group__"].astype(np.int64, copy=False)
        m_starts = merged["window_start"].astype(np.int64, copy=False)
        m_ends = merged["window_end"].astype(np.int64, copy=False)
        arrays = [merged[name] for name in names]
        bounds = np.append(run_starts(m_groups, m_starts, m_ends), len(m_groups))
        blocks = [tuple(a[lo:hi].copy() for a in arrays) for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
        # the same (key group, start, end)s in the same order as the touched ones
        backend.put_many(WINDOW_STATE, touched_groups.tolist(), block_keys(touched_starts, touched_ends), blocks)
        return MergedBlocks(touched_groups, touched_starts, touched_ends, had, bounds, dict(zip(names, arrays)),
                            m_starts, m_ends, merged["__new__"] == 1)

    def _merged(self, columns: dict[str, np.ndarray], by: list[str]) -> dict[str, np.ndarray]:
        """One row per ``by`` (sorted by it) of rows of blocks and partials: their state columns
        merged, and (given a column ``__new__``) whether any was new."""
        kinds = dict(zip(self.state_columns, self.kinds))
        if "__new__" in columns:
            kinds["__new__"] = "max"
        try:
            table = pa.table(columns)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # objects Arrow cannot type (mixed keys): pandas'
            table = None
        if table is not None and groupable(table.schema, by, self.state_columns):
            outputs = [(name, name, *OVER_PARTIALS[kind]) for name, kind in kinds.items()]
            merged = aggregate(table, by, outputs).sort_by([(name, "ascending") for name in by])
            return {name: merged.column(name).to_numpy() for name in merged.column_names}
        frame = pd.DataFrame(columns).groupby(by, sort=True, dropna=False).agg(
            **{name: (name, MERGE_IN_BATCH[kind]) for name, kind in kinds.items()}).reset_index()
        return {name: frame[name].to_numpy() for name in frame.columns}

    def fire(self, groups: list, keys: list, starts: list, ends: list) -> list[pa.Table]:
        """The rows of the blocks of (key group, BLOCK, window) timers."""
        blocks = self.scope.backend.get_many(WINDOW_STATE, groups, block_keys(starts, ends))
        live = [i for i, b in enumerate(blocks) if b is not None]  # none: a restore that had no rows
        if not live:
            return []
        sizes = [len(blocks[i][0]) for i in live]
        names = self.scope.key + self.state_columns
        columns = {name: np.concatenate([blocks[i][j] for i in live]) for j, name in enumerate(names)}
        return self.result_columns(columns, np.repeat(np.asarray(starts, dtype=np.int64)[live], sizes),
                                   np.repeat(np.asarray(ends, dtype=np.int64)[live], sizes))

    def clear(self, groups: list, keys: list, starts: list, ends: list) -> None:
        self.scope.backend.put_many(WINDOW_STATE, groups, block_keys(starts, ends), [None] * len(groups))
