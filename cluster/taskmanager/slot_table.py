"""A TaskManager's own slot table: which job holds each of its slots (pure bookkeeping)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cluster.protocol.states import ExecutionState


@dataclass(frozen=True)
class SlotOwner:
    job_id: str
    allocation_id: str


class SlotTable:
    def __init__(self, number_of_slots: int):
        self._slots: list[Optional[SlotOwner]] = [None] * number_of_slots

    def __len__(self) -> int:
        return len(self._slots)

    def allocate(self, index: int, job_id: str, allocation_id: str) -> bool:
        """Give slot ``index`` to a job; idempotent for the same allocation, False if held by another."""
        if not 0 <= index < len(self._slots):
            return False
        owner = self._slots[index]
        if owner is not None and owner.allocation_id != allocation_id:
            return False
        self._slots[index] = SlotOwner(job_id, allocation_id)
        return True

    def free(self, allocation_id: str) -> Optional[str]:
        """Free the slot of an allocation; returns its job id, or None if no slot had it."""
        for i, owner in enumerate(self._slots):
            if owner is not None and owner.allocation_id == allocation_id:
                self._slots[i] = None
                return owner.job_id
        return None

    def owner(self, index: int) -> Optional[SlotOwner]:
        return self._slots[index] if 0 <= index < len(self._slots) else None

    def holds(self, allocation_id: str, job_id: str) -> bool:
        return SlotOwner(job_id, allocation_id) in self._slots

    def jobs(self) -> set[str]:
        return {o.job_id for o in self._slots if o is not None}

    def free_count(self) -> int:
        return sum(1 for o in self._slots if o is None)


# --------------------------------------------------------------------------- the task table
@dataclass(frozen=True)
class OfferSlot:
    job_id: str
    allocation_id: str


@dataclass(frozen=True)
class StartTask:
    execution_id: str


@dataclass(frozen=True)
class CancelTaskThread:
    execution_id: str


@dataclass(frozen=True)
class ReportTaskState:
    job_id: str
    execution_id: str
    state: ExecutionState
    error: Optional[str]


@dataclass(frozen=True)
class ReleaseJobNetwork:
    job_id: str


@dataclass(frozen=True)
class ForgetTask:
    """A task of a lost JobManager ended: drop its thread, report to no one."""
    execution_id: str


@dataclass
class TaskEntry:
    job_id: str
    allocation_id: str
    state: ExecutionState
    orphaned: bool = False  # its JobManager was lost: its end is reported to no one


class TaskSlotTable:
    """Flink's TaskSlotTable: the TaskExecutor's slots and the tasks in them, as a pure class
    (a method per event, instructions out). For the TaskManager's loop thread only."""

    TERMINAL = ExecutionState.TERMINAL

    def __init__(self, number_of_slots: int):
        self.slots = SlotTable(number_of_slots)
        self.tasks: dict[str, TaskEntry] = {}

    def __len__(self) -> int:
        return len(self.slots)

    def request_slot(self, index: int, job_id: str, allocation_id: str) -> list:
        """A slot held by another allocation that runs no task goes to the new request: the
        ResourceManager asks for a slot only when it knows it free, and an allocation it has
        forgotten (asked for before it declared this TaskManager lost, the request delivered late,
        after the TaskManager registered again) would otherwise hold the slot forever, the new job
        waiting for it (Flink frees such slots on taskmanager.slot.timeout). A slot whose task
        still runs is refused."""
        stale = self.slots.owner(index)
        if stale is None or stale.allocation_id == allocation_id or \
                any(t.allocation_id == stale.allocation_id for t in self.tasks.values()):
            stale = None
        else:
            self.slots.free(stale.allocation_id)  # no task to cancel
        if not self.slots.allocate(index, job_id, allocation_id):
            return []
        # the old job's network goes with its last slot (not when the new request is the same job's)
        released = [ReleaseJobNetwork(stale.job_id)] if stale and stale.job_id not in self.slots.jobs() else []
        return [*released, OfferSlot(job_id, allocation_id)]

    def submit_task(self, job_id: str, execution_id: str, allocation_id: str) -> list:
        if not self.slots.holds(allocation_id, job_id):
            return [ReportTaskState(job_id, execution_id, ExecutionState.FAILED,
                                    f"this TaskManager has no slot {allocation_id} for job {job_id}")]
        if execution_id in self.tasks:
            return []  # a duplicate deployment
        self.tasks[execution_id] = TaskEntry(job_id, allocation_id, ExecutionState.DEPLOYING)
        return [StartTask(execution_id)]

    def cancel_task(self, execution_id: str) -> list:
        return [CancelTaskThread(execution_id)] if execution_id in self.tasks else []

    def job_manager_lost(self) -> list:
        """Flink's TaskExecutor on a JobManager heartbeat timeout: cancel every task, free every
        slot and release every job's network; the cancelled tasks' ends go unreported."""
        out: list = []
        for execution_id, entry in self.tasks.items():
            if not entry.orphaned:
                entry.orphaned = True
                out.append(CancelTaskThread(execution_id))
        jobs = self.slots.jobs()
        self.slots = SlotTable(len(self.slots))
        out += [ReleaseJobNetwork(j) for j in sorted(jobs)]
        return out

    def free_slot(self, allocation_id: str) -> list:
        job_id = self.slots.free(allocation_id)
        out: list = [CancelTaskThread(e) for e, t in self.tasks.items() if t.allocation_id == allocation_id]
        if job_id is not None and job_id not in self.slots.jobs():
            out.append(ReleaseJobNetwork(job_id))
        return out

    def task_state_changed(self, execution_id: str, state: ExecutionState, error: Optional[str]) -> list:
        entry = self.tasks.get(execution_id)
        if entry is None or entry.state in self.TERMINAL:
            return []
        entry.state = state
        if state in self.TERMINAL:
            del self.tasks[execution_id]
        if entry.orphaned:
            return [ForgetTask(execution_id)] if state in self.TERMINAL else []
        return [ReportTaskState(entry.job_id, execution_id, state, error)]

    def tasks_of(self, job_id: str) -> list[str]:
        return [e for e, t in self.tasks.items() if t.job_id == job_id]
