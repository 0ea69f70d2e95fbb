"""How many bytes of batches a TaskManager's Spark JVM holds at once, over all its Spark stages.

While its job runs, a batch is in the JVM's heap several times over: the Arrow stream read in,
each Spark task's serialized copy and the copy it runs, the Arrow output and its serialized result.
With the default 1g heap, fused jobs of two subtasks' 64 MB batches (1M rows of eight int64
columns each) ran the heap out within a few jobs (that each job's first batch stayed alive, fixed
in plans.py, hastened it); the OutOfMemoryError killed Spark's scheduler thread, and the job
waited for tasks that never started. Every Spark job of the TaskManager (any task, any job) holds
its input's bytes here while it runs; one that would go over the budget waits for others to end,
and no job takes more than the whole budget (stage.py's and fusion.py's caps).

Thread use: any thread (the Spark stages' workers of every task in the TaskManager).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from cluster.conf import parse_size_bytes

from cluster.operators.base import TaskCancelled

# A fraction of the heap: 64 MB of the default 1g, at which 14 jobs in a row of 5M rows of eight
# int64 columns ran fused jobs of 64 MB at a steady 2.0-2.3 M rows/s. (Before, jobs slowed down one
# after the other until the heap ran out: each kept whole batches alive, see plans.py.)
HEAP_SHARE = 16
WAIT_SLICE_S = 0.05  # how often a thread waiting on Spark (a job for room, a task for its stage) looks at its task's cancellation


def budget_of_heap(driver_memory: str) -> int:
    """The budget for a session JVM of ``driver_memory`` (Spark's notation: "1g", "512m")."""
    return max(1 << 20, parse_size_bytes(driver_memory) // HEAP_SHARE)


class BatchMemory:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.held = 0
        self._cond = threading.Condition()

    @contextmanager
    def hold(self, nbytes: int, cancelled: threading.Event) -> Iterator[None]:
        """Hold ``nbytes`` (at most the whole budget) for a job; waits while the rest is held."""
        nbytes = min(nbytes, self.capacity)
        with self._cond:
            while self.held and self.held + nbytes > self.capacity:
                if cancelled.is_set():
                    raise TaskCancelled()
                self._cond.wait(WAIT_SLICE_S)
            self.held += nbytes
        try:
            yield
        finally:
            with self._cond:
                self.held -= nbytes
                self._cond.notify_all()
