"""Clients across a JobManager failover: an open JobClient (what a notebook holds) and the CLI.

A client made before the failover, from the cluster directory (ClusterInfo finds the leader in
ZooKeeper), keeps its job handle: after the leader's SIGKILL it follows the new leader, its collect
sink's rows arrive exactly once (the recovered job streams to the same client, which acknowledges
its checkpoints at the new leader), ``wait()`` returns the finished job, and ``streamlab list``
run as a fresh command finds the job under the new leader.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.client.cluster_info import ClusterInfo
from tests.conftest import rest, wait_for
from tests.e2e.test_exactly_once import events, running_total

from .conftest import ha_cluster
from .test_zookeeper_ha import leader_pid

pytestmark = pytest.mark.slow

N, RATE, BATCH = 24_000, 3_000, 200


def streamlab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_runtime.cli.main", *args], capture_output=True, text=True,
                          timeout=60)


def test_an_open_client_and_the_cli_follow_the_new_leader(zookeeper, tmp_path):
    ha = ha_cluster(tmp_path / "ha-client", zookeeper.quorum)
    client = None
    try:
        ha.start_jobmanager()
        ha.info = ha.leader()
        ha.start_jobmanager()  # the standby
        ha.start_taskmanager()
        wait_for(lambda: rest(ha, "/overview")[1]["taskmanagers"] == 1, 60, "the TaskManager")
        client = JobClient(ClusterInfo.load(ha.cluster_dir))  # the leader as ZooKeeper names it
        env = StreamEnvironment(parallelism=2, cluster=ha.cluster_dir, config={
            "execution.checkpointing.interval": "500 ms", "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": 10, "restart-strategy.fixed-delay.delay": "200 ms"})
        (env.from_generator(events, count=N, rate=RATE, batch_size=BATCH, split_size=16 * BATCH)
            .key_by("k").process(running_total, name="running total").collect("totals"))
        handle = env.execute_async("followed across a failover", client=client)
        handle.wait_for_rows(3_000, timeout=60)
        wait_for(lambda: rest(ha, f"/jobs/{handle.job_id}/checkpoints")[1]["counts"]["completed"] >= 1, 60,
                 "a completed checkpoint")
        pid = leader_pid(ha)
        os.kill(pid, signal.SIGKILL)
        ha.process_of(pid)[1].wait(5)
        ha.start_jobmanager()  # the replacement standby
        ha.info = ha.leader(60, not_pid=pid)

        def listed_running():
            done = streamlab("list", "--cluster-dir", str(ha.cluster_dir))
            return done.returncode == 0 and handle.job_id in done.stdout and "RUNNING" in done.stdout
        wait_for(listed_running, 60, "streamlab list to show the job RUNNING under the new leader")
        assert client.job_status(handle.job_id).attempt == 2  # the open client asks the new leader
        result = handle.wait(timeout=120)
        assert result.state == "FINISHED"
        got = handle.results_of("totals").sort_values("seq").reset_index(drop=True)[["k", "seq", "total"]]
        df = events(np.arange(N, dtype=np.int64))
        want = pd.DataFrame({"k": df.k, "seq": df.seq, "total": df.groupby("k")["v"].cumsum()})
        pd.testing.assert_frame_equal(got, want, check_dtype=False)  # exactly once through the failover
        assert client.rpc.address == ha.info.rpc_address
    except BaseException:
        print(ha.log_tails())
        raise
    finally:
        if client is not None:
            client.close()
        ha.stop()
