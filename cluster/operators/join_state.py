"""The rows a join keeps waiting in keyed state: Chunks, per key group and batch an Arrow table.

A batch or a watermark is joined with one vectorised merge over all the key groups it touches,
so the rows wait per key group and batch (a chunk), not per key: the joins (cluster.operators.joins
and its three kinds) read and rewrite whole chunks. Thread use: the task thread only.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa


class Chunks:
    """One side's rows waiting in keyed state, in chunks: per key group, the rows of a batch there
    (their times, epoch ms, and an Arrow table) under a chunk number, and an index of the group's
    chunks, each with the time from which it wants another look (the watermark it waits for)."""

    _INDEX_KEY = 0  # the index is the only key of its state in each key group

    def __init__(self, backend, name: str):
        self.backend = backend
        self.state, self.index_state = f"{name}-chunks", f"{name}-index"

    MERGE_AT = 8  # a key group's chunks are merged into one when a new one would make this many

    def add(self, groups: Sequence[int], numbers: Sequence[int], chunks: Sequence[tuple],
            times: Sequence[Optional[int]]) -> None:
        """A new chunk for each key group (each group once). Small batches make small chunks, and a
        join reads every chunk of the key groups it looks at: so a group's chunks are merged when
        there are MERGE_AT of them, which keeps their count, and the cost per chunk, bounded."""
        index_keys = [self._INDEX_KEY] * len(groups)
        indexes = [index or () for index in self.backend.get_many(self.index_state, groups, index_keys)]
        full = [i for i, index in enumerate(indexes) if len(index) + 1 >= self.MERGE_AT]
        new_chunks, new_times = list(chunks), list(times)
        if full:
            old = self.read([groups[i] for i in full], [[n for n, _ in indexes[i]] for i in full])
            for i in full:
                parts = [chunk for g, chunk in old if g == groups[i]] + [new_chunks[i]]
                new_chunks[i] = (np.concatenate([ts for ts, _ in parts]),
                                 pa.concat_tables([rows for _, rows in parts], promote_options="default"))
                known = [t for _, t in indexes[i] if t is not None] + ([t] if (t := new_times[i]) is not None else [])
                new_times[i] = min(known) if known else None
                self.backend.put_many(self.state, [groups[i]] * len(indexes[i]), [n for n, _ in indexes[i]],
                                      [None] * len(indexes[i]))
                indexes[i] = ()
        self.backend.put_many(self.state, groups, numbers, new_chunks)
        self.backend.put_many(self.index_state, groups, index_keys,
                              [index + ((n, t),) for index, n, t in zip(indexes, numbers, new_times)])

    def index(self, group: int) -> dict[int, Optional[int]]:
        """Chunk number -> its time (None: it wants no look), in the order the chunks came."""
        return dict(self.backend.get(self.index_state, group, self._INDEX_KEY) or ())

    def read(self, groups: list[int], numbers: Optional[list[list[int]]] = None) -> list[tuple[int, tuple]]:
        """(key group, chunk (ts, rows)) of the chunks of these key groups (all, or those ``numbers``),
        in the order they came."""
        if numbers is None:
            indexes = self.backend.get_many(self.index_state, groups, [self._INDEX_KEY] * len(groups))
            numbers = [[n for n, _ in index or ()] for index in indexes]
        at = [(g, n) for g, ns in zip(groups, numbers) for n in ns]
        if not at:
            return []
        return list(zip([g for g, _ in at], self.backend.get_many(self.state, [g for g, _ in at], [n for _, n in at])))

    def read_numbered(self, groups: list[int]) -> list[tuple[int, int, tuple]]:
        """(key group, chunk number, chunk) of every chunk of these key groups, in read()'s order."""
        indexes = self.backend.get_many(self.index_state, groups, [self._INDEX_KEY] * len(groups))
        numbers = [[n for n, _ in index or ()] for index in indexes]
        return [(g, n, chunk) for (g, chunk), n in zip(self.read(groups, numbers), [n for ns in numbers for n in ns])]

    def rewrite(self, group: int, index: Mapping[int, Optional[int]], changed: Mapping[int, Optional[tuple]]) -> None:
        """The group's new ``index`` after putting the ``changed`` chunks (None: gone)."""
        for number, chunk in changed.items():
            self.backend.put(self.state, group, number, chunk)
        self.backend.put(self.index_state, group, self._INDEX_KEY, tuple(index.items()) or None)


def by_key_group(key_groups: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(key group, the positions holding it) for every key group in ``key_groups``."""
    order = np.argsort(key_groups, kind="stable")
    groups, firsts = np.unique(key_groups[order], return_index=True)
    return list(zip(groups.tolist(), np.split(order, firsts[1:])))


def concat(chunks: list[tuple[int, tuple]]) -> tuple[np.ndarray, np.ndarray, pa.Table]:
    """(key group, ts) of every row of these chunks (as Chunks.read gives them), and the rows."""
    rows = pa.concat_tables([rows for _, (_, rows) in chunks], promote_options="default")
    return (np.repeat([g for g, _ in chunks], [len(ts) for _, (ts, _) in chunks]),
            np.concatenate([ts for _, (ts, _) in chunks]),
            rows.combine_chunks() if len(chunks) > 1 else rows)  # a take from many chunks is slow
