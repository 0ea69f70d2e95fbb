import pytest

from cluster.graph.execution_graph import ExecutionGraph, IllegalStateTransition
from cluster.protocol.states import ExecutionState, JobState
from kernel_runtime import StreamEnvironment


def _eg():
    env = StreamEnvironment(parallelism=2)
    env.from_generator(count=10).key_by("seq").count(parallelism=3).collect()
    return ExecutionGraph(env.get_job_graph("t"), now_ms=1)


def test_one_execution_per_subtask_and_slot_sharing():
    eg = _eg()
    # source (2) -> count (3) -> collect (2): the sink has the default parallelism, so no chain
    assert len(eg.executions) == 2 + 3 + 2
    assert eg.required_slots == 3


def test_job_transitions_follow_flink():
    eg = _eg()
    eg.transition(JobState.RUNNING, 2)
    eg.transition(JobState.FAILING, 3)
    eg.transition(JobState.RESTARTING, 4)
    eg.transition(JobState.CREATED, 5)
    with pytest.raises(IllegalStateTransition):
        eg.transition(JobState.FINISHED, 6)
    assert eg.timestamps[JobState.RESTARTING] == 4


def test_stale_reports_are_ignored_after_a_restart():
    eg = _eg()
    old = next(iter(eg.executions))
    eg.reset_executions()
    assert eg.attempt == 2 and eg.update_execution(old, ExecutionState.FAILED) is None


def test_terminal_executions_do_not_change_and_counts_add_up():
    eg = _eg()
    ids = list(eg.executions)
    for eid in ids:
        for state in (ExecutionState.SCHEDULED, ExecutionState.DEPLOYING, ExecutionState.RUNNING):
            assert eg.update_execution(eid, state) is not None
        assert eg.update_execution(eid, ExecutionState.FINISHED) is not None
    assert eg.update_execution(ids[0], ExecutionState.FAILED) is None
    assert eg.all_finished() and eg.status_counts()[ExecutionState.FINISHED] == len(ids)


def test_task_transitions_follow_the_table():
    eg = _eg()
    eid = next(iter(eg.executions))
    assert eg.update_execution(eid, ExecutionState.RUNNING) is None  # CREATED cannot jump to RUNNING
    assert eg.executions[eid].state == ExecutionState.CREATED
    for state in (ExecutionState.SCHEDULED, ExecutionState.DEPLOYING, ExecutionState.CANCELING):
        assert eg.update_execution(eid, state) is not None
    # a RUNNING that arrives after the JobMaster asked the task to cancel loses
    assert eg.update_execution(eid, ExecutionState.RUNNING) is None
    assert eg.executions[eid].state == ExecutionState.CANCELING
    # a task that finishes while being cancelled counts as cancelled, as in Flink
    assert eg.update_execution(eid, ExecutionState.FINISHED).state == ExecutionState.CANCELED
