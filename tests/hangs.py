"""A hung test names itself, fails alone, and leaves nothing running.

pytest-timeout's ``thread`` method ends the whole process at the first test past its timeout: no
later test runs, no summary is printed, and the clusters, ZooKeeper and Spark JVMs the run started
are left behind. This plugin takes over pytest-timeout's timer (its ``pytest_timeout_set_timer``
hook) so that a timeout

* raises in the test's main thread (``SIGALRM``) with the stacks of every thread of the test
  process and of every process below it (Python ones through ``py-spy dump``, JVMs through
  ``jstack``) in the test's report: the test fails, its teardown runs, and the run goes on;
* ends, after the test's teardown, every process started since the timed-out phase began (a
  session fixture's processes, started before, are left to their fixture);
* has a backstop for a test the signal cannot reach (stuck in C code that never returns to the
  interpreter, or a teardown that hangs after the alarm was spent): ``BACKSTOP_S`` later a thread
  prints the same stacks on the process's own stderr, ends every process below the test process
  and exits, as pytest-timeout's thread method would, so CI names the test instead of running into
  its own limit (under pytest-xdist the controller reports the worker's crash and the test).
"""
from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import threading
from typing import Iterable, Optional

import psutil
import pytest
from pytest_timeout import timeout_sigalrm

BACKSTOP_S = 90.0  # after the timeout: time for the alarm's failure and the teardown to finish
TOOL_TIMEOUT_S = 20.0  # one py-spy/jstack dump: a busy machine can take seconds to attach
TIMED_OUT = pytest.StashKey[str]()  # the phase ("setup", "call", "teardown") the alarm went off in
BEFORE = pytest.StashKey[dict[str, set[int]]]()  # descendant pids at the start of each phase
SECTIONS = pytest.StashKey[list[tuple[str, str]]]()  # what the timeout adds to the test's report


def descendants() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _pids() -> set[int]:
    return {p.pid for p in descendants()}


def command_line(proc: psutil.Process, limit: int = 300) -> str:
    try:
        return " ".join(proc.cmdline())[:limit]
    except psutil.Error:
        return "?"


def _dump_command(proc: psutil.Process) -> Optional[list[str]]:
    try:
        name = os.path.basename(proc.exe())
    except psutil.Error:
        return None
    if name.startswith("python"):
        tool = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        return [tool, "dump", "--pid", str(proc.pid)] if os.path.exists(tool) else None
    if name == "java" and shutil.which("jstack"):
        return ["jstack", str(proc.pid)]
    return None


def process_stacks(procs: Iterable[psutil.Process], max_lines: int = 200) -> str:
    """The stacks of ``procs``, each headed by its pid and command line."""
    parts = []
    for proc in procs:
        command = _dump_command(proc)
        head = f"--- pid {proc.pid}: {command_line(proc)}"
        if command is None:
            parts.append(f"{head}\n(no stack dumper for this process)")
            continue
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
            lines = (out.stdout + out.stderr).splitlines()
        except (OSError, subprocess.TimeoutExpired) as exc:
            lines = [f"({command[0]} failed: {exc})"]
        if len(lines) > max_lines:
            lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more lines)"]
        parts.append("\n".join([head, *lines]))
    return "\n".join(parts)


def end_processes(procs: Iterable[psutil.Process]) -> list[str]:
    """SIGKILL ``procs`` and what runs below them; returns their command lines."""
    ended: dict[int, str] = {}
    for proc in procs:
        try:
            family = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            continue
        for member in family:
            if member.pid in ended:
                continue
            try:
                ended[member.pid] = f"{member.pid}: {command_line(member)}"
                member.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(family, timeout=5)
    return list(ended.values())


def _to_stderr(item: pytest.Item, *parts: str) -> None:
    """On the process's own stderr, past pytest's capture (as pytest-timeout's thread method
    writes): what a backstop prints before it exits would be lost in a capture file, and a
    pytest-xdist worker's stdout is its channel to the controller."""
    capman = item.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        capman.suspend_global_capture(in_=True)
    for part in parts:
        sys.stderr.write(part + "\n")
    sys.stderr.flush()


def _phase(item: pytest.Item) -> str:
    return max(item.stash.get(BEFORE, {"setup": set()}), key=["setup", "call", "teardown"].index)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings) -> Optional[bool]:
    if threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own thread method
    item.stash[BEFORE] = {"setup": _pids()}

    def alarm(signum, frame):
        __tracebackhide__ = True
        item.stash[TIMED_OUT] = _phase(item)
        item.stash[SECTIONS] = [("stacks of the processes below the test", process_stacks(descendants()))]
        timeout_sigalrm(item, settings)  # the test process's threads (captured output), then pytest.fail

    def backstop():
        _to_stderr(item, f"+++ Timeout backstop: {item.nodeid} did not end {BACKSTOP_S:.0f} s after its "
                         f"{settings.timeout} s timeout; ending the run. Its threads:")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        below = descendants()
        _to_stderr(item, "+++ stacks of the processes below the test", process_stacks(below),
                   "+++ ended", *end_processes(below))
        os._exit(1)

    guard = threading.Timer(settings.timeout + BACKSTOP_S, backstop)
    guard.daemon = True
    guard.name = f"hang backstop {item.nodeid}"

    def cancel():
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        guard.cancel()

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # pytest-timeout calls it
    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    guard.start()
    return True


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item):
    if BEFORE in item.stash:
        item.stash[BEFORE]["call"] = _pids()
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    if BEFORE in item.stash:
        item.stash[BEFORE]["teardown"] = _pids()
    try:
        return (yield)
    finally:
        phase = item.stash.get(TIMED_OUT, None)
        if phase is not None:
            # what the timed-out phase started and its teardown did not end
            kept = item.stash[BEFORE][phase]
            left = [p for p in descendants() if p.pid not in kept]
            ended = end_processes(left)
            if ended:  # a warning: the warnings summary shows it, under pytest-xdist too
                item.warn(pytest.PytestWarning("ended what the timed-out test left running:\n" + "\n".join(ended)))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    # in the report, not on the terminal: a pytest-xdist worker's terminal is nobody's
    rep = yield
    if rep.when == item.stash.get(TIMED_OUT, None):
        rep.sections.extend(item.stash.get(SECTIONS, []))
    return rep
