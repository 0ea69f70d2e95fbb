"""Sources. The generator is deterministic and replayable, and can be rescaled from a savepoint.

Its sequence 0, 1, 2, ... is cut into splits of ``split_size`` numbers (FLIP-27's splits); subtask
i of p reads splits i, i+p, i+2p, ... in order. Its position is a set of facts that stay true
whatever the parallelism: "splits s with s % p == i and s // p < done are read" and "split s is
read up to offset o". A subtask restored at another parallelism takes the union of every old
subtask's facts and reads the splits of its own residue class that are not done, resuming the
partly read ones: every number is emitted exactly once, at any parallelism.
"""
from __future__ import annotations

import time
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa

from .base import SourceOperator, UserFunctionError


def to_table(result, where: str) -> pa.Table:
    if isinstance(result, pa.Table):
        return result
    if isinstance(result, pa.RecordBatch):
        return pa.Table.from_batches([result])
    if isinstance(result, dict):
        result = pd.DataFrame(result)
    if isinstance(result, pd.DataFrame):
        return pa.Table.from_pandas(result, preserve_index=False)
    raise UserFunctionError(f"{where} must return a pandas DataFrame, got {type(result).__name__}")


def default_split_size(count: Optional[int], batch_size: int) -> int:
    """Whole batches (no short batch but at a split's end), 16 of them, fewer for a bounded count
    so that it still makes some 64 splits to share. Never a function of the parallelism: the
    splits must stay the same when a savepoint is restored at another one."""
    batches = 16 if count is None else max(1, min(16, -(-count // (64 * batch_size))))
    return batches * batch_size


class GeneratorSource(SourceOperator, kind="generator-source"):
    """params: count (None: unbounded), rate (rows/s over all subtasks, None: as fast as possible),
    batch_size, split_size; udf: optional fn(seq: numpy int64 array) -> DataFrame (default: one
    column 'seq')."""

    def open(self) -> None:
        self.count: Optional[int] = self.params.get("count")
        p = self.ctx.parallelism
        self.batch_size = int(self.params.get("batch_size") or 1000)
        self.split_size = int(self.params.get("split_size") or default_split_size(self.count, self.batch_size))
        rate = self.params.get("rate")
        self.rate = None if rate is None else rate / p
        self.inherited: list[dict] = []   # facts restored from earlier runs
        self.partial: dict[int, int] = {}  # split -> offset, from earlier runs
        self.k = 0                         # index into this subtask's own splits: split = subtask + k*p
        self.offset = 0                    # rows read of the current split
        self.emitted = 0                   # rows emitted by this run (for the rate)
        self.started = time.monotonic()
        self._skip_done()

    @staticmethod
    def ends(params: dict) -> bool:
        return params.get("count") is not None

    # ------------------------------------------------------------------ splits
    def _split(self) -> int:
        return self.ctx.subtask + self.k * self.ctx.parallelism

    def _done_before(self, split: int) -> bool:
        return any(split % f["p"] == f["i"] and split // f["p"] < f["done"] for f in self.inherited)

    def _skip_done(self) -> None:
        while self._done_before(self._split()):
            self.k += 1
        self.offset = self.partial.get(self._split(), 0)

    def _split_rows(self, split: int) -> int:
        if self.count is None:
            return self.split_size
        return max(0, min(self.split_size, self.count - split * self.split_size))

    def poll(self) -> Optional[pa.Table]:
        split = self._split()
        remaining = self._split_rows(split) - self.offset
        if remaining <= 0:
            if self.count is not None and split * self.split_size >= self.count:
                return None
            self.k += 1
            self._skip_done()
            return pa.table({})
        n = min(self.batch_size, remaining)
        if self.rate is not None:
            due = int((time.monotonic() - self.started) * self.rate) - self.emitted
            if due <= 0:
                # sleep until the next row is due, at most 100 ms, so cancellation stays quick
                time.sleep(max(0.0, min(0.1, (self.emitted + 1) / self.rate - (time.monotonic() - self.started))))
                return pa.table({})
            n = min(n, due)
        start = split * self.split_size + self.offset
        seq = np.arange(start, start + n, dtype=np.int64)
        if self.udf is None:
            table = pa.table({"seq": seq})
        else:
            table = to_table(self.call_user(seq), f"{self.spec.where()}: the generator function")
            if table.num_rows != n:
                raise UserFunctionError(f"{self.spec.where()}: the generator function returned "
                                        f"{table.num_rows} rows for {n} sequence numbers")
        self.offset += n
        self.emitted += n
        return table

    # ------------------------------------------------------------------ position
    def snapshot_position(self) -> dict:
        own = {"p": self.ctx.parallelism, "i": self.ctx.subtask, "done": self.k}
        return {"facts": self.inherited + [own], "partial": {str(self._split()): self.offset}}

    def restore_position(self, position: dict) -> None:
        self.restore_state([{"subtask": self.ctx.subtask, "parallelism": self.ctx.parallelism,
                             "position": position}])

    def restore_state(self, handles: list[dict]) -> None:
        facts: list[dict] = []
        partial: dict[int, int] = {}
        for h in handles:
            facts += [f for f in h["position"]["facts"] if f not in facts]
            for split, offset in h["position"]["partial"].items():
                partial[int(split)] = max(offset, partial.get(int(split), 0))
        self.inherited = [f for f in facts if f["done"] > 0]
        self.partial = partial
        self.k = 0
        self._skip_done()
