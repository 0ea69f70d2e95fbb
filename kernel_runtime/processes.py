"""Whether a cluster's processes live, and stopping them, on psutil.

Standard library and psutil only: a notebook kernel's watchdog runs this file as a script
(``python -I processes.py KERNEL_PID CLUSTER_DIR``), which costs a few MB rather than a second
copy of the kernel's imports. A cluster directory names its processes in ``cluster.json``.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import Iterable, Optional

import psutil

PIDS_FILE = "cluster.json"  # {"jobmanager": pid, "taskmanagers": [pid, ...]}


def cluster_pids(cluster_dir: str | os.PathLike) -> list[int]:
    """The pids a cluster directory lists (none if it lists none)."""
    try:
        with open(os.path.join(cluster_dir, PIDS_FILE)) as f:
            pids = json.load(f)
    except FileNotFoundError:
        return []
    return [pids["jobmanager"], *pids["taskmanagers"]]  # a TaskManager-only directory lists jobmanager: null


CLUSTER_MODULES = ("cluster.jobmanager", "cluster.taskmanager")


def _of_cluster_dir(proc: psutil.Process, cluster_dir: str | os.PathLike) -> bool:
    """Whether ``proc`` is a JobManager or TaskManager of ``cluster_dir``, by its command line
    (``python -m cluster.<x> --cluster-dir DIR ...``), run by this user."""
    try:
        if proc.uids().real != os.getuid():
            return False
        argv = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    pairs = dict(zip(argv, argv[1:]))
    directory = pairs.get("--cluster-dir")
    return pairs.get("-m") in CLUSTER_MODULES and directory is not None \
        and os.path.realpath(directory) == os.path.realpath(cluster_dir)


def stale_processes(cluster_dir: str | os.PathLike, role: Optional[str] = None) -> list[psutil.Process]:
    """The live processes of a cluster directory's pids file (all, or one role's: "jobmanager",
    "taskmanagers") that really are that cluster's (a pid the system gave to another program since
    is left alone). A JobManager killed with SIGKILL leaves its TaskManagers listed here."""
    pids = cluster_pids(cluster_dir) if role is None else _listed(cluster_dir).get(role) or []
    pids = [pids] if isinstance(pids, int) else pids
    return [p for p in _processes(pids) if _running(p) and _of_cluster_dir(p, cluster_dir)]


def _listed(cluster_dir: str | os.PathLike) -> dict:
    try:
        with open(os.path.join(cluster_dir, PIDS_FILE)) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"jobmanager": None, "taskmanagers": []}


def record_pids(cluster_dir: str | os.PathLike, jobmanager: Optional[int] = None,
                add_taskmanagers: Iterable[int] = (), keep_taskmanagers: bool = True,
                keep_jobmanager: bool = True) -> None:
    """Update the pids file of a cluster assembled process by process (``streamlab jobmanager|
    taskmanager start``): each start adds its pid, each stop removes its role's. The file is
    removed once it lists none. Under a lock: two starts in one directory may run at once."""
    import fcntl
    with open(os.path.join(cluster_dir, PIDS_FILE + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        pids = _listed(cluster_dir)
        pids["jobmanager"] = jobmanager or (pids.get("jobmanager") if keep_jobmanager else None)
        pids["taskmanagers"] = [*(pids.get("taskmanagers") or [] if keep_taskmanagers else []), *add_taskmanagers]
        path = os.path.join(cluster_dir, PIDS_FILE)
        if pids["jobmanager"] or pids["taskmanagers"]:
            with open(path + ".tmp", "w") as f:
                json.dump(pids, f)
            os.replace(path + ".tmp", path)
        elif os.path.exists(path):
            os.unlink(path)


def _running(proc: psutil.Process) -> bool:
    try:  # is_running() also tells a reused pid apart; a zombie has exited, only not been reaped
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _processes(pids: Iterable[Optional[int]]) -> list[psutil.Process]:
    procs = []
    for pid in pids:
        try:
            if pid:
                procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return procs


def alive(pid: Optional[int]) -> bool:
    return any(_running(p) for p in _processes([pid]))


def _wait(procs: list[psutil.Process], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(_running(p) for p in procs):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def stop(pids: Iterable[Optional[int]], grace: float = 0.0, timeout: float = 2.0) -> bool:
    """Give the processes ``grace`` seconds to exit by themselves, then SIGTERM the ones left,
    then SIGKILL, waiting up to ``timeout`` seconds after each. True when all are gone."""
    procs = _processes(pids)
    if _wait(procs, grace):
        return True
    for send in (psutil.Process.terminate, psutil.Process.kill):
        for proc in procs:
            if _running(proc):
                try:
                    send(proc)
                except psutil.NoSuchProcess:
                    pass
        if _wait(procs, timeout):
            return True
    return False


def watch(parent_pid: int, cluster_dir: str) -> None:
    """Stop the cluster of ``cluster_dir`` and remove the directory once ``parent_pid`` is gone,
    unless the cluster was stopped first (its pids file is gone)."""
    parent = _processes([parent_pid])
    pids_file = os.path.join(cluster_dir, PIDS_FILE)
    while any(_running(p) for p in parent) and os.path.exists(pids_file):
        time.sleep(1)
    if os.path.exists(pids_file):
        stop(cluster_pids(cluster_dir), timeout=3)
        shutil.rmtree(cluster_dir, ignore_errors=True)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2])
