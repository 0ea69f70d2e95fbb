"""The active ResourceManager's decisions, and the provider that starts TaskManager processes.

With ``resourcemanager.provider: process`` the ResourceManager does not only hand out the slots
it has: when slot requests wait for more slots than are free, it starts TaskManager processes on
this machine (Flink's ActiveResourceManager, whose YARN and Kubernetes drivers start containers
and pods), up to ``slotmanager.number-of-slots.max`` slots in the cluster, and stops one it
started once it held no slot for ``resourcemanager.taskmanager-timeout``. It keeps at least
``slotmanager.number-of-slots.min`` slots (what application mode's ``--taskmanagers N`` asks).

``ActiveResourceState`` decides, purely: events in (slot demand, processes started, registered,
lost, exited; the clock an argument), ``StartTaskManager`` / ``StopTaskManager`` out. The
``ProcessTaskManagerProvider`` does the process work; the ResourceManager carries the
instructions out on the JobManager's loop thread.
"""
from __future__ import annotations

import logging
import math
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from cluster.common import launch
from cluster.conf import check_slot_bounds

log = logging.getLogger(__name__)

# Consecutive TaskManagers that exited (or never registered) before registering, after which no
# more are started until a slot request arrives anew or one registers: a command that cannot start
# (a broken environment) must not be retried in a loop.
MAX_FAILED_STARTS = 3


# --------------------------------------------------------------------------- instructions
@dataclass(frozen=True)
class StartTaskManager:
    worker_id: str  # also the TaskManager id it registers with


@dataclass(frozen=True)
class StopTaskManager:
    worker_id: str
    task_manager_id: Optional[str]  # registered under this id (its slots leave the table), or None
    reason: str


@dataclass(frozen=True)
class SlotLimitReached:
    """Slots are wanted beyond slotmanager.number-of-slots.max (said once per shortage)."""
    wanted: int
    max_slots: int


@dataclass(frozen=True)
class StartsGivenUp:
    reason: str


# --------------------------------------------------------------------------- events' data
@dataclass(frozen=True)
class SlotDemand:
    """The slot table as the decisions need it."""
    pending: int  # slots requested and not granted yet (requests wait whole)
    free: int  # free slots of registered TaskManagers
    total: int  # slots of every registered TaskManager, started by us or not
    busy: frozenset[str] = frozenset()  # registered TaskManagers holding an allocated slot


@dataclass
class Worker:
    """A TaskManager process this ResourceManager started."""
    worker_id: str
    started_at: float
    unregistered_since: Optional[float]  # None while registered
    pid: Optional[int] = None
    task_manager_id: Optional[str] = None  # the id it is registered under, while registered
    ever_registered: bool = False
    idle_since: Optional[float] = None


@dataclass
class ActiveResourceState:
    """Which TaskManagers to start and stop; pure (no I/O, the clock an argument).

    Used by the ResourceManager on the JobManager's loop thread only."""

    slots_per_task_manager: int
    max_slots: int
    idle_timeout_s: float
    registration_timeout_s: float
    min_slots: int = 0
    id_prefix: str = field(default_factory=lambda: f"tm-active-{os.urandom(3).hex()}")
    workers: dict[str, Worker] = field(default_factory=dict)
    failed_starts: int = 0
    given_up: bool = False
    _started: int = 0
    _limit_said: bool = False

    def __post_init__(self) -> None:
        check_slot_bounds(self.min_slots, self.max_slots)

    # ------------------------------------------------------------------ events
    def process_started(self, worker_id: str, pid: int) -> None:
        if worker_id in self.workers:
            self.workers[worker_id].pid = pid

    def slots_requested(self) -> None:
        """A new slot request: a start given up after failures is tried again."""
        self.given_up = False
        self.failed_starts = 0

    def task_manager_registered(self, tm_id: str, pid: int) -> None:
        """A TaskManager registered: ours if it has the id we started it with, the id it registered
        under before, or the pid of our process (a TaskManager re-executes itself under a fresh id
        after a fatal error)."""
        worker = self._worker_of(tm_id) or next((w for w in self.workers.values() if w.pid == pid), None)
        if worker is None:
            return  # not ours: started by someone else, never stopped by us
        worker.task_manager_id = tm_id
        worker.unregistered_since = None
        worker.ever_registered = True
        worker.idle_since = None
        self.failed_starts = 0
        self.given_up = False

    def task_manager_lost(self, tm_id: str, now: float) -> None:
        """Ours may come back (it registers again) within resourcemanager.taskmanager-registration.timeout."""
        worker = self._worker_of(tm_id)
        if worker is not None:
            worker.task_manager_id = None
            worker.unregistered_since = now

    def process_exited(self, worker_id: str, reason: str) -> list:
        """Our process ended by itself. Before it registered, it counts as a failed start."""
        worker = self.workers.pop(worker_id, None)
        if worker is None or worker.ever_registered:
            return []
        return self._failed_start(f"TaskManager {worker_id} ended before it registered: {reason}")

    def reconcile(self, demand: SlotDemand, now: float) -> list:
        """Start what waiting requests (or the minimum) need, stop what idled too long."""
        out = self._registration_timeouts(now)
        out += self._start(demand, now)
        out += self._release_idle(demand, now)
        return out

    def stop_all(self, reason: str) -> list:
        out = [StopTaskManager(w.worker_id, w.task_manager_id, reason) for w in self.workers.values()]
        self.workers.clear()
        return out

    # ------------------------------------------------------------------ decisions
    @property
    def starting(self) -> list[Worker]:
        """Started and not registered (yet, or again): their slots are on the way."""
        return [w for w in self.workers.values() if w.task_manager_id is None]

    def _worker_of(self, tm_id: str) -> Optional[Worker]:
        return self.workers.get(tm_id) or next((w for w in self.workers.values() if w.task_manager_id == tm_id), None)

    def _failed_start(self, reason: str) -> list:
        self.failed_starts += 1
        if self.failed_starts < MAX_FAILED_STARTS:
            return []
        self.given_up = True
        return [StartsGivenUp(f"{self.failed_starts} TaskManagers in a row did not register, no more are "
                              f"started until a new slot request; the last: {reason}")]

    def _registration_timeouts(self, now: float) -> list:
        out: list = []
        for worker in self.starting:
            assert worker.unregistered_since is not None  # what "starting" means
            if now - worker.unregistered_since >= self.registration_timeout_s:
                del self.workers[worker.worker_id]
                reason = (f"TaskManager {worker.worker_id} not registered within "
                          f"{self.registration_timeout_s * 1000:.0f} ms (resourcemanager.taskmanager-registration.timeout)")
                out.append(StopTaskManager(worker.worker_id, None, reason))
                if not worker.ever_registered:
                    out += self._failed_start(reason)
        return out

    def _start(self, demand: SlotDemand, now: float) -> list:
        on_the_way = len(self.starting) * self.slots_per_task_manager
        shortfall = max(demand.pending - demand.free, self.min_slots - demand.total) - on_the_way
        if shortfall <= 0:
            self._limit_said = False
            return []
        if self.given_up:
            return []
        wanted = math.ceil(shortfall / self.slots_per_task_manager)
        room = max(0, (self.max_slots - demand.total - on_the_way) // self.slots_per_task_manager)
        out: list = []
        for _ in range(min(wanted, room)):
            self._started += 1
            worker_id = f"{self.id_prefix}-{self._started}"
            self.workers[worker_id] = Worker(worker_id, now, unregistered_since=now)
            out.append(StartTaskManager(worker_id))
        if wanted > room and not self._limit_said:
            self._limit_said = True
            out.append(SlotLimitReached(demand.total + on_the_way + wanted * self.slots_per_task_manager,
                                        self.max_slots))
        return out

    def _release_idle(self, demand: SlotDemand, now: float) -> list:
        out: list = []
        total = demand.total
        for worker in list(self.workers.values()):
            if worker.task_manager_id is None:
                continue
            if worker.task_manager_id in demand.busy:
                worker.idle_since = None
                continue
            if worker.idle_since is None:
                worker.idle_since = now
            # a request still waiting could take these slots once more arrive: keep them
            if demand.pending or now - worker.idle_since < self.idle_timeout_s \
                    or total - self.slots_per_task_manager < self.min_slots:
                continue
            total -= self.slots_per_task_manager
            del self.workers[worker.worker_id]
            out.append(StopTaskManager(worker.worker_id, worker.task_manager_id,
                                       f"TaskManager {worker.task_manager_id} held no slot for "
                                       f"{self.idle_timeout_s * 1000:.0f} ms (resourcemanager.taskmanager-timeout)"))
        return out


# --------------------------------------------------------------------------- the provider
class ProcessTaskManagerProvider:
    """TaskManager processes on this machine, each ``python -m cluster.taskmanager --cluster-dir
    <the JobManager's> --jobmanager <rpc> --id <worker id>`` (cluster.common.launch.spawn), logging to
    ``log/taskmanager-<worker id>.log``.

    ``start``, ``stop`` and ``poll_exited`` are for the JobManager's loop thread (the caller
    checks); ``stop_all`` is for shutdown, from any thread once the loop no longer calls the others.
    """

    def __init__(self, cluster_dir: Path, jobmanager_address: str, stop_grace_s: float = 10.0):
        self.cluster_dir = Path(cluster_dir)
        self.jobmanager_address = jobmanager_address
        self.stop_grace_s = stop_grace_s
        self._running: dict[str, subprocess.Popen] = {}
        self._stopping: dict[subprocess.Popen, float] = {}  # process -> when it is killed if still there

    def start(self, worker_id: str) -> int:
        proc = launch.spawn("cluster.taskmanager", f"taskmanager-{worker_id}", self.cluster_dir,
                            "--jobmanager", self.jobmanager_address, "--id", worker_id)
        self._running[worker_id] = proc
        return proc.pid

    def stop(self, worker_id: str) -> None:
        """SIGTERM (the TaskManager stops itself), SIGKILL after ``stop_grace_s`` (poll_exited)."""
        proc = self._running.pop(worker_id, None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            self._stopping[proc] = time.monotonic() + self.stop_grace_s

    def poll_exited(self) -> list[tuple[str, str]]:
        """(worker id, why) of the processes that ended by themselves; reaps the stopped ones."""
        exited = []
        for worker_id, proc in list(self._running.items()):
            if proc.poll() is not None:
                del self._running[worker_id]
                exited.append((worker_id, launch.exit_report(proc, self.cluster_dir, f"taskmanager-{worker_id}", 5)))
        now = time.monotonic()
        for proc, kill_at in list(self._stopping.items()):
            if proc.poll() is not None:
                del self._stopping[proc]
            elif now >= kill_at:
                proc.kill()
        return exited

    def pids(self) -> list[int]:
        return [p.pid for p in self._running.values()]

    def stop_all(self, timeout: float = 10.0) -> None:
        """Stop every process started, waiting up to ``timeout`` before SIGKILL; returns when all are gone."""
        procs = [*self._running.values(), *self._stopping]
        self._running.clear()
        self._stopping.clear()
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
