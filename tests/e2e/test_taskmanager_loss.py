"""A TaskManager killed with SIGKILL: detected by heartbeat timeout; the job fails or waits as configured."""
from __future__ import annotations

import os
import signal

import pytest

from kernel_runtime import JobClient, JobExecutionError, StreamEnvironment
from tests.conftest import assert_at_rest, rest, wait_for

# each test's own_cluster (tests/cluster_fixture.py), 2 TaskManagers x 2 slots, checked after it.
# No Spark here: these jobs do not use it, and two JVMs starting would only slow the kills.
# Spread out: every job here has tasks on both TaskManagers, whichever one a test kills
pytestmark = [pytest.mark.slow, pytest.mark.cluster(taskmanagers=2, slots=2, **{
    "taskmanager.spark.startup": "lazy", "cluster.evenly-spread-out-slots": True})]


def _kill_taskmanager(local, index: int) -> str:
    _, tms = rest(local, "/taskmanagers")
    pid = local.taskmanagers[index].pid
    (tm,) = [t for t in tms["taskmanagers"] if t["pid"] == pid]
    os.kill(pid, signal.SIGKILL)
    local.taskmanagers[index].wait(5)
    return tm["id"]


def test_lost_taskmanager_fails_the_job_without_restart_strategy(own_cluster):
    client = JobClient(own_cluster.info)
    env = StreamEnvironment(parallelism=4, cluster=own_cluster.cluster_dir)
    env.from_generator(rate=2_000, batch_size=50).key_by("seq").count().collect()
    handle = env.execute_async("loses a TM", client=client)
    wait_for(lambda: len(handle.results) > 200, 20, "rows flowing")
    lost = _kill_taskmanager(own_cluster, 0)
    with pytest.raises(JobExecutionError) as info:
        handle.wait(20)
    assert str(info.value) == f"TaskManager {lost} lost: no heartbeat for 2000 ms (heartbeat.timeout)"
    assert "restart-strategy.type is none" in info.value.failure
    _, overview = rest(own_cluster, "/overview")
    assert (overview["taskmanagers"], overview["slots-total"]) == (1, 2)
    assert_at_rest(own_cluster)
    client.close()


def test_job_waits_for_slots_after_a_loss_and_resumes_on_a_replacement(own_cluster):
    client = JobClient(own_cluster.info)
    env = StreamEnvironment(parallelism=4, cluster=own_cluster.cluster_dir, config={
        "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 3,
        "restart-strategy.fixed-delay.delay": "200 ms", "slot.request.timeout": "60 s"})
    # the changelog: a row delivered twice would show, where the table per key would hide it
    env.from_generator(count=20_000, rate=4_000, batch_size=100).key_by("seq").count().changelog().collect()
    handle = env.execute_async("waits", client=client)
    wait_for(lambda: len(handle.results) > 500, 20, "rows flowing")
    _kill_taskmanager(own_cluster, 1)
    status = wait_for(lambda: (s := handle.job_status()).state == "CREATED" and s.attempt == 2 and s, 20,
                      "the restarted job waiting for slots")
    assert "waiting for 4 free slot(s); the cluster has 2 free of 2" in status.reason
    own_cluster.start_taskmanager()
    result = handle.wait(60)
    out = result.to_pandas()
    # results of the failed attempt are dropped; the new attempt delivers every row once
    assert sorted(out["seq"]) == list(range(20_000)) and (out["count"] == 1).all()
    assert handle.job_status().attempt == 2
    client.close()


def test_job_restarts_on_the_remaining_slots_when_they_suffice(own_cluster):
    client = JobClient(own_cluster.info)
    env = StreamEnvironment(parallelism=2, cluster=own_cluster.cluster_dir, config={
        "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": "100 ms"})
    env.from_generator(count=10_000, rate=3_000, batch_size=100).map_batches(lambda df: df).collect()
    handle = env.execute_async("shrinks", client=client)
    wait_for(lambda: len(handle.results) > 300, 20, "rows flowing")
    _kill_taskmanager(own_cluster, 0)
    assert sorted(handle.wait(60).to_pandas()["seq"]) == list(range(10_000))
    client.close()
