"""Nexmark on streamlab beside PyFlink 2.3, on the same events, with the same answers.

The events (NexmarkSource's generator, cluster.connectors.nexmark) are written once as Parquet
files, 1M rows a file at most and 8 files a table at least (so that both engines' readers share each
table), into ~/.cache/streamlab/nexmark/<events>-<seed>/{bid,auction,person}; both
engines read those files, one after the other, each with 2 cores and parallelism 2:

* streamlab: an embedded LocalCluster (2 TaskManagers x 2 slots), the three tables as views of
  FileSource.parquet with Nexmark's watermark, each query as Spark SQL through env.sql_query
  (NexmarkSource.query: kernel_runtime.api.nexmark.QUERIES, and the views a query reads) into a
  DiscardingSink;
* PyFlink: bench/nexmark_flink.py in PyFlink's own venv, Flink's filesystem connector with its
  Parquet format (jars from Maven Central: bench/nexmark/pom.xml), nexmark-flink's own SQL text of
  each query into a blackhole sink, as Nexmark measures.

Per query: a warm-up run, then the timed run (events/s = all events / the job's RUNNING time, as
bench/peers.py), then a run writing the answer to Parquet: the two answers must hold the same rows
(compared as multisets of row hashes, file by file; q4's result updates, which neither engine's
file sink takes, so its answers are not compared: tests/e2e/test_nexmark.py checks them). Peak RSS is the most the engine's processes
held at once during a query's runs, and over all its queries after the table (streamlab: this
process, the client, and its cluster's processes and JVMs; PyFlink: its Python process and JVM;
both keep their JVMs from one query to the next). The bound is the same work with no framework at all:
one process per core reading its half of the files with pyarrow and doing the query with Arrow's
kernels (q3: each process joins its half of the auctions with all persons; q5, q7 and q8: each
window's counts, maximum or people over its half of the rows, in pandas); streamlab / bound says how
near to it the runtime comes.

    .venv/bin/python bench/nexmark.py [--quick | --events N] [--queries q0,q1,q2,q3] [--pyflink-venv DIR]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from kafka_io import maven_jars  # noqa: E402  (it also puts the project on sys.path)
from peers import pyflink_python  # noqa: E402
from throughput import running_rows_per_s, warm_every_taskmanager  # noqa: E402

from cluster.connectors import nexmark as nx  # noqa: E402
from cluster.graph.nexmark import SCHEMAS, TABLES, count  # noqa: E402
from kernel_runtime import JobClient, LocalCluster, StreamEnvironment  # noqa: E402
from kernel_runtime.api import DiscardingSink, FileSink, FileSource, NexmarkSource  # noqa: E402
from kernel_runtime.api.nexmark import QUERIES  # noqa: E402

CACHE = Path.home() / ".cache/streamlab"
FILE_ROWS = 1_000_000  # at most; and each table in 8 files at least, so that each engine's readers share it
LAYOUT = "v2: 8+ files a table"
PARALLELISM = 2
# a query whose result updates (q4's averages): timed into a discarding sink, its answers not compared
UPDATING = {"q4"}


# ---------------------------------------------------------------------- the events, once
def write_events(events: int, seed: int) -> Path:
    """The first ``events`` Nexmark events as Parquet files, made once per (events, seed)."""
    home = CACHE / "nexmark" / f"{events}-{seed}"
    marker = home / ".written"
    if marker.exists() and marker.read_text() == LAYOUT:
        return home
    shutil.rmtree(home, ignore_errors=True)
    config = nx.NexmarkConfig(seed=seed)
    for table in TABLES:
        (home / table).mkdir(parents=True)
        rows = count(table, events)
        step = max(1, min(FILE_ROWS, -(-rows // 8)))
        for part, start in enumerate(range(0, rows, step)):
            seq = np.arange(start, min(rows, start + step), dtype=np.int64)
            pq.write_table(nx.rows(table, seq, config), home / table / f"part-{part:04d}.parquet")
    marker.write_text(LAYOUT)
    return home


# ---------------------------------------------------------------------- peak RSS
class PeakRss:
    """The most resident memory a process tree held at once, sampled every 100 ms."""

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self.peak = 0   # since the last take
        self.most = 0   # over the whole run
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:  # a process ended while the tree was walked: the next sample counts
                continue
            total = 0
            for proc in procs:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self.most = max(self.most, total)

    def take(self) -> int:
        """The peak since the last take (or the start), and a new one from here: one query's."""
        peak, self.peak = self.peak, 0
        return peak

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.most


# ---------------------------------------------------------------------- streamlab
def streamlab_job(cluster, data: Path, query: str, sink) -> StreamEnvironment:
    env = StreamEnvironment(parallelism=PARALLELISM, cluster=cluster.cluster_dir)
    for table in TABLES:
        source = FileSource.parquet(data / table, schema=SCHEMAS[table], batch_size=65_536, name=table)
        env.create_temporary_view(table, env.from_source(source, NexmarkSource.watermarks()))
    NexmarkSource.query(env, query).sink_to(sink)
    return env


def run_streamlab(data: Path, out: Path, queries: list[str], events: int) -> dict:
    results = {}
    peak = PeakRss(os.getpid())
    with LocalCluster(Path(tempfile.mkdtemp(prefix="streamlab-nexmark-")), taskmanagers=2, slots=2,
                      embedded=True) as cluster:
        client = JobClient(cluster.info)
        warm_every_taskmanager(cluster, client)
        for query in queries:
            runs = []
            for attempt in ("warm-up", "timed"):
                handle = streamlab_job(cluster, data, query, DiscardingSink()).execute_async(
                    f"nexmark {query} {attempt}", client=client)
                handle.wait(3600)
                runs.append(running_rows_per_s(client, handle.job_id, events))
            if query not in UPDATING:  # a file sink cannot take an updating result (q4's averages)
                streamlab_job(cluster, data, query, FileSink.parquet(out / query)).execute_async(
                    f"nexmark {query} answer", client=client).wait(3600)
            results[query] = {"events_per_s": runs[1], "warmup_events_per_s": runs[0], "peak_rss": peak.take()}
            print(f"  streamlab {query}: {runs[1]:,.0f} events/s (warm-up {runs[0]:,.0f})", flush=True)
        client.close()
    return {"results": results, "peak_rss": peak.stop()}


# ---------------------------------------------------------------------- PyFlink
def run_pyflink(venv: Path, data: Path, out: Path, queries: list[str], events: int) -> dict:
    jars = sorted(str(jar) for jar in maven_jars(BENCH / "nexmark" / "pom.xml", CACHE / "nexmark-bench-jars")
                  .glob("*.jar"))
    proc = subprocess.Popen([str(pyflink_python(venv)), str(BENCH / "nexmark_flink.py"), "--data", str(data),
                             "--out", str(out), "--jars", ",".join(jars), "--queries", ",".join(queries),
                             "--events", str(events)], stdout=subprocess.PIPE, text=True)
    peak = PeakRss(proc.pid)
    assert proc.stdout is not None
    lines, per_query = [], {}
    for line in proc.stdout:  # "done <query>" after each query's runs, then the report
        if line.startswith("done "):
            per_query[line.split()[1]] = peak.take()
        lines.append(line)
    proc.wait()
    rss = peak.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"bench/nexmark_flink.py failed ({proc.returncode})")
    report = json.loads(lines[-1])
    for query, figures in report["results"].items():
        figures["peak_rss"] = per_query.get(query, 0)
        print(f"  PyFlink {query}: {figures['events_per_s']:,.0f} events/s", flush=True)
    return report | {"peak_rss": rss}


# ---------------------------------------------------------------------- the bound: no framework
def bare_part(args: tuple) -> int:
    """One core's half of a query with pyarrow alone: its files read, the query done on each batch
    by Arrow's kernels (no pandas: the fastest a bare Python process gets)."""
    data, query, part = args
    files = {t: sorted((Path(data) / t).glob("*.parquet"))[part::PARALLELISM] for t in TABLES}
    rows = 0
    if query == "q7":  # each window's highest price, then the bids at it in the window: pandas over all
        bids = pa.concat_tables(pq.read_table(f, columns=["auction", "price", "bidder", "dateTime"])
                                for f in files["bid"]).to_pandas()
        end = bids["dateTime"].dt.floor("10s") + pd.Timedelta("10s")
        top = bids.assign(end=end).groupby("end")["price"].transform("max")
        return int((bids["price"] == top).sum())
    if query == "q4":  # each auction's highest bid while open, over this half of the bids; averaged per category
        auctions = pa.concat_tables(pq.read_table(f, columns=["id", "category", "dateTime", "expires"])
                                    for f in sorted((Path(data) / "auction").glob("*.parquet"))).to_pandas()
        bids = pa.concat_tables(pq.read_table(f, columns=["auction", "price", "dateTime"])
                                for f in files["bid"]).to_pandas()
        met = bids.merge(auctions, left_on="auction", right_on="id", suffixes=("", "_a"))
        met = met[(met["dateTime"] >= met["dateTime_a"]) & (met["dateTime"] <= met["expires"])]
        return len(met.groupby(["id", "category"])["price"].max().groupby(level="category").mean())
    if query == "q5":  # each 10 s window every 2 s, its auctions with the most bids: pandas over all
        bids = pa.concat_tables(pq.read_table(f, columns=["auction", "dateTime"]) for f in files["bid"]).to_pandas()
        slot = bids["dateTime"].to_numpy().astype("datetime64[ms]").astype(np.int64) // 2_000
        counts = pd.concat(pd.DataFrame({"auction": bids["auction"].to_numpy(), "start": slot - back})
                           for back in range(5)).groupby(["auction", "start"], as_index=False).size()
        return int((counts["size"] == counts.groupby("start")["size"].transform("max")).sum())
    if query == "q8":  # each 10 s window's new people who opened an auction in it
        windows = []
        for table, key in (("person", "id"), ("auction", "seller")):
            rows = pa.concat_tables(pq.read_table(f, columns=[key, "dateTime"]) for f in files[table]).to_pandas()
            windows.append(rows.assign(dateTime=rows["dateTime"].dt.floor("10s")).drop_duplicates()
                           .set_axis(["id", "start"], axis=1))
        return len(windows[0].merge(windows[1], on=["id", "start"]))
    if query == "q3":
        people = pa.concat_tables([pq.read_table(f, columns=["id", "name", "city", "state"])
                                   for f in sorted((Path(data) / "person").glob("*.parquet"))])
        people = people.filter(pc.is_in(people["state"], value_set=pa.array(["OR", "ID", "CA"])))
        for f in files["auction"]:
            auctions = pq.read_table(f, columns=["id", "seller", "category"])
            auctions = auctions.filter(pc.equal(auctions["category"], 10)).rename_columns(["auction", "seller", "category"])
            rows += auctions.join(people, keys="seller", right_keys="id").num_rows
        return rows
    euro = pa.scalar(Decimal("0.908"), pa.decimal128(3, 3))
    for f in files["bid"]:
        for bids in pq.ParquetFile(f).iter_batches(65_536):
            if query == "q1":
                bids = bids.set_column(2, "price", pc.multiply(euro, pc.cast(bids["price"], pa.decimal128(20, 0))))
            elif query == "q2":
                auction = bids["auction"]
                bids = bids.filter(pc.equal(pc.subtract(auction, pc.multiply(pc.divide(auction, 123), 123)), 0))
                bids = bids.select(["auction", "price"])
            rows += bids.num_rows
    return rows


def run_bare(data: Path, queries: list[str], events: int) -> dict:
    results = {}
    with multiprocessing.get_context("spawn").Pool(PARALLELISM) as pool:
        pool.map(bare_part, [(str(data), "q2", part) for part in range(PARALLELISM)])  # processes started, imports done
        for query in queries:
            started = time.perf_counter()
            pool.map(bare_part, [(str(data), query, part) for part in range(PARALLELISM)])
            results[query] = events / (time.perf_counter() - started)
    return results


# ---------------------------------------------------------------------- the answers
def answer_digest(folder: Path) -> tuple[int, int]:
    """Rows and the sum of their hashes (a multiset's digest), file by file; times as epoch ms and
    decimals as text, so that two writers' Parquet types compare."""
    rows, digest = 0, np.uint64(0)
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith((".", "_"))):
        table = pq.read_table(path)
        columns = {}
        for name, column in zip(table.column_names, table.columns):
            if pa.types.is_timestamp(column.type):
                column = pc.cast(pc.cast(column, pa.timestamp("ms")), pa.int64())
            elif pa.types.is_decimal(column.type):
                column = pc.cast(column, pa.string())
            columns[name] = column
        frame = pa.table(columns).to_pandas()
        rows += len(frame)
        with np.errstate(over="ignore"):
            digest += pd.util.hash_pandas_object(frame[sorted(frame.columns)], index=False).to_numpy().sum()
    return rows, int(digest)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--quick", action="store_true", help="200,000 events: a smoke run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--queries", default=",".join(QUERIES))
    parser.add_argument("--peers", default="streamlab,flink,bare")
    parser.add_argument("--pyflink-venv", type=Path, default=CACHE / "pyflink-venv",
                        help="PyFlink's own venv, created when missing (default ~/.cache/streamlab/pyflink-venv)")
    args = parser.parse_args()
    events = 200_000 if args.quick else args.events
    queries = args.queries.split(",")
    peers = args.peers.split(",")
    data = write_events(events, args.seed)
    out = Path(tempfile.mkdtemp(prefix="nexmark-answers-"))
    print(f"Nexmark, {events:,} events (seed {args.seed}) in {data}; parallelism {PARALLELISM}, one engine "
          "after the other; events/s = events / the timed job's RUNNING time", flush=True)
    report = {}
    if "streamlab" in peers:
        report["streamlab"] = run_streamlab(data, out / "streamlab", queries, events)
    if "flink" in peers:
        report["flink"] = run_pyflink(args.pyflink_venv, data, out / "flink", queries, events)
    if "bare" in peers:
        report["bare"] = run_bare(data, queries, events)
    print("\n| query | answers | streamlab events/s | PyFlink events/s | ratio | bare events/s | streamlab / bare "
          "| peak RSS streamlab / PyFlink |")
    print("|---|---|---|---|---|---|---|---|")
    for query in queries:
        ours = report.get("streamlab", {}).get("results", {}).get(query, {}).get("events_per_s")
        theirs = report.get("flink", {}).get("results", {}).get(query, {}).get("events_per_s")
        bare = report.get("bare", {}).get(query)
        same = "-"
        if ours and theirs and query in UPDATING:
            same = "not compared (updating)"
        elif ours and theirs:
            a, b = answer_digest(out / "streamlab" / query), answer_digest(out / "flink" / query)
            same = f"equal ({a[0]:,} rows)" if a == b else f"DIFFER: {a[0]:,} vs {b[0]:,} rows"
        cells = [f"{v:,.0f}" if v else "-" for v in (ours, theirs)]
        ratio = f"{ours / theirs:.2f}x" if ours and theirs else "-"
        to_bare = f"{ours / bare:.2f}" if ours and bare else "-"
        rss = " / ".join(f"{r / 2**20:,.0f} MiB" if r else "-" for r in (
            report.get(engine, {}).get("results", {}).get(query, {}).get("peak_rss") for engine in ("streamlab", "flink")))
        print(f"| {query} | {same} | {cells[0]} | {cells[1]} | {ratio} | {f'{bare:,.0f}' if bare else '-'} | {to_bare} "
              f"| {rss} |")
    for engine in ("streamlab", "flink"):
        if engine in report:
            print(f"peak RSS {engine}: {report[engine]['peak_rss'] / 2**20:,.0f} MiB")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
