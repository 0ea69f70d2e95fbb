"""The TaskExecutor's conversations with the JobManager: registration, heartbeats and slots with
the ResourceManager (Flink's ResourceManagerGateway / TaskExecutorGateway), slot offers, task
deployment and task execution state with the JobMaster (JobMasterGateway). Checkpoints, which
run over the same connection, are cluster.protocol.checkpoint_messages.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cluster.protocol.message_base import Message
from cluster.protocol.states import ExecutionState


@dataclass(frozen=True)
class RegisterTaskManager(Message, op="register-task-manager"):
    task_manager_id: str
    data_address: str
    number_of_slots: int
    pid: int
    hardware: dict  # cpuCores, physicalMemory, freeMemory: shown in GET /taskmanagers
    # one per registration round: the retries of a round repeat it; a TaskManager that gave its
    # JobManager up (and cancelled its tasks) registers with a new one
    registration_id: str
    # its SparkSession's phase as HeartbeatFromTaskManager's: the first job's slots may be asked
    # for before the first heartbeat comes
    spark: str


@dataclass(frozen=True)
class RegistrationSuccess(Message, op="registration-success"):
    heartbeat_interval_ms: int


@dataclass(frozen=True)
class RegistrationRejected(Message, op="registration-rejected"):
    reason: str


@dataclass(frozen=True)
class HeartbeatFromTaskManager(Message, op="heartbeat-from-task-manager"):
    task_manager_id: str
    # One dict per running task: execution_id, job_id, vertex_id, subtask, records-in,
    # records-out, bytes-in, bytes-out, backpressured/idle/busy ms.
    tasks: list[dict]
    # its SparkSession: "" (not started), "queued", "starting", "ready" or "failed"
    # (SparkRunner.phase); slots go to the TaskManagers furthest along first
    spark: str


@dataclass(frozen=True)
class HeartbeatFromResourceManager(Message, op="heartbeat-from-resource-manager"):
    """The answer to a known TaskManager's heartbeat: silence for heartbeat.timeout tells the
    TaskManager its JobManager is lost."""


@dataclass(frozen=True)
class RequestRegistration(Message, op="request-registration"):
    """The ResourceManager does not know the sender (e.g. it was declared lost): register again."""


@dataclass(frozen=True)
class DisconnectTaskManager(Message, op="disconnect-task-manager"):
    task_manager_id: str
    reason: str


@dataclass(frozen=True)
class RequestSlot(Message, op="request-slot"):
    slot_index: int
    job_id: str
    allocation_id: str


@dataclass(frozen=True)
class ShutdownTaskManager(Message, op="shutdown-task-manager"):
    pass


# --------------------------------------------------------------------------- TaskExecutor <-> JobMaster
@dataclass(frozen=True)
class OfferSlots(Message, op="offer-slots"):
    task_manager_id: str
    job_id: str
    allocation_ids: list[str]


@dataclass(frozen=True)
class FreeSlot(Message, op="free-slot"):
    allocation_id: str


@dataclass(frozen=True)
class SubmitTask(Message, op="submit-task"):
    # A TaskDeploymentDescriptor (cluster.graph.deployment) as a plain dict.
    deployment: dict


@dataclass(frozen=True)
class CancelTask(Message, op="cancel-task"):
    execution_id: str


@dataclass(frozen=True)
class UpdateTaskExecutionState(Message, op="update-task-execution-state"):
    job_id: str
    execution_id: str
    state: ExecutionState
    error: Optional[str]
    metrics: dict  # the task's counters at this moment (final ones on a terminal state)
