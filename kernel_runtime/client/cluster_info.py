"""How a client reaches a running cluster (ClusterInfo), as its directory tells it.

A cluster lives in a directory (kernel_runtime.deploy.local starts one there): its config.yaml,
its secret, and jobmanager.json, the addresses the JobManager bound and its pid. Any process that
knows the directory reaches the cluster from them: a script, the CLI, a notebook, the lab's
server; of an HA cluster it asks ZooKeeper which JobManager leads (kernel_runtime.client.leader).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import psutil

from cluster.conf import Configuration
from cluster.ha.services import ha_enabled
from cluster.protocol.auth import load_secret, rest_token

from kernel_runtime.client.leader import LeaderWatch


def default_cluster_dir() -> Path:
    return Path(os.environ.get("STREAMLAB_CLUSTER_DIR") or Path.home() / ".streamlab" / "cluster")


class ClusterNotRunning(RuntimeError):
    pass


@dataclass(frozen=True)
class ClusterInfo:
    """How a client reaches a running cluster."""

    cluster_dir: Path
    rpc_address: str
    rest_address: str
    events_address: str  # where the JobManager publishes job events
    secret: bytes = field(repr=False)  # never in a printed cell output or a log line

    @classmethod
    def load(cls, cluster_dir: Optional[Path] = None) -> "ClusterInfo":
        cluster_dir = Path(cluster_dir or default_cluster_dir())
        if (cluster_dir / "config.yaml").exists():
            conf = Configuration.from_file(cluster_dir / "config.yaml")
            if ha_enabled(conf):
                return cls._of_leader(cluster_dir, conf)
        info_file = cluster_dir / "jobmanager.json"
        if not info_file.exists():
            raise ClusterNotRunning(f"no cluster is running in {cluster_dir} "
                                    "(start one with: streamlab cluster start)")
        info = json.loads(info_file.read_text())
        if not _alive(info.get("pid")):
            raise ClusterNotRunning(f"the JobManager of {cluster_dir} (pid {info.get('pid')}) is not running")
        return cls.published(cluster_dir, info)

    @classmethod
    def published(cls, cluster_dir: Path, info: dict) -> "ClusterInfo":
        """The JobManager whose addresses ``info`` are (what it wrote to jobmanager.json)."""
        return cls(cluster_dir, info["rpc"], info["rest"], info["events"], load_secret(cluster_dir / "secret"))

    @classmethod
    def _of_leader(cls, cluster_dir: Path, conf: Configuration, timeout: float = 10.0) -> "ClusterInfo":
        """The leader ZooKeeper names (it may be on another host: no pid to check here); a client
        made from it follows later leaders itself (kernel_runtime.client.leader)."""
        try:
            watch = LeaderWatch.of(conf)
        except ConnectionError as exc:
            raise ClusterNotRunning(f"cannot find the leading JobManager of {cluster_dir}: {exc}") from None
        assert watch is not None
        try:
            leader = watch.leader(timeout)
        except TimeoutError as exc:
            raise ClusterNotRunning(f"no JobManager of {cluster_dir} leads: {exc}") from None
        finally:
            watch.release()
        return cls(cluster_dir, "", "", "", load_secret(cluster_dir / "secret")).with_leader(leader)

    def with_leader(self, leader: dict) -> "ClusterInfo":
        """This cluster reached through another leading JobManager (its published addresses)."""
        return replace(self, rpc_address=leader["rpc"], rest_address=leader["rest"], events_address=leader["events"])

    def configuration(self) -> Configuration:
        """The cluster's configuration, as its JobManager read it (config.yaml of its directory)."""
        return Configuration.from_file(self.cluster_dir / "config.yaml")

    @property
    def rest_token(self) -> str:
        """The REST API's bearer token (derived from the secret, as the JobManager derives it)."""
        return rest_token(self.secret)

    @property
    def rest_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.rest_token}"}


def _alive(pid: Optional[int]) -> bool:
    """Whether the process that published jobmanager.json still runs (a zombie has exited, only
    not been reaped; a pid of another user's process counts as running). The deployment's
    kernel_runtime.deploy.processes asks the same of its processes: the client may not import it."""
    try:
        proc = psutil.Process(pid) if pid else None
        return proc is not None and proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
