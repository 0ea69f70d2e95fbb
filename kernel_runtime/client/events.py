"""A cluster's job events as this process follows them: one subscription per cluster, shared.

The JobManager publishes every job's status changes, a summary of each watched job once per
update interval when it changed, the cluster's overview and a heartbeat (cluster/jobmanager/
events.py). Everything in this process that follows a job (``JobHandle.wait()``, every dashboard
of a kernel, the CLI through ``wait()``) watches it here: one SUB socket and one thread per
cluster, one RPC client of its own for the fetches, however many watchers.

ZeroMQ's slow joiner: a subscription takes effect some time after it is made, so a watch first
subscribes, then fetches the job once over RPC (RequestJobSnapshot: the state and the sequence
of the latest event it reflects), then follows the events. A gap in a job's sequence, a heartbeat
naming a newer sequence (the last events were lost), or a silence of several heartbeat intervals
(the JobManager is gone, or the connection is) makes it fetch again.

Watchers read ``JobView``s: immutable, replaced as a whole at every change, so any thread may
read the newest one without a lock. Listeners are called on the events thread and must not block.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

import zmq

from cluster.protocol.states import JobState
from cluster.protocol import messages as m
from cluster.protocol.curve import cluster_codec
from cluster.protocol.endpoint import RpcError
from cluster.protocol.rpc_client import RpcClient
from cluster.protocol.sockets import inproc_pair, make_socket, subscribe_to

from kernel_runtime.client.leader import LeaderWatch
from kernel_runtime.client.cluster_info import ClusterInfo

log = logging.getLogger(__name__)

CLUSTER_TOPIC = b"cluster/"
SILENT_INTERVALS = 3  # heartbeats missed before the JobManager is asked directly
FIRST_INTERVAL_S = 1.0  # assumed until the first heartbeat says the JobManager's interval
FETCH_TIMEOUT_S = 5.0


def job_topic(job_id: str) -> bytes:
    return f"job/{job_id}/".encode()


@dataclass(frozen=True)
class JobView:
    """One job as this process last heard of it."""

    job_id: str
    status: Optional[m.JobStatus] = None  # None until the first fetch or event
    entered_ms: int = 0  # when the job entered its state (the JobManager's clock)
    summary: dict = field(default_factory=dict)  # JobSummaryUpdated.summary
    summary_t: float = 0.0  # time.monotonic() when the summary arrived
    plan: dict = field(default_factory=dict)
    overview: dict = field(default_factory=dict)
    taskmanagers: list = field(default_factory=list)
    error: Optional[str] = None  # why the JobManager could not be asked, if it could not
    # (attempt, failure) of each restart heard of, in order: a listener called once for several
    # changes (a restart without delay) still learns of each
    restarts: tuple[tuple[int, str], ...] = ()
    t: float = 0.0  # time.monotonic() of the change
    version: int = 0

    @property
    def state(self) -> Optional[JobState]:
        return self.status.state if self.status else None

    @property
    def ended(self) -> bool:
        return self.state in JobState.GLOBALLY_TERMINAL


class JobWatch:
    """One watcher's handle on a job; several share the job's view. Close it when done."""

    def __init__(self, events: "ClusterEvents", job_id: str, listener: Optional[Callable[[JobView], None]]):
        self.events, self.job_id, self.listener = events, job_id, listener
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed or self.events.closed

    @property
    def view(self) -> JobView:
        return self.events.view(self.job_id)

    def wait_for_change(self, version: int, timeout: Optional[float]) -> JobView:
        """The newest view once its version is past ``version`` (or the timeout passed)."""
        return self.events.wait_for_change(self.job_id, version, timeout)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.events.unwatch(self)

    def __enter__(self) -> "JobWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Job:
    """The events thread's bookkeeping of one watched job."""

    def __init__(self, job_id: str):
        self.view = JobView(job_id)
        self.sequence = 0  # of the latest event (or fetch) applied
        self.watchers: list[JobWatch] = []
        self.needs_fetch = False  # set once subscribed: subscribe first, then fetch


class ClusterEvents:
    """The one subscription of this process to one cluster's events."""

    _shared: dict[tuple, "ClusterEvents"] = {}
    _shared_lock = threading.Lock()  # taken before an instance's own lock

    @classmethod
    def follow(cls, cluster: ClusterInfo, job_id: str,
               listener: Optional[Callable[[JobView], None]] = None) -> JobWatch:
        """Watch a job of ``cluster`` through this process's subscription to it (made on the first
        watch, closed with the last); ``listener(view)`` is called on the events thread at every
        change and must not block."""
        key = (cluster.events_address, cluster.secret)
        with cls._shared_lock:
            events = cls._shared.get(key)
            if events is None:
                events = cls._shared[key] = cls(cluster, key)
            return events._watch(job_id, listener)

    def __init__(self, cluster: ClusterInfo, key: tuple):
        self.cluster, self._key = cluster, key
        self.codec = cluster_codec(cluster.configuration(), cluster.secret)
        self.ctx: zmq.Context = zmq.Context.instance()
        self._lock = threading.Condition()
        self._jobs: dict[str, _Job] = {}
        self._commands: deque = deque()
        self._changed: set[str] = set()  # jobs whose listeners have not heard of their newest view
        self._wake_recv, self._wake_send = inproc_pair(self.ctx, "job-events")
        self.interval_s = FIRST_INTERVAL_S
        self.cluster_sequence = 0
        self._overview: tuple[dict, list] = ({}, [])
        self.last_heard = time.monotonic()
        self.fetches = 0  # RequestJobSnapshot sent (tests, benches)
        self.received = 0  # events received
        self.closed = False
        self._sub: Optional[zmq.Socket] = None  # these three: the events thread's
        self._rpc: Optional[RpcClient] = None
        self._poller = zmq.Poller()
        self._leader = LeaderWatch.of(cluster.configuration())
        if self._leader is not None:  # an HA cluster: follow its leader
            self._leader.subscribe(self._leader_changed)
        self._thread = threading.Thread(target=self._run, name=f"job events {cluster.events_address}", daemon=True)
        self._thread.start()

    def _leader_changed(self, leader: dict) -> None:
        """A ZooKeeper thread: the events thread re-subscribes at the new leader."""
        with self._lock:
            self._command(("leader", leader))

    # ------------------------------------------------------------------ watchers (any thread)
    def _watch(self, job_id: str, listener: Optional[Callable[[JobView], None]]) -> JobWatch:
        watch = JobWatch(self, job_id, listener)
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                job = self._jobs[job_id] = _Job(job_id)
                self._command(("subscribe", job_id))
            job.watchers.append(watch)
        return watch

    def unwatch(self, watch: JobWatch) -> None:
        with ClusterEvents._shared_lock, self._lock:
            job = self._jobs.get(watch.job_id)
            if job is None or watch not in job.watchers:
                return
            job.watchers.remove(watch)
            if job.watchers:
                return
            del self._jobs[watch.job_id]
            if self._jobs:
                self._command(("unsubscribe", watch.job_id))
                return
            # the last watch: nobody follows this cluster any more (e.g. it was stopped)
            if ClusterEvents._shared.get(self._key) is self:
                del ClusterEvents._shared[self._key]
            self.closed = True
            self._command(("close",))
            self._lock.notify_all()

    def view(self, job_id: str) -> JobView:
        job = self._jobs.get(job_id)
        return job.view if job is not None else JobView(job_id)

    def wait_for_change(self, job_id: str, version: int, timeout: Optional[float]) -> JobView:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                view = self.view(job_id)
                remaining = None if deadline is None else deadline - time.monotonic()
                if view.version > version or (remaining is not None and remaining <= 0) or self.closed:
                    return view
                self._lock.wait(remaining)

    def _command(self, command: tuple) -> None:
        # with the lock: it makes the shared PUSH socket safe
        self._commands.append(command)
        try:
            self._wake_send.send(b"", flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # a wake-up is pending already

    # ------------------------------------------------------------------ the events thread
    def _connect(self, cluster: ClusterInfo) -> None:
        """Events thread: subscribe at ``cluster``'s JobManager (again, after a change of leader:
        then every sequence starts over, as the new leader's do)."""
        again = self._sub is not None
        if self._sub is not None:
            self._poller.unregister(self._sub)
            self._sub.close(0)
        if self._rpc is not None:
            self._rpc.close()
        self.cluster = cluster
        self._sub = sub = make_socket(self.ctx, zmq.SUB)
        subscribe_to(sub, cluster.events_address, self.codec)
        sub.setsockopt(zmq.SUBSCRIBE, CLUSTER_TOPIC)
        self._rpc = RpcClient(cluster.rpc_address, self.codec, FETCH_TIMEOUT_S, self.ctx)
        self._poller.register(sub, zmq.POLLIN)
        self.cluster_sequence = 0
        with self._lock:
            for job in self._jobs.values() if again else ():  # else their subscribe commands are queued
                sub.setsockopt(zmq.SUBSCRIBE, job_topic(job.view.job_id))
                job.sequence, job.needs_fetch = 0, True

    def _run(self) -> None:
        self._connect(self.cluster)
        self._poller.register(self._wake_recv, zmq.POLLIN)
        try:
            while True:
                silence_at = self.last_heard + SILENT_INTERVALS * self.interval_s
                wait_ms = 0 if any(j.needs_fetch for j in list(self._jobs.values())) \
                    else max(0, int((silence_at - time.monotonic()) * 1000)) + 1
                ready = dict(self._poller.poll(wait_ms))
                if self._wake_recv in ready:
                    while self._wake_recv.poll(0):
                        self._wake_recv.recv()
                if not self._run_commands():
                    return
                sub, rpc = self._sub, self._rpc
                assert sub is not None and rpc is not None
                if sub in ready:
                    for _ in range(1000):  # bounded: fetches and commands get their turn
                        try:
                            frames = sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._receive(frames)
                if time.monotonic() >= self.last_heard + SILENT_INTERVALS * self.interval_s:
                    self.last_heard = time.monotonic()  # ask again after another silence, not at once
                    with self._lock:
                        for job in self._jobs.values():
                            job.needs_fetch = True
                for job in [j for j in list(self._jobs.values()) if j.needs_fetch]:
                    if not self._fetch(rpc, job):
                        break  # the JobManager does not answer: the others wait for the next try
                self._notify_listeners()
        except Exception:
            log.exception("the job events of %s stopped", self.cluster.events_address)
        finally:
            with ClusterEvents._shared_lock, self._lock:  # after a failure too: watchers must not wait on
                if ClusterEvents._shared.get(self._key) is self:
                    del ClusterEvents._shared[self._key]
                self.closed = True
                self._lock.notify_all()
            if self._sub is not None:
                self._sub.close(0)
            if self._rpc is not None:
                self._rpc.close()
            if self._leader is not None:
                self._leader.release(self._leader_changed)
            self._wake_recv.close(0)
            self._wake_send.close(0)

    def _run_commands(self) -> bool:
        while self._commands:
            command = self._commands.popleft()
            if command[0] == "close":
                return False
            if command[0] == "leader":
                leader = self.cluster.with_leader(command[1])
                if leader.events_address != self.cluster.events_address:
                    log.warning("job events: following the new leading JobManager at %s", leader.rpc_address)
                    self._connect(leader)
                continue
            kind, job_id = command
            assert self._sub is not None
            self._sub.setsockopt(zmq.SUBSCRIBE if kind == "subscribe" else zmq.UNSUBSCRIBE, job_topic(job_id))
            if kind == "subscribe":
                with self._lock:
                    job = self._jobs.get(job_id)
                    if job is not None:
                        job.needs_fetch = True
        return True

    def _receive(self, frames: list) -> None:
        if len(frames) < 3:
            log.warning("job events: dropped a message of %d frames", len(frames))
            return
        topic = frames[0]
        try:
            msg, _, _ = self.codec.decode(frames[1:])
        except m.MalformedMessage as exc:
            log.warning("job events: dropped a malformed message: %s", exc)
            return
        self.received += 1
        self.last_heard = time.monotonic()
        if isinstance(msg, (m.JobStatusChanged, m.JobSummaryUpdated)):
            if topic == job_topic(msg.job_id):  # signed, and on the topic it names
                self._job_event(msg)
        elif topic != CLUSTER_TOPIC:
            log.warning("job events: %s on topic %r dropped", msg.op, topic)
        elif isinstance(msg, m.ClusterOverviewChanged):
            if msg.sequence > self.cluster_sequence:  # each one is the whole picture: a gap loses nothing
                self.cluster_sequence = msg.sequence
                self._overview = (msg.overview, msg.taskmanagers)
                with self._lock:
                    for job in self._jobs.values():
                        self._change(job, overview=msg.overview, taskmanagers=msg.taskmanagers)
        elif isinstance(msg, m.EventsHeartbeat):
            self.interval_s = max(0.05, msg.interval_ms / 1000)
            with self._lock:
                for job_id, sequence in msg.job_sequences.items():
                    watched = self._jobs.get(job_id)
                    if watched is not None and isinstance(sequence, int) and sequence > watched.sequence:
                        watched.needs_fetch = True  # its latest events never arrived
                if msg.cluster_sequence > self.cluster_sequence and self._jobs:
                    next(iter(self._jobs.values())).needs_fetch = True  # a fetch carries the overview

    def _job_event(self, msg) -> None:
        with self._lock:
            job = self._jobs.get(msg.job_id)
            if job is None or msg.sequence <= job.sequence:
                return  # not watched (any more), or older than what we have
            if msg.sequence != job.sequence + 1:
                job.needs_fetch = True  # some were lost: this one is newer still, so apply it too
            job.sequence = msg.sequence
            if isinstance(msg, m.JobStatusChanged):
                self._change(job, status=m.JobStatus(msg.job_id, msg.name, msg.state, msg.attempt, msg.reason,
                                                     msg.failure), entered_ms=msg.timestamp)
            else:
                self._change(job, summary=msg.summary, summary_t=time.monotonic())

    def _fetch(self, rpc: RpcClient, job: _Job) -> bool:
        """Ask the JobManager for the job as it is; False if it did not answer."""
        job.needs_fetch = False
        self.fetches += 1
        try:
            snap = rpc.request(m.RequestJobSnapshot(job.view.job_id), expect=m.JobSnapshot)
        except (RpcError, TimeoutError) as exc:
            with self._lock:
                for other in self._jobs.values() if isinstance(exc, TimeoutError) else [job]:
                    other.needs_fetch = False
                    self._change(other, error=f"{type(exc).__name__}: {exc}")
            return not isinstance(exc, TimeoutError)
        self.last_heard = time.monotonic()
        s = snap.status
        with self._lock:
            if snap.sequence < job.sequence:
                job.needs_fetch = True  # answered before events we applied since: ask again
                return True
            job.sequence = snap.sequence
            if snap.cluster_sequence >= self.cluster_sequence:
                self.cluster_sequence = snap.cluster_sequence
                self._overview = (snap.overview, snap.taskmanagers)
            overview, taskmanagers = self._overview
            self._change(job, status=m.JobStatus(snap.job_id, s["name"], s["state"], s["attempt"], s["reason"],
                                                 s["failure"]),
                         entered_ms=s["timestamp"], summary=snap.summary, summary_t=time.monotonic(),
                         plan=snap.plan, overview=overview,
                         taskmanagers=taskmanagers, error=None)
        return True

    def _change(self, job: _Job, **changes) -> None:
        """A new view of the job, for its listeners, then its waiters, at the end of this turn of
        the loop (once however many changes it brought). Events thread, with the lock."""
        changes.setdefault("error", None)
        status = changes.get("status")
        if status is not None and status.state == JobState.RESTARTING and status.failure \
                and all(attempt != status.attempt for attempt, _ in job.view.restarts):
            changes["restarts"] = (*job.view.restarts, (status.attempt, status.failure))
        if "overview" not in changes and not job.view.overview and self._overview[0]:
            changes["overview"], changes["taskmanagers"] = self._overview
        job.view = replace(job.view, **changes, t=time.monotonic(), version=job.view.version + 1)
        self._changed.add(job.view.job_id)

    def _notify_listeners(self) -> None:
        with self._lock:
            changed, self._changed = self._changed, set()
            calls = [(w.listener, job.view) for job_id in changed if (job := self._jobs.get(job_id))
                     for w in job.watchers if w.listener is not None]
        for listener, view in calls:  # without the lock: a listener may take its time, or unwatch
            try:
                listener(view)
            except Exception:  # one broken watcher must not stop the others
                log.exception("job events: a listener of job %s failed", view.job_id)
        if changed:  # waiters last: a wait() that pumps a dashboard finds its new snapshot there
            with self._lock:
                self._lock.notify_all()
