"""JobManager failover with a real ZooKeeper: exactly-once output through leader SIGKILLs.

Two JobManagers (one leader, one standby) and two TaskManagers that find the leader in ZooKeeper.
The checkpointed keyed running total of tests/e2e/test_exactly_once.py writes into the
transactional Parquet sink; the leader is SIGKILLed at random moments of a running attempt (a
replacement standby started each time). The standby that wins recovers the job from the latest
completed checkpoint ZooKeeper points to, the TaskManagers re-register there, and the committed
output equals the failure-free run (which that test shows equal to pandas) row for row.
"""
from __future__ import annotations

import json
import os
import random
import signal
import time

import pandas as pd
import pytest

from cluster.ha.services import EXIT_LEADERSHIP_REVOKED
from kernel_runtime import JobClient
from kernel_runtime.deploy.ha import HaLocalCluster, LocalZooKeeper
from tests.conftest import rest, wait_for
from tests.e2e.test_exactly_once import committed, expected, run_job

from .conftest import ha_cluster
from .zookeeper_history import leader_writes

pytestmark = pytest.mark.slow
KILLS = 3


def leader_pid(ha: HaLocalCluster) -> int:
    return json.loads((ha.cluster_dir / "jobmanager.json").read_text())["pid"]


def answered(ha: HaLocalCluster, path: str):
    """The leader's REST answer, or None while it is not there (dead, not elected, job not recovered yet)."""
    try:
        return rest(ha, path)[1]
    except OSError:
        return None


def status_at_leader(ha: HaLocalCluster, job_id: str):
    client = JobClient(ha.leader())
    try:
        return client.job_status(job_id)
    finally:
        client.close()


def test_the_leader_is_killed_three_times_and_the_output_is_exactly_once(zookeeper, tmp_path):
    random.seed("leader-kills")
    ha = ha_cluster(tmp_path / "ha-kills", zookeeper.quorum)
    client = None
    try:
        ha.start_jobmanager()
        ha.info = ha.leader()  # what run_job submits through
        ha.start_jobmanager()  # the standby
        ha.start_taskmanager()
        ha.start_taskmanager()
        wait_for(lambda: rest(ha, "/overview")[1]["taskmanagers"] == 2, 60, "two TaskManagers")
        out = str(tmp_path / "out")
        client, handle = run_job(ha, "hashmap", out)
        job_id = handle.job_id
        failovers = []
        for kill in range(KILLS):
            # a checkpoint completed under this leader: the job progresses between kills
            wait_for(lambda: (answered(ha, f"/jobs/{job_id}/checkpoints") or {"counts": {"completed": 0}})[
                "counts"]["completed"] >= 1, 60,
                     f"a completed checkpoint under leader {kill}")
            time.sleep(random.uniform(0.2, 1.0))
            assert status_at_leader(ha, job_id).state == "RUNNING", f"the job ended after {kill} kills"
            pid = leader_pid(ha)
            os.kill(pid, signal.SIGKILL)
            killed_at = time.monotonic()
            ha.process_of(pid)[1].wait(5)
            ha.start_jobmanager()  # the replacement standby
            ha.info = ha.leader(60, not_pid=pid)
            # FINISHED too: after the last kill, a source near its end may finish before a poll
            # sees every vertex RUNNING at once
            wait_for(lambda: (job := answered(ha, f"/jobs/{job_id}")) is not None
                     and all(v["status"] in ("RUNNING", "FINISHED") for v in job["vertices"]),
                     60, f"the job running again under leader {kill + 1}")
            failovers.append(time.monotonic() - killed_at)
            # a new attempt number: the old leader's tasks, maybe still cancelling, use the last one
            assert status_at_leader(ha, job_id).attempt == kill + 2
        wait_for(lambda: status_at_leader(ha, job_id).state in ("FINISHED", "FAILED", "CANCELED"), 180,
                 "the job to end")
        assert status_at_leader(ha, job_id).state == "FINISHED"
        checkpoints = rest(ha, f"/jobs/{job_id}/checkpoints")[1]
        assert checkpoints["latest"]["restored"]["id"] >= 1  # recovered, not started over
        pd.testing.assert_frame_equal(committed(out), expected(), check_dtype=False)
        # ZooKeeper's own history: each leader wrote, and only while it held the leader node
        writes, wrong = leader_writes(zookeeper.directory / "data", f"/flink/{ha.cluster_dir.name}")
        assert len({w.session for w in writes}) == KILLS + 1 and not wrong, wrong or writes
        print(f"failover times (kill to every vertex RUNNING): {[round(f, 2) for f in failovers]} s")
    except BaseException:
        print(ha.log_tails())
        raise
    finally:
        if client is not None:
            client.close()
        ha.stop()


def test_a_leader_cut_off_from_zookeeper_stops_leading(tmp_path):
    server = LocalZooKeeper(tmp_path / "zk-own").start()
    ha = ha_cluster(tmp_path / "ha-cut", server.quorum)
    try:
        name = ha.start_jobmanager()
        ha.info = ha.leader()
        assert rest(ha, "/overview")[0] == 200
        server.stop()
        proc = ha.jobmanagers[name]
        proc.wait(60)  # it ends, and says why (how soon follows the ZooKeeper session timeout)
        assert proc.returncode == EXIT_LEADERSHIP_REVOKED
        log = (ha.cluster_dir / "log" / f"{name}.log").read_text()
        assert "leadership revoked: the ZooKeeper session is SUSPENDED" in log
        with pytest.raises(OSError):
            rest(ha, "/overview")  # nothing answers as leader any more
    finally:
        ha.stop()
        server.stop()
