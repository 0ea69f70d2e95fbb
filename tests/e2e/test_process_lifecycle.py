"""Nothing outlives its owner (cluster.common.lifecycle): an embedded cluster's processes, Spark
JVMs included, end with the script or kernel that started them however it ends; a TaskManager and
a JobManager stop on SIGTERM in every state, their signal handlers only noting the signal."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import psutil
import pytest

from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.deploy.local import PROJECT_ROOT
from tests.cluster_fixture import started_processes
from tests.conftest import start_cluster, wait_for
from tests.kernel_runtime.test_two_kernels import Kernel

GONE_S = 15       # what an owner's end leaves must be gone within this (the bound)
SIGTERM_S = 10    # a process must exit within this of its SIGTERM, in any state

SCRIPT = """
import pandas as pd
from kernel_runtime import StreamEnvironment
env = StreamEnvironment.get_execution_environment(parallelism=2)
(env.from_generator(lambda s: pd.DataFrame({"k": s % 5, "v": s}), rate=200)
    .sql("SELECT k, v FROM input WHERE v % 2 = 0").key_by("k").count().collect())
env.execute("owned by its script")
"""


def _running(proc: psutil.Process) -> bool:
    try:  # a zombie has ended: only its parent (init, for an orphan) has not reaped it yet
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cluster_below(root: psutil.Process) -> list[psutil.Process]:
    """The JobManager, TaskManagers and Spark JVMs started below ``root``, once there are a
    JobManager, TaskManagers and a JVM for each; else []."""
    try:
        found = [p for p in root.children(recursive=True) if _running(p)]
        lines = [" ".join(p.cmdline()) for p in found]
        names = [p.name() for p in found]
    except psutil.NoSuchProcess:
        return []  # one ended while looked at (a JVM's launcher script)
    taskmanagers = sum("cluster.taskmanager" in line for line in lines)
    enough = (sum("cluster.jobmanager" in line for line in lines) == 1 and taskmanagers >= 1
              and names.count("java") >= taskmanagers)
    return found if enough else []


def _cluster_dir(cluster: list[psutil.Process]) -> Path:
    """The cluster's directory, from its JobManager's command line."""
    jobmanager = next(p for p in cluster if "cluster.jobmanager" in " ".join(p.cmdline()))
    arguments = jobmanager.cmdline()
    return Path(arguments[arguments.index("--cluster-dir") + 1])


def _job_running(cluster: list[psutil.Process]) -> bool:
    from kernel_runtime.client.cluster_info import ClusterInfo
    directory = _cluster_dir(cluster)
    if not (directory / "jobmanager.json").exists():
        return False
    client = JobClient(ClusterInfo.load(directory), timeout=5)
    try:
        return any(job["state"] == "RUNNING" for job in client.list_jobs())
    finally:
        client.close()


def _assert_all_end(processes: list[psutil.Process], what: str) -> None:
    wait_for(lambda: not any(_running(p) for p in processes), GONE_S, what)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_scripts_embedded_cluster_ends_with_it(tmp_path, how):
    script = tmp_path / "owned.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        root = psutil.Process(proc.pid)
        cluster = wait_for(lambda: _cluster_below(root), 120, "the script's cluster with its Spark JVMs")
        wait_for(lambda: _job_running(cluster), 120, "the script's job running")
        proc.send_signal(how)
        proc.wait(30)
        _assert_all_end(cluster, f"every process of the script's cluster gone after its {how.name}")
    finally:
        proc.kill()


def test_a_killed_kernels_cluster_ends_with_it():
    kernel = Kernel(spark_startup="eager")  # JVMs below the TaskManagers, to see them end too
    try:
        kernel.client.wait_for_ready(timeout=60)
        kernel.execute("%load_ext kernel_runtime")  # starts the embedded cluster, on a thread of the kernel
        root = psutil.Process(kernel.evaluate("__import__('os').getpid()"))
        cluster = wait_for(lambda: _cluster_below(root), 120, "the kernel's cluster with its Spark JVMs")
        kernel.cluster_dir = _cluster_dir(cluster)  # Kernel.close stops what a failure leaves
        kernel.client.stop_channels()
        kernel.manager.shutdown_kernel(now=True)  # jupyter_client kills the kernel's process group
        _assert_all_end(cluster, "every process of the kernel's cluster gone after the kernel was killed")
    finally:
        kernel.close()


# ---------------------------------------------------------------------- SIGTERM in every state
RESTARTS = {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 100,
            "restart-strategy.fixed-delay.delay": "1 h"}


def _failing(df: pd.DataFrame) -> pd.DataFrame:
    raise ValueError("planned failure")


def _start_job(local, failing: bool = False):
    env = StreamEnvironment(parallelism=1, cluster=local.cluster_dir)
    stream = env.from_generator(lambda s: pd.DataFrame({"k": s % 3, "v": s}), rate=100)
    stream.map_batches(_failing if failing else (lambda df: df), name="step").collect()
    client = JobClient(local.info)
    handle = env.execute_async("lifecycle", client=client)
    if failing:
        wait_for(lambda: handle.status == "RESTARTING", 60, "the job restarting (for an hour)")
    else:
        wait_for(lambda: handle.row_count() > 0, 120, "the job's first rows")
    return client


def _sigterm_ends(proc: subprocess.Popen, what: str) -> None:
    below = [p for p in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(SIGTERM_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the {what} did not exit within {SIGTERM_S} s of its SIGTERM")
    assert code == 0, f"the {what} exited with {code}: not by its orderly stop"
    _assert_all_end(below, f"the {what}'s Spark JVM gone with it")


def _taskmanager_jvm(local) -> psutil.Process:
    return wait_for(lambda: next((p for p in psutil.Process(local.taskmanagers[0].pid).children()
                                  if p.name() == "java"), None), 120, "the TaskManager's Spark JVM")


@pytest.mark.parametrize("state", ["idle", "running", "restarting", "JVM gone", "JobManager gone"])
def test_a_taskmanager_exits_on_sigterm(tmp_path, state):
    local = start_cluster(tmp_path / "cluster", taskmanagers=1, slots=1, **RESTARTS)
    client = None
    try:
        if state in ("running", "restarting"):
            client = _start_job(local, failing=state == "restarting")
        elif state == "JVM gone":
            jvm = _taskmanager_jvm(local)
            jvm.kill()
            jvm.wait(30)
        elif state == "JobManager gone":
            local.jobmanager.kill()
            local.jobmanager.wait(30)
        _sigterm_ends(local.taskmanagers[0], f"TaskManager ({state})")
    finally:
        if client is not None:
            client.close()
        local.stop()


@pytest.mark.parametrize("state", ["idle", "running", "restarting"])
def test_a_jobmanager_exits_on_sigterm(tmp_path, state):
    local = start_cluster(tmp_path / "cluster", taskmanagers=1, slots=1, **RESTARTS)
    client = None
    try:
        if state != "idle":
            client = _start_job(local, failing=state == "restarting")
        _sigterm_ends(local.jobmanager, f"JobManager ({state})")
        # its TaskManager is the test's: it goes on, and ends with the cluster's stop below
    finally:
        if client is not None:
            client.close()
        local.stop()
        started = started_processes(local)
        _assert_all_end(started, "the cluster's processes gone after its stop")


def test_an_owned_process_whose_owner_ended_before_it_started_exits_at_once(tmp_path):
    """follow_owner's race: the owner may end between the spawn and the parent-death signal."""
    code = ("import os, sys; from cluster.common.lifecycle import follow_owner; "
            "follow_owner(os.getppid() + 1 if os.getppid() != 1 else 2, True)")
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(PROJECT_ROOT)))
    assert done.returncode == 1 and "ended before it started" in done.stderr
