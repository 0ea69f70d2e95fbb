"""Throughput and latency of a Spark streaming pipeline on a local 2 x 2 cluster, default settings.

Pipeline: generator -> .sql filter/projection -> key_by -> keyed count -> collect. No batch size
is given anywhere: batching is the runtime's (a Spark job takes what waited while the last ran).

* records/s over the job's RUNNING time, beside the same query (filter/projection + GROUP BY
  count) run as a plain Spark batch job over the same rows in this process;
* end-to-end latency percentiles at fixed input rates (1,000 and 100,000 rows/s, and half of the
  latency pipeline's own maximum, after a run at that rate to warm up, whose figures are printed
  too): every row carries its creation time and the bench's own result
  socket stamps its arrival. The count is replaced there by a keyed pass-through (count rows do
  not carry the time of the rows behind them); the path is otherwise the same: generator -> Spark
  SQL -> hash exchange -> keyed task -> collect. Baseline: a batch of 10 ms worth of rows through
  the same query as a Spark batch job in this process (the floor of a Spark hop).

Before measuring, the cluster is warmed up as bench/peers.py warms every peer: the throughput job
once and the latency pipeline for a run's length, on every slot; the warm-up job's own (cold)
rows/s is printed.

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
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.protocol import messages as m  # noqa: E402
from cluster.protocol.codec import Codec  # noqa: E402
from cluster.protocol.serde import ipc_to_table  # noqa: E402
from cluster.protocol.sockets import bound_address, make_socket  # noqa: E402
from kernel_runtime import JobClient, LocalCluster, StreamEnvironment  # noqa: E402
from kernel_runtime.api import DiscardingSink  # noqa: E402

KEYS = 1_000
QUERY = "SELECT k, v FROM input WHERE v % 10 < 8"


def rows(seq):
    return pd.DataFrame({"k": seq % KEYS, "v": seq})


def timed_rows(seq):
    return pd.DataFrame({"k": seq % KEYS, "v": seq, "ts": np.full(len(seq), time.time())})


def spark_session():
    from pyspark.sql import SparkSession
    from cluster.conf import TaskConfig
    from cluster.spark.runner import spark_conf
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


def streaming_rows_per_s(cluster, client, n: int, parallelism: int = 2) -> float:
    env = StreamEnvironment(parallelism=parallelism, cluster=cluster.cluster_dir)
    env.from_generator(rows, count=n).sql(QUERY).key_by("k").count().collect()
    return job_rows_per_s(client, env, f"throughput {n}", n)


def warm_every_taskmanager(cluster, client) -> None:
    """A small Spark job in every slot: every TaskManager's SparkSession is up (and its JVM start,
    seconds of CPU, over) before anything is measured. Slots fill one TaskManager first, so a job
    of the benchmarks' parallelism alone would warm only one."""
    slots = client.cluster_overview().overview["slots-total"]
    env = StreamEnvironment(parallelism=slots, cluster=cluster.cluster_dir)
    env.from_generator(rows, count=20_000).sql(QUERY).sink_to(DiscardingSink())
    env.execute_async("warm-up", client=client).wait(600)


def job_rows_per_s(client, env, name: str, n: int, timeout: float = 900) -> float:
    """Run env's bounded job of n input rows to its end: rows/s over the job's RUNNING time."""
    handle = env.execute_async(name, client=client)
    handle.wait(timeout)
    return running_rows_per_s(client, handle.job_id, n)


def running_rows_per_s(client, job_id: str, n: int) -> float:
    ts = client.job_details(job_id)["timestamps"]
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

    def submit(self, client, env: StreamEnvironment, name: str) -> str:
        """Submit env's job with its results sent here; its job id."""
        reply = client.rpc.request(m.SubmitJob(env.get_job_graph(name).to_dict(), self.address),
                                   expect=m.JobSubmitted)
        return reply.job_id

    def stop(self) -> np.ndarray:
        """Stop listening: every row's latency so far, in ms."""
        self.running = False
        self.thread.join()
        return np.concatenate(self.latencies) * 1000


LATENCY_QUERY = "SELECT k, v, ts FROM input WHERE v % 10 < 8"


def latency_pipeline(cluster, rate: Optional[int] = None, count: Optional[int] = None,
                     parallelism: int = 2) -> StreamEnvironment:
    env = StreamEnvironment(parallelism=parallelism, cluster=cluster.cluster_dir)
    (env.from_generator(timed_rows, rate=rate, count=count).sql(LATENCY_QUERY)
        .key_by("k").map_batches(lambda df: df, name="keyed pass-through").collect())
    return env


def latency_ms(cluster, client, rate: int, seconds: float, parallelism: int = 2) -> np.ndarray:
    return job_latency_ms(cluster, client, latency_pipeline(cluster, rate=rate, parallelism=parallelism), seconds)


def warm_up(cluster, client, n: int, seconds: float) -> float:
    """What bench/peers.py does for every peer, as JVM benchmarks do: the throughput job once and
    the latency pipeline for ``seconds``, on every slot (both TaskManagers' JVMs). A fresh JVM runs
    Spark's code interpreted at first, and its planning takes a few hundred jobs to compile.
    The throughput job's rows/s (cold: a fresh JVM's first)."""
    slots = client.cluster_overview().overview["slots-total"]
    cold = streaming_rows_per_s(cluster, client, n, slots)
    latency_ms(cluster, client, 100_000, seconds, slots)
    return cold


def job_latency_ms(cluster, client, env, seconds: float, before_cancel=None) -> np.ndarray:
    """Run env's job (rows with a creation time ``ts``, ending in collect()) for ``seconds``, then
    cancel it: each collected row's arrival minus its ts, in ms, without the first fifth (warm-up).
    ``before_cancel(job_id)``: called at the end of the run, while the job still runs."""
    stamps = ArrivalStamps(cluster.info.secret)
    job_id = stamps.submit(client, env, "latency")
    time.sleep(seconds)
    if before_cancel is not None:
        before_cancel(job_id)
    client.cancel(job_id)
    lat = stamps.stop()
    return lat[len(lat) // 5:]


def latency_max_rows_per_s(cluster, client, n: int) -> float:
    """The latency pipeline as fast as it goes (its rows to this process too)."""
    stamps = ArrivalStamps(cluster.info.secret)
    job_id = stamps.submit(client, latency_pipeline(cluster, count=n), "latency pipeline, unlimited")
    _wait_finished(client, job_id)
    stamps.stop()
    return running_rows_per_s(client, job_id, n)


def _wait_finished(client, job_id: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while client.job_details(job_id)["state"] not in ("FINISHED", "FAILED", "CANCELED"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} did not end in {timeout} s")
        time.sleep(0.2)


def baseline_latency_ms(spark, batch_rows: int) -> float:
    table = pa.Table.from_pandas(timed_rows(np.arange(batch_rows, dtype=np.int64)), preserve_index=False)
    times = []
    for _ in range(7):
        started = time.perf_counter()
        spark.createDataFrame(table).createOrReplaceTempView("input")
        spark.sql(LATENCY_QUERY).toArrow()
        times.append(time.perf_counter() - started)
    return float(np.median(times) * 1000)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rows, for a smoke run")
    args = parser.parse_args()
    n = 500_000 if args.quick else 5_000_000
    seconds = 10 if args.quick else 25
    directory = Path(tempfile.mkdtemp(prefix="streamlab-bench-"))
    results = []
    with LocalCluster(directory, taskmanagers=2, slots=2, embedded=True) as cluster:
        client = JobClient(cluster.info)
        warm_every_taskmanager(cluster, client)
        print(f"pipeline: generator -> .sql({QUERY!r}) -> key_by(k) -> count -> collect; "
              f"2 TaskManagers x 2 slots, parallelism 2, {os.cpu_count()} cores, default settings")
        cold = warm_up(cluster, client, n, seconds)
        print(f"warm-up (as bench/peers.py): the throughput job on every slot, cold, {cold:,.0f} rows/s; "
              f"the latency pipeline at 100,000 rows/s for {seconds} s", flush=True)
        ours = streaming_rows_per_s(cluster, client, n)
        most = latency_max_rows_per_s(cluster, client, n)
        for rate in (1_000, 100_000):
            results.append((rate, latency_ms(cluster, client, rate, seconds)))
        # Warmed at its own rate first, as every point is: the warm-up at 100,000 rows/s runs its
        # small batches in the driver without a Spark job (spark_local), and the JVM compiles the
        # code of rounds this size, which are jobs, over their first tens of seconds
        half = int(most / 2)
        warming = latency_ms(cluster, client, half, seconds)
        results.append((half, latency_ms(cluster, client, half, seconds)))
        client.close()
    spark = spark_session()  # after the cluster: the baselines do not share the cores with it
    base = baseline_rows_per_s(spark, n)
    print(f"{'rows':>10} {'streamlab rows/s':>17} {'spark batch rows/s':>19} {'ratio':>6}")
    print(f"{n:>10} {ours:>17,.0f} {base:>19,.0f} {ours / base:>6.2f}")
    print(f"latency pipeline (generator -> .sql({LATENCY_QUERY!r}) -> key_by -> pass-through -> collect): "
          f"at most {most:,.0f} rows/s")
    print(f"{'rate rows/s':>12} {'rows seen':>10} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'max ms':>7} "
          f"{'Spark job over 10 ms of rows':>29}")
    for rate, lat in results:
        p50, p90, p99 = np.percentile(lat, [50, 90, 99])
        floor = baseline_latency_ms(spark, max(1, rate // 100))
        print(f"{rate:>12,} {len(lat):>10,} {p50:>7.0f} {p90:>7.0f} {p99:>7.0f} {lat.max():>7.0f} {floor:>26.0f} ms")
    p50, p90, p99 = np.percentile(warming, [50, 90, 99])
    print(f"the warm-up run at {half:,} rows/s before it (not counted): p50/p90/p99 {p50:.0f}/{p90:.0f}/{p99:.0f} ms")
    spark.stop()


if __name__ == "__main__":
    main()
