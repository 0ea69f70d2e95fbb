"""A local HA cluster through the real CLI: `streamlab cluster start --ha --jobmanagers 2` with a
ZooKeeper of its own, a checkpointed keyed job, the leader SIGKILLed, the standby leading and the
job running there, its output equal to pandas; `cluster stop` leaves no process (ZooKeeper
included). And `streamlab jobmanager start` twice in one HA directory: a leader and a standby."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import psutil
import pytest

from kernel_runtime import JobClient
from kernel_runtime.client.cluster_info import ClusterInfo
from tests.conftest import rest, wait_for
from tests.e2e.test_exactly_once import committed, expected, run_job
from tests.e2e.test_standalone import gone, sh

pytestmark = pytest.mark.slow
FAST = ["-D", "heartbeat.interval=200 ms", "-D", "heartbeat.timeout=2 s",
        "-D", "high-availability.zookeeper.client.session-timeout=2 s", "-D", "taskmanager.spark.startup=lazy"]


def listed(directory: Path) -> dict:
    return json.loads((directory / "cluster.json").read_text())


def leader_pid(directory: Path) -> int:
    return json.loads((directory / "jobmanager.json").read_text())["pid"]


def leader(directory: Path) -> SimpleNamespace:
    """What tests.conftest.rest and run_job take: the leader's addresses as jobmanager.json has them now."""
    return SimpleNamespace(cluster_dir=directory, info=ClusterInfo.load(directory))


def job_running(directory: Path, job_id: str) -> bool:
    try:
        job = rest(leader(directory), f"/jobs/{job_id}")[1]
    except Exception:  # no leader published yet, or the job not recovered yet
        return False
    return job["state"] == "RUNNING" and all(v["status"] == "RUNNING" for v in job["vertices"])


@pytest.mark.timeout(420)
def test_cluster_start_ha_survives_a_leader_kill(tmp_path):
    directory = tmp_path / "ha-local"
    pids: list[int] = []
    try:
        out = sh("cluster", "start", "--ha", "--jobmanagers", "2", "-n", "2", "-s", "2", "--cluster-dir",
                 str(directory), "-D", "jobmanager.rpc.port=0", "-D", "rest.port=0", *FAST).stdout
        pids = [*listed(directory)["jobmanagers"], *listed(directory)["taskmanagers"], listed(directory)["zookeeper"]]
        first = leader_pid(directory)
        (standby,) = [p for p in listed(directory)["jobmanagers"] if p != first]
        assert listed(directory)["jobmanager"] == first and len(listed(directory)["taskmanagers"]) == 2
        assert f"leader pid {first}, standby JobManager pid(s) {standby}" in out, out
        zk = psutil.Process(listed(directory)["zookeeper"])
        assert zk.cmdline()[-1] == str(directory / "zookeeper" / "zoo.cfg")
        quorum = f"127.0.0.1:{(directory / 'zookeeper' / 'zoo.cfg').read_text().split('clientPort=')[1].split()[0]}"
        assert f"ZooKeeper {quorum} (the cluster's own" in out, out
        config = (directory / "config.yaml").read_text()
        assert "high-availability.type: zookeeper" in config and "high-availability.cluster-id: ha-local" in config

        out_dir = str(tmp_path / "out")
        client, handle = run_job(leader(directory), "hashmap", out_dir)
        client.close()  # submitted: the job runs on without this client
        job_id = handle.job_id
        wait_for(lambda: (rest(leader(directory), f"/jobs/{job_id}/checkpoints")[1]["counts"]["completed"] >= 1),
                 60, "a completed checkpoint under the first leader")

        os.kill(first, signal.SIGKILL)
        wait_for(lambda: (directory / "jobmanager.json").exists() and leader_pid(directory) == standby, 60,
                 "the standby to lead")
        wait_for(lambda: job_running(directory, job_id), 60, "the job RUNNING under the new leader")
        # both follow the leader: one by ZooKeeper's news, or first by its heartbeat timeout, then registering
        # again (the job may run on the other's slots meanwhile)
        wait_for(lambda: rest(leader(directory), "/overview")[1]["taskmanagers"] == 2, 30,
                 "both TaskManagers registered at the new leader")
        status = JobClient(ClusterInfo.load(directory))
        try:
            wait_for(lambda: status.job_status(job_id).state in ("FINISHED", "FAILED", "CANCELED"), 180,
                     "the job to end")
            assert status.job_status(job_id).state == "FINISHED"
        finally:
            status.close()
        assert rest(leader(directory), f"/jobs/{job_id}/checkpoints")[1]["latest"]["restored"]["id"] >= 1
        pd.testing.assert_frame_equal(committed(out_dir), expected(), check_dtype=False)

        assert f"Cluster in {directory} stopped" in sh("cluster", "stop", "--cluster-dir", str(directory)).stdout
        left = gone(pids)
        assert not left, f"left running after cluster stop: {left}"
        assert not (directory / "cluster.json").exists() and not (directory / "jobmanager.json").exists()
    except BaseException:
        for log in sorted((directory / "log").glob("*.log")) if directory.exists() else []:
            print(f"--- {log.name}", *log.read_text(errors="replace").splitlines()[-25:], sep="\n")
        raise
    finally:
        sh("cluster", "stop", "--cluster-dir", str(directory), check=False)
        for proc in gone(pids, 0):
            proc.kill()


@pytest.mark.timeout(300)
def test_jobmanager_start_twice_in_ha_mode_gives_a_leader_and_a_standby(zookeeper, tmp_path):
    directory = tmp_path / "jm-ha"
    ha = ["-D", "high-availability.type=zookeeper", "-D", f"high-availability.zookeeper.quorum={zookeeper.quorum}",
          "-D", "high-availability.cluster-id=jm-ha", "-D", "jobmanager.rpc.port=0", "-D", "rest.port=0", *FAST]
    pids: list[int] = []
    try:
        first = sh("jobmanager", "start", "--cluster-dir", str(directory), *ha).stdout
        pids = listed(directory)["jobmanagers"]
        info = ClusterInfo.load(directory)
        assert f"(pid {pids[0]}): leader, rpc {info.rpc_address}, REST {info.rest_address}" in first, first

        second = sh("jobmanager", "start", "--cluster-dir", str(directory)).stdout  # the directory's HA config
        pids = listed(directory)["jobmanagers"]
        assert len(pids) == 2 and listed(directory)["jobmanager"] == pids[0]
        assert f"(pid {pids[1]}): standby, the leader is at rpc {info.rpc_address} (pid {pids[0]})" in second, second
        assert (directory / "log" / "jobmanager-1.log").exists()
        assert leader_pid(directory) == pids[0]  # the standby left the leader's jobmanager.json alone

        stopped = sh("jobmanager", "stop", "--cluster-dir", str(directory)).stdout
        assert "Stopped 2 JobManager" in stopped, stopped
        left = gone(pids)
        assert not left, f"left running after jobmanager stop: {left}"
        assert not (directory / "cluster.json").exists()
    finally:
        sh("jobmanager", "stop", "--cluster-dir", str(directory), check=False)
        for proc in gone(pids, 0):
            proc.kill()


def test_cluster_start_ha_fails_over_in_seconds_unless_the_session_is_configured(tmp_path):
    # Flink's 60 s session kept a dead leader's jobs down for a minute under `cluster start --ha`
    from cluster.conf.options import HighAvailabilityOptions
    from kernel_runtime.deploy.local import LocalCluster
    timeout = HighAvailabilityOptions.ZOOKEEPER_SESSION_TIMEOUT
    assert LocalCluster(tmp_path / "default", ha=True).conf.get(timeout) == 5_000
    configured = {"high-availability.zookeeper.client.session-timeout": "30 s"}
    assert LocalCluster(tmp_path / "configured", ha=True, config=configured).conf.get(timeout) == 30_000
    assert LocalCluster(tmp_path / "no-ha").conf.get(timeout) == 60_000  # Flink's, where no HA is asked for
