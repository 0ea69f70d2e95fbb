"""How long Java objects that Python dropped wait before py4j releases them in the JVM.

py4j's finalizer thread sends the releases queued by Python's collector once per its sleep: one
second by default, which kept a second of batches alive in the JVM; the TaskManager's SparkRunner
sets it to ``PY4J_RELEASE_POLL_S`` (cluster/spark/chain.py). This starts the runner's
SparkSession in this process, drops 20 Java objects per round and prints how long the queue took
to empty each round (the figure a test bounded at 0.3 s before; no assertion here: a loaded
machine moves it).

    .venv/bin/python bench/py4j_release.py [--rounds 20]
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.conf import TaskConfig  # noqa: E402
from cluster.spark.runner import PY4J_RELEASE_POLL_S, SparkRunner  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    session = SparkRunner.get(TaskConfig.from_dict({})).session_for_task(threading.Event(), lambda detail: None)
    pending = session.sparkContext._gateway._gateway_client.finalizer_deque
    waited = []
    for _ in range(args.rounds):
        objects = [session._jvm.java.util.ArrayList() for _ in range(20)]
        del objects
        gc.collect()
        started = time.monotonic()
        while pending and time.monotonic() - started < 10:
            time.sleep(0.001)
        waited.append(time.monotonic() - started)
    print(f"py4j release poll {PY4J_RELEASE_POLL_S} s; queue emptied after (ms, {args.rounds} rounds): "
          f"median {statistics.median(waited) * 1000:.1f}, max {max(waited) * 1000:.1f}"
          f"{' (still waiting after 10 s)' if pending else ''}")
    SparkRunner.get(TaskConfig.from_dict({})).stop()


if __name__ == "__main__":
    main()
