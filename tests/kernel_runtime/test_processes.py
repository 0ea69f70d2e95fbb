"""Process liveness and stopping (kernel_runtime.deploy.processes), with real processes."""
import json
import subprocess
import sys
import time

import psutil

from kernel_runtime.deploy import processes

from ..conftest import wait_for

IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


def sleeper(code: str = "import time; time.sleep(60)") -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    if "ready" in code:
        proc.stdout.readline()  # its handler is installed
    return proc


def test_a_zombie_is_not_alive():
    proc = sleeper("pass")
    deadline = time.monotonic() + 10
    while processes.alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not processes.alive(proc.pid)
    assert proc.poll() == 0  # it was a zombie until now: exited, not reaped
    assert not processes.alive(proc.pid) and not processes.alive(None)


def test_stop_terminates_then_kills_what_ignores_sigterm():
    polite, stubborn = sleeper(), sleeper(IGNORES_SIGTERM)
    assert processes.alive(polite.pid) and processes.alive(stubborn.pid)
    assert processes.stop([polite.pid, stubborn.pid], timeout=1)
    assert polite.wait(5) == -15 and stubborn.wait(5) == -9


def wait_for_checks(watchdog: subprocess.Popen, checks: int) -> None:
    """Until the watchdog has looked at its kernel ``checks`` more times. Between two of its 1 s
    sleeps it reads /proc (psutil): a count of read calls that grew from one sleep to the next
    is one more check done."""
    seen: list[int] = []

    def checked() -> bool:
        assert watchdog.poll() is None, "the watchdog ended while its kernel lives"
        sleeping = "nanosleep" in open(f"/proc/{watchdog.pid}/wchan").read()
        reads = psutil.Process(watchdog.pid).io_counters().read_count
        if sleeping and (not seen or reads > seen[-1]):
            seen.append(reads)
        return len(seen) > checks
    wait_for(checked, 30, f"{checks} checks of the watchdog")


def test_the_watchdog_stops_a_cluster_whose_kernel_is_gone(tmp_path):
    kernel, member = sleeper(), sleeper()
    (tmp_path / processes.PIDS_FILE).write_text(json.dumps({"jobmanager": member.pid, "taskmanagers": []}))
    watchdog = subprocess.Popen([sys.executable, "-I", processes.__file__, str(kernel.pid), str(tmp_path)])
    try:
        wait_for_checks(watchdog, 2)
        assert processes.alive(member.pid) and tmp_path.exists()  # the kernel lives: nothing happens
        assert watchdog.poll() is None
        kernel.kill()
        kernel.wait()
        assert watchdog.wait(15) == 0
        assert member.wait(5) == -15 and not tmp_path.exists()
    finally:
        for proc in (kernel, member, watchdog):
            proc.kill()


def test_the_watchdog_removes_the_directory_of_a_cluster_its_kernel_stopped_but_did_not_remove(tmp_path):
    # Jupyter kills a kernel slow to exit: it may die between its stop's two steps
    kernel = sleeper()
    (tmp_path / "log").mkdir()
    watchdog = subprocess.Popen([sys.executable, "-I", processes.__file__, str(kernel.pid), str(tmp_path)])
    try:
        wait_for_checks(watchdog, 1)
        assert tmp_path.exists()
        kernel.kill()
        kernel.wait()
        assert watchdog.wait(15) == 0
        assert not tmp_path.exists()
    finally:
        for proc in (kernel, watchdog):
            proc.kill()


def test_the_watchdog_ends_when_its_kernel_removed_the_cluster_directory(tmp_path):
    kernel, directory = sleeper(), tmp_path / "cluster"
    directory.mkdir()
    watchdog = subprocess.Popen([sys.executable, "-I", processes.__file__, str(kernel.pid), str(directory)])
    try:
        wait_for_checks(watchdog, 1)
        directory.rmdir()
        assert watchdog.wait(15) == 0
        assert kernel.poll() is None
    finally:
        for proc in (kernel, watchdog):
            proc.kill()
