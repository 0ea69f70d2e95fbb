"""Event-time windows on streamlab beside the same windows in Flink SQL (PyFlink 2.3), one after the other.

Shapes (2 cores, parallelism 2, N rows, default 10M; event time ts = seq / 100 ms, i.e. 100,000
events per second of event time, in order within each source subtask, watermark: 200 ms bounded
out-of-orderness), each into a discarding sink:
 1. tumbling 1 s: k = seq % 10000, v = seq % 1000; COUNT and SUM of v per k and window;
 2. sliding 10 s / 1 s: the same per sliding window;
 3. highest bid (Nexmark q7's inner query): bids auction, price from seq; the highest price per
    tumbling 10 s window (one window for all bids);
 4. hot items (Nexmark q5's shape): bids per auction per 10 s window sliding by 2 s, then the most
    bids of any auction per window.
streamlab runs each shape with a .sql step before the window (each batch's window partials are
computed inside the Spark plan and only merged into window state), and shapes 1 and 2 also as a
user of the DataStream API writes them, with no .sql step ("(API)": the partials by Arrow, a
sliding window's by panes), beside the same Flink shape. Then the latency of shape 1 at
half its throughput: a rate-limited generator whose rows carry the wall clock as their event
time; each window result's arrival at the bench's own result socket minus (window end + the 200 ms
bound), i.e. how long after the watermark could first have passed the window its row left the sink.

PyFlink: bench/windows_flink.py in PyFlink's own venv (bench/peers.py makes it when missing).

    .venv/bin/python bench/windows.py [--quick | --rows N] [--latency-seconds S] [--pyflink-venv DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from peers import pyflink_rows_per_s  # noqa: E402  (bench/peers.py: PyFlink's venv and its scripts)
from throughput import job_latency_ms, job_rows_per_s, warm_every_taskmanager  # noqa: E402

from kernel_runtime import JobClient, LocalCluster, StreamEnvironment  # noqa: E402
from kernel_runtime.api import (DiscardingSink, Duration, SlidingEventTimeWindows, Time,  # noqa: E402
                                TumblingEventTimeWindows, WatermarkStrategy)

PARALLELISM = 2
KEYS = 10_000
BOUND_MS = 200
JOB_TIMEOUT_S = 3600
SHAPES = ("tumbling 1 s", "sliding 10 s / 1 s", "highest bid", "hot items")
# streamlab's shapes with no .sql step, and the Flink shape each is set beside
API_SHAPES = {"tumbling 1 s (API)": "tumbling 1 s", "sliding 10 s / 1 s (API)": "sliding 10 s / 1 s"}
WARMUP_ROWS = 200_000  # each shape's warm-up job on PyFlink (bench/windows_flink.py)


def events(seq):
    return pd.DataFrame({"k": seq % KEYS, "v": seq % 1_000, "ts": seq // 100})


def bids(seq):
    """Nexmark-like bids, deterministic: a quarter of them on 25 hot auctions."""
    return pd.DataFrame({"auction": np.where(seq % 4 == 0, seq % 100, seq % 10_000),
                         "price": 1 + seq * 7919 % 100_000, "ts": seq // 100})


def live_events(seq):
    """events() at the wall clock: the event time is when the generator makes the row."""
    return pd.DataFrame({"k": seq % KEYS, "v": seq % 1_000,
                         "ts": np.full(len(seq), time.time_ns() // 1_000_000, dtype=np.int64)})


def watermarks() -> WatermarkStrategy:
    return WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(BOUND_MS)).with_timestamp_column("ts")


def epoch_seconds(column: pd.Series) -> np.ndarray:
    if pd.api.types.is_integer_dtype(column):
        return column.to_numpy() / 1000
    if getattr(column.dt, "tz", None) is not None:
        column = column.dt.tz_convert(None)
    return column.to_numpy("datetime64[ms]").astype(np.int64) / 1000


def due_at(result: pd.DataFrame) -> pd.DataFrame:
    """A window result with ``ts``, the moment its window could first fire (end + bound), in
    epoch seconds: what ArrivalStamps subtracts from its arrival."""
    return result.assign(ts=epoch_seconds(result["window_end"]) + BOUND_MS / 1000)


# ---------------------------------------------------------------------- streamlab
def pipeline(env: StreamEnvironment, shape: str, n: int):
    if shape.startswith(("tumbling 1 s", "sliding 10 s / 1 s")):
        assigner = (TumblingEventTimeWindows.of(Time.seconds(1)) if shape.startswith("tumbling")
                    else SlidingEventTimeWindows.of(Time.seconds(10), Time.seconds(1)))
        rows = env.from_generator(events, count=n, watermark_strategy=watermarks())
        if shape not in API_SHAPES:
            rows = rows.sql("SELECT k, v, ts FROM input")
        return rows.key_by("k").window(assigner).aggregate(n=("v", "count"), s=("v", "sum"))
    rows = env.from_generator(bids, count=n, watermark_strategy=watermarks())
    if shape == "highest bid":
        return (rows.sql("SELECT price, ts FROM input")
                .window_all(TumblingEventTimeWindows.of(Time.seconds(10))).aggregate(m=("price", "max")))
    per_auction = (rows.sql("SELECT auction, ts FROM input")
                   .key_by("auction").window(SlidingEventTimeWindows.of(Time.seconds(10), Time.seconds(2))).count())
    # the most per window: a window over the counts' window ends (one 2 s slide holds one end)
    return (per_auction
            .assign_timestamps_and_watermarks(
                WatermarkStrategy.for_monotonous_timestamps().with_timestamp_column("window_end"))
            .window_all(TumblingEventTimeWindows.of(Time.seconds(2))).aggregate(m=("count", "max")))


def streamlab_rows_per_s(cluster, client, shape: str, n: int) -> float:
    env = StreamEnvironment(parallelism=PARALLELISM, cluster=cluster.cluster_dir)
    pipeline(env, shape, n).sink_to(DiscardingSink())
    return job_rows_per_s(client, env, f"windows {shape} {n}", n, timeout=JOB_TIMEOUT_S)


def streamlab_latency_ms(cluster, client, rate: int, seconds: float) -> np.ndarray:
    env = StreamEnvironment(parallelism=PARALLELISM, cluster=cluster.cluster_dir)
    (env.from_generator(live_events, rate=rate, watermark_strategy=watermarks())
        .sql("SELECT k, v, ts FROM input")
        .key_by("k").window(TumblingEventTimeWindows.of(Time.seconds(1))).aggregate(n=("v", "count"), s=("v", "sum"))
        .map_batches(due_at, name="due at").collect())
    return job_latency_ms(cluster, client, env, seconds)


def run_streamlab(args) -> dict:
    directory = Path(tempfile.mkdtemp(prefix="streamlab-windows-"))
    out: dict = {}
    with LocalCluster(directory, taskmanagers=2, slots=2, embedded=True) as cluster:
        client = JobClient(cluster.info)
        warm_every_taskmanager(cluster, client)
        print(f"streamlab {metadata.version('streamlab')}: embedded LocalCluster, 2 TaskManagers x 2 slots, "
              f"parallelism {PARALLELISM}, pyspark {metadata.version('pyspark')}, default settings; "
              "rows/s = N / (FINISHED - RUNNING) of the job", flush=True)
        for shape in (*SHAPES, *API_SHAPES):
            out[shape] = streamlab_rows_per_s(cluster, client, shape, args.rows)
            print(f"  streamlab {shape}: {out[shape]:,.0f} rows/s", flush=True)
        out["rate"] = max(1, int(out["tumbling 1 s"] / 2))
        out["latency"] = streamlab_latency_ms(cluster, client, out["rate"], args.latency_seconds)
        client.close()
    return out


# ---------------------------------------------------------------------- PyFlink
def run_pyflink(args) -> dict:
    return pyflink_rows_per_s(args.pyflink_venv, "windows_flink.py", args.rows, WARMUP_ROWS,
                              "datagen sequence -> TUMBLE/HOP window TVF -> blackhole")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows per throughput job (default 10M)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1M rows, 10 s of latency")
    parser.add_argument("--latency-seconds", type=float, help="seconds of the latency run (default 30, quick 10)")
    parser.add_argument("--pyflink-venv", type=Path, default=Path.home() / ".cache/streamlab/pyflink-venv",
                        help="PyFlink's own venv, created when missing (default ~/.cache/streamlab/pyflink-venv)")
    args = parser.parse_args()
    if args.quick:
        args.rows = 1_000_000
    args.latency_seconds = args.latency_seconds or (10 if args.quick else 30)
    if args.rows < 1:
        parser.error(f"--rows must be a positive integer, got {args.rows}")
    if args.latency_seconds <= 0:
        parser.error(f"--latency-seconds must be positive, got {args.latency_seconds}")
    print(f"{os.cpu_count()} cores, parallelism {PARALLELISM}, {args.rows:,} rows per throughput job "
          f"({args.rows / 100_000:g} s of event time), {args.latency_seconds:g} s of latency run; other work on "
          "the machine shares the cores, so the figures are indicative", flush=True)

    ours = run_streamlab(args)
    flink = run_pyflink(args)

    print()
    print(f"{'shape':<26} {'streamlab rows/s':>17} {'PyFlink rows/s':>15} {'streamlab/PyFlink':>18}")
    for shape in (*SHAPES, *API_SHAPES):
        theirs = flink[API_SHAPES.get(shape, shape)]
        print(f"{shape:<26} {ours[shape]:>17,.0f} {theirs:>15,.0f} {ours[shape] / theirs:>18.2f}")
    lat = ours["latency"]
    print()
    print(f"latency of tumbling 1 s at {ours['rate']:,} rows/s (half its throughput above): window result "
          f"leaving the sink - (window end + {BOUND_MS} ms bound), over {len(lat):,} result rows (first fifth "
          "of the run dropped)")
    if len(lat):
        p50, p90, p99 = np.percentile(lat, [50, 90, 99])
        print(f"  p50 {p50:,.0f} ms   p90 {p90:,.0f} ms   p99 {p99:,.0f} ms   max {lat.max():,.0f} ms")
    else:
        print("  no window result reached the sink during the run")


if __name__ == "__main__":
    main()
