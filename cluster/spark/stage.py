"""The Spark stage of a task: its Spark chain runs on threads of its own.

A Spark job costs some 50-90 ms here however small its batch (../shared/notes/spark.md), so one
job per incoming batch caps a task at about 15 batches a second, and a source chained to ``.sql``
at its batch size times that. Instead the task thread hands its tables to the stage and goes on
reading; they wait in a ``BatchAccumulator`` while Spark is busy, and the next job takes everything
that waits (up to ``execution.spark.max-batch-rows`` / ``-size``). A row that comes while Spark is
idle goes in at once, so low rates keep low latency and high rates get big batches, with no batch
size to tune. While the JVM runs batch n, the task thread produces batch n+1 and ships the output
of batch n-1: Python and the JVM overlap. Up to ``execution.spark.max-concurrent-batches`` jobs
run at once, each on its own thread and Spark session; their outputs are handed on in input order.

The subtasks of a chain that share this process run their Spark jobs together
(cluster/spark/fusion.py): one job at a time takes what waits in each of their stages.

Thread use: the task thread (the one that built the stage) calls ``submit``, ``take_results``,
``flush`` and ``close`` (checked); the stage's worker threads, and those of its fusion group's
other stages (``take_batch``, ``run_batch``, ``finish_batch``, ``fail_batch``), run the chain.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Optional

import pyarrow as pa

from cluster.operators.base import TaskCancelled
from cluster.spark.fusion import FusionGroup
from cluster.spark.memory import WAIT_SLICE_S


class BatchAccumulator:
    """Tables that wait for Spark, taken as one batch of one chunk per column.

    Plain data, no locking: the stage calls it under its own lock."""

    def __init__(self, max_rows: int, max_bytes: int):
        self.max_rows, self.max_bytes = max_rows, max_bytes
        self._tables: deque[pa.Table] = deque()
        self.rows = self.nbytes = 0

    def __bool__(self) -> bool:
        return bool(self._tables)

    def add(self, table: pa.Table) -> None:
        if table.num_rows:
            self._tables.append(table)
            self.rows += table.num_rows
            self.nbytes += table.nbytes

    @property
    def full(self) -> bool:
        return self.rows >= self.max_rows or self.nbytes >= self.max_bytes

    def take(self, max_bytes: Optional[int] = None) -> pa.Table:
        """What waits, oldest first, up to the caps (a first table over them is cut); tables of
        another schema than the first wait for the next batch. ``max_bytes``: a lower byte cap
        for this batch (what a fused job has left)."""
        max_bytes = self.max_bytes if max_bytes is None else min(max_bytes, self.max_bytes)
        first = self._tables[0]
        taken: list[pa.Table] = []
        rows = nbytes = 0
        while self._tables and self._tables[0].schema.equals(first.schema):
            table = self._tables[0]
            if taken and (rows + table.num_rows > self.max_rows or nbytes + table.nbytes > max_bytes):
                break
            # only the first table can be over a cap (a later one ends the batch): cut it, by bytes
            # at its rows' mean size
            room = self.max_rows
            if table.nbytes > max_bytes:
                room = min(room, max(1, table.num_rows * max_bytes // table.nbytes))
            if table.num_rows > room:
                table, rest = table.slice(0, room), table.slice(room)
                self._tables[0] = rest
            else:
                self._tables.popleft()
            taken.append(table)
            rows += table.num_rows
            nbytes += table.nbytes
        self.rows -= rows
        self.nbytes = sum(t.nbytes for t in self._tables) if self._tables else 0
        # Spark turns every chunk into an Arrow batch of its own and pays per batch: a thousand
        # 1,000-row chunks took 2.8 s where one 1M-row chunk took 0.3 s
        table = taken[0] if len(taken) == 1 else pa.concat_tables(taken)
        return table.combine_chunks() if any(c.num_chunks > 1 for c in table.columns) else table


class SparkStage:
    """``process`` is the Spark chain's (table -> output tables), ``cancel`` cancels its Spark jobs,
    ``where`` names it in errors."""

    def __init__(self, process: Callable[[pa.Table], list[pa.Table]], cancel: Callable[[], None], where: str,
                 max_rows: int, max_bytes: int, concurrency: int,
                 cancelled: threading.Event, wake: Callable[[], None]):
        self._process, self._cancel, self.where = process, cancel, where
        self._cancelled = cancelled
        self._wake = wake  # tells the task thread that a result is ready
        self._owner = threading.get_ident()
        self._cond = threading.Condition()
        self._waiting = BatchAccumulator(max_rows, max_bytes)
        self._taken = 0       # batches taken by the workers, in order: their sequence numbers
        self._done: dict[int, tuple[list[pa.Table], int]] = {}  # sequence -> (outputs, input rows)
        self._handed_on = 0   # the sequence number of the next result to hand on
        # rows given to submit, and rows whose outputs were handed on: a watermark that came after
        # the first n rows goes on once n rows are through (the task holds it till then)
        self.rows_submitted = self.rows_through = 0
        self._running = 0
        self._error: Optional[BaseException] = None
        self._closing = False
        # the fusion group of the chain's subtasks in this process (set by the task before any input)
        self.group: Optional[FusionGroup] = None
        self._workers = [threading.Thread(target=self._work, daemon=True,
                                          name=f"{threading.current_thread().name} spark-{i}")
                         for i in range(concurrency)]
        for worker in self._workers:
            worker.start()

    # ------------------------------------------------------------------ the task thread
    def submit(self, tables: list[pa.Table]) -> None:
        """Hand tables to Spark; waits only while the input already waiting fills a batch."""
        self._check_owner()
        with self._cond:
            for table in tables:
                self._waiting.add(table)
                self.rows_submitted += table.num_rows
            self._cond.notify_all()
            while self._waiting.full and self._error is None:
                self._wait()

    @property
    def idle(self) -> bool:
        """Nothing waits, runs or is done and not yet handed on."""
        self._check_owner()
        with self._cond:
            return not self._waiting and not self._running and not self._done and self._error is None

    def take_results(self) -> list[pa.Table]:
        """The outputs of finished jobs, in input order; raises a job's failure."""
        self._check_owner()
        with self._cond:
            if self._error is not None:
                raise self._error
            out: list[pa.Table] = []
            while self._handed_on in self._done:
                outputs, rows = self._done.pop(self._handed_on)
                out += outputs
                self.rows_through += rows
                self._handed_on += 1
            return out

    def flush(self) -> list[pa.Table]:
        """Wait until every row submitted has been through Spark; the outputs not yet taken."""
        self._check_owner()
        with self._cond:
            while (self._waiting or self._running) and self._error is None:
                self._cond.notify_all()
                self._wait()
        return self.take_results()

    def close(self) -> None:
        """Stop the workers; a job still running is cancelled in Spark (a failed or cancelled task)."""
        with self._cond:
            self._closing = True
            running = self._running
            self._cond.notify_all()
        if running:
            self._cancel()
        for worker in self._workers:  # a job that ignores the cancel is left to end on its own
            worker.join(timeout=2)
        if self.group is not None:
            self.group.leave(self)

    def _wait(self) -> None:
        if self._cancelled.is_set():
            raise TaskCancelled()
        self._cond.wait(WAIT_SLICE_S)

    def _check_owner(self) -> None:
        if threading.get_ident() != self._owner:
            raise RuntimeError(f"SparkStage of {self.where} called from thread "
                               f"{threading.current_thread().name}, not its task's thread")

    # ------------------------------------------------------------------ worker threads
    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._closing and (not self._waiting or self._error is not None):
                    self._cond.wait()
                if self._closing:
                    return
                group = self.group
                if group is None:
                    sequence, table = self._take()
            if group is not None:
                group.run_round(self)  # this stage's input, and its fellow subtasks', in one job
            else:
                self.run_batch(sequence, table)

    def _take(self, max_bytes: Optional[int] = None) -> tuple[int, pa.Table]:
        """Under the condition: the next batch, numbered, counted as running."""
        table = self._waiting.take(max_bytes)
        sequence, self._taken = self._taken, self._taken + 1
        self._running += 1
        self._cond.notify_all()  # a task thread waiting for room may go on
        return sequence, table

    def take_batch(self, max_bytes: int) -> Optional[tuple[int, pa.Table]]:
        """Any worker of the group: this stage's next batch, if one waits (see _take)."""
        with self._cond:
            if self._closing or self._error is not None or not self._waiting:
                return None
            return self._take(max_bytes)

    def run_batch(self, sequence: int, table: pa.Table) -> None:
        """A taken batch through this stage's chain, in a job of its own, on the calling thread."""
        try:
            out = self._process(table)
        except BaseException as exc:  # the task thread raises it: it fails (or cancels) the task
            self.fail_batch(exc)
            return
        self.finish_batch(sequence, out, table.num_rows)

    def finish_batch(self, sequence: int, out: list[pa.Table], rows: int) -> None:
        with self._cond:
            self._running -= 1
            self._done[sequence] = (out, rows)
            self._cond.notify_all()
        self._wake()

    def fail_batch(self, exc: BaseException) -> None:
        with self._cond:
            self._running -= 1
            if self._error is None:
                self._error = exc
            self._cond.notify_all()
        self._wake()
