"""The dashboard's one listener: the job's events, handed to the kernel's event loop.

Every dashboard of a kernel follows its job through the process's one subscription to the
cluster's events (kernel_runtime.client.events): no thread and no control socket per dashboard, and
nothing asked of the JobManager in a loop. A change of the job becomes a Snapshot in the shape
the components read (the fields of GET /jobs/<id> they show, the subtasks, the slot table).

Widgets are only touched on the kernel's main thread: the dashboards with a new snapshot are
applied by one callback on the IOLoop (``add_callback``), all of them in one go; while a cell
blocks the loop in ``JobHandle.wait()``, that loop calls ``pump()`` instead. A slow loop never
builds a backlog: a newer snapshot replaces one not yet applied.

The page is the bottleneck, not the kernel: every applied update is a dozen comm messages (HTML
widgets, Bokeh patches) that the browser renders, and the kernel's replies to the cells travel to
the page behind them on the same websocket. Measured in chromium: ten dashboards applied at every
event (a few a second each) queued so much that a ``time.sleep(3)`` cell's reply did not arrive
within 60 s. So the feeds of one kernel share a budget: together they apply at most
``FEEDS_PER_PACE`` updates per ``PACE_S`` seconds, each feed its newest snapshot, the others
waiting their turn; one or two dashboards update every ``PACE_S``, ten every few seconds.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from cluster.protocol.states import JobState

from kernel_runtime.client.events import ClusterEvents, JobView, JobWatch
from kernel_runtime.client.cluster_info import ClusterInfo
from kernel_runtime.notebook.widgets import current_kernel

log = logging.getLogger(__name__)
# after the job's end, a few more refreshes of the local views: the last result rows trail the end
REFRESHES_AFTER_END = 3
PACE_S = 1.0  # seconds between two updates of a dashboard, with up to FEEDS_PER_PACE of them live
FEEDS_PER_PACE = 2


@dataclass(frozen=True)
class Snapshot:
    t: float  # time.monotonic() of the metrics in it
    details: dict  # JobClient.job_details() (or the summary of it the events carry): GET /jobs/<id> plus "subtasks"
    overview: dict  # cluster overview
    taskmanagers: list = field(default_factory=list)  # each with its "slots"
    error: Optional[str] = None  # why the JobManager could not be asked

    @property
    def state(self) -> str:
        return self.details.get("state", "")


def snapshot_of(view: JobView, now: Optional[float] = None) -> Snapshot:
    """What the components read, from what the events said of the job. The status events are
    newer than the summary they may follow; a running job's duration goes on between summaries."""
    details = dict(view.summary)
    if details:
        details["plan"] = view.plan
    if view.status is not None:
        details |= {"state": view.status.state, "status-reason": view.status.reason,
                    "failure-cause": view.status.failure}
    if view.summary and view.state not in JobState.GLOBALLY_TERMINAL and details.get("duration", -1) >= 0:
        details["duration"] += int(((now or time.monotonic()) - view.summary_t) * 1000)
    return Snapshot(view.summary_t or view.t, details, view.overview, view.taskmanagers, view.error)


def _direct(fn: Callable[[], None]) -> None:
    fn()


def kernel_scheduler() -> Callable[[Callable[[], None]], None]:
    """How to run a function on the kernel's main thread: its IOLoop when in a kernel, else
    (a script, a terminal) at once on the calling thread, as no frontend is there to race."""
    kernel = current_kernel()
    return kernel.io_loop.add_callback if kernel is not None else _direct


class _Batch:
    """The feeds with a snapshot waiting for one scheduler (the kernel's loop): one callback
    applies them all, so ten dashboards cost the loop one wake-up per update, not ten. It also
    keeps their budget: how long a feed waits after an update before its next one (``pace``)."""

    _all: dict = {}
    _all_lock = threading.Lock()

    @classmethod
    def of(cls, schedule: Callable[[Callable[[], None]], None]) -> "_Batch":
        with cls._all_lock:
            batch = cls._all.get(schedule)
            if batch is None:
                batch = cls._all[schedule] = cls(schedule)
            return batch

    def __init__(self, schedule):
        self.schedule = schedule
        self._lock = threading.Lock()
        self._feeds: dict["JobFeed", None] = {}  # insertion-ordered set
        self._live: set["JobFeed"] = set()
        self._scheduled = False

    def join(self, feed: "JobFeed") -> None:
        with self._lock:
            self._live.add(feed)

    def leave(self, feed: "JobFeed") -> None:
        with self._lock:
            self._live.discard(feed)

    def pace(self) -> float:
        """Seconds between two updates of one feed: the live feeds share FEEDS_PER_PACE updates
        per PACE_S. Outside a kernel no page renders them: no budget."""
        if self.schedule is _direct:
            return 0.0
        return PACE_S * max(1.0, len(self._live) / FEEDS_PER_PACE)

    def add(self, feed: "JobFeed") -> None:
        with self._lock:
            self._feeds[feed] = None
            if self._scheduled:
                return
            self._scheduled = True
        delay = 0.0 if feed.final else feed.next_at - time.monotonic()
        if delay <= 0:
            self.schedule(self._apply)
            return
        timer = threading.Timer(delay, self.schedule, (self._apply,))
        timer.daemon = True
        timer.start()

    def _apply(self) -> None:
        with self._lock:
            feeds, self._feeds, self._scheduled = list(self._feeds), {}, False
        for feed in feeds:
            feed.pump()
        for feed in feeds:
            if feed.pending:  # not its turn yet
                self.add(feed)


class JobFeed:
    def __init__(self, cluster: ClusterInfo, job_id: str, deliver: Callable[[Snapshot], None],
                 interval: float = 0.3, schedule: Optional[Callable[[Callable[[], None]], None]] = None):
        """``interval``: seconds between the refreshes after the job's end (the events bring
        every update before it)."""
        self.cluster, self.job_id, self.deliver, self.interval = cluster, job_id, deliver, interval
        self.schedule = schedule or kernel_scheduler()
        self._batch = _Batch.of(self.schedule)
        self._lock = threading.Lock()
        self._latest: Optional[Snapshot] = None
        self._view: Optional[JobView] = None
        self._watch: Optional[JobWatch] = None
        self._ending: Optional[threading.Timer] = None
        self._stopped = False
        self.next_at = 0.0  # time.monotonic() from which its next update may be applied

    def start(self) -> "JobFeed":
        self._batch.join(self)
        self._watch = ClusterEvents.follow(self.cluster, self.job_id, self._changed)
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._ending is not None:
                self._ending.cancel()
        self._batch.leave(self)
        if self._watch is not None:
            self._watch.close()

    @property
    def running(self) -> bool:
        return self._watch is not None and not self._watch.closed and not self._stopped

    def _changed(self, view: JobView) -> None:
        """On the events thread: the job changed."""
        self._view = view
        self._offer(snapshot_of(view))
        final = view.ended and view.summary.get("state") in JobState.GLOBALLY_TERMINAL
        with self._lock:
            if final and self._ending is None and not self._stopped:
                self._refresh_later(REFRESHES_AFTER_END)

    def _refresh_later(self, left: int) -> None:
        """With the lock."""
        self._ending = threading.Timer(self.interval, self._refresh, (left,))
        self._ending.daemon = True
        self._ending.start()

    def _refresh(self, left: int) -> None:
        """After the job's end: the local views again (result rows), then stop following."""
        if self._view is not None:
            self._offer(snapshot_of(self._view))
        with self._lock:
            if self._stopped:
                return
            if left > 1:
                self._refresh_later(left - 1)
                return
        self.stop()

    @property
    def final(self) -> bool:
        """An ended job's last pictures are not held back (a finished cell shows its end)."""
        return self._view is not None and self._view.ended

    def _offer(self, snapshot: Snapshot) -> None:
        with self._lock:
            if self._stopped:
                return
            self._latest = snapshot
        self._batch.add(self)

    @property
    def pending(self) -> bool:
        return self._latest is not None and not self._stopped

    def _take(self) -> Optional[Snapshot]:
        with self._lock:
            snapshot, self._latest = self._latest, None
            return snapshot

    def pump(self) -> None:
        """Apply the newest snapshot now if it is this feed's turn (else it waits for it); only on
        the kernel's main thread (the one the widgets belong to)."""
        if self.schedule is not _direct and threading.current_thread() is not threading.main_thread():
            return
        now = time.monotonic()
        if now < self.next_at and not self.final:
            return
        snapshot = self._take()
        if snapshot is not None:
            self.next_at = now + self._batch.pace()
            try:
                self.deliver(snapshot)
            except Exception:  # a broken view must not stop the others or the feed
                log.exception("dashboard update failed")
