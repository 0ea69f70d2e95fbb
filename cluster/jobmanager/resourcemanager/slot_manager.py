"""The ResourceManager's slot table: which TaskManagers exist, their slots, who holds each.

Pure bookkeeping, tested without sockets. Requests are all-or-nothing (a job gets every slot it
needs or none), so two jobs can never deadlock each holding part of what both need.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

from cluster.graph.job_graph import new_id


@dataclass
class TaskManagerRegistration:
    task_manager_id: str
    data_address: str
    number_of_slots: int
    pid: int
    registered_at: float
    last_heartbeat: float
    hardware: dict = field(default_factory=dict)
    tasks: list = field(default_factory=list)  # latest per-task metrics from its heartbeat
    registration_id: str = ""  # the TaskManager's registration round (RegisterTaskManager)
    spark: str = ""  # its SparkSession's phase, from its registration and heartbeats


@dataclass(frozen=True)
class SlotAllocation:
    task_manager_id: str
    slot_index: int
    job_id: str
    allocation_id: str


# Among TaskManagers with as many free slots, the one whose SparkSession is furthest along gives
# the slot: a cluster's JVMs start one after the other (SparkRunner._start_slot), so a first job
# on the TaskManager that starts first has its rows when that one is ready, not the last one
# (notebook 01's first job: 8 s sooner here), and a restart after a TaskManager loss keeps off
# the replacement whose JVM has yet to start. A job without a Spark step loses nothing by it.
SPARK_ORDER = {"ready": 0, "starting": 1, "queued": 2, "": 3, "failed": 4}


class SlotManager:
    """``spread_out`` is Flink's cluster.evenly-spread-out-slots: each slot from the TaskManager with
    the most free slots. Otherwise (Flink's default) slots are taken from the fullest TaskManager that
    has one free: a small job's tasks share one TaskManager, and so one SparkSession, where its JVM
    has the machine's cores to itself (two JVMs on 2 cores made the Spark path 1.5x slower,
    bench/peers.py). Ties go by SPARK_ORDER, then registration order."""

    def __init__(self, spread_out: bool = False):
        self.spread_out = spread_out
        self.task_managers: dict[str, TaskManagerRegistration] = {}
        self._slots: dict[tuple[str, int], Optional[SlotAllocation]] = {}
        self._pending: OrderedDict[str, int] = OrderedDict()

    # ------------------------------------------------------------------ TaskManagers
    def register(self, reg: TaskManagerRegistration) -> bool:
        """Add a TaskManager; False if it was known already (its slots are kept as they are)."""
        known = reg.task_manager_id in self.task_managers
        if known:
            old = self.task_managers[reg.task_manager_id]
            reg.tasks = old.tasks
        self.task_managers[reg.task_manager_id] = reg
        for i in range(reg.number_of_slots):
            self._slots.setdefault((reg.task_manager_id, i), None)
        return not known

    def unregister(self, tm_id: str) -> list[SlotAllocation]:
        """Remove a TaskManager and its slots; returns the allocations that were lost with it."""
        reg = self.task_managers.pop(tm_id, None)
        if reg is None:
            return []
        lost = []
        for i in range(reg.number_of_slots):
            alloc = self._slots.pop((tm_id, i), None)
            if alloc is not None:
                lost.append(alloc)
        return lost

    def heartbeat(self, tm_id: str, now: float, tasks: list, spark: str = "") -> bool:
        reg = self.task_managers.get(tm_id)
        if reg is None:
            return False
        reg.last_heartbeat = now
        reg.tasks = tasks
        reg.spark = spark
        return True

    def _spark_order(self, tm_id: str) -> int:
        return SPARK_ORDER.get(self.task_managers[tm_id].spark, SPARK_ORDER[""])

    def expired(self, now: float, timeout: float) -> list[str]:
        return [t for t, reg in self.task_managers.items() if now - reg.last_heartbeat > timeout]

    # ------------------------------------------------------------------ slots
    @property
    def total_slots(self) -> int:
        return len(self._slots)

    @property
    def free_slots(self) -> int:
        return sum(1 for a in self._slots.values() if a is None)

    def free_slots_of(self, tm_id: str) -> int:
        return sum(1 for (t, _), a in self._slots.items() if t == tm_id and a is None)

    def allocations_of(self, job_id: str) -> list[SlotAllocation]:
        return [a for a in self._slots.values() if a is not None and a.job_id == job_id]

    def request(self, job_id: str, count: int) -> None:
        self._pending[job_id] = count

    def cancel_request(self, job_id: str) -> None:
        self._pending.pop(job_id, None)

    def pending(self) -> dict[str, int]:
        return dict(self._pending)

    def allocate_pending(self) -> list[list[SlotAllocation]]:
        """Serve waiting requests in arrival order, each only if it fits whole."""
        granted = []
        for job_id, count in list(self._pending.items()):
            if count <= self.free_slots:
                granted.append(self._allocate(job_id, count))
                del self._pending[job_id]
        return granted

    def _allocate(self, job_id: str, count: int) -> list[SlotAllocation]:
        allocations = []
        for _ in range(count):
            with_free = [t for t in self.task_managers if self.free_slots_of(t)]
            if self.spread_out:  # min keeps the first of equals: sorted by id
                tm_id = min(sorted(with_free), key=lambda t: (-self.free_slots_of(t), self._spark_order(t)))
            else:  # registration order
                tm_id = min(with_free, key=lambda t: (self.free_slots_of(t), self._spark_order(t)))
            index = next(i for (t, i), a in sorted(self._slots.items()) if t == tm_id and a is None)
            alloc = SlotAllocation(tm_id, index, job_id, new_id())
            self._slots[(tm_id, index)] = alloc
            allocations.append(alloc)
        return allocations

    def free(self, job_id: str) -> list[SlotAllocation]:
        freed = []
        for key, alloc in self._slots.items():
            if alloc is not None and alloc.job_id == job_id:
                self._slots[key] = None
                freed.append(alloc)
        return freed

    def slot_report(self, tm_id: str) -> list[Optional[SlotAllocation]]:
        reg = self.task_managers[tm_id]
        return [self._slots.get((tm_id, i)) for i in range(reg.number_of_slots)]
