"""The active ResourceManager with real processes: a job needing 6 slots on a cluster started with
one TaskManager of 2 gets two more TaskManagers started, runs to the right result, and the two
started ones are stopped once idle for resourcemanager.taskmanager-timeout; the first stays."""
from __future__ import annotations

import os

import pandas as pd
import psutil

from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.deploy.processes import CLUSTER_MODULES

from ..conftest import start_cluster, wait_for

IDLE_TIMEOUT_S = 5


def taskmanager_pids(cluster_dir) -> set[int]:
    """The live TaskManager processes of a cluster directory, by command line."""
    pids = set()
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        pairs = dict(zip(argv, argv[1:]))
        if pairs.get("-m") == CLUSTER_MODULES[1] \
                and os.path.realpath(pairs.get("--cluster-dir", "")) == os.path.realpath(cluster_dir) \
                and proc.status() != psutil.STATUS_ZOMBIE:
            pids.add(proc.pid)
    return pids


def test_a_job_needing_more_slots_gets_taskmanagers_started_and_they_stop_when_idle(tmp_path):
    local = start_cluster(tmp_path / "cluster", taskmanagers=1, slots=2, **{
        "resourcemanager.provider": "process",
        "resourcemanager.taskmanager-timeout": f"{IDLE_TIMEOUT_S} s",
        "taskmanager.spark.startup": "lazy",
    })
    client = JobClient(local.info)
    try:
        (first,) = taskmanager_pids(local.cluster_dir)
        assert first == local.taskmanagers[0].pid
        env = StreamEnvironment(parallelism=6)
        rows = 30_000
        (env.from_generator(lambda seq: {"key": seq % 11, "seq": seq}, count=rows, batch_size=1000)
            .key_by("key").count().collect(name="counts"))
        result = client.submit(env.get_job_graph("six slots")).wait(timeout=120)
        assert result.state == "FINISHED"
        frame = pd.DataFrame({"key": pd.RangeIndex(rows) % 11})
        expected = frame.groupby("key").size().rename("count").reset_index()
        got = result.to_pandas().sort_values("key").reset_index(drop=True)
        pd.testing.assert_frame_equal(got[["key", "count"]], expected, check_dtype=False)

        overview = client.cluster_overview()
        assert overview.overview["slots-total"] == 6 and len(overview.taskmanagers) == 3
        started = taskmanager_pids(local.cluster_dir) - {first}
        assert len(started) == 2
        # idle from the job's end: the started ones go after the timeout, the first stays
        wait_for(lambda: taskmanager_pids(local.cluster_dir) == {first}, IDLE_TIMEOUT_S + 20,
                 "the started TaskManagers to stop")
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in started)
        assert len(client.cluster_overview().taskmanagers) == 1
    finally:
        client.close()
        local.stop()
    assert taskmanager_pids(local.cluster_dir) == set()
