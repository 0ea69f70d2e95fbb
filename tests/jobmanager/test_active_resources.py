"""The active ResourceManager's decisions without processes or sockets: what it starts for waiting
slot requests, what it stops after the idle timeout (time moved by hand), and failed starts."""
from __future__ import annotations

import pytest

from cluster.conf import ConfigError
from cluster.jobmanager.resourcemanager.active_resources import (MAX_FAILED_STARTS, ActiveResourceState, SlotDemand, SlotLimitReached, StartsGivenUp, StartTaskManager, StopTaskManager)


def state(**kw) -> ActiveResourceState:
    options = dict(slots_per_task_manager=2, max_slots=100, idle_timeout_s=5.0, registration_timeout_s=30.0,
                   id_prefix="tm")
    return ActiveResourceState(**options | kw)


def of(instructions, kind):
    return [i for i in instructions if isinstance(i, kind)]


def started(instructions) -> list[str]:
    return [i.worker_id for i in of(instructions, StartTaskManager)]


def test_waiting_requests_start_what_they_lack_and_no_more_while_those_register():
    rm = state()
    # a job of 6 slots on one TaskManager of 2 (not ours): two more are started
    demand = SlotDemand(pending=6, free=2, total=2)
    assert started(rm.reconcile(demand, now=0.0)) == ["tm-1", "tm-2"]
    for wid, pid in (("tm-1", 101), ("tm-2", 102)):
        rm.process_started(wid, pid)
    # still registering: the same demand starts nothing more, however often it is looked at
    assert rm.reconcile(demand, now=0.5) == []
    assert rm.reconcile(demand, now=10.0) == []
    rm.task_manager_registered("tm-1", 101)
    assert rm.reconcile(SlotDemand(pending=6, free=4, total=4), now=11.0) == []
    # a second job arrives meanwhile: only its own shortfall is started
    assert started(rm.reconcile(SlotDemand(pending=6 + 3, free=4, total=4), now=11.5)) == ["tm-3", "tm-4"]


def test_slotmanager_number_of_slots_max_bounds_what_is_started():
    rm = state(max_slots=5)
    out = rm.reconcile(SlotDemand(pending=8, free=0, total=0), now=0.0)
    assert started(out) == ["tm-1", "tm-2"]  # 4 slots; a third TaskManager would make 6 > 5
    (limit,) = of(out, SlotLimitReached)
    assert limit.max_slots == 5
    assert rm.reconcile(SlotDemand(pending=8, free=0, total=0), now=1.0) == []  # said once
    with pytest.raises(ConfigError, match="number-of-slots.min"):
        state(min_slots=6, max_slots=4)


def test_only_own_taskmanagers_stop_and_only_after_the_idle_timeout():
    rm = state(idle_timeout_s=5.0)
    rm.reconcile(SlotDemand(pending=4, free=0, total=2, busy=frozenset({"first"})), now=0.0)
    rm.task_manager_registered("tm-1", 101)
    rm.task_manager_registered("tm-2", 102)
    busy = frozenset({"first", "tm-1", "tm-2"})
    assert rm.reconcile(SlotDemand(pending=0, free=0, total=6, busy=busy), now=1.0) == []
    # the job ended at 2.0: everything idle, the first TaskManager (not ours) included
    idle = SlotDemand(pending=0, free=6, total=6)
    assert rm.reconcile(idle, now=2.0) == []
    assert rm.reconcile(idle, now=6.9) == []
    out = rm.reconcile(idle, now=7.0)
    assert [(i.worker_id, i.task_manager_id) for i in of(out, StopTaskManager)] == [("tm-1", "tm-1"), ("tm-2", "tm-2")]
    assert "resourcemanager.taskmanager-timeout" in out[0].reason
    assert rm.workers == {}
    assert rm.reconcile(SlotDemand(pending=0, free=2, total=2), now=100.0) == []  # "first" is never stopped


def test_a_taskmanager_that_gets_a_slot_again_is_not_stopped_and_a_waiting_request_keeps_idle_ones():
    rm = state(idle_timeout_s=5.0)
    rm.reconcile(SlotDemand(pending=2, free=0, total=0), now=0.0)
    rm.task_manager_registered("tm-1", 101)
    rm.reconcile(SlotDemand(pending=0, free=2, total=2), now=1.0)  # idle from 1.0
    rm.reconcile(SlotDemand(pending=0, free=0, total=2, busy=frozenset({"tm-1"})), now=5.0)  # busy again
    assert rm.reconcile(SlotDemand(pending=0, free=2, total=2), now=9.0) == []  # idle from 9.0 only
    # a request for more than there is waits whole: its TaskManagers are kept for it
    out = rm.reconcile(SlotDemand(pending=4, free=2, total=2), now=20.0)
    assert not of(out, StopTaskManager) and started(out) == ["tm-2"]


def test_slotmanager_number_of_slots_min_is_started_up_front_and_kept():
    rm = state(min_slots=4, idle_timeout_s=1.0)
    assert started(rm.reconcile(SlotDemand(pending=0, free=0, total=0), now=0.0)) == ["tm-1", "tm-2"]
    rm.task_manager_registered("tm-1", 1)
    rm.task_manager_registered("tm-2", 2)
    assert rm.reconcile(SlotDemand(pending=0, free=4, total=4), now=100.0) == []


def test_a_process_that_dies_before_registering_is_replaced_a_bounded_number_of_times():
    rm = state()
    demand = SlotDemand(pending=2, free=0, total=0)
    assert started(rm.reconcile(demand, now=0.0)) == ["tm-1"]
    replacements = []
    for n in range(1, MAX_FAILED_STARTS):
        assert rm.process_exited(f"tm-{n}", "exit code 1") == []
        replacements += started(rm.reconcile(demand, now=float(n)))
    assert replacements == [f"tm-{n}" for n in range(2, MAX_FAILED_STARTS + 1)]
    (given_up,) = rm.process_exited(f"tm-{MAX_FAILED_STARTS}", "exit code 1")
    assert isinstance(given_up, StartsGivenUp) and "exit code 1" in given_up.reason
    assert rm.reconcile(demand, now=10.0) == []  # no loop of starts
    rm.slots_requested()  # a new request tries again
    assert started(rm.reconcile(demand, now=11.0)) == [f"tm-{MAX_FAILED_STARTS + 1}"]


def test_a_process_that_never_registers_is_stopped_and_replaced_and_one_that_registered_is_not_a_failed_start():
    rm = state(registration_timeout_s=30.0)
    demand = SlotDemand(pending=2, free=0, total=0)
    rm.reconcile(demand, now=0.0)
    out = rm.reconcile(demand, now=30.0)
    assert [(i.worker_id, i.task_manager_id) for i in of(out, StopTaskManager)] == [("tm-1", None)]
    assert started(out) == ["tm-2"]
    rm.task_manager_registered("tm-2", 7)
    rm.task_manager_lost("tm-2", now=40.0)  # its slots are gone from the table: it may come back
    assert rm.reconcile(demand, now=41.0) == []  # counted as on its way, not started twice
    assert rm.process_exited("tm-2", "killed") == [] and rm.failed_starts == 0


def test_a_taskmanager_that_reexecutes_under_a_fresh_id_stays_ours():
    rm = state(idle_timeout_s=1.0)
    rm.reconcile(SlotDemand(pending=2, free=0, total=0), now=0.0)
    rm.process_started("tm-1", 4242)
    rm.task_manager_registered("tm-1", 4242)
    rm.task_manager_lost("tm-1", now=1.0)
    rm.task_manager_registered("tm-fresh", 4242)  # same process, new id after a fatal error
    assert rm.reconcile(SlotDemand(pending=0, free=2, total=2), now=5.0) == []  # registered: nothing started
    (stop,) = rm.reconcile(SlotDemand(pending=0, free=2, total=2), now=6.0)
    assert (stop.worker_id, stop.task_manager_id) == ("tm-1", "tm-fresh")


def test_stop_all_names_every_started_process():
    rm = state()
    rm.reconcile(SlotDemand(pending=4, free=0, total=0), now=0.0)
    rm.task_manager_registered("tm-1", 1)
    out = rm.stop_all("the JobManager is shutting down")
    assert sorted((i.worker_id, i.task_manager_id) for i in out) == [("tm-1", "tm-1"), ("tm-2", None)]
    assert rm.workers == {}
