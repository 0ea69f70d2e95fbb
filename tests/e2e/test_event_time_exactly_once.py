"""Exactly-once event time through TaskManager kills: a windowed aggregation and an interval
join, from replayable generators into the transactional Parquet sink, SIGKILLed at random.

Each source subtask reads its splits in order, so its event time only grows and no record is ever
late (the bound covers nothing, the watermark of each channel stays behind its rows): the windows
and the joined pairs are a function of the data alone, and the committed output after the kills
must equal the failure-free run's (which equals pandas) row for row. Window contents, timers and
watermarks come back from the checkpoints; rows after a checkpoint are replayed.
"""
from __future__ import annotations

import glob
import os
import random
import time

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.api import Duration, FileSink, Time, TumblingEventTimeWindows, WatermarkStrategy
from tests.conftest import rest, wait_for
from tests.e2e.test_exactly_once import fault_cluster, kill_a_busy_taskmanager  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

N, RATE, BATCH = 16_000, 2_000, 200
SPLIT = 16 * BATCH
KILLS = 5


def orders(seq):
    return pd.DataFrame({"k": seq % 5, "v": seq % 97, "ts": seq * 10, "seq": seq})


def payments(seq):
    return pd.DataFrame({"k": seq % 5, "amount": seq % 13, "pts": seq * 10 + 3, "pseq": seq})


def strategy(column: str) -> WatermarkStrategy:
    return WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(50)).with_timestamp_column(column)


def run_job(local, backend: str, windows_out: str, joins_out: str):
    env = StreamEnvironment(parallelism=2, cluster=local.cluster_dir, config={
        "execution.checkpointing.interval": "500 ms", "state.backend.type": backend,
        "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 100,
        "restart-strategy.fixed-delay.delay": "200 ms"})
    left = env.from_generator(orders, count=N, rate=RATE, batch_size=BATCH, split_size=SPLIT, name="orders",
                              watermark_strategy=strategy("ts"))
    right = env.from_generator(payments, count=N, rate=RATE, batch_size=BATCH, split_size=SPLIT, name="payments",
                               watermark_strategy=strategy("pts"))
    (left.key_by("k").window(TumblingEventTimeWindows.of(Time.seconds(1)))
        .aggregate(n=("v", "count"), total=("v", "sum"))
        .sink_to(FileSink.parquet(windows_out, rows_per_file=200)))
    (left.key_by("k").interval_join(right.key_by("k")).between(Time.milliseconds(-100), Time.milliseconds(100))
        .process().sink_to(FileSink.parquet(joins_out, rows_per_file=4_000)))
    client = JobClient(local.info)
    return client, env.execute_async(f"event time exactly once ({backend})", client=client)


def committed(out: str, order: list[str]) -> pd.DataFrame:
    files = sorted(glob.glob(os.path.join(out, "part-*.parquet")))
    frame = pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)
    return frame.sort_values(order).reset_index(drop=True)


def expected_windows() -> pd.DataFrame:
    frame = orders(np.arange(N, dtype=np.int64))
    frame["start"] = frame.ts - frame.ts % 1_000
    out = frame.groupby(["k", "start"]).agg(n=("v", "count"), total=("v", "sum")).reset_index()
    out["window_start"] = pd.to_datetime(out.start, unit="ms")
    out["window_end"] = pd.to_datetime(out.start + 1_000, unit="ms")
    return out[["k", "window_start", "window_end", "n", "total"]]


def expected_joins() -> pd.DataFrame:
    pairs = orders(np.arange(N, dtype=np.int64)).merge(payments(np.arange(N, dtype=np.int64)), on="k")
    return pairs[(pairs.pts >= pairs.ts - 100) & (pairs.pts <= pairs.ts + 100)]


WINDOW_ORDER, JOIN_ORDER = ["k", "window_start"], ["seq", "pseq"]


def outputs(windows_out: str, joins_out: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    windows = committed(windows_out, WINDOW_ORDER)[["k", "window_start", "window_end", "n", "total"]]
    joins = committed(joins_out, JOIN_ORDER)[["k", "v", "ts", "seq", "amount", "pts", "pseq"]]
    return windows, joins


@pytest.fixture(scope="module")
def reference(fault_cluster, tmp_path_factory):  # noqa: F811 (the imported fixture)
    windows_out, joins_out = (str(tmp_path_factory.mktemp(n)) for n in ("ref-windows", "ref-joins"))
    client, handle = run_job(fault_cluster, "hashmap", windows_out, joins_out)
    handle.wait(180)
    client.close()
    windows, joins = outputs(windows_out, joins_out)
    pd.testing.assert_frame_equal(windows, expected_windows().sort_values(WINDOW_ORDER).reset_index(drop=True),
                                  check_dtype=False)
    pd.testing.assert_frame_equal(joins, expected_joins().sort_values(JOIN_ORDER).reset_index(drop=True)[
        joins.columns], check_dtype=False)
    return windows, joins


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_windows_and_joins_are_exactly_once_through_taskmanager_kills(fault_cluster, reference, backend,  # noqa: F811
                                                                      tmp_path):
    random.seed(f"event-time-kills-{backend}")
    windows_out, joins_out = str(tmp_path / "windows"), str(tmp_path / "joins")
    client, handle = run_job(fault_cluster, backend, windows_out, joins_out)
    kills = 0
    while kills < KILLS:
        wait_for(lambda: (s := handle.job_status()).state == "RUNNING" and s.attempt == kills + 1 and all(
            t["status"] == "RUNNING" for t in client.job_details(handle.job_id)["subtasks"]), 60,
            f"attempt {kills + 1} running")
        time.sleep(random.uniform(0.3, 1.2))
        assert handle.status == "RUNNING", f"the job ended after only {kills} kills; make it longer"
        kill_a_busy_taskmanager(fault_cluster, handle.job_id, client)
        kills += 1
    handle.wait(240)
    status = handle.job_status()
    assert status.state == "FINISHED" and status.attempt >= KILLS + 1
    assert rest(fault_cluster, f"/jobs/{handle.job_id}/checkpoints")[1]["latest"]["restored"]["id"] >= 1
    windows, joins = outputs(windows_out, joins_out)
    pd.testing.assert_frame_equal(windows, reference[0])
    pd.testing.assert_frame_equal(joins, reference[1])
    client.close()
    wait_for(lambda: rest(fault_cluster, "/overview")[1]["taskmanagers"] == 2, 30, "two TaskManagers again")
