"""JobEventPublisher: the JobManager tells the clients that watch a job what happens to it.

Clients used to ask for a job's status every 100 ms and for its whole details every 300 ms per
dashboard, so the JobManager's work grew with every open dashboard. Instead it publishes events
on a socket of its own, next to the control socket: each event is built and signed once, and
ZeroMQ's PUB fan-out copies it to every subscriber, so a subscriber costs one message per update.

* A job's status change (state, attempt, why it waits, its failure) goes out as soon as the
  handler that caused it has finished (so the reason and failure it carries are settled).
* A job's summary (what a dashboard shows: vertices and subtasks with their load, the newest
  checkpoints) is read on the publisher's own timer, once per ``metrics.fetcher.update-interval``,
  for the jobs someone subscribed to, and published only when it changed.
* The cluster's overview and slot table, when they changed; and a heartbeat every interval
  with the latest sequence of every watched job, so a subscriber notices the loss of a last event
  and a silent (gone) JobManager.

Topics are ``job/<id>/`` and ``cluster/``; every job counts its events (``sequence``), so a
subscriber that sees a gap fetches the job again (RequestJobSnapshot, answered here). The socket
is an XPUB: its subscription messages say which jobs are watched, so summaries of jobs nobody
watches are never built.

Everything here runs on the JobManager's loop thread (the listeners are called by the
JobMasters' ExecutionGraphs, the timer and the handler by the endpoint), like the state it reads.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Optional

import zmq

from cluster.graph.execution_graph import ExecutionGraph
from cluster.protocol import messages as m
from cluster.protocol.codec import Codec
from cluster.protocol.endpoint import Peer, RpcEndpoint
from cluster.protocol.metrics import EVENT_TIME_METRICS, LATE_ROWS
from cluster.protocol.sockets import advertised_address, bind_broadcast, bound_address, make_socket
from cluster.protocol.states import JobState

from cluster.jobmanager.rest.views import job_json, overview_json, plan_json, subtasks_json, taskmanagers_json
from cluster.conf.options import JobManagerOptions, MetricOptions

if TYPE_CHECKING:
    from cluster.jobmanager.dispatcher import Dispatcher
    from cluster.jobmanager.jobmaster.job_master import JobMaster

log = logging.getLogger(__name__)

CLUSTER_TOPIC = b"cluster/"
# the metrics of a subtask a dashboard shows; the rest stay in the full job details
SUBTASK_METRICS = ("records-in", "records-out", "records-sent", "bytes-in", "bytes-out", "busyTimeMsPerSecond",
                   "backPressuredTimeMsPerSecond", "idleTimeMsPerSecond", *EVENT_TIME_METRICS, LATE_ROWS)
SUMMARY_FIELDS = ("jid", "name", "state", "attempt", "start-time", "end-time", "duration", "now", "status-reason",
                  "failure-cause", "last-failure", "window-waits", "bottleneck", "latency")
VOLATILE_FIELDS = ("duration", "now")  # move with the clock: not a change worth an event
CHECKPOINTS_SHOWN = 10  # the newest checkpoints in a summary
SEND_HIGH_WATER_MARK = 1000  # events queued per subscriber; beyond it a slow one loses some (a gap)


def job_topic(job_id: str) -> bytes:
    # the trailing "/" makes ZeroMQ's prefix match exact: "job/ab/" is no prefix of "job/abc/"
    return f"job/{job_id}/".encode()


def job_summary(d: "Dispatcher", job_id: str) -> dict:
    """The part of GET /jobs/<id> (and of its subtasks) a dashboard shows, in the same shape."""
    details = job_json(d, job_id)
    summary = {key: details[key] for key in SUMMARY_FIELDS}
    summary["vertices"] = [{key: v[key] for key in ("id", "name", "parallelism", "status")}
                           for v in details["vertices"]]
    summary["subtasks"] = [s | {"metrics": {k: s["metrics"][k] for k in SUBTASK_METRICS if k in s["metrics"]}}
                           for s in subtasks_json(d, job_id)]
    checkpoints = {key: value for key, value in details["checkpoints"].items() if key != "summary"}
    checkpoints["history"] = checkpoints["history"][:CHECKPOINTS_SHOWN]
    summary["checkpoints"] = checkpoints
    return summary


def cluster_view(d: "Dispatcher") -> tuple[dict, list[dict]]:
    """The overview and the TaskManagers with their slots, without the time since each one's
    last heartbeat (it moves at every heartbeat; the full answer has it)."""
    taskmanagers = [{k: v for k, v in tm.items() if k != "timeSinceLastHeartbeat"}
                    for tm in taskmanagers_json(d)["taskmanagers"]]
    return overview_json(d), taskmanagers


class EventSocket:
    """The XPUB socket events leave by; frames are ``[topic, *signed message]``."""

    def __init__(self, ctx: zmq.Context, codec: Codec, address: str, advertised_host: Optional[str] = None):
        self.codec = codec.for_socket()  # its own sending stream (see codec.py)
        self._sock = make_socket(ctx, zmq.XPUB)
        self._sock.setsockopt(zmq.SNDHWM, SEND_HIGH_WATER_MARK)
        bind_broadcast(self._sock, address, codec)
        self.address = advertised_address(self._sock, advertised_host) if advertised_host else bound_address(self._sock)
        self.dropped = 0

    def send(self, topic: bytes, msg: m.Message) -> None:
        if self._sock.closed:  # the JobManager stops; a timer may still be due in this loop turn
            return
        try:
            self._sock.send_multipart([topic, *self.codec.encode(msg)], flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # XPUB drops per subscriber at its high-water mark; this is the socket's own
            self.dropped += 1

    def subscriptions(self) -> list[tuple[bool, bytes]]:
        """The (subscribed?, topic) changes since the last call: XPUB reports the first subscriber
        of a topic and the departure of its last one."""
        changes: list[tuple[bool, bytes]] = []
        while not self._sock.closed:
            try:
                frame = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return changes
            if frame[:1] in (b"\x00", b"\x01"):
                changes.append((frame[:1] == b"\x01", frame[1:]))
        return changes

    def close(self) -> None:
        self._sock.close(0)


class JobEventPublisher:
    """Builds each event once and hands it to ``send(topic, message)``. Loop thread only."""

    def __init__(self, dispatcher: "Dispatcher", interval_ms: int, send: Callable[[bytes, m.Message], None],
                 call_soon: Callable[[Callable[[], None]], None]):
        self.dispatcher = dispatcher
        self.interval_ms = interval_ms
        self.send = send
        self.call_soon = call_soon
        self.watched: set[str] = set()  # job ids someone subscribed to
        self.sequences: dict[str, int] = {}  # job id -> sequence of its latest event
        self.cluster_sequence = 0
        self.summaries_built = 0  # how often a watched job's summary was read (tests, benches)
        self._pending: list[tuple[str, JobState, int, int]] = []  # status changes not yet published
        self._last_status: dict[str, tuple] = {}
        self._last_summary: dict[str, dict] = {}
        self._settled: set[str] = set()  # ended jobs whose final status and summary went out
        self._last_cluster: Optional[tuple] = None
        self.socket: Optional[EventSocket] = None  # set by bind()
        self.handlers = {m.RequestJobSnapshot: self.request_job_snapshot}
        dispatcher.job_added_listeners.append(self.job_added)

    @classmethod
    def bind(cls, endpoint: RpcEndpoint, dispatcher: "Dispatcher", conf) -> "JobEventPublisher":
        """A publisher on a socket at ``jobmanager.rpc.address``:``jobmanager.events.port``,
        publishing on the endpoint's loop every ``metrics.fetcher.update-interval``."""
        bind_host = conf.get(JobManagerOptions.BIND_HOST) or conf.get(JobManagerOptions.ADDRESS)
        socket = EventSocket(endpoint.ctx, endpoint.codec, f"tcp://{bind_host}:{conf['jobmanager.events.port']}",
                             advertised_host=conf.get(JobManagerOptions.ADDRESS))
        publisher = cls(dispatcher, conf.get(MetricOptions.METRIC_FETCHER_UPDATE_INTERVAL), socket.send, endpoint.call_soon)
        publisher.socket = socket

        def tick() -> None:
            for subscribed, topic in socket.subscriptions():
                publisher.subscription_changed(topic, subscribed)
            publisher.tick()
        endpoint.call_every(publisher.interval_ms / 1000, tick)
        return publisher

    @property
    def address(self) -> Optional[str]:
        return self.socket.address if self.socket else None

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()

    # ------------------------------------------------------------------ subscriptions
    def subscription_changed(self, topic: bytes, subscribed: bool) -> None:
        text = topic.decode(errors="replace")
        if not (text.startswith("job/") and text.endswith("/")):
            return  # the cluster topic: always published
        job_id = text[len("job/"):-1]
        if subscribed:
            self.watched.add(job_id)
        else:
            self.watched.discard(job_id)
            self._last_summary.pop(job_id, None)  # a later subscriber fetches first anyway

    # ------------------------------------------------------------------ status changes
    def job_added(self, master: "JobMaster") -> None:
        master.graph.listeners.append(self._state_changed)
        self._publish_status(master, master.state, master.graph.attempt, master.status_reason,
                             master.graph.timestamps[master.state])

    def _state_changed(self, graph: ExecutionGraph, old: JobState, new: JobState, now_ms: int) -> None:
        # in the middle of a JobMaster's handler: publish once it has finished (its reason and
        # failure are then settled), every state in the order taken
        if not self._pending:
            self.call_soon(self.flush)
        self._pending.append((graph.job_graph.job_id, new, graph.attempt, now_ms))

    def flush(self) -> None:
        """Publish the state changes not yet published."""
        pending, self._pending = self._pending, []
        for i, (job_id, state, attempt, timestamp) in enumerate(pending):
            master = self.dispatcher.jobs.get(job_id)
            if master is None:
                continue
            latest = state == master.state and not any(p[0] == job_id for p in pending[i + 1:])
            self._publish_status(master, state, attempt, master.status_reason if latest else None, timestamp)

    def _publish_status(self, master: "JobMaster", state: JobState, attempt: int, reason: Optional[str],
                        timestamp: int) -> None:
        job_id = master.job_id
        failure = master.graph.failure_in(state)
        self._last_status[job_id] = (state, attempt, reason, failure)
        self.send(job_topic(job_id), m.JobStatusChanged(
            job_id, self._next(job_id), master.job_graph.name, state, attempt, reason, failure, timestamp))

    def _next(self, job_id: str) -> int:
        self.sequences[job_id] = self.sequences.get(job_id, 0) + 1
        return self.sequences[job_id]

    # ------------------------------------------------------------------ the timer
    def tick(self) -> None:
        """Once per update interval: what changed without a state change (why a job waits, the
        watched jobs' summaries, the slot table), then the heartbeat."""
        self.flush()
        for job_id, master in list(self.dispatcher.jobs.items()):
            if job_id in self._settled:
                continue
            status = (master.state, master.graph.attempt, master.status_reason, master.graph.current_failure)
            if status != self._last_status.get(job_id):
                self._publish_status(master, master.state, master.graph.attempt, master.status_reason,
                                     master.graph.timestamps[master.state])
            if job_id in self.watched:
                self._publish_summary_if_changed(job_id)
            if master.graph.is_globally_terminal:
                self._settled.add(job_id)  # nothing about it changes any more
        self._publish_cluster_if_changed()
        self.send(CLUSTER_TOPIC, m.EventsHeartbeat(
            self.interval_ms, self.cluster_sequence,
            {job_id: self.sequences[job_id] for job_id in self.watched if job_id in self.sequences}))

    def _publish_summary_if_changed(self, job_id: str) -> None:
        summary = job_summary(self.dispatcher, job_id)
        self.summaries_built += 1
        steady = {k: v for k, v in summary.items() if k not in VOLATILE_FIELDS}
        if steady != self._last_summary.get(job_id):
            self._last_summary[job_id] = steady
            self.send(job_topic(job_id), m.JobSummaryUpdated(job_id, self._next(job_id), summary))

    def _publish_cluster_if_changed(self) -> None:
        overview, taskmanagers = cluster_view(self.dispatcher)
        if (overview, taskmanagers) != self._last_cluster:
            self._last_cluster = (overview, taskmanagers)
            self.cluster_sequence += 1
            self.send(CLUSTER_TOPIC, m.ClusterOverviewChanged(self.cluster_sequence, overview, taskmanagers))

    # ------------------------------------------------------------------ the fetch
    def request_job_snapshot(self, msg: m.RequestJobSnapshot, peer: Peer) -> m.JobSnapshot:
        master = self.dispatcher.job(msg.job_id)  # an unknown job is an error answer
        self.flush()  # so the sequence counts every change the snapshot shows
        status = master.status()
        overview, taskmanagers = cluster_view(self.dispatcher)
        return m.JobSnapshot(
            msg.job_id, self.sequences.get(msg.job_id, 0),
            {"name": status.name, "state": status.state, "attempt": status.attempt, "reason": status.reason,
             "failure": status.failure, "timestamp": master.graph.timestamps[status.state]},
            job_summary(self.dispatcher, msg.job_id), plan_json(master), self.cluster_sequence, overview,
            taskmanagers)
