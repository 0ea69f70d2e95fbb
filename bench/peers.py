"""streamlab beside its peers, PyFlink (Flink SQL) and Spark Structured Streaming, in one run.

The peers run one after the other, never at once, each with 2 cores and parallelism 2:
streamlab on an embedded local cluster (2 TaskManagers x 2 slots), then PyFlink 2.3 in its own
virtual environment (bench/peers_flink.py, in a subprocess), then Spark Structured Streaming in
this process (local[2]), started after streamlab's cluster is closed.

Workloads (rows id = seq, k = seq % 10000, v = seq % 1000):
 1. stateless: SELECT id, k, v*2 AS v2 FROM input WHERE v < 500 -> discard;
 2. keyed: a .sql step, then COUNT(*) and SUM(v) per k (Flink: GROUP BY k, Spark SS: groupBy in
    update mode) -> discard;
 3. latency, streamlab and Spark SS, at fixed input rates: WHERE v % 10 < 8, a key_by hop (streamlab)
    and the arrival time of each row at the sink minus its creation time.
streamlab runs with its defaults: no batch size and no configuration anywhere.

Every peer is warmed up the same way before anything is measured, as JVM benchmarks are: each
throughput workload once at --warmup-rows (default: as many rows as the measured job), and
(streamlab and Spark SS) the latency pipeline at the first rate for --warmup-seconds. A JVM's
first jobs run interpreted and compile as they go: on this machine a fresh TaskManager's first
5M-row stateless job ran at half to two thirds of the rows/s of its third, and a Spark job's
planning takes a few hundred jobs to reach full speed. streamlab's warm-up jobs use every slot, so
that both TaskManagers' JVMs are warm (a job of parallelism 2 fills one TaskManager; which one a
later job gets is not fixed). The warm-up jobs' own figures are printed too, as "cold".

Each measured throughput job runs --repeat times (default 3) on every peer, one after the other,
and the median is the figure: on this machine the same warm 5M-row stateless job ran anywhere
between 3.6 and 5.7 M rows/s from one run to the next, so one run each decided a ratio by chance.
Every run's figure is printed too.

    .venv/bin/python bench/peers.py [--quick | --rows N] [--repeat N] [--rate R ...] [--pyflink-venv DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import cloudpickle
import numpy as np
import pandas as pd

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import throughput  # noqa: E402  (bench/throughput.py: it also puts the project on sys.path)
from throughput import job_latency_ms, job_rows_per_s, timed_rows, warm_every_taskmanager  # noqa: E402

from kernel_runtime import JobClient, LocalCluster, StreamEnvironment  # noqa: E402
from kernel_runtime.api import DiscardingSink  # noqa: E402

# the TaskManagers cannot import bench/throughput.py: ship timed_rows by value
cloudpickle.register_pickle_by_value(throughput)

PARALLELISM = 2
PYFLINK = "apache-flink==2.3.0"
JOB_TIMEOUT_S = 3600  # 5M rows at today's default batching take several minutes
STATELESS = "SELECT id, k, v * 2 AS v2 FROM input WHERE v < 500"
LATENCY_FILTER = "v % 10 < 8"


def median_of(runs: list[float]) -> dict:
    """The median of runs' rows/s, and every run's (every peer's figure is made here)."""
    return {"median": float(np.median(runs)), "runs": runs}


def median_run(measure, repeat: int) -> dict:
    """``measure()`` run ``repeat`` times: see median_of."""
    return median_of([measure() for _ in range(repeat)])


def peer_rows(seq):
    return pd.DataFrame({"id": seq, "k": seq % 10_000, "v": seq % 1_000})


# ---------------------------------------------------------------------- streamlab
def streamlab_env(cluster) -> StreamEnvironment:
    return StreamEnvironment(parallelism=PARALLELISM, cluster=cluster.cluster_dir)


def streamlab_stateless(cluster, client, n: int, parallelism: int = PARALLELISM) -> float:
    env = StreamEnvironment(parallelism=parallelism, cluster=cluster.cluster_dir)
    env.from_generator(peer_rows, count=n).sql(STATELESS).sink_to(DiscardingSink())
    return job_rows_per_s(client, env, f"peers stateless {n}", n, timeout=JOB_TIMEOUT_S)


def streamlab_keyed(cluster, client, n: int, parallelism: int = PARALLELISM) -> float:
    env = StreamEnvironment(parallelism=parallelism, cluster=cluster.cluster_dir)
    (env.from_generator(peer_rows, count=n).sql("SELECT id, k, v FROM input")
        .key_by("k").aggregate(n=("v", "count"), s=("v", "sum")).sink_to(DiscardingSink()))
    return job_rows_per_s(client, env, f"peers keyed {n}", n, timeout=JOB_TIMEOUT_S)


def streamlab_latency(cluster, client, rate: int, seconds: float, parallelism: int = PARALLELISM,
                      before_cancel=None) -> np.ndarray:
    env = StreamEnvironment(parallelism=parallelism, cluster=cluster.cluster_dir)
    (env.from_generator(timed_rows, rate=rate).sql(f"SELECT k, v, ts FROM input WHERE {LATENCY_FILTER}")
        .key_by("k").map_batches(lambda df: df, name="keyed pass-through").collect())
    return job_latency_ms(cluster, client, env, seconds, before_cancel)


def run_streamlab(args) -> dict:
    directory = Path(tempfile.mkdtemp(prefix="streamlab-peers-"))
    out: dict = {"latency": {}}
    with LocalCluster(directory, taskmanagers=2, slots=2, embedded=True) as cluster:
        client = JobClient(cluster.info)
        warm_every_taskmanager(cluster, client)
        print(f"streamlab {metadata.version('streamlab')}: embedded LocalCluster, 2 TaskManagers x 2 slots, "
              f"parallelism {PARALLELISM}, pyspark {metadata.version('pyspark')}, default settings "
              "(no batch size, no configuration); rows/s = N / (FINISHED - RUNNING) of the job", flush=True)
        slots = client.cluster_overview().overview["slots-total"]
        out["cold"] = {"stateless": streamlab_stateless(cluster, client, args.warmup_rows, slots),
                       "keyed": streamlab_keyed(cluster, client, args.warmup_rows, slots)}
        streamlab_latency(cluster, client, args.rates[0], args.warmup_seconds, slots)
        for w, measure in (("stateless", streamlab_stateless), ("keyed", streamlab_keyed)):
            out[w] = median_run(lambda: measure(cluster, client, args.rows), args.repeat)
        for rate in args.rates:
            out["latency"][rate] = streamlab_latency(cluster, client, rate, args.latency_seconds)
        client.close()
    return out


# ---------------------------------------------------------------------- PyFlink
def pyflink_python(venv: Path) -> Path:
    """The venv's python, with PyFlink in it: the venv is created and filled when missing."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import pyflink"], capture_output=True).returncode == 0:
        return python
    print(f"installing {PYFLINK} into {venv} (its own venv, not the project's)", flush=True)
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", PYFLINK], check=True)
    return python


def flink_report(venv: Path, script: str, *arguments: str) -> dict:
    """Run a bench script in PyFlink's venv (made when missing): the JSON report it prints last."""
    python = pyflink_python(venv)
    done = subprocess.run([python, BENCH / script, *arguments], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bench/{script} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def pyflink_rows_per_s(venv: Path, script: str, rows: int, warmup_rows: int, plan: str, repeat: int = 1) -> dict:
    """Run a PyFlink bench script, print its setup (``plan``: what its jobs do), and return its
    rows/s by workload (with ``repeat`` > 1: {"median", "runs"}), and under "cold" its warm-up
    jobs' rows/s."""
    report = flink_report(venv, script, "--rows", str(rows), "--warmup-rows", str(warmup_rows),
                          *(("--repeat", str(repeat)) if repeat > 1 else ()))
    s = report["setup"]
    print(f"PyFlink {s['pyflink']} (Flink {s['flink']}, Java {s['java']}, Python {s['python']}): Table API SQL, "
          f"streaming mode, {s['cluster']}, parallelism {s['parallelism']}, {plan}, "
          f"after a {s['warmup_rows']:,}-row warm-up job of each workload; rows/s = N / (FINISHED - RUNNING) "
          "of the job (GET /jobs/<id>)", flush=True)
    out: dict = {name: median_of(r["runs"]) if repeat > 1 else r["rows_per_s"]
                 for name, r in report["results"].items()}
    out["cold"] = {name: r["rows_per_s"] for name, r in report["warmup"].items()}
    return out


def run_pyflink(args) -> dict:
    return pyflink_rows_per_s(args.pyflink_venv, "peers_flink.py", args.rows, args.warmup_rows,
                              "datagen sequence -> blackhole", args.repeat)


# ---------------------------------------------------------------------- Spark Structured Streaming
def spark_session():
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master(f"local[{PARALLELISM}]").appName("bench-peers")
             .config("spark.sql.shuffle.partitions", PARALLELISM).config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop_quietly(spark, query) -> None:
    """Stop a query that is never idle (the rate sources always have rows): the micro-batch it
    cancels logs pages of ERROR stack traces that are not errors of the bench's."""
    spark.sparkContext.setLogLevel("OFF")
    try:
        query.stop()
        time.sleep(1)  # the cancelled tasks log after stop() returns
    finally:
        spark.sparkContext.setLogLevel("ERROR")


def ss_rows_per_s(spark, query, n: int) -> float:
    """Rows/s over the micro-batches that together read the first n rows: their rows over the sum
    of their trigger durations (the query's own timing of each micro-batch)."""
    while sum(p["numInputRows"] for p in query.recentProgress) < n:
        if query.exception() is not None:
            raise RuntimeError(f"Spark SS query failed: {query.exception()}")
        time.sleep(0.05)
    stop_quietly(spark, query)
    rows = millis = 0
    for p in sorted(query.recentProgress, key=lambda p: p["batchId"]):
        if rows >= n:
            break
        rows += p["numInputRows"]
        millis += p["durationMs"]["triggerExecution"]
    return rows / (millis / 1000)


def ss_source(spark, rows_per_batch: int):
    return (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows_per_batch)
            .option("numPartitions", PARALLELISM).load()
            .selectExpr("value AS id", "value % 10000 AS k", "value % 1000 AS v"))


def ss_throughput(spark, workload: str, n: int, rows_per_batch: int, checkpoints: Path) -> float:
    from pyspark.sql import functions as F
    rows = ss_source(spark, rows_per_batch)
    if workload == "stateless":
        writer = rows.where("v < 500").selectExpr("id", "k", "v * 2 AS v2").writeStream
    else:
        writer = (rows.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("s"))
                  .writeStream.outputMode("update"))
    query = (writer.format("noop").option("checkpointLocation", str(checkpoints / f"{workload}-{n}"))
             .queryName(f"peers-{workload}").start())
    return ss_rows_per_s(spark, query, n)


def ss_latency(spark, rate: int, seconds: float, checkpoints: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """Event-to-sink lag: the rate source's timestamp is when a row was due; the foreachBatch sink
    stamps time.time() once a batch's rows are in hand. The rate source releases rows a whole
    second at a time (its offsets count seconds), so a row's lag includes its wait for the end of
    its second; the lag of each batch's newest row is the engine's part alone."""
    lags: list[np.ndarray] = []

    def stamp(batch, _batch_id):
        micros = batch.selectExpr("unix_micros(ts) AS us").toArrow()["us"].to_numpy()
        if len(micros):
            lags.append(time.time() - micros / 1e6)

    rows = (spark.readStream.format("rate").option("rowsPerSecond", rate).option("numPartitions", PARALLELISM)
            .load().selectExpr("value % 1000 AS k", "value AS v", "timestamp AS ts").where(LATENCY_FILTER))
    query = (rows.writeStream.foreachBatch(stamp).option("checkpointLocation", str(checkpoints / f"lat-{rate}"))
             .queryName(f"peers-latency-{rate}").start())
    time.sleep(seconds)
    if query.exception() is not None:
        raise RuntimeError(f"Spark SS query failed: {query.exception()}")
    stop_quietly(spark, query)
    lat = np.concatenate(lags) * 1000 if lags else np.zeros(0)
    newest = np.array([batch.min() for batch in lags[len(lags) // 5:]]) * 1000
    return lat[len(lat) // 5:], newest, len(lat)  # drop the first fifth: warm-up, as streamlab's side does


def run_spark_ss(args) -> dict:
    spark = spark_session()
    rows_per_batch = args.ss_rows_per_batch or max(args.rows // 10, 1)
    checkpoints = Path(tempfile.mkdtemp(prefix="streamlab-peers-ss-"))  # the queries' checkpoints, junk after
    print(f"Spark Structured Streaming {spark.version}: local[{PARALLELISM}], spark.sql.shuffle.partitions "
          f"{PARALLELISM}, otherwise defaults; throughput: rate-micro-batch source, {rows_per_batch:,} rows "
          f"per micro-batch, {PARALLELISM} partitions, noop sink, rows/s = N / sum of the micro-batches' "
          "triggerExecution; latency: rate source at R rows/s, foreachBatch sink", flush=True)
    try:
        warm_batch = max(args.warmup_rows // 10, 1)
        cold = {w: ss_throughput(spark, w, args.warmup_rows, warm_batch, checkpoints / "warm-up")
                for w in ("stateless", "keyed")}
        ss_latency(spark, args.rates[0], args.warmup_seconds, checkpoints / "warm-up")  # its own offsets
        runs = iter(range(2 * args.repeat))  # each run's query reads from offset 0: a checkpoint of its own
        out = {w: median_run(lambda: ss_throughput(spark, w, args.rows, rows_per_batch, checkpoints / str(next(runs))),
                             args.repeat) for w in ("stateless", "keyed")}
        out["cold"] = cold
        out["latency"] = {rate: ss_latency(spark, rate, args.latency_seconds, checkpoints) for rate in args.rates}
    finally:
        spark.stop()
        shutil.rmtree(checkpoints, ignore_errors=True)
    return out


# ---------------------------------------------------------------------- report
def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000, help="rows per throughput job (default 5M)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 300k rows, 10 s per latency run")
    parser.add_argument("--rate", type=int, action="append", default=[],
                        help="another input rate (rows/s) for the latency runs, beside 1,000 and 100,000")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each measured throughput job per peer, the median reported (default 3)")
    parser.add_argument("--latency-seconds", type=float, help="seconds per latency run (default 25, quick 10)")
    parser.add_argument("--warmup-rows", type=int, help="rows of each peer's warm-up job of each workload "
                        "(default: --rows)")
    parser.add_argument("--warmup-seconds", type=float, help="seconds of each peer's latency warm-up run "
                        "(default 20, quick 5)")
    parser.add_argument("--ss-rows-per-batch", type=int, help="Spark SS rows per micro-batch (default rows/10)")
    parser.add_argument("--pyflink-venv", type=Path, default=Path.home() / ".cache/streamlab/pyflink-venv",
                        help="PyFlink's own venv, created when missing (default ~/.cache/streamlab/pyflink-venv)")
    args = parser.parse_args()
    if args.quick:
        args.rows = 300_000
    args.latency_seconds = args.latency_seconds or (10 if args.quick else 25)
    args.warmup_rows = args.warmup_rows or args.rows
    args.warmup_seconds = args.warmup_seconds if args.warmup_seconds is not None else (5 if args.quick else 20)
    args.rates = sorted({1_000, 100_000, *args.rate})
    for label, value in (("--rows", args.rows), ("--warmup-rows", args.warmup_rows), ("--repeat", args.repeat), *(("--rate", r) for r in args.rates)):
        if value < 1:
            parser.error(f"{label} must be a positive integer, got {value}")
    print(f"{os.cpu_count()} cores, parallelism {PARALLELISM}, {args.rows:,} rows per throughput job "
          f"(the median of {args.repeat} runs), {args.latency_seconds:g} s per latency run", flush=True)

    ours = run_streamlab(args)
    flink = run_pyflink(args)
    spark = run_spark_ss(args)

    print()
    print(f"{'workload':<10} {'streamlab rows/s':>17} {'PyFlink rows/s':>15} {'Spark SS rows/s':>16} "
          f"{'streamlab/PyFlink':>18} {'streamlab/SparkSS':>18}")
    for w in ("stateless", "keyed"):
        mine, theirs, ss = ours[w]["median"], flink[w]["median"], spark[w]["median"]
        print(f"{w:<10} {mine:>17,.0f} {theirs:>15,.0f} {ss:>16,.0f} "
              f"{ratio(mine, theirs):>18} {ratio(mine, ss):>18}")
    for w in ("stateless", "keyed"):
        cold = (ours["cold"][w], flink["cold"][w], spark["cold"][w])
        print(f"{w + ' cold':<16} {cold[0]:>11,.0f} {cold[1]:>15,.0f} {cold[2]:>16,.0f} "
              f"{ratio(cold[0], cold[1]):>18} {ratio(cold[0], cold[2]):>18}")
    print(f"the median of {args.repeat} runs each; every run, M rows/s:")
    for w in ("stateless", "keyed"):
        print(f"  {w:<10} " + "; ".join(f"{peer} {' '.join(f'{r / 1e6:.2f}' for r in result[w]['runs'])}"
                                        for peer, result in (("streamlab", ours), ("PyFlink", flink), ("Spark SS", spark))))
    print(f"cold: each peer's warm-up job of {args.warmup_rows:,} rows, the first of its kind in a fresh JVM "
          "(streamlab's at parallelism 4, on every slot of both TaskManagers; Spark SS: micro-batches of a tenth of it)")
    print()
    print(f"latency, ms (WHERE {LATENCY_FILTER}; streamlab: generator(rate=R) -> .sql -> key_by(k) -> keyed "
          "pass-through -> collect, arrival - row creation; Spark SS: rate -> filter -> foreachBatch, "
          "time.time() - timestamp; first fifth of each run dropped)")
    print(f"{'rate':>9} {'peer':<10} {'p50':>7} {'p90':>7} {'p99':>7} {'rows':>10} {'delivered':>10}")
    expected = {rate: rate * args.latency_seconds * 0.8 for rate in args.rates}  # 8 in 10 rows pass the filter
    for rate in args.rates:
        lat_ss, newest_ss, got_ss = spark["latency"][rate]
        lat_ours = ours["latency"][rate]
        got_ours = round(len(lat_ours) * 5 / 4)
        for peer, lat, got in (("streamlab", lat_ours, got_ours), ("Spark SS", lat_ss, got_ss),
                               ("Spark SS*", newest_ss, None)):
            p50, p90, p99 = np.percentile(lat, [50, 90, 99]) if len(lat) else (float("nan"),) * 3
            delivered = f"{got:>10,} {got / expected[rate]:>9.0%}" if got is not None else f"{len(lat):>10,} batches"
            print(f"{rate:>9,} {peer:<10} {p50:>7.0f} {p90:>7.0f} {p99:>7.0f} {delivered}")
    print("delivered: rows that reached the sink over the rows the rate would give in the run (below 100%:\n"
          "  the pipeline fell behind or started late; streamlab's generator stamps a row when it makes it, so\n"
          "  falling behind shows here, not in its latency). Spark SS*: the newest row of each micro-batch only:\n"
          "  the rate source releases rows one whole second at a time, which adds up to 1 s to a row's lag")


if __name__ == "__main__":
    main()
