"""The scheduler's output vocabulary: what the networked JobMaster must do for a job.

Each instruction is plain, frozen data returned by ``DefaultScheduler.handle``; the JobMaster
carries it out (a message to a TaskManager or the ResourceManager, a timer on its loop, disk work
on the storage executor). Timers are named here, since an instruction starts them and an event
(TimerFired) reports them: the names are the one vocabulary both sides share.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cluster.checkpoint.coordinator import CompletedCheckpoint
from cluster.graph.execution_graph import Execution
from cluster.jobmanager.resourcemanager.slot_manager import SlotAllocation
from cluster.protocol.states import JobState

# timer names
SLOT_REQUEST_TIMER = "slot-request"
RESTART_TIMER = "restart"
CHECKPOINT_TIMER = "checkpoint"
FINAL_CHECKPOINT_TIMER = "final-checkpoint"


class Instruction:
    """Something the networked JobMaster must do; the only output of DefaultScheduler.handle."""


@dataclass(frozen=True)
class RequestSlots(Instruction):
    count: int


@dataclass(frozen=True)
class CancelSlotRequest(Instruction):
    pass


@dataclass(frozen=True)
class ReleaseSlots(Instruction):
    pass


@dataclass(frozen=True)
class DeployTasks(Instruction):
    """Submit every execution of the attempt to the TaskManager of its slot."""
    attempt: int
    placements: tuple[tuple[Execution, SlotAllocation], ...]
    restore: Optional[dict]


@dataclass(frozen=True)
class CancelTask(Instruction):
    task_manager_id: str
    execution_id: str


@dataclass(frozen=True)
class StartTimer(Instruction):
    name: str
    delay_ms: int


@dataclass(frozen=True)
class CancelTimer(Instruction):
    name: str


@dataclass(frozen=True)
class TriggerCheckpoint(Instruction):
    """Inject barrier n at each source task."""
    checkpoint_id: int
    timestamp: int
    kind: str
    directory: str
    sources: tuple[tuple[str, str], ...]  # (task manager id, execution id)


@dataclass(frozen=True)
class WriteMetadata(Instruction):
    """Write ``_metadata`` (storage executor); answered by MetadataWritten."""
    checkpoint_id: int
    directory: str
    body: dict


@dataclass(frozen=True)
class NotifyCheckpointComplete(Instruction):
    checkpoint_id: int
    task_managers: tuple[str, ...]


@dataclass(frozen=True)
class NotifyCheckpointAborted(Instruction):
    checkpoint_id: int
    task_managers: tuple[str, ...]


@dataclass(frozen=True)
class DisposeCheckpoint(Instruction):
    directory: str


@dataclass(frozen=True)
class FindRestorePoint(Instruction):
    """Read the candidates' metadata, newest first, plus any completed checkpoint on disk in
    ``job_dir`` (storage executor); answered by RestorePointFound."""
    candidates: tuple[tuple[int, str], ...]
    job_dir: str


@dataclass(frozen=True)
class SavepointFinished(Instruction):
    request_id: str
    location: Optional[str]
    failure: Optional[str]


@dataclass(frozen=True)
class CheckpointFinished(Instruction):
    """The answer to CheckpointRequested: the completed checkpoint, or why it failed."""
    request_id: str
    completed: Optional[CompletedCheckpoint]
    failure: Optional[str]


@dataclass(frozen=True)
class JobTerminated(Instruction):
    state: JobState

