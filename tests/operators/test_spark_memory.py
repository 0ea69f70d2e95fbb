"""The TaskManager's budget for batches in its Spark JVM (cluster/spark/memory.py)."""
from __future__ import annotations

import sys
import threading

import pytest

from cluster.operators.base import TaskCancelled
from cluster.spark.memory import BatchMemory, budget_of_heap
from tests.conftest import wait_for


def test_the_budget_is_a_sixteenth_of_the_session_heap():
    assert budget_of_heap("1g") == 64 << 20
    assert budget_of_heap("4g") == 256 << 20


def waiting_in_hold(thread: threading.Thread) -> bool:
    """Whether ``thread`` is blocked on the budget's condition inside BatchMemory.hold."""
    frame = sys._current_frames().get(thread.ident)
    codes = set()
    while frame is not None:
        codes.add(frame.f_code)
        frame = frame.f_back
    return BatchMemory.hold.__wrapped__.__code__ in codes and threading.Condition.wait.__code__ in codes


def test_a_job_over_what_is_left_waits_until_others_end():
    memory, cancelled = BatchMemory(100), threading.Event()
    order = []
    with memory.hold(60, cancelled):
        def second():
            with memory.hold(60, cancelled):
                order.append(("second", memory.held))
        thread = threading.Thread(target=second)
        thread.start()
        wait_for(lambda: waiting_in_hold(thread), 10, "the second job waiting for the budget")
        order.append(("first ends", memory.held))
    thread.join(5)
    assert order == [("first ends", 60), ("second", 60)]
    assert memory.held == 0


def test_jobs_within_the_budget_run_together_and_one_over_it_runs_alone():
    memory, cancelled = BatchMemory(100), threading.Event()
    with memory.hold(40, cancelled), memory.hold(60, cancelled):
        assert memory.held == 100
    with memory.hold(500, cancelled):  # held as the whole budget: it never waits for itself
        assert memory.held == 100
    assert memory.held == 0


def test_a_waiting_job_of_a_cancelled_task_gives_up():
    memory, cancelled = BatchMemory(100), threading.Event()
    raised = []
    with memory.hold(100, threading.Event()):
        def waiting():
            try:
                with memory.hold(1, cancelled):
                    pass
            except TaskCancelled:
                raised.append(True)
        thread = threading.Thread(target=waiting)
        thread.start()
        cancelled.set()
        thread.join(5)
    assert raised == [True] and memory.held == 0


def test_a_failing_job_gives_its_bytes_back():
    memory = BatchMemory(100)
    with pytest.raises(ValueError):
        with memory.hold(70, threading.Event()):
            raise ValueError("the job failed")
    assert memory.held == 0
