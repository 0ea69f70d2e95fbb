"""Sources. The generator is deterministic and replayable, and can be rescaled from a savepoint.

Its sequence 0, 1, 2, ... is cut into splits of ``split_size`` numbers (FLIP-27's splits); subtask
i of p reads splits i, i+p, i+2p, ... in order. Its position is a set of facts that stay true
whatever the parallelism: "splits s with s % p == i and s // p < done are read" and "split s is
read up to offset o". A subtask restored at another parallelism takes the union of every old
subtask's facts and reads the splits of its own residue class that are not done, resuming the
partly read ones: every number is emitted exactly once, at any parallelism.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from typing import Optional

import numpy as np
import pyarrow as pa

from cluster.common.frames import to_table
from cluster.operators.base import SourceOperator, UserFunctionError

log = logging.getLogger(__name__)


SPLIT_BATCH = 1_000     # the batch that splits are made of when no batch_size is given (as before it was adaptive)
DEFAULT_POLL_ROWS = 65_536  # the most rows one poll reads when no batch_size is given
PACE_S = 0.005          # a rate-limited poll reads at most this often: rows due meanwhile wait for the next one


def default_split_size(count: Optional[int], batch_size: int) -> int:
    """Whole batches (no short batch but at a split's end), 16 of them, fewer for a bounded count
    so that it still makes some 64 splits to share. Never a function of the parallelism: the
    splits must stay the same when a savepoint is restored at another one."""
    batches = 16 if count is None else max(1, min(16, -(-count // (64 * batch_size))))
    return batches * batch_size


class GeneratorSource(SourceOperator, kind="generator-source"):
    """params: count (None: unbounded), rate (rows/s over all subtasks, None: as fast as possible),
    batch_size, split_size; udf: optional fn(seq: numpy int64 array) -> DataFrame (default: one
    column 'seq').

    Without a batch_size a poll reads what is due: as much of its split as it may (at most
    DEFAULT_POLL_ROWS) when there is no rate, else the rows due since the last poll, at most every
    PACE_S. So the batch size is no performance knob: the fixed cost of a poll (the user's function,
    pandas, Arrow) is spread over many rows when it can be, and a rate still gives rows when due."""

    def open(self) -> None:
        self.count: Optional[int] = self.params.get("count")
        p = self.ctx.parallelism
        given = self.params.get("batch_size")
        self.batch_size = int(given or DEFAULT_POLL_ROWS)
        # a given batch_size fixes every batch (but a split's last): batch boundaries, and with them
        # the watermarks generated after each batch, never depend on the timing of the polls
        self.fixed_batches = bool(given)
        # splits stay what they were with 1,000-row batches: positions in older savepoints stay true
        self.split_size = int(self.params.get("split_size") or default_split_size(self.count, int(given or SPLIT_BATCH)))
        rate = self.params.get("rate")
        self.rate = None if rate is None else rate / p
        self.inherited: list[dict] = []   # facts restored from earlier runs
        self.partial: dict[int, int] = {}  # split -> offset, from earlier runs
        self.k = 0                         # index into this subtask's own splits: split = subtask + k*p
        self.offset = 0                    # rows read of the current split
        self.emitted = 0                   # rows emitted by this run (for the rate)
        self.started: Optional[float] = None  # the rate's clock starts at the first poll, not while
        # the task waits for its Spark session or for the tasks after it to open
        self.last_poll = 0.0
        self._skip_done()

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
        start = split * self.split_size + self.offset
        n = self._rows_before_sentinel(start, min(self.batch_size, remaining))
        if n == 0:
            return pa.table({})
        if self.rate is not None:
            now = time.monotonic()
            if self.started is None:
                self.started = now
            due = int((now - self.started) * self.rate) - self.emitted
            if 0 < due < n and now - self.last_poll < PACE_S:  # a few rows: gather more (a poll has a cost)
                time.sleep(self.waiting(PACE_S - (now - self.last_poll)))
                return pa.table({})
            wanted = n if self.fixed_batches else 1
            if due < wanted:
                # sleep until the rows are due, at most 100 ms, so cancellation stays quick
                time.sleep(self.waiting(max(0.0, min(0.1, (self.emitted + wanted) / self.rate
                                                     - (time.monotonic() - self.started)))))
                return pa.table({})
            n = min(n, due)
            self.last_poll = now
        table = self.make_rows(np.arange(start, start + n, dtype=np.int64))
        self.offset += n
        self.emitted += n
        return table

    def make_rows(self, seq: np.ndarray) -> pa.Table:
        """The rows of sequence numbers ``seq``: the user's function of them, or the numbers."""
        if self.udf is None:
            return pa.table({"seq": seq})
        table = to_table(self.call_user(seq), f"{self.spec.where()}: the generator function")
        if table.num_rows != len(seq):
            raise UserFunctionError(f"{self.spec.where()}: the generator function returned "
                                    f"{table.num_rows} rows for {len(seq)} sequence numbers")
        return table

    def _rows_before_sentinel(self, start: int, n: int) -> int:
        """How many of the ``n`` rows from sequence number ``start`` to read now (TestingSource
        stops before a planned failure)."""
        return n

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


class PlannedFailure(RuntimeError):
    """What a TestingSource raises at its ``fail_at`` row."""


class TestingSource(GeneratorSource, kind="testing-source"):
    """The generator's rows and position, with failures planned for recovery tests (bytewax's
    TestingSource sentinels). params fail_at and kill_at: lists of [row, attempt]. In job attempt
    ``attempt`` (1 the first, each restart one more), the subtask whose split holds sequence number
    ``row`` emits the rows before it, then raises PlannedFailure (fail_at: the job fails over by
    its restart strategy) or SIGKILLs its own TaskManager (kill_at). With checkpointing on, it
    holds at that row until a checkpoint of the attempt has completed, so that the restart
    restores a position past the start, whatever the timing. A restored attempt reads on from its
    checkpoint's position, past the row if the attempt is another one."""

    def open(self) -> None:
        super().open()
        self.sentinels: list[tuple[int, str]] = sorted(
            (int(row), how) for how in ("fail_at", "kill_at")
            for row, attempt in self.params.get(how) or [] if int(attempt) == self.ctx.attempt)
        self.checkpointed = not self.ctx.config.checkpointing  # a checkpoint of this attempt completed

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if checkpoint_id > self.ctx.restored_checkpoint:
            self.checkpointed = True

    def _rows_before_sentinel(self, start: int, n: int) -> int:
        for row, how in self.sentinels:
            if row == start:
                if not self.checkpointed:
                    time.sleep(self.waiting(PACE_S))  # held at the row: barriers still pass between polls
                    return 0
                self._trigger(row, how)
            if start < row < start + n:
                return row - start
        return n

    def _trigger(self, row: int, how: str) -> None:
        where = f"{self.spec.where()}: planned failure at row {row} in attempt {self.ctx.attempt}"
        if how == "fail_at":
            raise PlannedFailure(where)
        log.warning("%s: SIGKILL of this TaskManager (pid %d)", where, os.getpid())
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
