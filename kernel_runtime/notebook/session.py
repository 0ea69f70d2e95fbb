"""The notebook's session: this kernel's clusters and a JobClient for each.

Without ``--cluster`` a cell runs on this kernel's embedded cluster, on free ports of 127.0.0.1,
stopped when the kernel exits (and by a watchdog process when the kernel is killed outright). It
starts in the background at ``%load_ext`` (its TaskManagers start their SparkSessions at once), so
the first cell finds it up and Spark warm or warming; a cell with ``--cluster`` attaches to a
running cluster by its directory or its JobManager's address.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

from cluster.conf import OPTIONS
from cluster.protocol.endpoint import RpcError

from kernel_runtime.client.cluster_info import ClusterInfo, ClusterNotRunning, default_cluster_dir
from kernel_runtime.client.job_client import JobClient
from kernel_runtime.deploy import processes
from kernel_runtime.deploy.local import LocalCluster
from kernel_runtime.export.magic_arguments import ClusterAddress
from kernel_runtime.notebook import lab_registry


class StreamSession:
    """This kernel's clusters: the embedded one (started at %load_ext or on first use, stopped at
    exit) and the running clusters cells attached to with --cluster, each with one JobClient.

    Called on the kernel's main thread (cells, %stream_cluster, atexit); only ``_start_quietly``
    runs on the thread that ``start_in_background`` begins, and ``start``/``stop`` wait for it."""

    def __init__(self, config: dict, taskmanagers: int, slots: int):
        self.config, self.taskmanagers, self.slots = config, taskmanagers, slots
        self.embedded: Optional[LocalCluster] = None
        self._clients: dict[str, JobClient] = {}  # cluster directory -> client
        self.current: Optional[ClusterInfo] = None  # the cluster of the latest cell
        self._starting: Optional[threading.Thread] = None  # the start begun at %load_ext
        self._pending: Optional[LocalCluster] = None  # the cluster that thread is starting
        self.untouched = False  # started (or starting) in the background, and no cell has used it yet
        atexit.register(self.stop)

    # ------------------------------------------------------------------ the embedded cluster
    def start_in_background(self) -> None:
        """Start the embedded cluster without waiting (at %load_ext): a JobManager and
        TaskManagers take seconds to start, their SparkSessions tens of seconds, all of which the
        user would otherwise wait for at the first cell. ``start()`` waits for it."""
        if self.embedded is not None or self._starting is not None:
            return
        self.untouched = True
        self._starting = threading.Thread(target=self._start_quietly, name="streamlab-cluster-start", daemon=True)
        self._starting.start()

    def _start_quietly(self) -> None:
        try:
            self._start(self.taskmanagers, self.slots)
        except BaseException:
            pass  # start() starts it again in the foreground, where its error reaches the user

    def wait_for_background_start(self, timeout: Optional[float] = None) -> None:
        starting = self._starting
        if starting is not None:
            starting.join(timeout)
            if not starting.is_alive():
                self._starting = None

    def wait_for_spark(self, poll_s: float = 0.5) -> None:
        """Until every TaskManager of the embedded cluster has started its SparkSession (or failed
        to, or does not start one yet), or no cluster is up. Not on the kernel's main thread: the
        SQL planner's warm-up waits on it, so that its JVM does not slow theirs."""
        starting = self._starting
        if starting is not None:
            starting.join()
        cluster = self.embedded
        if cluster is None:
            return
        client = JobClient(cluster.info)
        try:
            while True:
                taskmanagers = client.cluster_overview().taskmanagers
                if (len(taskmanagers) >= cluster.num_taskmanagers
                        and not any(t.get("spark") in ("queued", "starting") for t in taskmanagers)):
                    return
                time.sleep(poll_s)
        except (RpcError, ClusterNotRunning, TimeoutError, OSError):
            return  # stopped meanwhile
        finally:
            client.close()

    def start(self, taskmanagers: Optional[int] = None, slots: Optional[int] = None) -> LocalCluster:
        if self.untouched and ((taskmanagers or self.taskmanagers, slots or self.slots)
                               != (self.taskmanagers, self.slots)):
            # %stream_cluster start of another size, before any job ran on it: end the start begun
            # at %load_ext now, rather than wait for its TaskManagers (and their JVMs) to come up
            self.stop()
        self.wait_for_background_start()
        self.untouched = False
        return self._start(taskmanagers, slots)

    def _start(self, taskmanagers: Optional[int], slots: Optional[int]) -> LocalCluster:
        if self.embedded is not None:
            jobmanager = self.embedded.jobmanager
            if jobmanager is not None and jobmanager.poll() is None:
                return self.embedded
            self.stop()  # its JobManager died (killed, out of memory): start a new cluster
        directory = Path(tempfile.mkdtemp(prefix="streamlab-notebook-"))
        cluster = LocalCluster(directory, taskmanagers=taskmanagers or self.taskmanagers,
                               slots=slots or self.slots, config=self.config, embedded=True)
        self._pending = cluster
        try:
            cluster.start()
        except BaseException:
            cluster.stop(timeout=4)
            shutil.rmtree(directory, ignore_errors=True)
            raise
        finally:
            self._pending = None
        _start_watchdog(directory)
        self.embedded = cluster
        lab_registry.register(directory)  # the lab's Streams panel shows it from now on
        return cluster

    def stop(self) -> bool:
        """Stop the embedded cluster (quickly: a kernel restart waits for this)."""
        if self._starting is not None:  # still starting in the background: end that start
            pending = self._pending
            if pending is not None:
                pending.stop(timeout=4)  # its start() fails on this, at once
            self.wait_for_background_start(timeout=30)
        self.untouched = False
        cluster, self.embedded = self.embedded, None
        if cluster is None:
            return False
        client = self._clients.pop(str(cluster.cluster_dir), None)
        if client is not None:
            client.close()
        if self.current is not None and self.current.cluster_dir == cluster.cluster_dir:
            self.current = None
        lab_registry.unregister(cluster.cluster_dir)
        cluster.stop(timeout=4)
        shutil.rmtree(cluster.cluster_dir, ignore_errors=True)
        return True

    # ------------------------------------------------------------------ clients
    def client(self, address: Optional[str] = None) -> JobClient:
        info = self._resolve(address) if address else self.start().info
        client = self._clients.get(str(info.cluster_dir))
        if client is None or client.cluster != info:  # a restarted cluster has new ports and secret
            if client is not None:
                client.close()
            client = self._clients[str(info.cluster_dir)] = JobClient(info)
        self.current = info
        lab_registry.register(info.cluster_dir)
        return client

    def _resolve(self, address: str) -> ClusterInfo:
        where = ClusterAddress.parse(address)
        if where.directory is not None:
            return ClusterInfo.load(Path(where.directory).expanduser())
        rpc_address = where.rpc_address
        if rpc_address is None:
            raise ValueError(f"cluster address {address!r} names neither a directory nor a host:port")
        # Messages are signed with the cluster's secret, which lives in its directory: find the
        # directory of the cluster that listens there.
        known = [default_cluster_dir()] + ([self.embedded.cluster_dir] if self.embedded else [])
        for directory in known:
            try:
                info = ClusterInfo.load(directory)
            except ClusterNotRunning:
                continue
            if _same_address(info.rpc_address, rpc_address):
                return info
        raise ClusterNotRunning(
            f"no running cluster known at {where.rpc_address} (looked in {', '.join(map(str, known))}); "
            "a client needs the cluster's secret, which is in its directory: use --cluster DIR")


def _start_watchdog(directory: Path) -> None:
    # A kernel killed outright (SIGKILL, out of memory) runs no atexit handler, and the cluster's
    # processes live in sessions of their own: this small process stops them when the kernel is gone.
    subprocess.Popen([sys.executable, "-I", processes.__file__, str(os.getpid()), str(directory)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)


def _same_address(a: str, b: str) -> bool:
    def norm(addr: str) -> str:
        return addr.replace("tcp://", "").replace("localhost:", "127.0.0.1:")
    return norm(a) == norm(b)


def default_cluster_config() -> dict:
    """The embedded cluster's defaults: metrics reported more often than on a production
    cluster, so the dashboard moves smoothly. Spark starts with each TaskManager, as on any
    cluster (taskmanager.spark.startup: eager): a notebook that runs Spark finds it warm, and
    one that never does pays a JVM per TaskManager, started one after the other, in the background
    (``%config StreamMagics.cluster_config = {"taskmanager.spark.startup": "lazy"}`` saves it)."""
    wanted = {"heartbeat.interval": "500 ms", "metrics.fetcher.update-interval": "500 ms"}
    return {k: v for k, v in wanted.items() if k in OPTIONS}
