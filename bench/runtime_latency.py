"""The runtime's own end-to-end latency (GET /jobs/<id> "latency": ingestion at the source to the
sink, over its last 5-10 s) beside this bench's measurement of the same job: bench/peers.py's
latency pipeline (generator(rate=R) -> .sql filter -> key_by -> pass-through -> collect), each
collected row's arrival in this process minus the time the generator made it, over the rows that
arrived in the same last seconds. The runtime stops counting when the sink is given the rows; the
bench counts on to their arrival here, so it reads a little higher.

    .venv/bin/python bench/runtime_latency.py [--seconds 25] [--rate R ...]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import LATENCY_FILTER, streamlab_latency  # noqa: E402
from throughput import warm_every_taskmanager  # noqa: E402

from kernel_runtime import JobClient, LocalCluster  # noqa: E402

WINDOW_S = 10  # the runtime's report covers 5-10 s: the bench's rows of its last 10 s beside it


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=25, help="seconds per run (default 25)")
    parser.add_argument("--rate", type=int, action="append", default=[], help="rows/s (default 1,000 and 100,000)")
    args = parser.parse_args()
    rates = args.rate or [1_000, 100_000]
    print(f"latency, ms: WHERE {LATENCY_FILTER}, key_by, collect; {args.seconds:g} s per run, the last {WINDOW_S} s")
    print(f"{'rate':>9} {'measured by':<12} {'p50':>7} {'p90':>7} {'p99':>7} {'rows':>9}   runtime/bench p50 p90 p99")
    with LocalCluster(Path(tempfile.mkdtemp(prefix="streamlab-latency-")), taskmanagers=2, slots=2,
                      embedded=True) as cluster:
        client = JobClient(cluster.info)
        warm_every_taskmanager(cluster, client)
        streamlab_latency(cluster, client, rates[0], 10)  # warm-up
        for rate in rates:
            said: dict = {}
            lat = streamlab_latency(cluster, client, rate, args.seconds,
                                    before_cancel=lambda job_id: said.update(client.job_details(job_id)["latency"]))
            recent = lat[-int(rate * 0.8 * WINDOW_S):]  # 8 rows in 10 pass the filter
            bench = np.percentile(recent, [50, 90, 99]) if len(recent) else [float("nan")] * 3
            runtime = [said.get(q) or float("nan") for q in ("p50", "p90", "p99")]
            print(f"{rate:>9,} {'bench':<12} {bench[0]:>7.0f} {bench[1]:>7.0f} {bench[2]:>7.0f} {len(recent):>9,}")
            print(f"{rate:>9,} {'runtime':<12} {runtime[0]:>7.0f} {runtime[1]:>7.0f} {runtime[2]:>7.0f} "
                  f"{said.get('rows', 0):>9,}   " + " ".join(f"{r / b:.2f}" for r, b in zip(runtime, bench)))
        client.close()


if __name__ == "__main__":
    main()
