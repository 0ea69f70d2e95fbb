"""The JobMaster's decisions, driven by hand: no sockets, no threads, time moved by the test.

Each test feeds DefaultScheduler the events a real cluster would produce (in the orders that
are races on a real cluster) and checks the instructions it returns and the states it reaches.
"""
from __future__ import annotations

import pytest

from cluster.checkpoint.savepoint_fit import savepoint_fit, state_shape
from cluster.common import failures
from cluster.common.failures import UserFunctionError
from cluster.conf import Configuration
from cluster.protocol.states import ExecutionState, JobState
from cluster.jobmanager.jobmaster import checkpointing, instructions as ins, scheduler as s, scheduler_events as ev
from cluster.jobmanager.resourcemanager.slot_manager import SlotAllocation
from kernel_runtime import StreamEnvironment


class Clock:
    def __init__(self):
        self.ms = 1_000

    def __call__(self) -> int:
        return self.ms


def make(config=None, result_address=None, free=(4, 4)):
    env = StreamEnvironment(parallelism=2)
    env.from_generator(count=10).key_by("seq").count().collect()
    conf = Configuration(dict(config or {}), "test")
    clock = Clock()
    sched = s.DefaultScheduler(env.get_job_graph("t"), conf, clock, result_address, lambda: free)
    return sched, clock


def of(instructions, kind):
    return [i for i in instructions if isinstance(i, kind)]


def allocations(sched, tms=("tm-a", "tm-b")):
    return tuple(SlotAllocation(tms[i % len(tms)], i, sched.job_id, f"alloc-{i}")
                 for i in range(sched.graph.required_slots))


def running(config=None, result_address=None):
    """A scheduler whose job is deployed and every task RUNNING; returns (scheduler, clock, deploy)."""
    sched, clock = make(config, result_address)
    out = sched.handle(ev.StartScheduling())
    assert of(out, ins.RequestSlots) == [ins.RequestSlots(2)]
    allocs = allocations(sched)
    sched.handle(ev.SlotsAllocated(allocs))
    out = sched.handle(ev.SlotsOffered(tuple(a.allocation_id for a in allocs)))
    (deploy,) = of(out, ins.DeployTasks)
    for execution, _ in deploy.placements:
        sched.handle(ev.TaskStateReported(execution.execution_id, ExecutionState.RUNNING))
    assert sched.state == JobState.RUNNING
    return sched, clock, deploy


def report_all(sched, state):
    out = []
    for eid in list(sched.graph.executions):
        out += sched.handle(ev.TaskStateReported(eid, state))
    return out


def test_deploys_once_every_allocated_slot_was_offered():
    sched, _ = make()
    sched.handle(ev.StartScheduling())
    allocs = allocations(sched)
    sched.handle(ev.SlotsAllocated(allocs))
    assert sched.state == JobState.CREATED
    assert not of(sched.handle(ev.SlotsOffered(("alloc-0", "not-ours"))), ins.DeployTasks)
    out = sched.handle(ev.SlotsOffered(("alloc-1",)))
    (deploy,) = of(out, ins.DeployTasks)
    assert sched.state == JobState.RUNNING
    assert {a.allocation_id for _, a in deploy.placements} == {"alloc-0", "alloc-1"}
    assert sched.handle(ev.SlotsAllocated(allocs)) == [ins.CancelTimer(ins.SLOT_REQUEST_TIMER)]  # a stray grant
    assert all(e.state == ExecutionState.DEPLOYING for e in sched.graph.executions.values())


def test_slot_request_timeout_fails_the_job_naming_what_was_free():
    sched, clock = make({"slot.request.timeout": "2 s"}, free=(1, 4))
    out = sched.handle(ev.StartScheduling())
    assert ins.StartTimer(ins.SLOT_REQUEST_TIMER, 2000) in out
    assert sched.status_reason == "waiting for 2 free slot(s); the cluster has 1 free of 4"
    clock.ms += 2000
    out = sched.handle(ev.TimerFired(ins.SLOT_REQUEST_TIMER))
    assert ins.CancelSlotRequest() in out and ins.JobTerminated(JobState.FAILED) in out
    assert sched.state == JobState.FAILED
    assert "NoResourceAvailableException" in sched.graph.failure and "only 1 of 4 were free" in sched.graph.failure
    assert all(e.state == ExecutionState.CANCELED for e in sched.graph.executions.values())


def test_slot_timeout_after_the_slots_came_changes_nothing():
    sched, _ = make()
    sched.handle(ev.StartScheduling())
    sched.handle(ev.SlotsAllocated(allocations(sched)))
    assert sched.handle(ev.TimerFired(ins.SLOT_REQUEST_TIMER)) == []
    assert sched.state == JobState.CREATED


def test_taskmanager_lost_between_allocation_and_deployment_asks_again():
    sched, _ = make()
    sched.handle(ev.StartScheduling())
    sched.handle(ev.SlotsAllocated(allocations(sched)))
    out = sched.handle(ev.TaskManagerLost("tm-b", "TaskManager tm-b lost"))
    assert of(out, ins.ReleaseSlots) and of(out, ins.RequestSlots) == [ins.RequestSlots(2)]
    assert sched.state == JobState.CREATED and sched.allocations == []
    # the offer of the lost allocation arrives late: nothing is deployed on it
    assert not of(sched.handle(ev.SlotsOffered(("alloc-0", "alloc-1"))), ins.DeployTasks)
    fresh = tuple(SlotAllocation("tm-a", i, sched.job_id, f"new-{i}") for i in range(2))
    sched.handle(ev.SlotsAllocated(fresh))
    (deploy,) = of(sched.handle(ev.SlotsOffered(("new-0", "new-1"))), ins.DeployTasks)
    assert {a.task_manager_id for _, a in deploy.placements} == {"tm-a"}


def test_deployment_to_a_vanished_taskmanager_fails_over():
    sched, _, deploy = running({"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": "1 s"})
    execution = deploy.placements[0][0]
    out = sched.handle(ev.DeploymentFailed(execution.execution_id, "TaskManager tm-a is gone"))
    assert sched.state == JobState.FAILING
    assert {i.execution_id for i in of(out, ins.CancelTask)} == {
        e.execution_id for e in sched.graph.executions.values() if e.state == ExecutionState.CANCELING}


def test_failover_cancels_the_rest_restarts_from_the_newest_checkpoint():
    sched, clock, _ = running({"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 2,
                               "restart-strategy.fixed-delay.delay": "500 ms"})
    first = list(sched.graph.executions)
    out = sched.handle(ev.TaskStateReported(first[0], ExecutionState.FAILED, "ValueError: boom"))
    assert sched.state == JobState.FAILING and "ValueError: boom" in sched.graph.failure
    cancels = of(out, ins.CancelTask)
    assert len(cancels) == len(first) - 1
    # the cancelled tasks report; a straggler's late RUNNING changes nothing
    sched.handle(ev.TaskStateReported(cancels[0].execution_id, ExecutionState.RUNNING))
    assert sched.graph.executions[cancels[0].execution_id].state == ExecutionState.CANCELING
    out = []
    for c in cancels:
        out += sched.handle(ev.TaskStateReported(c.execution_id, ExecutionState.CANCELED))
    assert sched.state == JobState.RESTARTING
    assert ins.StartTimer(ins.RESTART_TIMER, 500) in out and of(out, ins.ReleaseSlots)
    clock.ms += 500
    (find,) = of(sched.handle(ev.TimerFired(ins.RESTART_TIMER)), ins.FindRestorePoint)
    body = {"checkpoint_id": 7, "operators": {"op": {"subtasks": [{"file": "x"}]}}}
    out = sched.handle(ev.RestorePointFound(body, "/ck/chk-7"))
    assert sched.state == JobState.CREATED and sched.graph.attempt == 2
    assert of(out, ins.RequestSlots)
    assert not set(first) & set(sched.graph.executions)  # fresh executions: old reports are stale
    assert sched.handle(ev.TaskStateReported(first[0], ExecutionState.RUNNING)) == []
    sched.handle(ev.SlotsAllocated(allocations(sched)))
    (deploy,) = of(sched.handle(ev.SlotsOffered(("alloc-0", "alloc-1"))), ins.DeployTasks)
    assert deploy.attempt == 2 and deploy.restore["checkpoint_id"] == 7
    # numbering continues after the restored checkpoint
    report_all(sched, ExecutionState.RUNNING)
    assert sched.checkpointing.trigger(sched.facts(), "checkpoint", []).checkpoint_id == 8


def test_no_restart_strategy_fails_the_job_with_the_reason():
    sched, _, _ = running()
    eid = next(iter(sched.graph.executions))
    sched.handle(ev.TaskStateReported(eid, ExecutionState.FAILED, "KeyError: 'x'"))
    out = report_all(sched, ExecutionState.CANCELED)
    assert sched.state == JobState.FAILED and ins.JobTerminated(JobState.FAILED) in out
    assert sched.graph.failure.endswith("The job was not restarted: restart-strategy.type is none.")


def test_a_failure_no_restart_can_fix_fails_the_job_at_once_whatever_the_strategy():
    sched, _, _ = running({"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 5})
    eid = next(iter(sched.graph.executions))
    error = failures.describe(RuntimeError("loading the operator failed"), {})
    assert failures.unrecoverable(error) is None  # a RuntimeError alone may pass: restarted
    try:
        import streamlab_no_such_module  # noqa: F401
    except ModuleNotFoundError as missing:
        error = failures.describe(_wrapped(missing), {})
    sched.handle(ev.TaskStateReported(eid, ExecutionState.FAILED, error))
    out = report_all(sched, ExecutionState.CANCELED)
    assert sched.state == JobState.FAILED and ins.JobTerminated(JobState.FAILED) in out
    assert not of(out, ins.StartTimer) and sched.restart_strategy.restarts == 0
    assert "No restart can fix this: ModuleNotFoundError: No module named 'streamlab_no_such_module'." \
        in sched.graph.failure
    assert "The job was not restarted: no restart can fix its failure." in sched.graph.failure


def test_a_check_before_deployment_that_fails_ends_the_job_before_it_asks_for_slots():
    sched, _ = make({"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 5})
    out = sched.handle(ev.InitializationFailed("KafkaTopicMissing: topic 'out' does not exist"))
    assert sched.state == JobState.FAILED and ins.JobTerminated(JobState.FAILED) in out
    assert not of(out, ins.RequestSlots) and not of(out, ins.StartTimer)
    assert sched.graph.failure == ("KafkaTopicMissing: topic 'out' does not exist\n"
                                   "The job was not restarted: no restart can fix its failure.")
    assert all(e.state == ExecutionState.CANCELED for e in sched.graph.executions.values())
    assert sched.handle(ev.StartScheduling()) == []  # a late start changes nothing


def test_a_job_cancelled_while_it_is_checked_neither_starts_nor_fails_afterwards():
    sched, _ = make()
    sched.handle(ev.CancelRequested())
    assert sched.state == JobState.CANCELED
    assert sched.handle(ev.StartScheduling()) == []
    assert sched.handle(ev.InitializationFailed("KafkaTopicMissing: x")) == [] and sched.state == JobState.CANCELED


def _wrapped(cause: BaseException) -> UserFunctionError:
    """A user's exception as the task raises it: wrapped in the operator's, ``from`` it."""
    try:
        raise UserFunctionError("operator 'step' could not be loaded on the TaskManager") from cause
    except UserFunctionError as exc:
        return exc


def test_cancel_while_restarting_ends_canceled_and_ignores_the_late_restore_point():
    sched, _, _ = running({"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": "1 s"})
    sched.handle(ev.TaskManagerLost("tm-a", "TaskManager tm-a lost"))
    report_all(sched, ExecutionState.CANCELED)
    assert sched.state == JobState.RESTARTING
    sched.handle(ev.TimerFired(ins.RESTART_TIMER))  # the restore point is being looked for
    out = sched.handle(ev.CancelRequested())
    assert sched.state == JobState.CANCELED
    assert ins.CancelTimer(ins.RESTART_TIMER) in out and ins.JobTerminated(JobState.CANCELED) in out
    assert sched.handle(ev.RestorePointFound(None, None)) == []
    assert sched.state == JobState.CANCELED
    assert sched.handle(ev.TimerFired(ins.RESTART_TIMER)) == []


def test_cancel_while_running_waits_for_every_task():
    sched, _, _ = running()
    out = sched.handle(ev.CancelRequested())
    assert sched.state == JobState.CANCELLING and len(of(out, ins.CancelTask)) == len(sched.graph.executions)
    eids = list(sched.graph.executions)
    sched.handle(ev.TaskStateReported(eids[0], ExecutionState.FINISHED))  # finished while cancelling
    assert sched.graph.executions[eids[0]].state == ExecutionState.CANCELED
    for eid in eids[1:]:
        sched.handle(ev.TaskStateReported(eid, ExecutionState.CANCELED))
    assert sched.state == JobState.CANCELED
    assert sched.handle(ev.CancelRequested()) == []


def test_checkpoint_completes_only_after_metadata_is_written_then_sinks_are_told():
    sched, clock, _ = running({"execution.checkpointing.interval": "1 s"}, result_address="tcp://client")
    clock.ms += 1000
    out = sched.handle(ev.TimerFired(ins.CHECKPOINT_TIMER))
    (trigger,) = of(out, ins.TriggerCheckpoint)
    assert ins.StartTimer(ins.CHECKPOINT_TIMER, 1000) in out
    assert {eid for _, eid in trigger.sources} == {
        e.execution_id for e in sched.graph.executions.values() if e.vertex.is_source}
    cid = trigger.checkpoint_id
    for eid in sched.graph.executions:
        assert sched.handle(ev.CheckpointAcknowledged(cid, eid, {"op": {"bytes": 10}})) == []
    collect = [p for p in sched.checkpointing.coordinator.pending[cid].waiting]
    assert collect and all(p.startswith("collect/") for p in collect)  # the client's rows count too
    out = []
    for p in collect:
        out += sched.handle(ev.CheckpointAcknowledged(cid, p))
    (write,) = of(out, ins.WriteMetadata)
    assert write.body["checkpoint_id"] == cid and not of(out, ins.NotifyCheckpointComplete)
    out = sched.handle(ev.MetadataWritten(cid))
    assert of(out, ins.NotifyCheckpointComplete) == [ins.NotifyCheckpointComplete(cid, ("tm-a", "tm-b"))]
    assert sched.checkpointing.coordinator.latest().checkpoint_id == cid


def test_a_checkpoint_aborted_while_its_metadata_was_written_is_disposed():
    sched, clock, _ = running({"execution.checkpointing.interval": "1 s",
                               "restart-strategy.type": "fixed-delay"})
    pending = sched.checkpointing.trigger(sched.facts(), "checkpoint", [])
    out = []
    for eid in sched.graph.executions:
        out += sched.handle(ev.CheckpointAcknowledged(pending.checkpoint_id, eid, {}))
    assert of(out, ins.WriteMetadata)
    out = sched.handle(ev.TaskManagerLost("tm-b", "lost"))  # failover aborts the pending checkpoint
    assert of(out, ins.NotifyCheckpointAborted)
    out = sched.handle(ev.MetadataWritten(pending.checkpoint_id))
    assert out == [ins.DisposeCheckpoint(pending.directory)]
    assert sched.checkpointing.coordinator.latest() is None


def test_failed_metadata_write_aborts_the_checkpoint():
    sched, _, _ = running({"execution.checkpointing.interval": "1 s"})
    pending = sched.checkpointing.trigger(sched.facts(), "checkpoint", [])
    for eid in sched.graph.executions:
        sched.handle(ev.CheckpointAcknowledged(pending.checkpoint_id, eid, {}))
    out = sched.handle(ev.MetadataWritten(pending.checkpoint_id, "No space left on device"))
    assert of(out, ins.NotifyCheckpointAborted)
    assert "No space left on device" in sched.checkpointing.coordinator.records[pending.checkpoint_id].failure


def test_savepoint_answers_its_request_and_stop_ends_the_sources():
    sched, _, _ = running()
    with pytest.raises(ev.SchedulerError):
        make()[0].handle(ev.SavepointRequested("r0", None, False))  # not running: refused, nothing changes
    out = sched.handle(ev.SavepointRequested("r1", "/sp", True))
    (trigger,) = of(out, ins.TriggerCheckpoint)
    assert trigger.kind == "stop" and trigger.directory.startswith("/sp/savepoint-")
    assert sched.checkpointing.savepoint_requests["r1"] == {"status": "IN_PROGRESS"}
    for eid in sched.graph.executions:
        sched.handle(ev.CheckpointAcknowledged(trigger.checkpoint_id, eid, {}))
    out = sched.handle(ev.MetadataWritten(trigger.checkpoint_id))
    assert ins.SavepointFinished("r1", trigger.directory, None) in out
    assert sched.checkpointing.savepoint_requests["r1"]["location"] == trigger.directory


def test_savepoints_in_flight_are_bounded_and_a_completed_one_frees_its_place():
    sched, _, _ = running()
    triggers = [of(sched.handle(ev.SavepointRequested(f"r{i}", None, False)), ins.TriggerCheckpoint)[0]
                for i in range(checkpointing.MAX_PENDING_SAVEPOINTS)]
    with pytest.raises(ev.TooManySavepoints, match=f"already takes {checkpointing.MAX_PENDING_SAVEPOINTS} savepoints"):
        sched.handle(ev.SavepointRequested("one too many", None, False))
    assert "one too many" not in sched.checkpointing.savepoint_requests
    assert ev.TooManySavepoints.__mro__[1] is ev.SchedulerError  # refused as any request the job cannot serve
    for eid in sched.graph.executions:
        sched.handle(ev.CheckpointAcknowledged(triggers[0].checkpoint_id, eid, {}))
    sched.handle(ev.MetadataWritten(triggers[0].checkpoint_id))
    (again,) = of(sched.handle(ev.SavepointRequested("after one completed", None, False)), ins.TriggerCheckpoint)
    assert again.kind == "savepoint"


def test_a_declined_savepoint_fails_its_request():
    sched, _, _ = running()
    (trigger,) = of(sched.handle(ev.SavepointRequested("r1", None, False)), ins.TriggerCheckpoint)
    eid = next(iter(sched.graph.executions))
    out = sched.handle(ev.CheckpointDeclined(trigger.checkpoint_id, eid, "task not ready"))
    (finished,) = of(out, ins.SavepointFinished)
    assert finished.location is None and "task not ready" in finished.failure


def test_final_checkpoint_once_every_source_ended_and_retried_when_it_fails():
    sched, _, _ = running()
    sources = [e.execution_id for e in sched.graph.executions.values() if e.vertex.is_source]
    assert sched.handle(ev.SourceExhausted(sources[0])) == []
    (trigger,) = of(sched.handle(ev.SourceExhausted(sources[1])), ins.TriggerCheckpoint)
    assert trigger.kind == "final"
    out = sched.handle(ev.CheckpointDeclined(trigger.checkpoint_id, sources[0], "busy"))
    assert ins.StartTimer(ins.FINAL_CHECKPOINT_TIMER, checkpointing.FINAL_RETRY_MS) in out
    (again,) = of(sched.handle(ev.TimerFired(ins.FINAL_CHECKPOINT_TIMER)), ins.TriggerCheckpoint)
    assert again.kind == "final" and again.checkpoint_id > trigger.checkpoint_id
    out = report_all(sched, ExecutionState.FINISHED)
    assert sched.state == JobState.FINISHED and ins.JobTerminated(JobState.FINISHED) in out


def test_a_savepoint_for_another_job_is_refused_naming_the_operator():
    sched, _ = make()
    body = {"checkpoint_id": 3, "operators": {"someone-elses-operator": {"vertex": "v", "name": "tally",
                                                                          "kind": "keyed-count", "subtasks": []}}}
    with pytest.raises(ev.SchedulerError, match=r"operator 'tally' \(uid someone-elses-operator\).*"
                                               r"ignore-unclaimed-state"):
        sched.restore_from_savepoint(body, "/sp/x")
    assert sched.checkpointing.restore is None


def pipeline_graph(filter_after=False, process_as_count=False, without_count=False, count_uid=None):
    env = StreamEnvironment(parallelism=2)
    keyed = env.from_generator(count=10).key_by("seq")
    if without_count:
        out = keyed.map_batches(lambda df: df)
    elif process_as_count:
        out = keyed.process(lambda key, rows, state: None, name="count")
    else:
        out = keyed.count()
        if count_uid:
            out = out.uid(count_uid)
    if filter_after:
        out = out.filter(lambda df: df["count"] > 1)
    out.collect()
    return env.get_job_graph("t")


def savepoint_of(graph):
    return {"checkpoint_id": 7, "operators": {o.uid: {"vertex": v.name, "name": o.name, "kind": o.kind,
                                                      "subtasks": [{"subtask": 0, "parallelism": 2}]}
                                              for v in graph.vertices for o in v.operators
                                              if o.kind in ("generator-source", "keyed-count", "keyed-process")}}


def names(specs):
    return sorted(o.name for o in specs)


def test_an_operator_added_after_a_stateful_one_keeps_its_upstreams_state():
    fit = savepoint_fit(savepoint_of(pipeline_graph()), pipeline_graph(filter_after=True))
    assert names(fit.kept) == ["count", "generator"] and fit.empty == [] and not fit.misfits


def test_a_removed_stateful_operator_is_unclaimed_and_a_new_one_starts_empty():
    old = pipeline_graph()
    fit = savepoint_fit(savepoint_of(old), pipeline_graph(without_count=True))
    assert names(fit.kept) == ["generator"] and fit.empty == []
    (count_uid,) = [o.uid for v in old.vertices for o in v.operators if o.kind == "keyed-count"]
    assert list(fit.unclaimed) == [count_uid]
    assert f"operator 'count' (uid {count_uid}), which this job does not have" in fit.refusal()
    fit = savepoint_fit(savepoint_of(pipeline_graph(without_count=True)), pipeline_graph())
    assert names(fit.empty) == ["count"] and not fit.misfits


def test_an_operator_of_another_kind_under_the_same_uid_is_a_changed_state_type():
    fit = savepoint_fit(savepoint_of(pipeline_graph(count_uid="tally")),
                          pipeline_graph(process_as_count=True))
    assert not fit.changed and fit.unclaimed  # without a pinned uid the process is another operator
    env = StreamEnvironment(parallelism=2)
    env.from_generator(count=10).key_by("seq").process(lambda k, r, st: None, name="count").uid("tally").collect()
    fit = savepoint_fit(savepoint_of(pipeline_graph(count_uid="tally")), env.get_job_graph("t"))
    ((spec, entry),) = fit.changed
    assert spec.uid == "tally" and names(fit.empty) == ["count"] and names(fit.kept) == ["generator"]
    assert "the state of operator 'count' (uid tally) is keyed-count state" in fit.refusal()


def preview(old, new, allow=False):
    fit = savepoint_fit(savepoint_of(old), new)
    return [(row["operator"], row["state"]) for row in fit.preview([o for v in new.vertices for o in v.operators],
                                                                    allow)]


def test_an_upgrades_preview_says_per_operator_what_becomes_of_its_state():
    assert preview(pipeline_graph(), pipeline_graph(filter_after=True)) == [
        ("generator", "restored"), ("count", "restored"), ("filter", "no state"), ("collect", "no state")]
    assert preview(pipeline_graph(without_count=True), pipeline_graph()) == [
        ("generator", "restored"), ("count", "started empty"), ("collect", "no state")]
    old = pipeline_graph()
    assert preview(old, pipeline_graph(without_count=True))[-1] == ("count", "refused")
    assert preview(old, pipeline_graph(without_count=True), allow=True)[-1] == ("count", "dropped")
    env = StreamEnvironment(parallelism=2)
    env.from_generator(count=10).key_by("seq").process(lambda k, r, st: None, name="count").uid("tally").collect()
    assert preview(pipeline_graph(count_uid="tally"), env.get_job_graph("t"), allow=True)[1] == (
        "count", "started empty (dropped: its keyed-count state)")


def test_an_upgrades_preview_says_when_a_restored_operators_key_changed():
    old = pipeline_graph(count_uid="tally")
    body = savepoint_of(old)
    body["operators"]["tally"]["key"] = ["user"]  # as a checkpoint of the job keyed by user saved it
    new = pipeline_graph(count_uid="tally")
    rows = savepoint_fit(body, new).preview([o for v in new.vertices for o in v.operators], False)
    assert rows[1]["state"] == "restored (its key was user, now seq)"
    body["operators"]["tally"]["key"] = ["seq"]
    assert savepoint_fit(body, new).preview([o for v in new.vertices for o in v.operators], False)[1]["state"] \
        == "restored"


def restorable(config):
    conf = Configuration(dict(config), "test")
    return s.DefaultScheduler(pipeline_graph(without_count=True), conf, Clock(), None, lambda: (4, 4))


def test_ignore_unclaimed_state_starts_without_the_state_that_does_not_fit():
    body = savepoint_of(pipeline_graph())
    with pytest.raises(ev.SchedulerError, match="operator 'count'"):
        restorable({}).restore_from_savepoint(body, "/sp/x")
    sched = restorable({"execution.savepoint.ignore-unclaimed-state": "true"})
    sched.restore_from_savepoint(body, "/sp/x")
    assert set(sched.checkpointing.restore["operators"]) == {o.uid for v in sched.job_graph.vertices
                                                             for o in v.operators if o.kind == "generator-source"}


def test_task_counters_at_a_checkpoint_are_kept_apart_from_state_and_restored_on_recovery():
    from cluster.protocol.metrics import CHECKPOINTED_COUNTERS
    sched, clock, _ = running({"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": "1 ms"})
    pending = sched.checkpointing.trigger(sched.facts(), "checkpoint", [])
    out = []
    for n, eid in enumerate(sched.graph.executions):
        counters = {"records-in": 10 * n, "records-out": 10 * n, "bytes-in": n, "bytes-out": n}
        out += sched.handle(ev.CheckpointAcknowledged(pending.checkpoint_id, eid,
                                                     {"op": {"bytes": 10}, CHECKPOINTED_COUNTERS: counters}))
    (write,) = of(out, ins.WriteMetadata)
    assert set(write.body["operators"]) == {"op"}  # a savepoint of it names only operators
    counters = write.body["counters"]
    assert set(counters) == {v.id for v in sched.job_graph.vertices}
    assert sorted(e["subtask"] for e in counters[sched.job_graph.vertices[0].id]) == [0, 1]
    sched.handle(ev.MetadataWritten(pending.checkpoint_id))
    assert sched.graph.current_failure is None
    sched.handle(ev.TaskManagerLost("tm-a", "TaskManager tm-a lost"))
    assert "tm-a lost" in sched.graph.current_failure
    report_all(sched, ExecutionState.CANCELED)
    clock.ms += 5_000
    sched.handle(ev.TimerFired(ins.RESTART_TIMER))
    sched.handle(ev.RestorePointFound(write.body, pending.directory))
    # until the new attempt reports, its subtasks show what the checkpoint covered
    shown = {(e.vertex.id, e.subtask): e.metrics["records-in"] for e in sched.graph.executions.values()}
    assert shown == {(v, c["subtask"]): c["records-in"] for v, entries in counters.items() for c in entries}
    sched.handle(ev.SlotsAllocated(allocations(sched)))
    (deploy,) = of(sched.handle(ev.SlotsOffered(("alloc-0", "alloc-1"))), ins.DeployTasks)
    assert deploy.restore["counters"] == counters
    report_all(sched, ExecutionState.RUNNING)
    # the job as a whole: it started before the restart, and it is not failing any more
    assert sched.graph.start_ms == 1_000 and sched.graph.timestamps[JobState.CREATED] == 6_000
    assert sched.graph.current_failure is None and "tm-a lost" in sched.graph.failure
    # a new job started from a savepoint counts from zero, as Flink's does
    fresh, _ = make()
    fresh.restore_from_savepoint(dict(write.body, operators={}), "/sp")
    assert fresh.checkpointing.restore["counters"] == {}


def test_an_upgrades_preview_says_when_a_restored_operators_state_schema_changed():
    def totals(**aggregations):
        env = StreamEnvironment(parallelism=2)
        env.from_generator(count=10).key_by("seq").aggregate(**aggregations).uid("totals").collect()
        return env.get_job_graph("t")
    old, new = totals(n=("seq", "count")), totals(n=("seq", "count"), hi=("seq", "max"))
    (spec,) = [o for v in old.vertices for o in v.operators if o.uid == "totals"]
    body = {"checkpoint_id": 7, "operators": {"totals": {"vertex": "v", "name": spec.name, "kind": spec.kind,
                                                         "key": ["seq"], "shape": state_shape(spec),
                                                         "subtasks": [{"subtask": 0, "parallelism": 2}]}}}
    rows = savepoint_fit(body, new).preview([o for v in new.vertices for o in v.operators], False)
    (state,) = [r["state"] for r in rows if r["uid"] == "totals"]
    assert state == ("restored (its state's schema was aggregations {'n': ['seq', 'count']}, now aggregations "
                     "{'n': ['seq', 'count'], 'hi': ['seq', 'max']})")
    rows = savepoint_fit(body, old).preview([o for v in old.vertices for o in v.operators], False)
    assert [r["state"] for r in rows if r["uid"] == "totals"] == ["restored"]
