"""JobManager -> subscribers: the job and cluster events published on the events socket, the
snapshot a subscriber fetches, and the JobManager's count of handled control messages.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cluster.protocol.message_base import Message
from cluster.protocol.states import JobState


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
    state: JobState
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
