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
from typing import Callable, Iterable, Optional

import psutil

# {"jobmanager": pid, "jobmanagers": [pid, ...], "taskmanagers": [pid, ...], "zookeeper": pid}:
# "jobmanager" is the first of "jobmanagers" (the leader at start; the only one without HA), kept
# for readers of the one-JobManager layout; "zookeeper" is the process group of a ZooKeeper the
# cluster started itself (``streamlab cluster start --ha`` without a configured quorum)
PIDS_FILE = "cluster.json"
ZOOKEEPER_CONFIG = os.path.join("zookeeper", "zoo.cfg")  # under the cluster directory


def _listed(cluster_dir: str | os.PathLike) -> dict:
    """The pids file, with every key present (an older file has no "jobmanagers")."""
    try:
        with open(os.path.join(cluster_dir, PIDS_FILE)) as f:
            pids = json.load(f)
    except FileNotFoundError:
        pids = {}
    jobmanagers = pids.get("jobmanagers") or [p for p in [pids.get("jobmanager")] if p]
    return {"jobmanager": jobmanagers[0] if jobmanagers else None, "jobmanagers": jobmanagers,
            "taskmanagers": pids.get("taskmanagers") or [], "zookeeper": pids.get("zookeeper")}


def _unique(pids: Iterable[Optional[int]]) -> list[int]:
    return list(dict.fromkeys(p for p in pids if p))


def cluster_pids(cluster_dir: str | os.PathLike) -> list[int]:
    """The pids a cluster directory lists (none if it lists none), its ZooKeeper last."""
    return _all_pids(_listed(cluster_dir))


def _all_pids(pids: dict) -> list[int]:
    return _unique([*pids.get("jobmanagers", []), *pids.get("taskmanagers", []), pids.get("zookeeper")])


CLUSTER_MODULES = ("cluster.jobmanager", "cluster.taskmanager")
ROLES = {"jobmanager": "jobmanagers", "jobmanagers": "jobmanagers", "taskmanagers": "taskmanagers",
         "zookeeper": "zookeeper"}


def _of_cluster_dir(proc: psutil.Process, cluster_dir: str | os.PathLike) -> bool:
    """Whether ``proc`` is a JobManager or TaskManager of ``cluster_dir``, by its command line
    (``python -m cluster.<x> --cluster-dir DIR ...``), or its own ZooKeeper (a java whose last
    argument is ``DIR/zookeeper/zoo.cfg``), run by this user."""
    try:
        if proc.uids().real != os.getuid():
            return False
        argv = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    if argv and os.path.basename(argv[-1]) == "zoo.cfg":
        return os.path.realpath(argv[-1]) == os.path.realpath(os.path.join(cluster_dir, ZOOKEEPER_CONFIG))
    pairs = dict(zip(argv, argv[1:]))
    directory = pairs.get("--cluster-dir")
    return pairs.get("-m") in CLUSTER_MODULES and directory is not None \
        and os.path.realpath(directory) == os.path.realpath(cluster_dir)


def stale_processes(cluster_dir: str | os.PathLike, role: Optional[str] = None) -> list[psutil.Process]:
    """The live processes of a cluster directory's pids file (all, or one role's: "jobmanager"
    (every JobManager, leader and standbys), "taskmanagers", "zookeeper") that really are that
    cluster's (a pid the system gave to another program since is left alone). A JobManager killed
    with SIGKILL leaves its TaskManagers listed here."""
    if role is None:
        pids = cluster_pids(cluster_dir)
    else:
        listed = _listed(cluster_dir)[ROLES[role]]
        pids = [listed] if isinstance(listed, int) else listed or []
    return [p for p in _processes(pids) if _running(p) and _of_cluster_dir(p, cluster_dir)]


def record_pids(cluster_dir: str | os.PathLike, add_jobmanagers: Iterable[int] = (),
                add_taskmanagers: Iterable[int] = (), keep_taskmanagers: bool = True,
                keep_jobmanagers: bool = True, drop: Iterable[int] = ()) -> None:
    """Update the pids file of a cluster assembled process by process (``streamlab jobmanager|
    taskmanager start``): each start adds its pid, each stop removes its role's (``drop``: the pids
    of a start that failed). The file is removed once it lists none. Under a lock: two starts in
    one directory may run at once."""
    import fcntl
    with open(os.path.join(cluster_dir, PIDS_FILE + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        pids = _listed(cluster_dir)
        dropped = set(drop)
        pids["jobmanagers"] = [p for p in _unique([*(pids["jobmanagers"] if keep_jobmanagers else []),
                                                   *add_jobmanagers]) if p not in dropped]
        pids["jobmanager"] = pids["jobmanagers"][0] if pids["jobmanagers"] else None
        pids["taskmanagers"] = [p for p in [*(pids["taskmanagers"] if keep_taskmanagers else []), *add_taskmanagers]
                                if p not in dropped]
        if not pids["zookeeper"]:
            del pids["zookeeper"]
        if _all_pids(pids):
            write_pids(cluster_dir, pids)
        else:
            _unlink(os.path.join(cluster_dir, PIDS_FILE))


def write_pids(cluster_dir: str | os.PathLike, pids: dict) -> None:
    """Replace the pids file at once: a reader (a watchdog, a stop) never sees half of it."""
    path = os.path.join(cluster_dir, PIDS_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(pids, f)
    os.replace(path + ".tmp", path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


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


def _published_leader(cluster_dir: str | os.PathLike) -> Optional[int]:
    """The pid in jobmanager.json: the JobManager that leads (or last led)."""
    try:
        with open(os.path.join(cluster_dir, "jobmanager.json")) as f:
            return json.load(f).get("pid")
    except (FileNotFoundError, ValueError):
        return None


def _group_of(pgid: Optional[int], cluster_dir: str | os.PathLike) -> list[int]:
    """The processes of ``pgid``'s group when its leader is this cluster's ZooKeeper (never the
    group of a program that got the pid since)."""
    leader = _processes([pgid])
    if not (leader and _running(leader[0]) and _of_cluster_dir(leader[0], cluster_dir)):
        return []
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
        except OSError:
            pass
    return members


def stop_cluster_processes(cluster_dir: str | os.PathLike, grace: float = 0.0, timeout: float = 2.0,
                           shutdown: Callable[[], None] = lambda: None) -> bool:
    """Stop every process a cluster directory lists, in the order an HA cluster needs: the standby
    JobManagers first (one left running would win the election and recover the jobs this stop
    ends), then ``shutdown()`` (the leader asked to end the cluster), the leader and the
    TaskManagers (given ``grace`` seconds to exit by themselves), and the cluster's own ZooKeeper
    last (until then the JobManagers reach it). True when all are gone."""
    pids = _listed(cluster_dir)
    leader = _published_leader(cluster_dir)
    standbys = [p for p in pids["jobmanagers"] if p != leader]
    gone = stop(standbys, timeout=timeout)
    shutdown()
    leader_and_taskmanagers = [leader] if leader in pids["jobmanagers"] else []
    gone = stop([*leader_and_taskmanagers, *pids["taskmanagers"]], grace, timeout) and gone
    return stop(_group_of(pids["zookeeper"], cluster_dir), timeout=timeout) and gone


def watch(parent_pid: int, cluster_dir: str) -> None:
    """Once ``parent_pid`` is gone, stop the cluster of ``cluster_dir`` (unless it was stopped
    first: its pids file is gone) and remove the directory, unless its owner removed it first.
    The owner may die between the two steps of its own stop (the pids file removed, the directory
    not yet): a kernel that takes too long to exit is killed by Jupyter."""
    parent = _processes([parent_pid])
    pids_file = os.path.join(cluster_dir, PIDS_FILE)
    while any(_running(p) for p in parent) and os.path.isdir(cluster_dir):
        time.sleep(1)
    if os.path.exists(pids_file):
        stop_cluster_processes(cluster_dir, timeout=3)
    shutil.rmtree(cluster_dir, ignore_errors=True)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2])
