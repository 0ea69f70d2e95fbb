"""Start and stop a cluster of real processes on this machine.

Used by ``streamlab cluster start`` (a standing session cluster), by scripts and notebooks that
run without a cluster (an embedded one, on free ports, stopped when they end) and by the tests.
A cluster lives in a directory: its config.yaml, its secret (0600), jobmanager.json (the bound
addresses, written by the JobManager), cluster.json (the pids) and log/ (each process's rolling
``<name>.log`` and its stdout/stderr in ``<name>.out``).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from cluster.common import launch
from cluster.conf import ConfigError, Configuration
from cluster.protocol.auth import create_secret
from cluster.conf.options import HighAvailabilityOptions, RestOptions

from kernel_runtime.client.cluster_info import ClusterInfo, ClusterNotRunning, default_cluster_dir
from kernel_runtime.client.job_client import JobClient
from kernel_runtime.deploy import processes
from kernel_runtime.deploy.ha import LocalZooKeeper

PROJECT_ROOT = launch.PROJECT_ROOT
STANDING_BY = "waiting for leadership"  # what an HA JobManager logs once its latch node exists
HA_SESSION_TIMEOUT = "5 s"  # a local HA cluster's ZooKeeper session unless configured (see __init__)


class LocalCluster:
    """A JobManager (or, with ``ha``, ``jobmanagers`` of them around ZooKeeper: one leads, the
    others stand by) and ``taskmanagers`` TaskManagers of ``slots`` slots, as processes."""

    def __init__(self, cluster_dir: Optional[Path] = None, taskmanagers: int = 1, slots: int = 1,
                 config: Optional[Mapping[str, Any]] = None, embedded: bool = False,
                 ha: bool = False, jobmanagers: int = 1):
        self.cluster_dir = Path(cluster_dir or default_cluster_dir())
        self.num_taskmanagers = taskmanagers
        # an embedded cluster is this process's: its processes end when it does, however it ends
        self.owned = embedded
        overrides: dict[str, Any] = {"taskmanager.numberOfTaskSlots": slots}
        if embedded:  # never clash with a standing cluster or another notebook
            overrides |= {"jobmanager.rpc.port": 0, "rest.port": 0}
        self.conf = Configuration(dict(config or {}) | overrides, "the cluster configuration")
        self.ha = ha or self.conf.get(HighAvailabilityOptions.HA_MODE) == "zookeeper"
        if jobmanagers < 1 or (jobmanagers > 1 and not self.ha):
            raise ConfigError(f"{jobmanagers} JobManagers: a cluster has one, or with high availability "
                              "(--ha) one or more")
        self.num_jobmanagers = jobmanagers
        if self.ha:
            ha_keys: dict[str, Any] = {"high-availability.type": "zookeeper"}
            if not self.conf.is_set("high-availability.cluster-id"):
                ha_keys["high-availability.cluster-id"] = self.cluster_dir.resolve().name
            if not self.conf.is_set("high-availability.zookeeper.client.session-timeout"):
                # Flink's 60 s keeps a dead leader's jobs down for a minute; 5 s fails over in
                # about 6 (bench/ha_failover.py), and a leader whose ZooKeeper stalls longer than that steps down (its
                # jobs restart from their last checkpoint): docs/deployment.md
                ha_keys["high-availability.zookeeper.client.session-timeout"] = HA_SESSION_TIMEOUT
            port = self.conf.get(RestOptions.PORT)
            if port and not self.conf.is_set("rest.bind-port") and jobmanagers > 1:
                # JobManagers of one host: each standby's REST (answering for the leader) on a port of its own
                ha_keys["rest.bind-port"] = f"{port}-{port + jobmanagers - 1}"
            self.conf.update(ha_keys, "--ha")
        # without a configured quorum the cluster runs a ZooKeeper of its own, in its directory
        self.own_zookeeper = self.ha and not self.conf.get(HighAvailabilityOptions.HA_ZOOKEEPER_QUORUM)
        self.zookeeper: Optional[LocalZooKeeper] = None  # the cluster's own, without a configured quorum
        self.jobmanagers: list[subprocess.Popen] = []  # the leader first once start() knows it
        self.taskmanagers: list[subprocess.Popen] = []
        self._info: Optional[ClusterInfo] = None
        self.ended_stale: list[int] = []  # pids of a previous cluster in this directory, ended by start()

    @property
    def jobmanager(self) -> Optional[subprocess.Popen]:
        """The leading JobManager (as of start)."""
        return self.jobmanagers[0] if self.jobmanagers else None

    @jobmanager.setter
    def jobmanager(self, proc: subprocess.Popen) -> None:
        """A JobManager started in place of the leader (a test replacing a killed one)."""
        self.jobmanagers[:1] = [proc]

    @property
    def standbys(self) -> list[subprocess.Popen]:
        return self.jobmanagers[1:]

    @property
    def quorum(self) -> str:
        return self.conf.get(HighAvailabilityOptions.HA_ZOOKEEPER_QUORUM)

    # ------------------------------------------------------------------ start
    def start(self, timeout: float = 30.0) -> "LocalCluster":
        try:
            ClusterInfo.load(self.cluster_dir)
            raise RuntimeError(f"a cluster is already running in {self.cluster_dir}; stop it first "
                               "(streamlab cluster stop)")
        except ClusterNotRunning:
            pass
        self.ended_stale = self._end_stale_processes()
        (self.cluster_dir / "log").mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.cluster_dir / "jobmanager.json").unlink(missing_ok=True)
        create_secret(self.cluster_dir / "secret")
        try:
            self._start_processes(timeout)
        except BaseException:
            # what started must not outlive a failed start (a ZooKeeper above all: nothing else ends it)
            stop_cluster(self.cluster_dir, timeout=2)
            if self.zookeeper is not None:
                self.zookeeper.stop()
            raise
        return self

    def _start_processes(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        if self.own_zookeeper:
            self.zookeeper = LocalZooKeeper(self.cluster_dir / "zookeeper")
            self.conf.update({"high-availability.zookeeper.quorum": self.zookeeper.quorum},
                             "the cluster's own ZooKeeper")
            self.zookeeper.start(max(timeout, 60.0))  # a JVM: slow to start on a busy machine
            deadline = time.monotonic() + timeout
        self.conf.write(self.cluster_dir / "config.yaml")
        if not self.ha:
            procs = {"jobmanager": self._spawn("cluster.jobmanager", "jobmanager")}
        else:  # all at once: the first to publish jobmanager.json leads, the others stand by
            procs = {f"jobmanager-{i}": self._spawn("cluster.jobmanager", f"jobmanager-{i}")
                     for i in range(self.num_jobmanagers)}
        self.jobmanagers = list(procs.values())
        self._write_pids()
        if not self.ha:
            # beside the JobManager, not after it: their imports and first JVM start while it
            # starts (they wait for its jobmanager.json), a second sooner ready for a notebook's first row
            for _ in range(self.num_taskmanagers):
                self.start_taskmanager()
        self._info = wait_for_leader(self.cluster_dir, procs, deadline - time.monotonic())
        leader_pid = published_pid(self.cluster_dir / "jobmanager.json")
        leader = next(p for p in self.jobmanagers if p.pid == leader_pid)
        self.jobmanagers = [leader, *(p for p in self.jobmanagers if p is not leader)]
        self._write_pids()
        for name, proc in procs.items():
            if proc is not leader:
                wait_until_standing_by(self.cluster_dir, proc, name, deadline - time.monotonic())
        while len(self.taskmanagers) < self.num_taskmanagers:
            self.start_taskmanager()
        self.wait_for_taskmanagers(self.num_taskmanagers, deadline - time.monotonic())

    def _end_stale_processes(self) -> list[int]:
        """End what a previous cluster of this directory left running (its JobManager killed, its
        TaskManagers went on): they would keep their tasks' output going and knock at the new
        JobManager with the old secret. Returns their pids."""
        stale = processes.stale_processes(self.cluster_dir)
        pids = [p.pid for p in stale]
        if pids and not processes.stop(pids, timeout=5):
            raise RuntimeError(f"could not end the stale processes {pids} of {self.cluster_dir}")
        return pids

    @property
    def info(self) -> ClusterInfo:
        """How to reach this cluster; ClusterNotRunning before ``start()``."""
        if self._info is None:
            raise ClusterNotRunning(f"the cluster in {self.cluster_dir} is not started")
        return self._info

    def start_taskmanager(self) -> subprocess.Popen:
        index = len(self.taskmanagers)
        # with HA a TaskManager follows whichever JobManager leads, as ZooKeeper says; one started
        # with the JobManager reads its address from the jobmanager.json it is about to write
        jobmanager_at = "zk" if self.ha else self._info.rpc_address if self._info is not None else None
        proc = self._spawn("cluster.taskmanager", f"taskmanager-{index}",
                           *(("--jobmanager", jobmanager_at) if jobmanager_at else ()),
                           "--id", f"tm-{index}-{os.urandom(3).hex()}")
        self.taskmanagers.append(proc)
        self._write_pids()
        return proc

    def wait_for_taskmanagers(self, count: int, timeout: float = 30.0) -> None:
        client = JobClient(self.info)
        try:
            deadline = time.monotonic() + max(timeout, 1.0)
            while True:
                registered = len(client.cluster_overview().taskmanagers)
                if registered >= count:
                    return
                for i, proc in enumerate(self.taskmanagers):
                    self._check_alive(proc, f"taskmanager-{i}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {registered} of {count} TaskManagers registered within "
                                       f"{timeout:g} s; see {self.cluster_dir / 'log'}")
                time.sleep(0.05)
        finally:
            client.close()

    def _spawn(self, module: str, name: str, *args: str) -> subprocess.Popen:
        return launch.spawn(module, name, self.cluster_dir, *args, owned=self.owned)

    def _check_alive(self, proc: subprocess.Popen, name: str) -> None:
        if proc.poll() is not None:
            raise RuntimeError(launch.exit_report(proc, self.cluster_dir, name))

    def _write_pids(self) -> None:
        jobmanagers = [p.pid for p in self.jobmanagers]
        pids: dict[str, Any] = {"jobmanager": jobmanagers[0] if jobmanagers else None, "jobmanagers": jobmanagers,
                                "taskmanagers": [p.pid for p in self.taskmanagers]}
        if self.zookeeper is not None and self.zookeeper.proc is not None:
            pids["zookeeper"] = self.zookeeper.proc.pid  # its own session: the pid is the group's id
        processes.write_pids(self.cluster_dir, pids)

    # ------------------------------------------------------------------ stop
    def stop(self, timeout: float = 10.0) -> None:
        stop_cluster(self.cluster_dir, timeout)
        zookeeper = [self.zookeeper.proc] if self.zookeeper is not None and self.zookeeper.proc else []
        for proc in [*self.jobmanagers, *self.taskmanagers, *zookeeper]:
            try:
                proc.wait(1)
            except subprocess.TimeoutExpired:
                proc.kill()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_for_jobmanager(cluster_dir: Path, proc: subprocess.Popen, timeout: float, name: str = "jobmanager") -> ClusterInfo:
    """Wait until the JobManager process ``proc`` has published its addresses (jobmanager.json);
    its exit report if it exits first."""
    return wait_for_leader(cluster_dir, {name: proc}, timeout)


def wait_for_leader(cluster_dir: Path, jobmanagers: Mapping[str, subprocess.Popen], timeout: float) -> ClusterInfo:
    """Wait until one of the JobManager processes ``jobmanagers`` (by log name) has published its
    addresses in jobmanager.json, as the leader does; the exit report of one that exits first."""
    deadline = time.monotonic() + timeout
    path = cluster_dir / "jobmanager.json"
    pids = {proc.pid for proc in jobmanagers.values()}
    while not (path.exists() and published_pid(path) in pids):
        for name, proc in jobmanagers.items():
            if proc.poll() is not None:
                raise RuntimeError(launch.exit_report(proc, cluster_dir, name))
        if time.monotonic() > deadline:
            names = ", ".join(str(launch.log_path(cluster_dir, n)) for n in jobmanagers)
            raise TimeoutError(f"the JobManager did not start within {timeout:g} s; see {names}")
        time.sleep(0.05)
    return ClusterInfo.load(cluster_dir)


def published_pid(path: Path) -> Optional[int]:
    try:
        return json.loads(path.read_text()).get("pid")
    except (OSError, ValueError):
        return None  # being replaced


def standing_by(cluster_dir: Path, name: str) -> bool:
    """Whether the HA JobManager logging as ``name`` joined the election (its latch node exists)."""
    log_file = launch.log_path(cluster_dir, name)
    return log_file.exists() and STANDING_BY in log_file.read_text(errors="replace")


def wait_until_standing_by(cluster_dir: Path, proc: subprocess.Popen, name: str, timeout: float) -> None:
    deadline = time.monotonic() + max(timeout, 1.0)
    while not standing_by(cluster_dir, name):
        if proc.poll() is not None:
            raise RuntimeError(launch.exit_report(proc, cluster_dir, name))
        if time.monotonic() > deadline:
            raise TimeoutError(f"the standby JobManager {name} did not join the election within {timeout:g} s; "
                               f"see {launch.log_path(cluster_dir, name)}")
        time.sleep(0.05)


def stop_cluster(cluster_dir: Optional[Path] = None, timeout: float = 10.0) -> bool:
    """End a cluster: its standby JobManagers, then the leader asked to shut the cluster down,
    its TaskManagers, and its own ZooKeeper last; every process is made sure to be gone."""
    cluster_dir = Path(cluster_dir or default_cluster_dir())
    pids_file = cluster_dir / processes.PIDS_FILE
    if not pids_file.exists():
        return False

    def shutdown() -> None:
        try:
            client = JobClient(ClusterInfo.load(cluster_dir), timeout=3)
            client.shutdown_cluster()
            client.close()
        except Exception:
            pass  # not answering: the signals do it

    processes.stop_cluster_processes(cluster_dir, grace=timeout / 2, shutdown=shutdown)
    (cluster_dir / "jobmanager.json").unlink(missing_ok=True)
    pids_file.unlink(missing_ok=True)
    return True
