"""A leader JobManager frozen (SIGSTOP) past its ZooKeeper session, then resumed: the standby leads
meanwhile and the frozen one wakes up believing it leads. No two leaders may act: the old one
must step down (exit 70, "leadership revoked") without committing anything, and the job's
committed output stays exactly once. On both state backends, at a random moment (seeded by id).

The order is read from the JobManagers' own logs: every line the old leader wrote after it woke
is checked for an act of a leader (a checkpoint completed, a job deployed or restored)."""
from __future__ import annotations

import os
import random
import signal
import time

import pytest

from tests.conftest import rest, wait_for
from tests.faults import Stopwatch, check_exactly_once, seed
from tests.e2e.test_exactly_once import committed, expected, run_job

from .conftest import ha_cluster, shown_and_stopped
from .test_zookeeper_ha import answered, leader_pid, status_at_leader

pytestmark = pytest.mark.slow

SESSION_S = 2.0  # the HA test clusters' ZooKeeper session (kernel_runtime/deploy/ha.py)
LEADER_ACTS = ("Completed checkpoint", "deployed, attempt", "recovered")  # job_master.py's, dispatcher.py's lines


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_a_frozen_leader_that_wakes_after_its_session_steps_down_and_commits_nothing(zookeeper, tmp_path, backend):
    seed(f"frozen-leader-{backend}")
    with shown_and_stopped(ha_cluster(tmp_path / "ha-frozen", zookeeper.quorum)) as ha:
        first = ha.start_jobmanager()
        ha.info = ha.leader()
        ha.start_jobmanager()  # the standby
        ha.start_taskmanager()
        ha.start_taskmanager()
        wait_for(lambda: rest(ha, "/overview")[1]["taskmanagers"] == 2, 60, "two TaskManagers")
        out = str(tmp_path / "out")
        client, handle = run_job(ha, backend, out)
        try:
            wait_for(lambda: (answered(ha, f"/jobs/{handle.job_id}/checkpoints") or {"counts": {"completed": 0}})[
                "counts"]["completed"] >= 1, 60, "a completed checkpoint under the first leader")
            time.sleep(random.uniform(0.2, 1.0))  # a random moment of processing
            pid = leader_pid(ha)
            frozen = ha.process_of(pid)[1]
            os.kill(pid, signal.SIGSTOP)
            watch = Stopwatch()
            try:
                ha.info = ha.leader(60, not_pid=pid)  # the standby leads
                wait_for(lambda: (job := answered(ha, f"/jobs/{handle.job_id}")) is not None
                         and job["state"] == "RUNNING", 60, "the job running under the new leader")
                watch.recovered()
                time.sleep(SESSION_S)  # frozen well past the session's end
                log = ha.cluster_dir / "log" / f"{first}.log"
                before = log.read_text(errors="replace")
                assert "Completed checkpoint" in before  # the line looked for below is what it writes
                woke_at = len(before)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert frozen.wait(60) == 70, "the old leader did not step down"
            after = log.read_text(errors="replace")[woke_at:]
            assert "leadership revoked" in after, after[-2000:]
            acts = [line for line in after.splitlines() if any(a in line for a in LEADER_ACTS)]
            assert not acts, "the old leader acted after it woke:\n" + "\n".join(acts)
            wait_for(lambda: status_at_leader(ha, handle.job_id).state in ("FINISHED", "FAILED", "CANCELED"), 180,
                     "the job to end")
            assert status_at_leader(ha, handle.job_id).state == "FINISHED"
        finally:
            client.close()
        check_exactly_once(f"leader frozen past its session ({backend})", committed(out), expected(), watch)
