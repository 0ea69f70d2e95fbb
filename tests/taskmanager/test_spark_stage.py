"""The Spark stage's batching and ordering, with plain functions in Spark's place (no JVM): what
waits while a job runs goes into the next job whole, outputs keep the input's order, failures and
cancellation reach the task thread."""
from __future__ import annotations

import sys
import threading
import time

import pyarrow as pa
import pytest

from cluster.operators.base import TaskCancelled
from cluster.spark.stage import BatchAccumulator, SparkStage


def rows(start: int, n: int) -> pa.Table:
    return pa.table({"x": pa.array(range(start, start + n), pa.int64())})


def values(tables: list[pa.Table]) -> list[int]:
    return [v for t in tables for v in t["x"].to_pylist()]


# ---------------------------------------------------------------- BatchAccumulator
def test_everything_waiting_is_one_batch_of_one_chunk():
    waiting = BatchAccumulator(max_rows=1_000, max_bytes=1 << 30)
    for i in range(10):
        waiting.add(rows(i * 10, 10))
    waiting.add(rows(0, 0))  # empty tables are not kept
    batch = waiting.take()
    assert values([batch]) == list(range(100))
    assert all(column.num_chunks == 1 for column in batch.columns)
    assert not waiting and waiting.rows == 0


def test_the_row_cap_cuts_a_batch_and_the_rest_waits():
    waiting = BatchAccumulator(max_rows=25, max_bytes=1 << 30)
    for i in range(3):
        waiting.add(rows(i * 10, 10))
    assert waiting.full is True
    assert values([waiting.take()]) == list(range(20))  # a third table of 10 would pass 25
    assert values([waiting.take()]) == list(range(20, 30))
    waiting.add(rows(0, 60))  # one table over the cap is cut
    assert [t.num_rows for t in (waiting.take(), waiting.take(), waiting.take())] == [25, 25, 10]


def test_the_byte_cap_and_a_change_of_schema_end_a_batch():
    waiting = BatchAccumulator(max_rows=1_000_000, max_bytes=100 * 8)
    waiting.add(rows(0, 60))
    waiting.add(rows(60, 60))
    assert waiting.full is True
    assert waiting.take().num_rows == 60
    waiting.add(pa.table({"y": pa.array(["a"])}))
    assert waiting.take().num_rows == 60
    assert waiting.take().column_names == ["y"]


def test_a_table_over_the_byte_cap_is_cut_at_its_rows_mean_size():
    waiting = BatchAccumulator(max_rows=1_000_000, max_bytes=100 * 8)  # x is int64: 8 bytes a row
    waiting.add(rows(0, 250))
    assert [t.num_rows for t in (waiting.take(), waiting.take(), waiting.take())] == [100, 100, 50]
    waiting.add(rows(0, 250))
    assert waiting.take(max_bytes=40 * 8).num_rows == 40  # what a fused job has left: a lower cap
    assert waiting.take(max_bytes=1 << 30).num_rows == 100  # never above the accumulator's own


# ---------------------------------------------------------------- SparkStage
class Jobs:
    """Stands in for the Spark chain: records each batch, may be held until released."""

    def __init__(self):
        self.batches: list[list[int]] = []
        self.hold: dict[int, threading.Event] = {}  # job index -> released
        self.cancelled = 0
        self.results = threading.Event()

    def process(self, table: pa.Table) -> list[pa.Table]:
        index = len(self.batches)
        self.batches.append(values([table]))
        if index in self.hold:
            self.hold[index].wait(10)
        if values([table])[0] < 0:
            raise ValueError("a negative row")
        return [table]

    def cancel(self) -> None:
        self.cancelled += 1


def stage(jobs: Jobs, concurrency: int = 1, max_rows: int = 1_000, cancelled=None) -> SparkStage:
    return SparkStage(jobs.process, jobs.cancel, "operator 'sql' (t.py:1)", max_rows, 1 << 30, concurrency,
                      cancelled or threading.Event(), jobs.results.set)


def first_job_held(concurrency: int = 1, max_rows: int = 1_000) -> tuple[Jobs, SparkStage]:
    """A stage whose first job, rows 0-9, runs and is held until ``jobs.hold[0]`` is set."""
    jobs = Jobs()
    jobs.hold[0] = threading.Event()
    s = stage(jobs, concurrency, max_rows)
    s.submit([rows(0, 10)])
    until(lambda: len(jobs.batches) == 1)  # Spark was idle: the first rows went in at once
    return jobs, s


def until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {condition}")
        time.sleep(0.005)


def waiting_in_the_stage(ident: int) -> bool:
    """Whether thread ``ident`` is blocked in a SparkStage's wait for room."""
    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code is SparkStage._wait.__code__:
            return True
        frame = frame.f_back
    return False


def test_input_that_comes_while_a_job_runs_goes_into_the_next_job_whole():
    jobs, s = first_job_held()
    for i in range(1, 6):
        s.submit([rows(i * 10, 10)])
    jobs.hold[0].set()
    out = s.flush()
    assert [len(b) for b in jobs.batches] == [10, 50]
    assert values(out) == list(range(60))
    assert jobs.results.is_set()  # the task thread was woken for the results
    s.close()


def test_outputs_keep_the_input_order_when_a_later_job_ends_first():
    jobs, s = first_job_held(concurrency=2)
    s.submit([rows(10, 10)])
    until(lambda: len(jobs.batches) == 2)  # the second worker took it while the first is held
    until(jobs.results.is_set)  # job 1 is done: its output is in, and the task thread was woken
    assert s.take_results() == []  # but job 0 comes first
    jobs.hold[0].set()
    assert values(s.flush()) == list(range(20))
    s.close()


def test_a_full_stage_holds_the_task_thread_until_a_job_takes_the_input():
    jobs, s = first_job_held(max_rows=20)
    s.submit([rows(10, 10)])  # 10 wait: room for 10 more
    task_thread, released = threading.get_ident(), []

    def release_once_the_task_thread_waits():
        until(lambda: waiting_in_the_stage(task_thread))
        released.append(len(jobs.batches))  # still only the held job had taken input
        jobs.hold[0].set()
    releaser = threading.Thread(target=release_once_the_task_thread_waits, daemon=True)
    releaser.start()
    s.submit([rows(20, 10)])  # 20 wait: full, so this returns once the next job has taken them
    assert released == [1], "submit returned before the held job was released"
    releaser.join(5)
    assert values(s.flush()) == list(range(30))
    s.close()


def test_the_stage_is_idle_only_with_nothing_waiting_running_or_not_yet_handed_on():
    """The task answers a batch itself (OperatorChain._answered_here) only when the stage is idle:
    else that batch's output would pass outputs of earlier batches."""
    jobs, s = first_job_held()
    assert not s.idle  # a job runs
    s.submit([rows(10, 10)])
    assert not s.idle  # and input waits
    jobs.hold[0].set()
    assert values(s.flush()) == list(range(20))
    assert s.idle
    jobs.results.clear()
    s.submit([rows(20, 5)])
    until(jobs.results.is_set)  # done, its output not yet taken
    assert not s.idle
    assert values(s.take_results()) == list(range(20, 25))
    assert s.idle
    s.close()


def test_a_job_failure_reaches_the_task_thread_and_cancel_ends_a_wait():
    jobs = Jobs()
    s = stage(jobs)
    s.submit([rows(-5, 3)])
    with pytest.raises(ValueError, match="a negative row"):
        s.flush()
    s.close()

    jobs = Jobs()
    jobs.hold[0] = threading.Event()
    cancelled = threading.Event()
    s = stage(jobs, cancelled=cancelled)
    s.submit([rows(0, 10)])
    threading.Timer(0.1, cancelled.set).start()
    with pytest.raises(TaskCancelled):
        s.flush()
    threading.Timer(0.1, jobs.hold[0].set).start()  # the job ends soon after the cancel, as Spark's do
    s.close()  # the job still runs: its Spark jobs are cancelled
    assert jobs.cancelled == 1


def test_only_the_task_thread_may_use_the_stage():
    s = stage(Jobs())
    errors = []
    worker = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, s.submit, [rows(0, 1)])))
    worker.start()
    worker.join()
    assert "not its task's thread" in str(errors[0].value)
    s.close()
