"""How soon ``JobHandle.wait()`` returns after the job's end, by the JobManager's clock.

``wait()`` hears of the end from the job's events (no polling): a local 2 x 2 cluster runs a
short bounded job ``--runs`` times and this prints, per run, the milliseconds from the job's
``end-time`` (the JobManager's clock; same host, so one clock) to ``wait()``'s return. A test
bounded it at 500 ms before (tests/e2e/test_events.py keeps the no-polling part); no assertion
here: a loaded machine moves it.

    .venv/bin/python bench/wait_latency.py [--runs 10]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402

from kernel_runtime import JobClient, LocalCluster, StreamEnvironment  # noqa: E402

CONFIG = {"heartbeat.interval": "200 ms", "heartbeat.timeout": "2 s", "taskmanager.spark.startup": "lazy"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with LocalCluster(Path(tempfile.mkdtemp(prefix="bench-wait-")), taskmanagers=2, slots=2, config=CONFIG,
                      embedded=True) as cluster:
        client = JobClient(cluster.info)
        late = []
        for i in range(args.runs):
            env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
            env.from_generator(lambda seq: pd.DataFrame({"x": seq}), count=2_000, rate=2_000, batch_size=100).collect()
            handle = env.execute_async(f"prompt {i}", client=client)
            handle.wait(60)
            returned_ms = time.time() * 1000
            late.append(returned_ms - client.job_details(handle.job_id)["end-time"])
        client.close()
    print(f"wait() after the job's end (ms, {args.runs} runs): {', '.join(f'{x:.0f}' for x in late)}; "
          f"median {statistics.median(late):.0f}, max {max(late):.0f}")


if __name__ == "__main__":
    main()
