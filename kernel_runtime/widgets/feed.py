"""The dashboard's one listener: a thread that polls the JobManager and hands the newest answer
to the kernel's event loop.

The thread asks ``job_details`` and ``cluster_overview`` over a control socket of its own (the
kernel's JobClient stays free) a few times a second. Widgets are only touched on the kernel's
main thread: the snapshot is handed over with the IOLoop's ``add_callback``; while a cell
blocks the loop in ``JobHandle.wait()``, that loop calls ``pump()`` instead. A slow loop never
builds a backlog: a newer snapshot replaces one not yet applied. Polling is all it costs the job.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from cluster.graph.execution_graph import JobState

from ..client import JobClient
from ..local_cluster import ClusterInfo
from . import current_kernel

log = logging.getLogger(__name__)
# after the job's end, a few more polls: the last metrics and result rows trail the end
POLLS_AFTER_END = 3


@dataclass(frozen=True)
class Snapshot:
    t: float  # time.monotonic() of the answer
    details: dict  # JobClient.job_details(): GET /jobs/<id> plus "subtasks"
    overview: dict  # cluster overview
    taskmanagers: list = field(default_factory=list)  # each with its "slots"
    error: Optional[str] = None  # why the JobManager could not be asked

    @property
    def state(self) -> str:
        return self.details.get("state", "")


def _direct(fn: Callable[[], None]) -> None:
    fn()


def kernel_scheduler() -> Callable[[Callable[[], None]], None]:
    """How to run a function on the kernel's main thread: its IOLoop when in a kernel, else
    (a script, a terminal) at once on the calling thread, as no frontend is there to race."""
    kernel = current_kernel()
    return kernel.io_loop.add_callback if kernel is not None else _direct


class JobFeed:
    def __init__(self, cluster: ClusterInfo, job_id: str, deliver: Callable[[Snapshot], None],
                 interval: float = 0.3, schedule: Optional[Callable[[Callable[[], None]], None]] = None):
        self.cluster, self.job_id, self.deliver, self.interval = cluster, job_id, deliver, interval
        self.schedule = schedule or kernel_scheduler()
        self._lock = threading.Lock()
        self._latest: Optional[Snapshot] = None
        self._scheduled = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"dashboard {job_id[:8]}", daemon=True)
        self.polls = 0

    def start(self) -> "JobFeed":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        client = JobClient(self.cluster, timeout=5)
        after_end = 0
        try:
            while not self._stopped.is_set() and after_end <= POLLS_AFTER_END:
                started = time.monotonic()
                snapshot = self._poll(client)
                self.polls += 1
                self._offer(snapshot)
                if snapshot.state in JobState.GLOBALLY_TERMINAL or snapshot.error:
                    after_end += 1
                self._stopped.wait(max(0.0, self.interval - (time.monotonic() - started)))
        finally:
            client.close()

    def _poll(self, client: JobClient) -> Snapshot:
        try:
            details = client.job_details(self.job_id)
            overview = client.cluster_overview()
            return Snapshot(time.monotonic(), details, overview.overview, overview.taskmanagers)
        except Exception as exc:  # the cluster stopped, or does not answer: say so and end
            return Snapshot(time.monotonic(), {}, {}, [], f"{type(exc).__name__}: {exc}")

    def _offer(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._latest = snapshot
            if self._scheduled:
                return
            self._scheduled = True
        self.schedule(self._apply)

    def _take(self) -> Optional[Snapshot]:
        with self._lock:
            snapshot, self._latest = self._latest, None
            return snapshot

    def _apply(self) -> None:
        with self._lock:
            self._scheduled = False
        self.pump()

    def pump(self) -> None:
        """Apply the newest snapshot now; only on the kernel's main thread (the one the
        widgets belong to)."""
        if self.schedule is not _direct and threading.current_thread() is not threading.main_thread():
            return
        snapshot = self._take()
        if snapshot is not None:
            try:
                self.deliver(snapshot)
            except Exception:  # a broken view must not stop the others or the feed
                log.exception("dashboard update failed")
