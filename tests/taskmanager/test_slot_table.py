"""The TaskSlotTable's answer to a lost JobManager, and the command line a failed TaskManager
restarts with: pure, no sockets."""
from __future__ import annotations

import threading

import pytest

from cluster.taskmanager.slot_table import (CancelTaskThread, ForgetTask, OfferSlot, ReleaseJobNetwork,
                                            ReportTaskState, StartTask, TaskSlotTable)
from cluster.taskmanager.task_executor import published_address, restart_command_line


def _table_with_two_jobs() -> TaskSlotTable:
    table = TaskSlotTable(3)
    assert table.request_slot(0, "job-a", "alloc-a") == [OfferSlot("job-a", "alloc-a")]
    assert table.request_slot(1, "job-b", "alloc-b") == [OfferSlot("job-b", "alloc-b")]
    assert table.submit_task("job-a", "exec-a", "alloc-a") == [StartTask("exec-a")]
    assert table.submit_task("job-b", "exec-b", "alloc-b") == [StartTask("exec-b")]
    return table


def test_job_manager_lost_cancels_every_task_and_frees_every_slot():
    table = _table_with_two_jobs()
    out = table.job_manager_lost()
    assert out == [CancelTaskThread("exec-a"), CancelTaskThread("exec-b"),
                   ReleaseJobNetwork("job-a"), ReleaseJobNetwork("job-b")]
    assert table.slots.free_count() == 3 and table.slots.jobs() == set()
    # the freed slots can be offered to a new JobManager's jobs at once
    assert table.request_slot(0, "job-c", "alloc-c") == [OfferSlot("job-c", "alloc-c")]


def test_tasks_of_a_lost_job_manager_end_unreported_and_are_forgotten():
    table = _table_with_two_jobs()
    table.job_manager_lost()
    assert table.task_state_changed("exec-a", "RUNNING", None) == []
    assert table.task_state_changed("exec-a", "CANCELED", None) == [ForgetTask("exec-a")]
    assert table.task_state_changed("exec-b", "FAILED", "boom") == [ForgetTask("exec-b")]
    assert table.tasks == {}


def test_a_second_loss_does_not_cancel_again_and_new_tasks_report_as_usual():
    table = _table_with_two_jobs()
    table.job_manager_lost()
    assert table.job_manager_lost() == []  # still cancelling: the interrupter and watchdog already run
    table.request_slot(2, "job-c", "alloc-c")
    assert table.submit_task("job-c", "exec-c", "alloc-c") == [StartTask("exec-c")]
    assert table.task_state_changed("exec-c", "FINISHED", None) == [ReportTaskState("job-c", "exec-c", "FINISHED",
                                                                                    None)]


def test_job_manager_lost_with_nothing_running_changes_nothing():
    table = TaskSlotTable(2)
    assert table.job_manager_lost() == []
    assert table.slots.free_count() == 2


def test_restart_command_line_keeps_the_arguments_under_a_fresh_id():
    argv = ["python", "-m", "cluster.taskmanager", "--cluster-dir", "/c", "--jobmanager", "tcp://x:1",
            "--id", "tm-0-abc"]
    assert restart_command_line(argv, "tm-new") == ["python", "-m", "cluster.taskmanager", "--cluster-dir", "/c",
                                                    "--jobmanager", "tcp://x:1", "--id", "tm-new"]
    assert restart_command_line(["p", "--id=tm-1", "--cluster-dir", "/c"], "tm-2") == \
        ["p", "--cluster-dir", "/c", "--id", "tm-2"]


def test_a_taskmanager_started_beside_its_jobmanager_waits_for_the_address_it_publishes(tmp_path):
    path = tmp_path / "jobmanager.json"
    writer = threading.Thread(target=lambda: (path.write_text('{"rpc": "tcp'), path.write_text(
        '{"rpc": "tcp://127.0.0.1:6123", "pid": 1}')))  # half a file first: read again
    writer.start()
    assert published_address(path) == "tcp://127.0.0.1:6123"
    writer.join()
    with pytest.raises(SystemExit, match="no JobManager published its address in .*missing.json within 0.1 s"):
        published_address(tmp_path / "missing.json", timeout_s=0.1)
