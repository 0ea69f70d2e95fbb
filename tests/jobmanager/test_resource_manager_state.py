"""The ResourceManager's decisions without sockets: registration, heartbeat expiry (time moved by
hand), slot grants and what a lost TaskManager takes with it."""
from __future__ import annotations

from cluster.jobmanager.resourcemanager.resource_manager import (AcceptRegistration, AnswerHeartbeat, AskToRegister, DeclareLost, ForwardMetrics, FreeSlotAt, GrantSlots, RejectRegistration, RequestSlotAt, ResourceManagerState)
from cluster.jobmanager.resourcemanager.slot_manager import TaskManagerRegistration


def register(rm, tm_id, slots=2, now=0.0, connection=None, round="r1"):
    reg = TaskManagerRegistration(tm_id, f"tcp://127.0.0.1:{len(tm_id)}", slots, 1, now, now, registration_id=round)
    return rm.register_task_manager(reg, (connection or tm_id).encode())


def of(instructions, kind):
    return [i for i in instructions if isinstance(i, kind)]


def test_registration_must_come_from_the_connection_it_names():
    rm = ResourceManagerState(heartbeat_timeout_s=2)
    assert of(register(rm, "tm-a", connection="tm-b"), RejectRegistration)
    assert of(register(rm, "tm-a", slots=0), RejectRegistration)
    assert rm.slot_manager.task_managers == {}
    assert register(rm, "tm-a") == [AcceptRegistration("tm-a", True)]
    assert register(rm, "tm-a") == [AcceptRegistration("tm-a", False)]  # again: known, slots kept


def test_a_taskmanager_registering_in_a_new_round_is_lost_first_and_a_repeat_of_its_round_is_not():
    # it gave the JobManager up (no heartbeat answer) and cancelled its tasks, while its own
    # heartbeats and registrations kept reaching us: its slots must not go on holding the job
    rm = ResourceManagerState(heartbeat_timeout_s=2)
    register(rm, "tm-a", round="r1")
    (grant,) = of(rm.request_slots("job", 2), GrantSlots)
    assert register(rm, "tm-a", round="r1") == [AcceptRegistration("tm-a", False)]  # a retry of the round
    assert len(rm.slot_manager.allocations_of("job")) == 2
    out = register(rm, "tm-a", round="r2")
    (lost,) = of(out, DeclareLost)
    assert lost.task_manager_id == "tm-a" and "registered again" in lost.reason
    assert of(out, AcceptRegistration) == [AcceptRegistration("tm-a", True)]
    assert rm.slot_manager.allocations_of("job") == [] and rm.slot_manager.free_slots == 2


def test_a_silent_taskmanager_is_lost_after_the_timeout_and_a_heartbeat_keeps_it():
    rm = ResourceManagerState(heartbeat_timeout_s=2)
    register(rm, "tm-a", now=0.0)
    register(rm, "tm-b", now=0.0)
    assert rm.heartbeat_from_task_manager("tm-a", [{"execution_id": "e"}], now=1.5) == [
        AnswerHeartbeat("tm-a"), ForwardMetrics(({"execution_id": "e"},))]  # answered: the TM knows we live
    assert rm.check_heartbeats(now=2.0) == []
    out = rm.check_heartbeats(now=2.1)
    assert [i.task_manager_id for i in of(out, DeclareLost)] == ["tm-b"]
    assert "no heartbeat for 2000 ms (heartbeat.timeout)" in out[0].reason
    assert rm.check_heartbeats(now=3.4) == []
    assert of(rm.check_heartbeats(now=3.6), DeclareLost)  # tm-a's last word was at 1.5
    # a heartbeat from a TaskManager declared lost: it must register again
    assert rm.heartbeat_from_task_manager("tm-b", [], now=4.0) == [AskToRegister("tm-b")]


def test_slots_are_granted_whole_and_a_waiting_request_is_served_when_slots_arrive():
    rm = ResourceManagerState(heartbeat_timeout_s=2)
    register(rm, "tm-a", slots=2)
    assert rm.request_slots("big", 3) == []  # waits: all or nothing
    out = register(rm, "tm-b", slots=2)
    (grant,) = of(out, GrantSlots)
    assert grant.job_id == "big" and len(grant.allocations) == 3
    assert {i.allocation for i in of(out, RequestSlotAt)} == set(grant.allocations)
    out = rm.release_slots("big")
    assert {i.allocation for i in of(out, FreeSlotAt)} == set(grant.allocations)
    assert rm.slot_manager.free_slots == 4


def test_a_lost_taskmanager_takes_its_slots_and_a_cancelled_request_is_never_granted():
    rm = ResourceManagerState(heartbeat_timeout_s=2)
    register(rm, "tm-a", slots=2)
    register(rm, "tm-b", slots=2)
    (grant,) = of(rm.request_slots("job", 4), GrantSlots)
    out = rm.lose("tm-a", "TaskManager tm-a disconnected")
    assert out == [DeclareLost("tm-a", "TaskManager tm-a disconnected")]
    assert rm.slot_manager.total_slots == 2 and rm.lose("tm-a", "again") == []
    rm.release_slots("job")
    assert rm.request_slots("other", 3) == [] and rm.cancel_slot_request("other") == []
    assert of(register(rm, "tm-c", slots=2), GrantSlots) == []


def test_a_released_taskmanager_is_not_asked_back_nor_taken_back_while_it_stops():
    rm = ResourceManagerState(heartbeat_timeout_s=2)
    register(rm, "tm-a")
    register(rm, "tm-idle")
    assert rm.release("tm-idle") == []
    assert set(rm.slot_manager.task_managers) == {"tm-a"}
    # its last heartbeat, sent before it got the signal to stop
    assert rm.heartbeat_from_task_manager("tm-idle", [], now=1.0) == []
    (refused,) = register(rm, "tm-idle", now=1.0)
    assert isinstance(refused, RejectRegistration) and "released" in refused.reason
    assert set(rm.slot_manager.task_managers) == {"tm-a"}
    assert rm.heartbeat_from_task_manager("tm-gone", [], now=1.0) == [AskToRegister("tm-gone")]  # others still


def test_a_first_jobs_slots_go_to_the_taskmanager_whose_spark_starts_as_it_registers():
    # the job's request can come before either TaskManager's first heartbeat: the phase each gave at
    # registration decides (the queued one's JVM starts only after the other's is ready)
    rm = ResourceManagerState(heartbeat_timeout_s=2)
    for tm_id, spark in (("tm-queued", "queued"), ("tm-starting", "starting")):
        reg = TaskManagerRegistration(tm_id, "tcp://127.0.0.1:1", 2, 1, 0.0, 0.0, registration_id="r1", spark=spark)
        rm.register_task_manager(reg, tm_id.encode())
    (grant,) = of(rm.request_slots("job", 2), GrantSlots)
    assert {a.task_manager_id for a in grant.allocations} == {"tm-starting"}
