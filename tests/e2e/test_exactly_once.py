"""Exactly-once through TaskManager failures: SIGKILL at random moments, a replacement each time.

A keyed running total (a process function with value state, emitting one row per input row)
from the replayable generator into the transactional Parquet sink, checkpoints every 500 ms.
Each key's rows come from one source subtask in sequence order, so the output of a run without
failures is deterministic row for row, and the committed output after the kills must equal it:
nothing lost, nothing duplicated. Run with the heap and the RocksDB backend.
"""
from __future__ import annotations

import glob
import os
import random
import signal
import time

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.api import FileSink
from tests.conftest import rest, start_cluster, wait_for

pytestmark = pytest.mark.slow

N, RATE, BATCH = 48_000, 4_000, 200
SPLIT = 16 * BATCH
KILLS = 5
KEYS = 10  # per source subtask


def events(seq):
    # keys 0..9 are read by source subtask 0 only, 1000..1009 by subtask 1 (split % 2); few keys
    # because the process function runs once per key of a batch, pandas' cost per call (a third
    # of a millisecond) is most of a TaskManager's CPU, and the fault tests run this job often
    return pd.DataFrame({"k": (seq // SPLIT % 2) * 1000 + seq % KEYS, "v": seq % 97, "seq": seq})


def running_total(key, rows, state):
    total = state.value_state("total")
    sums = rows["v"].cumsum() + (total.value() or 0)
    total.update(int(sums.iloc[-1]))
    return pd.DataFrame({"k": key, "seq": rows["seq"], "total": sums})


def expected(rows=events, n: int = N) -> pd.DataFrame:
    """running_total's output for the first ``n`` rows of ``rows`` (a generator's function)."""
    df = rows(np.arange(n, dtype=np.int64))
    return pd.DataFrame({"k": df.k, "seq": df.seq, "total": df.groupby("k")["v"].cumsum()})


def run_job(local, backend: str, out: str, rate: int = RATE, **config):
    env = StreamEnvironment(parallelism=2, cluster=local.cluster_dir, config={
        "execution.checkpointing.interval": "500 ms", "state.backend.type": backend,
        "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 100,
        "restart-strategy.fixed-delay.delay": "200 ms"} | config)
    (env.from_generator(events, count=N, rate=rate, batch_size=BATCH, split_size=SPLIT)
        .key_by("k").process(running_total, name="running total")
        .sink_to(FileSink.parquet(out, rows_per_file=2_000)))
    client = JobClient(local.info)
    return client, env.execute_async(f"exactly once ({backend})", client=client)


def committed(out: str) -> pd.DataFrame:
    files = sorted(glob.glob(os.path.join(out, "part-*.parquet")))
    frame = pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)
    return frame.sort_values("seq").reset_index(drop=True)[["k", "seq", "total"]]


def kill_a_busy_taskmanager(local, job_id: str, client) -> None:
    """SIGKILL a TaskManager that runs tasks of the job (any, if it is between attempts)."""
    busy = {s["taskmanager_id"] for s in client.job_details(job_id)["subtasks"] if s["taskmanager_id"]}
    tms = rest(local, "/taskmanagers")[1]["taskmanagers"]
    victims = [tm["pid"] for tm in tms if tm["id"] in busy] or [tm["pid"] for tm in tms]
    pid = random.choice(victims)
    os.kill(pid, signal.SIGKILL)
    next(p for p in local.taskmanagers if p.pid == pid).wait(5)
    local.start_taskmanager()  # the replacement


def attempt_running(local, handle, client, attempt: int) -> bool:
    """Whether ``attempt`` of the job runs, every task of it; a later attempt than that (a restart
    no kill caused) fails the test at once, with the failure that restarted the job."""
    status = handle.job_status()
    if status.state in ("FINISHED", "FAILED", "CANCELED"):
        raise AssertionError(f"the job is {status.state} (attempt {status.attempt}) while waiting for attempt "
                             f"{attempt} to run: it ended before the test's kills; {status.failure or ''}")
    if status.attempt > attempt:
        failure = (rest(local, f"/jobs/{handle.job_id}")[1].get("last-failure") or {}).get("cause")
        raise AssertionError(f"attempt {status.attempt} while waiting for attempt {attempt}: the job restarted "
                             f"by itself, after {failure}")
    return status.state == "RUNNING" and status.attempt == attempt and all(
        t["status"] == "RUNNING" for t in client.job_details(handle.job_id)["subtasks"])


def kill_repeatedly(local, handle, client, kills: int, longest_pause: float = 1.5, running_within: float = 60) -> None:
    """SIGKILL a busy TaskManager ``kills`` times, each at a random moment of a running attempt,
    once a first checkpoint completed (so that every restart restores, and the job progresses).
    ``running_within``: how long an attempt may take to run (a replacement starting Spark: longer)."""
    wait_for(lambda: rest(local, f"/jobs/{handle.job_id}/checkpoints")[1]["counts"]["completed"] >= 1, running_within,
             "a first completed checkpoint")
    for killed in range(kills):
        # the attempt after the last kill, restored and running (the kill itself is noticed only
        # after heartbeat.timeout)
        wait_for(lambda: attempt_running(local, handle, client, killed + 1), running_within,
                 f"attempt {killed + 1} running")
        time.sleep(random.uniform(0.3, longest_pause))  # a random moment of processing
        assert handle.status == "RUNNING", f"the job ended after only {killed} kills; make it longer"
        kill_a_busy_taskmanager(local, handle.job_id, client)


FAULTS = {"taskmanager.spark.startup": "lazy", "heartbeat.timeout": "1500 ms"}


@pytest.fixture(scope="module")
def fault_cluster(tmp_path_factory):
    local = start_cluster(tmp_path_factory.mktemp("faults"), **FAULTS)
    yield local
    local.stop()


@pytest.fixture(scope="module")
def reference(fault_cluster, tmp_path_factory) -> pd.DataFrame:
    out = str(tmp_path_factory.mktemp("reference"))
    client, handle = run_job(fault_cluster, "hashmap", out)
    handle.wait(120)
    client.close()
    result = committed(out)
    pd.testing.assert_frame_equal(result, expected(), check_dtype=False)  # and it is what pandas says
    return result


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_committed_output_is_exactly_once_through_taskmanager_kills(fault_cluster, reference, backend, tmp_path):
    random.seed(f"kills-{backend}")
    out = str(tmp_path / "out")
    client, handle = run_job(fault_cluster, backend, out)
    kill_repeatedly(fault_cluster, handle, client, KILLS)
    handle.wait(180)
    status = handle.job_status()
    assert status.state == "FINISHED" and status.attempt >= KILLS + 1
    checkpoints = rest(fault_cluster, f"/jobs/{handle.job_id}/checkpoints")[1]
    assert checkpoints["counts"]["restored"] == 1 and checkpoints["latest"]["restored"]["id"] >= 1
    pd.testing.assert_frame_equal(committed(out), reference)
    client.close()
    wait_for(lambda: rest(fault_cluster, "/overview")[1]["taskmanagers"] == 2, 30, "two TaskManagers again")


@pytest.mark.cluster(taskmanagers=2, slots=2, **FAULTS)  # own_cluster: a fresh one, checked after the test
def test_a_checkpoint_with_corrupt_or_missing_metadata_is_skipped_on_recovery(own_cluster, tmp_path):
    out = str(tmp_path / "out")
    client, handle = run_job(own_cluster, "hashmap", out, **{"state.checkpoints.num-retained": 3})
    job_dir = own_cluster.cluster_dir / "checkpoints" / handle.job_id
    wait_for(lambda: len(list(job_dir.glob("chk-*/_metadata"))) >= 3, 60, "three retained checkpoints")
    kill_a_busy_taskmanager(own_cluster, handle.job_id, client)
    # the killed TaskManager acknowledges nothing more, so no checkpoint completes from here on,
    # and the JobManager notices the loss only after heartbeat.timeout: time to break two
    retained = sorted(job_dir.glob("chk-*"), key=lambda d: int(d.name[4:]))
    corrupt, missing, intact = retained[-1], retained[-2], retained[-3]
    (corrupt / "_metadata").write_text('{"format": "streamlab-checkpoint/1", "body": {"trunc')
    (missing / "_metadata").unlink()
    wait_for(lambda: handle.job_status().attempt == 2, 30, "the restart")
    handle.wait(180)
    log = (own_cluster.cluster_dir / "log" / "jobmanager.log").read_text()
    assert f"checkpoint {corrupt.name[4:]} skipped for recovery: {corrupt}/_metadata is not valid JSON" in log
    assert f"checkpoint {missing.name[4:]} skipped for recovery: {missing}/_metadata is missing" in log
    restored = rest(own_cluster, f"/jobs/{handle.job_id}/checkpoints")[1]["latest"]["restored"]
    assert restored["id"] == int(intact.name[4:])
    # restored from an older checkpoint than the last committed one: nothing is lost (what the
    # discarded checkpoints had committed is written again: exactly-once needs intact checkpoints)
    assert set(committed(out)["seq"]) == set(range(N))
    client.close()
    wait_for(lambda: rest(own_cluster, "/overview")[1]["taskmanagers"] == 2, 30, "two TaskManagers again")


@pytest.mark.cluster(taskmanagers=2, slots=2, **FAULTS)
def test_the_collect_sink_never_shows_a_row_twice_across_a_restart(own_cluster):
    env = StreamEnvironment(parallelism=2, cluster=own_cluster.cluster_dir, config={
        "execution.checkpointing.interval": "300 ms", "restart-strategy.fixed-delay.delay": "200 ms"})
    (env.from_generator(events, count=20_000, rate=4_000, batch_size=BATCH, split_size=SPLIT)
        .key_by("k").process(running_total).collect())
    client = JobClient(own_cluster.info)
    handle = env.execute_async("collect exactly once", client=client)
    wait_for(lambda: handle.row_count() > 4_000, 60, "rows collected")
    kill_a_busy_taskmanager(own_cluster, handle.job_id, client)
    result = handle.wait(120).to_pandas().sort_values("seq").reset_index(drop=True)
    assert handle.job_status().attempt == 2
    expected_rows = expected()
    expected_rows = expected_rows[expected_rows.seq < 20_000].reset_index(drop=True)
    pd.testing.assert_frame_equal(result[["k", "seq", "total"]], expected_rows, check_dtype=False)
    client.close()
    wait_for(lambda: rest(own_cluster, "/overview")[1]["taskmanagers"] == 2, 30, "two TaskManagers again")
