"""What live dashboards cost the JobManager: its CPU seconds with 0, 1 and 5 dashboards open.

A local 2 x 2 cluster with the notebook's settings (metrics every 500 ms) runs one unbounded
keyed job; this process opens live dashboards on it (the real Dashboard widgets, applied on the
feed's thread as outside a kernel: no Jupyter needed) and measures the JobManager process's CPU
time (psutil, user + system) over a fixed window for each count. It prints the CPU of this
process too: in a notebook that is the kernel's.

    .venv/bin/python bench/dashboards.py [--window 20] [--code DIR]

``--code DIR`` benchmarks another checkout of streamlab (e.g. the code before job events, from
``git worktree add``): the cluster it starts and the dashboards it opens are that tree's.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--window", type=float, default=20.0, help="Seconds measured per dashboard count.")
parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="The streamlab source tree to benchmark (default: this one).")
args = parser.parse_args()
sys.path.insert(0, str(args.code.resolve()))

import pandas as pd  # noqa: E402
import psutil  # noqa: E402

from kernel_runtime import JobClient, LocalCluster, StreamEnvironment  # noqa: E402
from kernel_runtime.notebook.widgets import Dashboard  # noqa: E402

COUNTS = (0, 1, 5)
CONFIG = {"heartbeat.interval": "500 ms", "metrics.fetcher.update-interval": "500 ms",
          "taskmanager.spark.startup": "lazy"}


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def measure(jobmanager: psutil.Process, window: float) -> tuple[float, float]:
    me = psutil.Process()
    jm0, me0 = cpu_seconds(jobmanager), cpu_seconds(me)
    time.sleep(window)
    return cpu_seconds(jobmanager) - jm0, cpu_seconds(me) - me0


def main() -> None:
    events = "events" if hasattr(importlib.import_module("kernel_runtime.client.cluster_info").ClusterInfo,
                                 "events_address") else "polling"
    print(f"code: {args.code} ({events}); window {args.window:g} s per count; {os.cpu_count()} cores")
    with LocalCluster(Path(tempfile.mkdtemp(prefix="bench-dashboards-")), taskmanagers=2, slots=2,
                      config=CONFIG, embedded=True) as cluster:
        client = JobClient(cluster.info)
        env = StreamEnvironment(parallelism=2)
        (env.from_generator(lambda seq: pd.DataFrame({"user": seq % 100}), rate=5_000, batch_size=250)
            .key_by("user").count().collect())
        handle = client.submit(env.get_job_graph("dashboards bench"))
        deadline = time.monotonic() + 60
        while handle.status != "RUNNING":
            if time.monotonic() > deadline:
                raise SystemExit("the job did not start within 60 s")
            time.sleep(0.2)
        time.sleep(2)  # past the start: the steady state is measured
        jobmanager = psutil.Process(cluster.jobmanager.pid)
        results = {}
        for count in COUNTS:
            boards = [Dashboard(handle, poll_interval=0.3) for _ in range(count)]
            time.sleep(1)  # every dashboard has its first picture
            jm, me = measure(jobmanager, args.window)
            updates = sum(b.updates for b in boards)
            for board in boards:
                board.close()
            results[count] = jm
            print(f"{count} dashboard(s): JobManager {jm:6.2f} CPU s, this process {me:6.2f} CPU s, "
                  f"{updates} dashboard updates")
            time.sleep(1)
        handle.cancel()
        client.close()
    base = results[0]
    print(f"JobManager CPU, 5 vs 1 dashboard: {results[5]:.2f} / {results[1]:.2f} s = "
          f"{results[5] / results[1]:.2f}x; serving them (minus the {base:.2f} s with none): "
          f"{results[5] - base:.2f} / {results[1] - base:.2f} s")


if __name__ == "__main__":
    main()
