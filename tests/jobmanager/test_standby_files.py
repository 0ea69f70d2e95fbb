"""Standby files of JobManagers that are gone are swept (a SIGKILLed standby cannot remove its
own), with real processes: a dead pid, a pid that is alive but no JobManager, and a live one."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

from cluster.jobmanager.entrypoint import sweep_standby_files

SLEEP = "import time; time.sleep(120)"


def _standby_file(directory, pid: int):
    path = directory / f"jobmanager-standby-{pid}.json"
    path.write_text(json.dumps({"rest": "http://127.0.0.1:1", "pid": pid}))
    return path


def test_the_files_of_standbys_that_are_gone_are_removed_and_a_live_ones_kept(tmp_path):
    killed = subprocess.Popen([sys.executable, "-c", SLEEP, "-m", "cluster.jobmanager"])
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    # argv after -c is the script's: these name themselves as JobManagers do, without being one
    live = subprocess.Popen([sys.executable, "-c", SLEEP, "-m", "cluster.jobmanager"])
    other = subprocess.Popen([sys.executable, "-c", SLEEP])  # a pid reused by something else
    try:
        dead_file, live_file, other_file = (_standby_file(tmp_path, p.pid) for p in (killed, live, other))
        garbled = tmp_path / "jobmanager-standby-0.json"
        garbled.write_text("{half a fi")
        assert sorted(sweep_standby_files(tmp_path)) == sorted([dead_file, other_file, garbled])
        assert live_file.exists() and not dead_file.exists() and not other_file.exists()
        assert sweep_standby_files(tmp_path) == []
    finally:
        for proc in (live, other):
            proc.kill()
            proc.wait()
