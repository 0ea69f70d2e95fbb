"""Sources. The generator is deterministic: subtask i of p emits sequence numbers i, i+p, i+2p ...

so the rows of a bounded generator are the same whatever the parallelism, and a position (how
many rows this subtask emitted) is all that replay needs.
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


class GeneratorSource(SourceOperator):
    """params: count (None: unbounded), rate (rows/s over all subtasks, None: as fast as possible),
    batch_size; udf: optional fn(seq: numpy int64 array) -> DataFrame (default: one column 'seq')."""

    def open(self) -> None:
        count: Optional[int] = self.params.get("count")
        p, i = self.ctx.parallelism, self.ctx.subtask
        self.remaining = None if count is None else len(range(i, count, p))
        self.position = 0  # rows emitted by this subtask
        rate = self.params.get("rate")
        self.rate = None if rate is None else rate / p
        self.batch_size = int(self.params.get("batch_size") or 1000)
        self.started = time.monotonic()

    @property
    def is_bounded(self) -> bool:
        return self.remaining is not None

    def snapshot_position(self) -> dict:
        return {"position": self.position}

    def restore_position(self, position: dict) -> None:
        done = position["position"] - self.position
        self.position = position["position"]
        if self.remaining is not None:
            self.remaining -= done
        if self.rate is not None:  # keep the rate from here on, not catch up on the replayed part
            self.started = time.monotonic() - self.position / self.rate

    def poll(self) -> Optional[pa.Table]:
        n = self.batch_size if self.remaining is None else min(self.batch_size, self.remaining)
        if n == 0:
            return None
        if self.rate is not None:
            due = int((time.monotonic() - self.started) * self.rate) - self.position
            if due <= 0:
                # sleep until the next row is due, at most the buffer timeout, so cancel stays quick
                time.sleep(max(0.0, min(0.1, (self.position + 1) / self.rate - (time.monotonic() - self.started))))
                return pa.table({})
            n = min(n, due)
        p, i = self.ctx.parallelism, self.ctx.subtask
        seq = np.arange(self.position, self.position + n, dtype=np.int64) * p + i
        if self.udf is None:
            table = pa.table({"seq": seq})
        else:
            table = to_table(self.call_user(seq), f"{self.spec.where()}: the generator function")
            if table.num_rows != n:
                raise UserFunctionError(f"{self.spec.where()}: the generator function returned "
                                        f"{table.num_rows} rows for {n} sequence numbers")
        self.position += n
        if self.remaining is not None:
            self.remaining -= n
        return table
