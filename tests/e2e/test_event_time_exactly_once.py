"""Exactly-once event time through TaskManager kills: a windowed aggregation and an interval
join, each written with the DataStream API and in SQL (GROUP BY window(...), JOIN ... ON ...
BETWEEN), and a deduplication (each (k, v) once), from replayable generators into the
transactional Parquet sink, SIGKILLed at random.

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

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.api import Duration, FileSink, Time, TumblingEventTimeWindows, WatermarkStrategy
from tests.conftest import rest, wait_for
from tests.e2e.test_exactly_once import fault_cluster, kill_repeatedly  # noqa: F401 (a fixture)

# the reference run starts the TaskManagers' Spark, and each of the five kills waits for a
# replacement TaskManager to start its own (about 10 s each here): two minutes is not a hang
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

N, RATE, BATCH = 16_000, 2_000, 200
SPLIT = 16 * BATCH
KILLS = 5


def orders(seq):
    return pd.DataFrame({"k": seq % 5, "v": seq % 97, "ts": pd.to_datetime(seq * 10, unit="ms"), "seq": seq})


def payments(seq):
    return pd.DataFrame({"k": seq % 5, "amount": seq % 13, "pts": pd.to_datetime(seq * 10 + 3, unit="ms"), "pseq": seq})


SQL_WINDOWS = ("SELECT k, window.start AS window_start, window.end AS window_end, count(v) AS n, sum(v) AS total "
               "FROM input GROUP BY window(ts, '1 second'), k")
SQL_JOINS = ("SELECT o.k, o.v, o.ts, o.seq, p.amount, p.pts, p.pseq FROM orders o JOIN payments p ON o.k = p.k "
             "AND p.pts BETWEEN o.ts - INTERVAL 100 MILLISECONDS AND o.ts + INTERVAL 100 MILLISECONDS")
OUTPUTS = ("windows", "joins", "sql-windows", "sql-joins", "firsts")


def strategy(column: str) -> WatermarkStrategy:
    return WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(50)).with_timestamp_column(column)


def run_job(local, backend: str, out: str):
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
        .sink_to(FileSink.parquet(os.path.join(out, "windows"), rows_per_file=200)))
    (left.key_by("k").interval_join(right.key_by("k")).between(Time.milliseconds(-100), Time.milliseconds(100))
        .process().sink_to(FileSink.parquet(os.path.join(out, "joins"), rows_per_file=4_000)))
    left.sql(SQL_WINDOWS, name="sql windows").sink_to(FileSink.parquet(os.path.join(out, "sql-windows"),
                                                                       rows_per_file=200))
    (left.drop_duplicates(["k", "v"], name="first per k, v").map_batches(lambda df: df[["k", "v"]], name="k, v")
        .sink_to(FileSink.parquet(os.path.join(out, "firsts"), rows_per_file=200)))
    env.create_temporary_view("orders", left)
    env.create_temporary_view("payments", right)
    env.sql_query(SQL_JOINS, name="sql joins").sink_to(FileSink.parquet(os.path.join(out, "sql-joins"),
                                                                        rows_per_file=4_000))
    client = JobClient(local.info)
    return client, env.execute_async(f"event time exactly once ({backend})", client=client)


def committed(out: str, order: list[str]) -> pd.DataFrame:
    files = sorted(glob.glob(os.path.join(out, "part-*.parquet")))
    frame = pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)
    for column in frame.columns:  # Spark's window times are instants (UTC, in µs); the generators' are naive ms
        if isinstance(frame[column].dtype, pd.DatetimeTZDtype):
            frame[column] = frame[column].dt.tz_convert("UTC").dt.tz_localize(None)
        if pd.api.types.is_datetime64_any_dtype(frame[column]):
            frame[column] = frame[column].astype("datetime64[ms]")
    return frame.sort_values(order).reset_index(drop=True)


def expected_windows() -> pd.DataFrame:
    frame = orders(np.arange(N, dtype=np.int64))
    frame["start"] = frame.seq * 10 - frame.seq * 10 % 1_000
    out = frame.groupby(["k", "start"]).agg(n=("v", "count"), total=("v", "sum")).reset_index()
    out["window_start"] = pd.to_datetime(out.start, unit="ms")
    out["window_end"] = pd.to_datetime(out.start + 1_000, unit="ms")
    return out[["k", "window_start", "window_end", "n", "total"]]


def expected_joins() -> pd.DataFrame:
    pairs = orders(np.arange(N, dtype=np.int64)).merge(payments(np.arange(N, dtype=np.int64)), on="k")
    bound = pd.Timedelta(100, "ms")
    return pairs[(pairs.pts >= pairs.ts - bound) & (pairs.pts <= pairs.ts + bound)]


WINDOW_ORDER, JOIN_ORDER = ["k", "window_start"], ["seq", "pseq"]


def outputs(out: str) -> dict[str, pd.DataFrame]:
    """Each sink's committed rows: the windows' and the joins' columns, in order."""
    found = {}
    for name in OUTPUTS:
        if name == "firsts":  # which row of a (k, v) came first differs between runs: the pair does not
            found[name] = committed(os.path.join(out, name), ["k", "v"])[["k", "v"]]
        elif "windows" in name:
            found[name] = committed(os.path.join(out, name), WINDOW_ORDER)[["k", "window_start", "window_end", "n",
                                                                            "total"]]
        else:
            found[name] = committed(os.path.join(out, name), JOIN_ORDER)[["k", "v", "ts", "seq", "amount", "pts",
                                                                         "pseq"]]
    return found


@pytest.fixture(scope="module")
def reference(fault_cluster, tmp_path_factory):  # noqa: F811 (the imported fixture)
    out = str(tmp_path_factory.mktemp("reference"))
    client, handle = run_job(fault_cluster, "hashmap", out)
    handle.wait(180)
    client.close()
    found = outputs(out)
    windows = expected_windows().sort_values(WINDOW_ORDER).reset_index(drop=True)
    joins = expected_joins().sort_values(JOIN_ORDER).reset_index(drop=True)
    firsts = orders(np.arange(N, dtype=np.int64))[["k", "v"]].drop_duplicates().sort_values(["k", "v"])
    for name, frame in found.items():  # the API's and SQL's alike
        expected = firsts.reset_index(drop=True) if name == "firsts" else windows if "windows" in name \
            else joins[frame.columns]
        pd.testing.assert_frame_equal(frame, expected, check_dtype=False, obj=name)
    return found


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_windows_and_joins_are_exactly_once_through_taskmanager_kills(fault_cluster, reference, backend,  # noqa: F811
                                                                      tmp_path):
    random.seed(f"event-time-kills-{backend}")
    client, handle = run_job(fault_cluster, backend, str(tmp_path))
    kill_repeatedly(fault_cluster, handle, client, KILLS, longest_pause=1.2)
    handle.wait(240)
    status = handle.job_status()
    assert status.state == "FINISHED" and status.attempt >= KILLS + 1
    assert rest(fault_cluster, f"/jobs/{handle.job_id}/checkpoints")[1]["latest"]["restored"]["id"] >= 1
    for name, frame in outputs(str(tmp_path)).items():
        pd.testing.assert_frame_equal(frame, reference[name], obj=name)
    client.close()
    wait_for(lambda: rest(fault_cluster, "/overview")[1]["taskmanagers"] == 2, 30, "two TaskManagers again")
