"""The TaskExecutor's task table without sockets or threads: slots, task deployment, cancel, free."""
from __future__ import annotations

from cluster.taskmanager.slot_table import (CancelTaskThread, OfferSlot, ReleaseJobNetwork, ReportTaskState,
                                            StartTask, TaskSlotTable)


def test_a_task_starts_only_in_a_slot_its_job_holds():
    table = TaskSlotTable(2)
    assert table.request_slot(0, "job", "a0") == [OfferSlot("job", "a0")]
    assert table.request_slot(0, "job", "a0") == [OfferSlot("job", "a0")]  # the same again: idempotent
    (report,) = table.submit_task("other", "e-x", "a0")
    assert isinstance(report, ReportTaskState) and report.state == "FAILED" and "no slot a0" in report.error
    assert table.submit_task("job", "e1", "a0") == [StartTask("e1")]
    assert table.submit_task("job", "e1", "a0") == []  # a duplicate deployment starts nothing
    assert table.request_slot(0, "other", "b0") == []  # held by another allocation, whose task runs


def test_a_slot_held_by_an_allocation_without_a_task_goes_to_the_newer_request():
    """A request delivered late, after the ResourceManager declared this TaskManager lost and it
    registered again, must not keep the slot from the request the ResourceManager makes now."""
    table = TaskSlotTable(2)
    table.request_slot(0, "old job", "stale")  # forgotten by the ResourceManager: no task ever comes
    table.request_slot(1, "job", "a1")
    assert table.request_slot(0, "job", "a0") == [ReleaseJobNetwork("old job"), OfferSlot("job", "a0")]
    assert table.submit_task("job", "e0", "a0") == [StartTask("e0")]
    (report,) = table.submit_task("old job", "e-old", "stale")
    assert report.state == "FAILED"  # the stale allocation holds nothing any more


def test_task_states_are_reported_once_and_terminal_tasks_leave_the_table():
    table = TaskSlotTable(1)
    table.request_slot(0, "job", "a0")
    table.submit_task("job", "e1", "a0")
    assert table.task_state_changed("e1", "RUNNING", None) == [ReportTaskState("job", "e1", "RUNNING", None)]
    assert table.task_state_changed("e1", "FAILED", "boom") == [ReportTaskState("job", "e1", "FAILED", "boom")]
    assert table.tasks_of("job") == []
    assert table.task_state_changed("e1", "CANCELED", None) == []  # nothing after the end
    assert table.cancel_task("e1") == []


def test_freeing_a_slot_cancels_its_tasks_and_the_last_slot_of_a_job_releases_its_network():
    table = TaskSlotTable(2)
    table.request_slot(0, "job", "a0")
    table.request_slot(1, "job", "a1")
    table.submit_task("job", "e0", "a0")
    table.submit_task("job", "e1", "a1")
    assert table.free_slot("a0") == [CancelTaskThread("e0")]
    assert table.free_slot("a1") == [CancelTaskThread("e1"), ReleaseJobNetwork("job")]
    assert table.free_slot("a1") == [CancelTaskThread("e1")]  # still cancelling: asked again
    table.task_state_changed("e1", "CANCELED", None)
    assert table.free_slot("a1") == []
    assert table.request_slot(0, "next", "n0") == [OfferSlot("next", "n0")]
