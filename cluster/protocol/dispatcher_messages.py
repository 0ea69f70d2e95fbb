"""Client <-> Dispatcher (Flink's DispatcherGateway): submit, watch, cancel and savepoint jobs,
query keyed state, acknowledge collected rows, shut the cluster down. The client and the CLI send
these over an RpcClient; the JobManager's Dispatcher answers them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cluster.protocol.message_base import Message
from cluster.protocol.states import JobState


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
    state: JobState
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
