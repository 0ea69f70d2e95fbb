"""A cluster of its own for one test, in one line, checked after it (dask's ``gen_cluster``).

    @pytest.mark.cluster(taskmanagers=3, slots=2, expect_errors=("PlannedFailure",),
                         **{"taskmanager.spark.startup": "lazy"})
    def test_something(own_cluster): ...

``own_cluster`` is a fresh LocalCluster of that shape (defaults: 2 TaskManagers x 2 slots, the
suite's fast heartbeats, tests.conftest.start_cluster) in the test's tmp_path. After the test it
checks, then stops the cluster and checks again:

* at rest: every slot free and no job running (REST /overview, as ``assert_at_rest``);
* no process left: every JobManager and TaskManager the cluster started (replacements too) and
  every process below them (a TaskManager's Spark JVM) has ended once the cluster is stopped;
* no thread left in the test process: every thread the test's body started has ended (a
  JobClient or a job watch not closed keeps one);
* no error in any log: no ERROR or CRITICAL record and no traceback in the cluster's logs
  (``log/*.log*``, ``log/*.out``) but those containing one of ``expect_errors``; and each of those
  is found at least once (a planned failure that did not happen fails the test too).

A test that fails is not checked further (its own failure is the news), only stopped.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import psutil
import pytest

from kernel_runtime import LocalCluster
from tests.conftest import assert_at_rest, start_cluster
from tests.hangs import command_line

# how long what ends by itself after a test (a client's threads, a stopped cluster's processes)
# may take: a deadline on a condition, waited on only when something is left
SETTLE_S = 15.0

# a record of a cluster process's log (cluster.common.process_logging.FORMAT) starts with its time and level
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ([A-Z]+) ", re.M)
_BAD_LEVELS = ("ERROR", "CRITICAL")
_TRACEBACK = "Traceback (most recent call last)"
# a line of a process's stdout/stderr (.out) that tells of an error: Python's, or a JVM's log4j
_OUT_ERROR = re.compile(r"Traceback \(most recent call last\)|Fatal Python error|^\S.*\b(ERROR|FATAL)\b|"
                        r"^Exception in thread", re.M)


@dataclass
class ClusterShape:
    taskmanagers: int = 2
    slots: int = 2
    expect_errors: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)


def _shape(taskmanagers: int = 2, slots: int = 2, expect_errors: tuple[str, ...] | str = (),
           config: Optional[dict] = None, **keys: Any) -> ClusterShape:
    """The marker's arguments: configuration keys as ``config={...}`` or ``**{"key": value}``."""
    expected = (expect_errors,) if isinstance(expect_errors, str) else tuple(expect_errors)
    return ClusterShape(taskmanagers, slots, expected, dict(config or {}) | keys)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cluster(taskmanagers=2, slots=2, expect_errors=(), config=None, **keys): the shape of "
                   "the test's own_cluster (tests/cluster_fixture.py), checked after the test")


THREADS_AT_CALL = pytest.StashKey[set]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    # the threads when the test's body starts, every fixture set up: those the body starts must end
    if "own_cluster" in getattr(item, "fixturenames", ()):
        item.stash[THREADS_AT_CALL] = set(threading.enumerate())
    return (yield)


@pytest.fixture
def own_cluster(request, tmp_path):
    marker = request.node.get_closest_marker("cluster")
    shape = _shape(*marker.args, **marker.kwargs) if marker else ClusterShape()
    local = start_cluster(tmp_path / "cluster", taskmanagers=shape.taskmanagers, slots=shape.slots, **shape.config)
    try:
        yield local
    finally:
        rep = getattr(request.node, "rep_call", None)  # kept by tests/conftest.py's makereport
        if rep is None or rep.failed:  # failed, or never ran (a fixture after this one failed)
            local.stop()
        else:
            check_cluster(local, shape.expect_errors, request.node.stash.get(THREADS_AT_CALL, set()))


def check_cluster(local: LocalCluster, expect_errors: tuple[str, ...], threads_before: set[threading.Thread]) -> None:
    """The invariants of a test's cluster once the test is done; stops the cluster in any case."""
    problems: list[str] = []
    started = started_processes(local)
    try:
        assert_at_rest(local)
    except AssertionError as exc:
        problems.append(f"the cluster is not at rest after the test: {exc}")
    finally:
        local.stop()
    if left := _left_after_settling(lambda: [p for p in started if _running(p)]):
        problems.append("processes of the cluster left running after it stopped: " +
                        ", ".join(f"{p.pid} ({command_line(p, 160)})" for p in left))
    if leaked := _left_after_settling(
            lambda: [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]):
        problems.append("threads started by the test still running: " + ", ".join(t.name for t in leaked))
    problems += log_problems(local.cluster_dir / "log", expect_errors)
    if problems:
        pytest.fail("the test's cluster was left in a bad state:\n* " + "\n* ".join(problems), pytrace=False)


def started_processes(local: LocalCluster) -> list[psutil.Process]:
    """Every process the cluster started (replacements of lost ones too) and, of those still
    running, every process below them."""
    pids = [p.pid for p in [*local.jobmanagers, *local.taskmanagers]]
    if local.zookeeper is not None and local.zookeeper.proc is not None:
        pids.append(local.zookeeper.proc.pid)
    found: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            found[pid] = proc
            for child in proc.children(recursive=True):
                found[child.pid] = child
        except psutil.NoSuchProcess:
            pass
    return list(found.values())


def _running(proc: psutil.Process) -> bool:
    try:  # is_running() tells a reused pid apart; a zombie has ended, only not been reaped
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _left_after_settling(left: Callable[[], list]) -> list:
    """What ``left()`` still names once it is empty or SETTLE_S has passed."""
    deadline = time.monotonic() + SETTLE_S
    while (now := left()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


def log_problems(folder: Path, expect_errors: tuple[str, ...]) -> list[str]:
    """The errors in a cluster's logs that are not expected, and the expected ones never seen."""
    problems, seen = [], set()
    for path in sorted(folder.iterdir()) if folder.exists() else []:
        if ".log" not in path.name and path.suffix != ".out":
            continue
        for chunk in _error_chunks(path):
            matched = [e for e in expect_errors if e in chunk]
            seen.update(matched)
            if not matched:
                problems.append(f"{path.name}: {chunk.strip()[:1500]}")
    problems += [f"the expected error {e!r} is in no log of the cluster" for e in expect_errors if e not in seen]
    return problems


def _error_chunks(path: Path) -> list[str]:
    text = path.read_text(errors="replace")
    if path.suffix == ".out":  # no records: each error line and the 30 after it (a traceback)
        lines = text.splitlines()
        return ["\n".join(lines[i:i + 30]) for i, line in enumerate(lines) if _OUT_ERROR.search(line)]
    starts = [m.start() for m in _RECORD.finditer(text)]
    records = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)])]
    if starts and starts[0] > 0:
        records.insert(0, text[:starts[0]])
    return [r for r in records if (m := _RECORD.match(r)) and m.group(1) in _BAD_LEVELS or _TRACEBACK in r]
