"""A TaskManager frozen (SIGSTOP) for longer than the heartbeat timeout, then resumed: the
JobManager has declared it lost and restarted the jobs elsewhere meanwhile, so the zombie's tasks
belong to a dead attempt and must not commit (and, resumed, it registers again). A job on each
state backend runs side by side through 3 freezes at random moments (their seed printed:
tests/faults.py); the committed output of each is exactly once."""
from __future__ import annotations

import os
import random
import signal
import time

import pytest

from tests.conftest import rest, start_cluster, wait_for
from tests.faults import Stopwatch, check_exactly_once, in_rounds, seed
from tests.e2e.test_exactly_once import FAULTS, committed, expected, run_job

pytestmark = pytest.mark.slow

FROZEN_S = 4.0  # heartbeat.timeout is 1.5 s in FAULTS
BACKENDS = ("hashmap", "rocksdb")
RATE = 1_500  # rows/s per job: long enough for the rounds


@pytest.fixture(scope="module")
def freeze_cluster(tmp_path_factory):
    # 6 slots: the two jobs' 4, and room to restart both while a TaskManager is frozen
    local = start_cluster(tmp_path_factory.mktemp("frozen"), taskmanagers=3, **FAULTS)
    yield local
    local.stop()


def test_a_frozen_taskmanager_resumed_after_its_loss_commits_nothing(freeze_cluster, tmp_path):
    seed("frozen")
    outs = {backend: str(tmp_path / f"out-{backend}") for backend in BACKENDS}
    jobs = {backend: run_job(freeze_cluster, backend, out, rate=RATE) for backend, out in outs.items()}
    handles = [handle for _, handle in jobs.values()]
    client = jobs["hashmap"][0]

    def freeze(watch: Stopwatch) -> None:
        busy = {s["taskmanager_id"] for h in handles for s in client.job_details(h.job_id)["subtasks"]
                if s["taskmanager_id"]}
        registered = rest(freeze_cluster, "/taskmanagers")[1]["taskmanagers"]
        victim = random.choice([tm for tm in registered if tm["id"] in busy])
        attempts = [h.job_status().attempt for h in handles]
        os.kill(victim["pid"], signal.SIGSTOP)
        try:
            wait_for(lambda: victim["id"] not in {tm["id"] for tm in rest(freeze_cluster, "/taskmanagers")[1]
                                                 ["taskmanagers"]}, 30, "the frozen TaskManager declared lost")
            wait_for(lambda: all(h.job_status().state == "RUNNING" for h in handles) and any(
                h.job_status().attempt > a for h, a in zip(handles, attempts)), 60, "the jobs restarted")
            watch.recovered()
            time.sleep(FROZEN_S)  # frozen past the heartbeat timeout by FROZEN_S at least
        finally:
            os.kill(victim["pid"], signal.SIGCONT)
        # resumed, it gives the JobManager up and registers again: the next freeze has its slots
        wait_for(lambda: len(rest(freeze_cluster, "/taskmanagers")[1]["taskmanagers"]) == len(registered), 60,
                 "the resumed TaskManager registered again")

    try:
        watches = in_rounds(freeze_cluster, client, handles, freeze)
        for handle in handles:
            assert handle.wait(180).state.name == "FINISHED"
    finally:
        for job_client, _ in jobs.values():
            job_client.close()
    for backend, out in outs.items():
        check_exactly_once(f"TaskManager frozen {FROZEN_S:g} s ({backend})", committed(out), expected(), watches)
