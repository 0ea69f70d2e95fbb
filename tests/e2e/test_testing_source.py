"""The testing source (env.from_testing): failures planned at a chosen row and attempt, so that a
recovery test is deterministic. The job is a keyed running total (one output row per input row,
so a row lost or delivered twice shows) with checkpoints; the source holds at its planned row
until a checkpoint of the attempt completed, so every restart here restores one. Each test runs
on a cluster of its own (tests/cluster_fixture.py), checked after it: the planned failure must be
in its logs, and nothing else."""
from __future__ import annotations

import glob
import os
import re

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from cluster.graph.job_graph import GraphValidationError
from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.api import FileSink
from tests.conftest import rest, wait_for
from tests.e2e.test_exactly_once import expected as totals_of, running_total

N, BATCH, SPLIT = 6_000, 100, 800
ROW = 2_500  # in split 3: read by subtask 1 of 2
LAZY = {"taskmanager.spark.startup": "lazy"}
RECOVERY = {"execution.checkpointing.interval": "200 ms", "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": 3, "restart-strategy.fixed-delay.delay": "100 ms"}


def events(seq):
    # keys 0..6 are read by source subtask 0 only, 100..106 by subtask 1 (split % 2): each key's
    # rows come in sequence order, so the running totals of a run without failures are known
    return pd.DataFrame({"k": (seq // SPLIT % 2) * 100 + seq % 7, "v": seq % 13, "seq": seq})


def submit(local, client, name: str, out: str | None = None, **planned):
    """The running total from a testing source with ``planned`` failures, into the transactional
    Parquet sink at ``out`` (or collected to the client)."""
    env = StreamEnvironment(parallelism=2, cluster=local.cluster_dir, config=RECOVERY)
    totals = (env.from_testing(events, count=N, batch_size=BATCH, split_size=SPLIT, **planned)
              .key_by("k").process(running_total, name="running total"))
    if out is None:
        totals.collect()
    else:
        totals.sink_to(FileSink.parquet(out, rows_per_file=1_000))
    return env.execute_async(name, client=client)


def ordered(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values("seq").reset_index(drop=True)[["k", "seq", "total"]]


def restored_once(local, job_id: str) -> None:
    checkpoints = rest(local, f"/jobs/{job_id}/checkpoints")[1]
    assert checkpoints["counts"]["restored"] == 1 and checkpoints["latest"]["restored"]["id"] >= 1, checkpoints


@pytest.mark.cluster(taskmanagers=1, slots=2, expect_errors=(f"planned failure at row {ROW} in attempt 1",), **LAZY)
def test_a_planned_failure_fails_over_once_and_the_committed_output_is_exactly_once(own_cluster, tmp_path):
    out = str(tmp_path / "out")
    client = JobClient(own_cluster.info)
    try:
        handle = submit(own_cluster, client, "fails at a row", out, fail_at=(ROW, 1))
        handle.wait(120)
        status = handle.job_status()
        # one restart: the failure planned for attempt 1 does not come back in attempt 2
        assert (status.state, status.attempt) == ("FINISHED", 2)
        restored_once(own_cluster, handle.job_id)
        files = sorted(glob.glob(os.path.join(out, "part-*.parquet")))
        committed = pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)
        pd.testing.assert_frame_equal(ordered(committed), totals_of(events, N), check_dtype=False)
    finally:
        client.close()
    log = (own_cluster.cluster_dir / "log" / "taskmanager-0.log").read_text()
    failures = [line for line in log.splitlines() if line.startswith("PlannedFailure: operator 'testing'")]
    assert failures and all(line.endswith(f"planned failure at row {ROW} in attempt 1") for line in failures)


@pytest.mark.cluster(taskmanagers=1, slots=2, expect_errors=(f"planned failure at row {ROW} in attempt 1",
                                                              "planned failure at row 4100 in attempt 2"), **LAZY)
def test_failures_planned_for_two_attempts_restart_twice_and_every_row_is_collected_once(own_cluster):
    client = JobClient(own_cluster.info)
    try:
        handle = submit(own_cluster, client, "fails twice", fail_at=[(ROW, 1), (4_100, 2)])
        result = handle.wait(120).to_pandas()
        status = handle.job_status()
        assert (status.state, status.attempt) == ("FINISHED", 3)
        pd.testing.assert_frame_equal(ordered(result), totals_of(events, N), check_dtype=False)
    finally:
        client.close()


# two TaskManagers: the job's tasks fill one (cluster.evenly-spread-out-slots is off), which the
# source kills; the job restarts on the other once the loss is noticed (heartbeat.timeout)
@pytest.mark.cluster(taskmanagers=2, slots=2, **LAZY)
def test_a_planned_kill_of_the_taskmanager_recovers_with_every_row_collected_once(own_cluster):
    client = JobClient(own_cluster.info)
    try:
        handle = submit(own_cluster, client, "kills its TaskManager", kill_at=(ROW, 1))
        result = handle.wait(120).to_pandas()
        status = handle.job_status()
        assert (status.state, status.attempt) == ("FINISHED", 2)
        restored_once(own_cluster, handle.job_id)
        pd.testing.assert_frame_equal(ordered(result), totals_of(events, N), check_dtype=False)
    finally:
        client.close()
    killed = [i for i, p in enumerate(own_cluster.taskmanagers) if p.poll() is not None]
    assert killed and all(own_cluster.taskmanagers[i].returncode == -9 for i in killed), killed
    (i,) = killed
    log = (own_cluster.cluster_dir / "log" / f"taskmanager-{i}.log").read_text()
    assert f"planned failure at row {ROW} in attempt 1: SIGKILL of this TaskManager" in log
    wait_for(lambda: rest(own_cluster, "/overview")[1]["taskmanagers"] == 1, 30, "the loss noticed")


@pytest.mark.parametrize("planned, message", [
    ({"fail_at": (N, 1)}, "fail_at takes (row, attempt) pairs with 0 <= row < count and attempt >= 1, got (6000, 1)"),
    ({"kill_at": [(1, 0)]}, "kill_at takes (row, attempt) pairs with 0 <= row < count and attempt >= 1, got (1, 0)"),
    ({"fail_at": 5}, "got 5"),
])
def test_planned_failures_are_checked_where_the_pipeline_is_built(planned, message):
    env = StreamEnvironment(parallelism=1)
    with pytest.raises(GraphValidationError, match=re.escape(message)):
        env.from_testing(count=N, **planned)
