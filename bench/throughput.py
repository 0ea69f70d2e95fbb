"""Throughput and latency of a Spark streaming pipeline on a local 2 x 2 cluster.

Pipeline: generator -> .sql filter/projection -> key_by -> keyed count -> collect.

* records/s for batch sizes 1k, 10k, 100k (generator batches and execution.batch-size), over the
  job's RUNNING time, beside the same query (filter/projection + GROUP BY count) run as a plain
  Spark batch job over the same rows in this process;
* end-to-end latency percentiles at a fixed input rate: every row carries its creation time and
  the bench's own result socket stamps its arrival. The count is replaced there by a keyed
  pass-through (count rows do not carry the time of the rows behind them); the path is otherwise
  the same: generator -> Spark SQL -> hash exchange -> keyed task -> collect. Baseline: one
  batch-worth of rows through the same query as a Spark batch job (the floor of a Spark hop).

    .venv/bin/python bench/throughput.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.protocol import messages as m  # noqa: E402
from cluster.protocol.codec import Codec  # noqa: E402
from cluster.protocol.endpoint import bound_address, make_socket  # noqa: E402
from cluster.protocol.serde import ipc_to_table  # noqa: E402
from kernel_runtime import JobClient, LocalCluster, StreamEnvironment  # noqa: E402

KEYS = 1_000
QUERY = "SELECT k, v FROM input WHERE v % 10 < 8"


def rows(seq):
    return pd.DataFrame({"k": seq % KEYS, "v": seq})


def timed_rows(seq):
    return pd.DataFrame({"k": seq % KEYS, "v": seq, "ts": np.full(len(seq), time.time())})


def spark_session():
    from pyspark.sql import SparkSession
    from cluster.conf import TaskConfig
    from cluster.operators.spark import spark_conf
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder
    for key, value in spark_conf(TaskConfig.from_dict({})).items():
        builder = builder.config(key, value)
    return builder.appName("bench-baseline").getOrCreate()


def baseline_rows_per_s(spark, n: int) -> float:
    table = pa.Table.from_pandas(rows(np.arange(n, dtype=np.int64)), preserve_index=False)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        spark.createDataFrame(table).createOrReplaceTempView("input")
        spark.sql(QUERY).groupBy("k").count().toArrow()
        best = min(best, time.perf_counter() - started)
    return n / best


def streaming_rows_per_s(cluster, client, batch_size: int, n: int) -> float:
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir,
                            config={"execution.batch-size": batch_size})
    (env.from_generator(rows, count=n, batch_size=batch_size).sql(QUERY)
        .key_by("k").count().collect())
    return job_rows_per_s(client, env, f"throughput {batch_size}", n)


def job_rows_per_s(client, env, name: str, n: int, timeout: float = 600) -> float:
    """Run env's bounded job of n input rows to its end: rows/s over the job's RUNNING time."""
    handle = env.execute_async(name, client=client)
    handle.wait(timeout)
    ts = client.job_details(handle.job_id)["timestamps"]
    return n / ((ts["FINISHED"] - ts["RUNNING"]) / 1000)


class ArrivalStamps:
    """A result socket of the bench's own: it stamps each batch as it arrives."""

    def __init__(self, secret: bytes):
        self.codec = Codec(secret)
        self.sock = make_socket(zmq.Context.instance(), zmq.ROUTER)
        self.sock.bind("tcp://127.0.0.1:0")
        self.address = bound_address(self.sock)
        self.latencies: list[np.ndarray] = []
        self.running = True
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while self.running:
            if not self.sock.poll(100):
                continue
            frames = self.sock.recv_multipart(copy=False)[1:]
            arrived = time.time()
            msg, _, payload = self.codec.decode(frames)
            if isinstance(msg, m.CollectBatch):
                self.latencies.append(arrived - ipc_to_table(payload[0].buffer)["ts"].to_numpy())


def latency_ms(cluster, client, rate: int, seconds: float) -> np.ndarray:
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(timed_rows, rate=rate, batch_size=rate // 10).sql("SELECT k, v, ts FROM input WHERE v % 10 < 8")
        .key_by("k").map_batches(lambda df: df, name="keyed pass-through").collect())
    return job_latency_ms(cluster, client, env, seconds)


def job_latency_ms(cluster, client, env, seconds: float) -> np.ndarray:
    """Run env's job (rows with a creation time ``ts``, ending in collect()) for ``seconds``, then
    cancel it: each collected row's arrival minus its ts, in ms, without the first fifth (warm-up)."""
    stamps = ArrivalStamps(cluster.info.secret)
    reply = client.rpc.request(m.SubmitJob(env.get_job_graph("latency").to_dict(), stamps.address),
                               expect=m.JobSubmitted)
    time.sleep(seconds)
    client.cancel(reply.job_id)
    stamps.running = False
    stamps.thread.join()
    lat = np.concatenate(stamps.latencies) * 1000
    return lat[len(lat) // 5:]  # drop the first fifth: warm-up


def baseline_latency_ms(spark, batch_rows: int) -> float:
    table = pa.Table.from_pandas(timed_rows(np.arange(batch_rows, dtype=np.int64)), preserve_index=False)
    times = []
    for _ in range(7):
        started = time.perf_counter()
        spark.createDataFrame(table).createOrReplaceTempView("input")
        spark.sql("SELECT k, v, ts FROM input WHERE v % 10 < 8").toArrow()
        times.append(time.perf_counter() - started)
    return float(np.median(times) * 1000)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rows, for a smoke run")
    args = parser.parse_args()
    batches_per_run = 20 if args.quick else 60
    directory = Path(tempfile.mkdtemp(prefix="streamlab-bench-"))
    with LocalCluster(directory, taskmanagers=2, slots=2, embedded=True) as cluster:
        client = JobClient(cluster.info)
        spark = spark_session()
        streaming_rows_per_s(cluster, client, 1_000, 20_000)  # warm: every TaskManager's Spark is up
        print(f"pipeline: generator -> .sql({QUERY!r}) -> key_by(k) -> count -> collect; "
              f"2 TaskManagers x 2 slots, parallelism 2, {os.cpu_count()} cores")
        print(f"{'batch':>8} {'rows':>10} {'streamlab rows/s':>17} {'spark batch rows/s':>19} {'ratio':>6}")
        for batch_size in (1_000, 10_000, 100_000):
            n = batch_size * batches_per_run
            ours = streaming_rows_per_s(cluster, client, batch_size, n)
            base = baseline_rows_per_s(spark, n)
            print(f"{batch_size:>8} {n:>10} {ours:>17,.0f} {base:>19,.0f} {ours / base:>6.2f}")
        rate = 20_000
        lat = latency_ms(cluster, client, rate, 10 if args.quick else 25)
        floor = baseline_latency_ms(spark, rate // 10)
        p50, p95, p99 = np.percentile(lat, [50, 95, 99])
        print(f"latency at {rate:,} rows/s ({len(lat):,} rows): p50 {p50:.0f} ms, p95 {p95:.0f} ms, "
              f"p99 {p99:.0f} ms, max {lat.max():.0f} ms; Spark batch job over one {rate // 10}-row "
              f"batch (same query, this process): {floor:.0f} ms")
        spark.stop()
        client.close()


if __name__ == "__main__":
    main()
