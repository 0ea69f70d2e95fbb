"""The scheduler's input vocabulary: what can happen to a job (Flink's SchedulerNG entry points).

Each event is plain, frozen data: the networked JobMaster builds one from a message, a fired
timer or a finished disk operation and hands it to ``DefaultScheduler.handle``; tests build them
by hand. An event carries no callable: a request that wants an answer names itself by a request
id and the answer comes back as an instruction (SavepointFinished, CheckpointFinished).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from cluster.jobmanager.resourcemanager.slot_manager import SlotAllocation
from cluster.protocol.states import ExecutionState


class SchedulerError(Exception):
    """A request the job cannot serve in its current state (answered to the caller, not a bug)."""


class TooManySavepoints(SchedulerError):
    """A savepoint asked for while the job already takes as many as it may: try again later
    (REST answers 429)."""


class Event:
    """Something that happened to the job; the only input of DefaultScheduler.handle."""


@dataclass(frozen=True)
class StartScheduling(Event):
    pass


@dataclass(frozen=True)
class InitializationFailed(Event):
    """A check before deployment (cluster.connectors.submission_checks) found what no restart fixes."""
    reason: str


@dataclass(frozen=True)
class SlotsAllocated(Event):
    allocations: tuple[SlotAllocation, ...]


@dataclass(frozen=True)
class SlotsOffered(Event):
    allocation_ids: tuple[str, ...]


@dataclass(frozen=True)
class TaskStateReported(Event):
    execution_id: str
    state: ExecutionState
    error: Optional[str] = None
    metrics: Optional[dict] = None


@dataclass(frozen=True)
class TaskMetricsReported(Event):
    tasks: tuple[dict, ...]


@dataclass(frozen=True)
class TaskManagerLost(Event):
    task_manager_id: str
    reason: str


@dataclass(frozen=True)
class DeploymentFailed(Event):
    """The shell could not hand a task to its TaskManager (gone since the allocation)."""
    execution_id: str
    reason: str


@dataclass(frozen=True)
class TimerFired(Event):
    name: str


@dataclass(frozen=True)
class CancelRequested(Event):
    pass


@dataclass(frozen=True)
class SavepointRequested(Event):
    request_id: str
    target_directory: Optional[str]
    stop: bool


@dataclass(frozen=True)
class CheckpointRequested(Event):
    """A checkpoint now, outside the periodic rules (Flink's manual checkpoint trigger); answered
    by CheckpointFinished with the same ``request_id`` once it completes or fails."""
    request_id: str


@dataclass(frozen=True)
class CheckpointAcknowledged(Event):
    checkpoint_id: int
    participant: str  # an execution id, or collect/<sink uid>/<subtask> for a client's acknowledgement
    state: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointDeclined(Event):
    checkpoint_id: int
    participant: str
    reason: str


@dataclass(frozen=True)
class SourceExhausted(Event):
    execution_id: str


@dataclass(frozen=True)
class MetadataWritten(Event):
    checkpoint_id: int
    error: Optional[str] = None


@dataclass(frozen=True)
class RestorePointFound(Event):
    """The answer to FindRestorePoint: the newest sound checkpoint's metadata, or None."""
    body: Optional[dict]
    directory: Optional[str]
