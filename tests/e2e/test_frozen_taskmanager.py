"""A TaskManager frozen (SIGSTOP) for longer than the heartbeat timeout, then resumed: the
JobManager has declared it lost and restarted the job elsewhere meanwhile, so the zombie's tasks
belong to a dead attempt and must not commit. The committed output is exactly once, on both state
backends, with the freeze at a random moment (its seed printed: tests/faults.py)."""
from __future__ import annotations

import os
import random
import signal
import time

import pytest

from tests.conftest import rest, start_cluster, wait_for
from tests.faults import Stopwatch, check_exactly_once, seed
from tests.e2e.test_exactly_once import FAULTS, committed, expected, run_job

pytestmark = pytest.mark.slow

FROZEN_S = 4.0  # heartbeat.timeout is 1.5 s in FAULTS


@pytest.fixture(scope="module")
def freeze_cluster(tmp_path_factory):
    local = start_cluster(tmp_path_factory.mktemp("frozen"), **FAULTS)
    yield local
    local.stop()


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_a_frozen_taskmanager_resumed_after_its_loss_commits_nothing(freeze_cluster, backend, tmp_path):
    seed(f"frozen-{backend}")
    out = str(tmp_path / "out")
    client, handle = run_job(freeze_cluster, backend, out)
    try:
        wait_for(lambda: rest(freeze_cluster, f"/jobs/{handle.job_id}/checkpoints")[1]["counts"]["completed"] >= 1,
                 60, "a first completed checkpoint")
        time.sleep(random.uniform(0.2, 1.5))  # a random moment of processing
        busy = {s["taskmanager_id"] for s in client.job_details(handle.job_id)["subtasks"] if s["taskmanager_id"]}
        victim = random.choice([tm for tm in rest(freeze_cluster, "/taskmanagers")[1]["taskmanagers"]
                                if tm["id"] in busy])
        freeze_cluster.start_taskmanager()  # slots for the restart while the victim is frozen
        os.kill(victim["pid"], signal.SIGSTOP)
        watch = Stopwatch()
        try:
            wait_for(lambda: victim["id"] not in {tm["id"] for tm in rest(freeze_cluster, "/taskmanagers")[1]
                                                 ["taskmanagers"]}, 30, "the frozen TaskManager declared lost")
            wait_for(lambda: (s := handle.job_status()).attempt >= 2 and s.state == "RUNNING", 30, "the job restarted")
            watch.recovered()
            # frozen past the heartbeat timeout by FROZEN_S at least
            time.sleep(FROZEN_S)
        finally:
            os.kill(victim["pid"], signal.SIGCONT)
        assert handle.wait(180).state.name == "FINISHED"
    finally:
        client.close()
    check_exactly_once(f"TaskManager frozen {FROZEN_S:g} s ({backend})", committed(out), expected(), watch)
