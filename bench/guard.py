"""The regression guard (`make bench-guard`): in about a minute, the few figures that catch a
regression, each beside the one recorded in bench/baseline.json for the last landed commit, with
any figure more than 1.5x worse marked.

The figures, measured in this order every time, on one embedded LocalCluster (2 TaskManagers x 2
slots) and one Kafka broker started here:
  1. latency at 1,000 rows/s of bench/runtime_latency.py's generator pipeline (generator -> .sql
     filter -> key_by -> pass-through -> collect; each row's arrival here minus its making);
  2. latency at 1,000 rows/s of bench/kafka.py's pipeline (Kafka -> .sql -> Kafka; CreateTime out
     minus CreateTime in), after a short unmeasured run of the same job;
  3. rows/s of bench/peers.py's stateless and keyed jobs, over a few million generated rows.
A p99 is the median of the p99s of three stretches of its run (``percentiles``).
A latency is marked only when it is also more than LATENCY_SLACK_MS above its baseline: two runs of
a plain confluent-kafka loop on this machine differ by a few ms at p99 (docs/benchmarks.md), which
is no regression. The load average is printed before and after: a loaded machine's figures are
not the code's. The guard is not in the test suite (a figure is no pass or fail there); its exit
status is 1 when a figure is marked.

    .venv/bin/python bench/guard.py            compare with bench/baseline.json
    .venv/bin/python bench/guard.py --record   write this run's figures there (commit them with the
                                               change that moved them on purpose)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
import cloudpickle  # noqa: E402
import kafka  # noqa: E402
import peers  # noqa: E402
from kafka_io import Offsets  # noqa: E402
from peers import streamlab_keyed, streamlab_latency, streamlab_stateless  # noqa: E402
from throughput import warm_every_taskmanager  # noqa: E402

from kernel_runtime import JobClient, LocalCluster  # noqa: E402
from kernel_runtime.deploy import kafka_broker  # noqa: E402

cloudpickle.register_pickle_by_value(peers)  # the TaskManagers cannot import bench/peers.py: its rows go by value

BASELINE = BENCH / "baseline.json"
WORSE = 1.5              # a figure this much worse than its baseline is marked
LATENCY_SLACK_MS = 5.0   # ... and a latency only if also this much higher (the machine's own noise)
RATE = 1_000             # rows/s of both latency runs
LATENCY_S = 10           # seconds of the generator's latency run (its first fifth is left out)
KAFKA_WARM_S, KAFKA_RUN_S = 3, 9
WINDOWS = 3              # stretches of a latency run whose p99s' median is the figure (percentiles)
KAFKA_WARM_JOB_S = 3     # seconds of the Kafka job's unmeasured first run (kafka_latency)
ROWS = 2_000_000         # rows of each throughput job


@dataclass(frozen=True)
class Figure:
    name: str
    unit: str
    lower_is_better: bool

    def worse_by(self, now: float, base: float) -> float:
        """How many times worse ``now`` is than ``base`` (below 1: better)."""
        if self.lower_is_better:
            return now / base if base > 0 else float("inf")
        return base / now if now > 0 else float("inf")

    def marked(self, now: float, base: float) -> bool:
        if self.worse_by(now, base) <= WORSE:
            return False
        return not self.lower_is_better or now - base > LATENCY_SLACK_MS


FIGURES = [Figure(f"{source} latency {q}", "ms", True)
           for source in ("generator", "kafka") for q in ("p50", "p99")] + \
          [Figure(f"{job} rows/s", "rows/s", False) for job in ("stateless", "keyed")]


def percentiles(latencies: np.ndarray, prefix: str) -> dict:
    """p50 over every row; p99 as the median of the p99s of WINDOWS equal stretches of the run (in
    the order the rows were made): one stall of the machine (a GC, another program) moves the p99
    of one stretch, not the figure. Over a whole run, the same code's Kafka p99 read anything from
    9 to 197 ms here, and the guard marked regressions that were not."""
    if len(latencies) < WINDOWS:
        raise RuntimeError(f"{prefix}: {len(latencies)} row(s) arrived")
    p50 = np.percentile(latencies, 50)
    p99 = np.median([np.percentile(part, 99) for part in np.array_split(latencies, WINDOWS)])
    return {f"{prefix} latency p50": float(p50), f"{prefix} latency p99": float(p99)}


def kafka_latency(cluster: LocalCluster, servers: str) -> dict:
    """A short run of the job first, not measured: a cluster's first Kafka job ran at p50/p99
    128/738 ms and the next ones at 2/9-29 (its first seconds: the client's start, Spark's first
    answer before Arrow has the plan); measured after a pass over 100,000 pre-loaded records
    instead, the job read p50 39 ms, p99 426 ms in one run of three."""
    peer = kafka.Streamlab("sql", "at-least-once", cluster=cluster)
    offsets = Offsets(servers)
    try:
        kafka.latency(peer, servers, offsets, RATE, 1, KAFKA_WARM_JOB_S, timeout=120)
        lat = kafka.latency(peer, servers, offsets, RATE, KAFKA_WARM_S, KAFKA_RUN_S, timeout=120)
    finally:
        offsets.close()
        peer.close()
    return percentiles(lat["samples"], "kafka")


def measure() -> dict:
    """Every figure, in the same order every run."""
    kafka_broker.JVM_OPTIONS = kafka.BROKER_JVM
    broker = kafka_broker.KafkaBroker(Path(tempfile.mkdtemp(prefix="bench-guard-broker-")))
    broker.start()
    try:
        with LocalCluster(Path(tempfile.mkdtemp(prefix="bench-guard-")), taskmanagers=2, slots=2,
                          embedded=True) as cluster:
            client = JobClient(cluster.info)
            try:
                warm_every_taskmanager(cluster, client)
                figures = percentiles(streamlab_latency(cluster, client, RATE, LATENCY_S), "generator")
                figures |= kafka_latency(cluster, broker.bootstrap)
                figures["stateless rows/s"] = streamlab_stateless(cluster, client, ROWS)
                figures["keyed rows/s"] = streamlab_keyed(cluster, client, ROWS)
            finally:
                client.close()
    finally:
        broker.stop()
    return figures


def checkout() -> str:
    """The commit measured: HEAD, with a '+' where the working tree changes it (a baseline recorded
    so is committed with those changes, in the commit after HEAD)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=BENCH, capture_output=True, text=True, check=True).stdout.strip()
    try:
        return git("rev-parse", "--short", "HEAD") + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def table(figures: dict, baseline: dict) -> list[str]:
    """The report's rows; a marked figure ends in 'WORSE'."""
    base = baseline.get("figures", {})
    rows = [f"{'figure':<24} {'baseline':>12} {'now':>12} {'now/base':>9}"]
    for figure in FIGURES:
        now, was = figures[figure.name], base.get(figure.name)
        if was is None:
            rows.append(f"{figure.name:<24} {'-':>12} {now:>12,.1f}")
            continue
        mark = "  WORSE" if figure.marked(now, was) else ""
        rows.append(f"{figure.name:<24} {was:>12,.1f} {now:>12,.1f} {now / was if was else float('inf'):>9.2f}{mark}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record", action="store_true", help="write this run's figures to bench/baseline.json")
    args = parser.parse_args()
    baseline = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
    load_before = os.getloadavg()
    started = time.monotonic()
    figures = measure()
    took = time.monotonic() - started
    load_after = os.getloadavg()
    print(f"bench-guard at {checkout()} ({took:.0f} s); baseline measured at {baseline.get('commit', 'none')} "
          f"on {baseline.get('recorded', '-')}")
    print(f"machine: {os.cpu_count()} cores; load average (1 min) {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after")
    rows = table(figures, baseline)
    print("\n".join(rows))
    marked = [row.split()[0:3] for row in rows if row.endswith("WORSE")]
    if args.record:
        BASELINE.write_text(json.dumps({
            "commit": checkout(),
            "recorded": time.strftime("%Y-%m-%d"), "load": round(load_before[0], 2),
            "figures": {name: round(value, 2) for name, value in figures.items()}}, indent=2) + "\n")
        print(f"recorded in {BASELINE.relative_to(BENCH.parent)}")
        return 0
    if marked:
        print(f"{len(marked)} figure(s) more than {WORSE}x worse than the baseline")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
