"""Every message that crosses a process boundary, one frozen dataclass each.

This module is the protocol's index: a reader finds here every ``op`` that any endpoint sends or
handles. Names follow Flink's gateways (JobMasterGateway, TaskExecutorGateway,
ResourceManagerGateway, DispatcherGateway) and, for the data plane, Flink's NettyMessage.

Each class registers itself under its kebab-case ``op``; ``Message.from_wire`` looks the op up,
checks that the fields are exactly the declared ones with the declared types, and refuses
anything else. The payload of data messages (Arrow IPC bytes) travels in extra frames, not in the
dataclass.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Optional


class MalformedMessage(ValueError):
    """A frame that is not a valid, authenticated message; it is dropped, never handled."""


class Message:
    op: ClassVar[str]
    registry: ClassVar[dict[str, type["Message"]]] = {}
    _field_types: ClassVar[dict[str, Any]]

    def __init_subclass__(cls, op: str, **kwargs):
        super().__init_subclass__(**kwargs)
        if op in Message.registry:
            raise TypeError(f"duplicate message op {op!r}")
        cls.op = op
        Message.registry[op] = cls

    def to_wire(self) -> dict:
        wire = {name: getattr(self, name) for name in _field_types(type(self))}
        wire["op"] = self.op
        return wire

    @staticmethod
    def from_wire(wire: Any) -> "Message":
        if not isinstance(wire, dict):
            raise MalformedMessage(f"message is a {type(wire).__name__}, not a map")
        op = wire.get("op")
        cls = Message.registry.get(op) if isinstance(op, str) else None
        if cls is None:
            raise MalformedMessage(f"unknown op {op!r}")
        types = _field_types(cls)
        given = set(wire) - {"op"}
        if given != set(types):
            missing, extra = set(types) - given, given - set(types)
            raise MalformedMessage(f"{op}: missing fields {sorted(missing)}, unexpected {sorted(extra)}")
        for name, annotation in types.items():
            if not _conforms(wire[name], annotation):
                raise MalformedMessage(f"{op}: field {name!r} is not {annotation}")
        return cls(**{name: wire[name] for name in types})


def _field_types(cls) -> dict[str, Any]:
    cached = cls.__dict__.get("_field_types")
    if cached is None:
        hints = typing.get_type_hints(cls)
        cached = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
        cls._field_types = cached
    return cached


def _conforms(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if origin is typing.Union:
        return any(_conforms(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(annotation) or (Any,)
        return isinstance(value, list) and all(_conforms(v, item) for v in value)
    if origin is dict or annotation is dict:
        return isinstance(value, dict)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


# --------------------------------------------------------------------------- generic replies
@dataclass(frozen=True)
class Acknowledge(Message, op="acknowledge"):
    pass


@dataclass(frozen=True)
class ErrorResponse(Message, op="error-response"):
    message: str


# --------------------------------------------------------------------------- client -> Dispatcher
@dataclass(frozen=True)
class SubmitJob(Message, op="submit-job"):
    job_graph: dict
    # Where collect sinks send their batches: the submitting client's result socket, or None
    # (detached submission: collected rows are discarded).
    result_address: Optional[str]


@dataclass(frozen=True)
class JobSubmitted(Message, op="job-submitted"):
    job_id: str


@dataclass(frozen=True)
class RequestJobStatus(Message, op="request-job-status"):
    job_id: str


@dataclass(frozen=True)
class JobStatus(Message, op="job-status"):
    job_id: str
    name: str
    state: str
    attempt: int
    reason: Optional[str]      # why a job waits (e.g. for slots)
    failure: Optional[str]     # the root cause, with the user's traceback, once FAILED


@dataclass(frozen=True)
class ListJobs(Message, op="list-jobs"):
    pass


@dataclass(frozen=True)
class JobList(Message, op="job-list"):
    jobs: list[dict]


@dataclass(frozen=True)
class CancelJob(Message, op="cancel-job"):
    job_id: str


@dataclass(frozen=True)
class RequestClusterOverview(Message, op="request-cluster-overview"):
    pass


@dataclass(frozen=True)
class ClusterOverview(Message, op="cluster-overview"):
    overview: dict
    taskmanagers: list[dict]


@dataclass(frozen=True)
class RequestJobDetails(Message, op="request-job-details"):
    job_id: str


@dataclass(frozen=True)
class JobDetails(Message, op="job-details"):
    details: dict  # GET /jobs/<jobid>, with per-subtask metrics and placement under "subtasks"


@dataclass(frozen=True)
class TriggerSavepoint(Message, op="trigger-savepoint"):
    job_id: str
    target_directory: Optional[str]  # None: state.savepoints.dir
    stop: bool                       # stop-with-savepoint: the job ends once the savepoint completes


@dataclass(frozen=True)
class SavepointCompleted(Message, op="savepoint-completed"):
    job_id: str
    location: str


@dataclass(frozen=True)
class DisposeSavepoint(Message, op="dispose-savepoint"):
    location: str


@dataclass(frozen=True)
class RequestKeyedState(Message, op="request-keyed-state"):
    """The keyed state of one operator of a running job at a completed checkpoint (the newest,
    or with ``fresh`` one triggered for this request); the job runs on."""
    job_id: str
    operator: str           # its name as the user gave it, or its uid
    key: Optional[bytes]    # one key's entries only (KeyCodec bytes), or None for every key
    fresh: bool


@dataclass(frozen=True)
class KeyedState(Message, op="keyed-state"):
    job_id: str
    checkpoint_id: int
    operator: dict          # name, uid, kind, key columns (cluster.checkpoint.inspection.operator_info)
    sources: dict           # source operator name -> each subtask's position at the checkpoint
    entries: bytes          # Arrow IPC stream: state, key (KeyCodec), value (pickle), undecoded


@dataclass(frozen=True)
class AcknowledgeCollect(Message, op="acknowledge-collect"):
    """The client received every row a collect sink subtask sent before checkpoint barrier n."""
    job_id: str
    attempt: int
    sink: str
    subtask: int
    checkpoint_id: int


@dataclass(frozen=True)
class ShutdownCluster(Message, op="shutdown-cluster"):
    pass


# --------------------------------------------------------------------------- TaskExecutor <-> ResourceManager
@dataclass(frozen=True)
class RegisterTaskManager(Message, op="register-task-manager"):
    task_manager_id: str
    data_address: str
    number_of_slots: int
    pid: int
    hardware: dict  # cpuCores, physicalMemory, freeMemory: shown in GET /taskmanagers


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
    state: str
    error: Optional[str]
    metrics: dict  # the task's counters at this moment (final ones on a terminal state)


@dataclass(frozen=True)
class TriggerCheckpoint(Message, op="trigger-checkpoint"):
    """To a source task: inject barrier n into the stream."""
    job_id: str
    execution_id: str
    checkpoint_id: int
    timestamp: int
    kind: str       # checkpoint | savepoint | final (all sources ended) | stop (stop-with-savepoint)
    directory: str  # where this checkpoint's files go


@dataclass(frozen=True)
class AcknowledgeCheckpoint(Message, op="acknowledge-checkpoint"):
    job_id: str
    execution_id: str
    checkpoint_id: int
    state: dict  # operator uid -> state handle (file names relative to the checkpoint directory)


@dataclass(frozen=True)
class DeclineCheckpoint(Message, op="decline-checkpoint"):
    job_id: str
    execution_id: str
    checkpoint_id: int
    reason: str


@dataclass(frozen=True)
class NotifyCheckpointComplete(Message, op="notify-checkpoint-complete"):
    job_id: str
    checkpoint_id: int


@dataclass(frozen=True)
class NotifyCheckpointAborted(Message, op="notify-checkpoint-aborted"):
    job_id: str
    checkpoint_id: int


@dataclass(frozen=True)
class EndOfInput(Message, op="end-of-input"):
    """A source task read all of its input; with checkpointing it waits for a final checkpoint."""
    job_id: str
    execution_id: str


# --------------------------------------------------------------------------- data plane (TM <-> TM)
@dataclass(frozen=True)
class BufferResponse(Message, op="buffer-response"):
    channel: str
    sequence: int


@dataclass(frozen=True)
class AddCredit(Message, op="add-credit"):
    channel: str
    credit: int


@dataclass(frozen=True)
class EndOfPartition(Message, op="end-of-partition"):
    channel: str


@dataclass(frozen=True)
class CheckpointBarrier(Message, op="checkpoint-barrier"):
    channel: str
    checkpoint_id: int
    timestamp: int
    kind: str
    directory: str


@dataclass(frozen=True)
class Watermark(Message, op="watermark"):
    """In-band event time, after every row before it (cluster.operators.windowing.watermarks)."""
    channel: str
    timestamp: int


@dataclass(frozen=True)
class WatermarkStatus(Message, op="watermark-status"):
    """The producer became idle (its watermark holds nobody back) or active again."""
    channel: str
    idle: bool


# --------------------------------------------------------------------------- collect sink -> client
@dataclass(frozen=True)
class CollectBatch(Message, op="collect-batch"):
    job_id: str
    attempt: int
    sink: str
    subtask: int
    # the last checkpoint barrier the sink passed before these rows (0: none), and the checkpoint
    # this attempt restored from: on a restart the client drops earlier attempts' rows of epochs
    # >= the restored checkpoint, because they will be replayed
    epoch: int
    restored_from: int


@dataclass(frozen=True)
class CollectBarrier(Message, op="collect-barrier"):
    """Every row before checkpoint barrier n was sent: the client acknowledges it to the JobManager."""
    job_id: str
    attempt: int
    sink: str
    subtask: int
    checkpoint_id: int


@dataclass(frozen=True)
class CollectEnd(Message, op="collect-end"):
    job_id: str
    attempt: int
    sink: str
    subtask: int


# --------------------------------------------------------------------------- JobManager -> subscribers (events)
# Published on the JobManager's events socket (PUB/SUB), each frame set preceded by its topic:
# ``job/<job id>/`` for one job's events, ``cluster/`` for the cluster's. ``sequence`` counts a
# topic's events (per job; one counter for the cluster), so a subscriber that sees a gap fetches
# the state again with RequestJobSnapshot.
@dataclass(frozen=True)
class JobStatusChanged(Message, op="job-status-changed"):
    """Published at once when a job changes state, and when why it waits changes."""
    job_id: str
    sequence: int
    name: str
    state: str
    attempt: int
    reason: Optional[str]
    failure: Optional[str]
    timestamp: int  # ms: when the job entered this state


@dataclass(frozen=True)
class JobSummaryUpdated(Message, op="job-summary-updated"):
    """What a dashboard shows of a job (GET /jobs/<id> fields, its subtasks' placement and load,
    its newest checkpoints), at most once per metrics.fetcher.update-interval and only if changed."""
    job_id: str
    sequence: int
    summary: dict


@dataclass(frozen=True)
class ClusterOverviewChanged(Message, op="cluster-overview-changed"):
    """The cluster overview and every TaskManager with its slots, when they change."""
    sequence: int
    overview: dict
    taskmanagers: list[dict]


@dataclass(frozen=True)
class EventsHeartbeat(Message, op="events-heartbeat"):
    """Once per update interval on the cluster topic: silence means the JobManager is gone, and a
    watched job whose latest sequence is ahead of a subscriber's lost its last events."""
    interval_ms: int
    cluster_sequence: int
    job_sequences: dict  # job id -> sequence of its latest event, for the jobs someone watches


@dataclass(frozen=True)
class RequestJobSnapshot(Message, op="request-job-snapshot"):
    """A subscriber's fetch (after subscribing, on a gap, after a silence): the job as it is now."""
    job_id: str


@dataclass(frozen=True)
class JobSnapshot(Message, op="job-snapshot"):
    job_id: str
    sequence: int         # the job's events up to this one are reflected here
    status: dict          # the fields of JobStatusChanged but job_id and sequence
    summary: dict         # as in JobSummaryUpdated
    plan: dict            # the job's plan (GET /jobs/<id>/plan): it never changes, so no event carries it
    cluster_sequence: int
    overview: dict
    taskmanagers: list[dict]


@dataclass(frozen=True)
class RequestControlStats(Message, op="request-control-stats"):
    pass


@dataclass(frozen=True)
class ControlStats(Message, op="control-stats"):
    """How many control messages the JobManager handled, per op, since it started."""
    handled: dict
