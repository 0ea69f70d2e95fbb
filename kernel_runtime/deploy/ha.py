"""A local HA cluster: Debian's ZooKeeper server and JobManagers and TaskManagers around it.

``LocalZooKeeper`` runs ``zkServer.sh start-foreground`` with a zoo.cfg of its own (data in its
folder, a free client port of 127.0.0.1, no admin server). ``HaLocalCluster`` writes an HA
configuration into a cluster directory and starts its JobManagers (the first to win leads, the
others stand by) and TaskManagers (``--jobmanager zk``: they follow the leader) one by one, so a
test or a benchmark can kill and replace them. The leader's addresses are in the directory's
``jobmanager.json``, which every new leader rewrites; a standby's REST address (it answers for
the leader) in ``jobmanager-standby-<pid>.json``.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from cluster.common import launch
from cluster.conf import Configuration
from cluster.protocol.auth import create_secret
from cluster.ha.services import EXIT_LEADERSHIP_REVOKED

from kernel_runtime.client.cluster_info import ClusterInfo

ZK_SERVER = Path("/usr/share/zookeeper/bin/zkServer.sh")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalZooKeeper:
    def __init__(self, directory: Path):
        self.directory = directory
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None
        directory.mkdir(parents=True, exist_ok=True)
        # tickTime 200 ms: sessions may be as short as 2 ticks, so a dead leader is noticed fast
        (directory / "zoo.cfg").write_text(
            f"tickTime=200\ninitLimit=10\nsyncLimit=5\ndataDir={directory / 'data'}\n"
            f"clientPort={self.port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
            "maxSessionTimeout=60000\n")

    @property
    def quorum(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "LocalZooKeeper":
        env = dict(os.environ, ZOO_LOG_DIR=str(self.directory), JVMFLAGS="-Xmx128m")
        log = open(self.directory / "zookeeper.out", "ab")
        self.proc = subprocess.Popen([str(ZK_SERVER), "start-foreground", str(self.directory / "zoo.cfg")],
                                     stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {self.proc.returncode}: "
                                   f"{(self.directory / 'zookeeper.out').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"srvr")  # the one four-letter word allowed by default
                    if b"Mode" in s.recv(1024):
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"ZooKeeper did not start within {timeout:g} s")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


class HaLocalCluster:
    """JobManagers and TaskManagers of one HA cluster directory, started and killed one by one."""

    def __init__(self, cluster_dir: Path, quorum: str, config: Optional[dict[str, Any]] = None):
        self.cluster_dir = cluster_dir
        (cluster_dir / "log").mkdir(mode=0o700, parents=True, exist_ok=True)
        create_secret(cluster_dir / "secret")
        Configuration({
            "jobmanager.rpc.port": 0, "rest.port": 0, "taskmanager.numberOfTaskSlots": 2,
            "taskmanager.spark.startup": "lazy",
            "high-availability.type": "zookeeper", "high-availability.zookeeper.quorum": quorum,
            "high-availability.cluster-id": cluster_dir.name,
            "high-availability.zookeeper.client.session-timeout": "2 s"} | (config or {}),
            "the HA test cluster").write(cluster_dir / "config.yaml")
        self.jobmanagers: dict[str, subprocess.Popen] = {}
        self.info: Optional[ClusterInfo] = None  # the leader the test talks to (rest(), run_job)
        self.taskmanagers: list[subprocess.Popen] = []

    def start_jobmanager(self) -> str:
        name = f"jobmanager-{len(self.jobmanagers)}"
        self.jobmanagers[name] = launch.spawn("cluster.jobmanager", name, self.cluster_dir)
        return name

    def start_taskmanager(self) -> subprocess.Popen:
        name = f"taskmanager-{len(self.taskmanagers)}"
        proc = launch.spawn("cluster.taskmanager", name, self.cluster_dir, "--jobmanager", "zk")
        self.taskmanagers.append(proc)
        return proc

    def leader(self, timeout: float = 60.0, not_pid: Optional[int] = None) -> ClusterInfo:
        """The leader's addresses once it published them (a leader other than ``not_pid``)."""
        deadline = time.monotonic() + timeout
        path = self.cluster_dir / "jobmanager.json"
        while True:
            if path.exists():
                try:
                    info = json.loads(path.read_text())
                    if info["pid"] != not_pid:
                        # the file's addresses, not ClusterInfo.load's: that asks the process's
                        # shared LeaderWatch, which may not have seen the new leader yet
                        return ClusterInfo.published(self.cluster_dir, info)
                except (ValueError, KeyError):
                    pass  # being replaced
            for name, proc in self.jobmanagers.items():
                # killed, or a leader that lost its session and stepped down, are what a test does
                if proc.poll() not in (None, -signal.SIGKILL, EXIT_LEADERSHIP_REVOKED):
                    raise RuntimeError(launch.exit_report(proc, self.cluster_dir, name))
            if time.monotonic() > deadline:
                raise TimeoutError(f"no new leader within {timeout:g} s")
            time.sleep(0.05)

    def standby_rest(self, name: str, timeout: float = 60.0) -> str:
        """The REST address a standby JobManager answers at for the leader (its standby file)."""
        proc = self.jobmanagers[name]
        path = self.cluster_dir / f"jobmanager-standby-{proc.pid}.json"
        deadline = time.monotonic() + timeout
        while not path.exists():
            if proc.poll() is not None:
                raise RuntimeError(launch.exit_report(proc, self.cluster_dir, name))
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} published no standby REST address within {timeout:g} s")
            time.sleep(0.05)
        return json.loads(path.read_text())["rest"]

    def process_of(self, pid: int) -> tuple[str, subprocess.Popen]:
        return next((n, p) for n, p in self.jobmanagers.items() if p.pid == pid)

    def stop(self) -> None:
        for proc in [*self.jobmanagers.values(), *self.taskmanagers]:
            if proc.poll() is None:
                proc.terminate()
        for proc in [*self.jobmanagers.values(), *self.taskmanagers]:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def log_tails(self, lines: int = 30) -> str:
        out = []
        for path in sorted((self.cluster_dir / "log").glob("*")):
            out += [f"--- {path.name}", *path.read_text(errors="replace").splitlines()[-lines:]]
        return "\n".join(out)
