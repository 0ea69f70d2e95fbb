"""Where one Spark batch's time goes: the per-batch cost of a Spark chain, phase by phase.

The query of issue 14 (``SELECT id, k, v*2 AS v2 FROM input WHERE v < 500``) and a keyed
pre-aggregation (``GROUP BY k: count, sum``), on batches of 1k to 1M rows, in one SparkSession
with the TaskManagers' settings (cluster.operators.spark.spark_conf), by the TaskManager's own
code (SparkChain.process). Each batch is split into:

* arrow in:  the Arrow table to the JVM (createDataFrame);
* analysis:  the steps' views and SQL, analysed (SparkChain._plan);
* planning:  optimisation and physical planning (QueryExecution.executedPlan);
* execute:   the physical plan run, rows counted in the JVM (no rows back to Python);
* arrow out: toArrow less the execution (the rows back to Python as Arrow);
* py4j:      Python -> JVM calls per batch.

The phases are timed on separate runs of the same batch (execute and arrow out each re-run the
plan), so they add up only roughly to "SparkChain.process", which is timed on its own.

    .venv/bin/python bench/spark_batch.py [--quick]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.conf import TaskConfig  # noqa: E402
from cluster.graph.job_graph import OperatorSpec  # noqa: E402
from cluster.operators.base import OperatorContext  # noqa: E402
from cluster.operators.spark import SparkChain, SparkRunner  # noqa: E402

QUERY = "SELECT id, k, v*2 AS v2 FROM input WHERE v < 500"


def batch(n: int) -> pa.Table:
    seq = np.arange(n, dtype=np.int64)
    return pa.table({"id": seq, "k": seq % 10_000, "v": seq % 1_000})


def chain(name: str, steps: list[dict]) -> SparkChain:
    config = TaskConfig.from_dict({})
    ctx = OperatorContext(job_id="bench", job_name="bench", attempt=0, subtask=0, parallelism=1,
                          max_parallelism=128, config=config, result_address=None, cancelled=threading.Event(),
                          sender=None, execution_id=f"bench-{name}", task_name=name)
    specs = [OperatorSpec(uid=f"{name}-{i}", kind="spark", name=name, call_site="bench/spark_batch.py",
                         params=params, udf=None) for i, params in enumerate(steps)]
    op = SparkChain(specs, ctx)
    op.open()
    return op


class Py4jCalls:
    """Counts the commands PySpark sends to the JVM (every py4j round trip)."""

    def __init__(self, session):
        client = session.sparkContext._gateway._gateway_client
        self.count = 0
        send = client.send_command

        def counted(*args, **kwargs):
            self.count += 1
            return send(*args, **kwargs)
        client.send_command = counted


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def breakdown(op: SparkChain, table: pa.Table, calls: Py4jCalls, reps: int) -> dict:
    session = op._session()
    jdf = op.bridge.to_jvm(session, table)  # the batch in the JVM; each phase below plans over it anew
    figures = {
        "arrow in": median_ms(lambda: op.bridge.to_jvm(session, table), reps),
        "analysis": median_ms(lambda: op._plan(session, jdf), reps),
        "planning": median_ms(lambda: op._plan(session, jdf).queryExecution().executedPlan(), reps),
        "execute": median_ms(lambda: op._plan(session, jdf).queryExecution().executedPlan().execute().count(),
                             reps),
        "toArrow": median_ms(lambda: op.bridge.from_jvm(session, op._plan(session, jdf)), reps),
    }
    figures["planning"] -= figures["analysis"]
    figures["execute"] -= figures["analysis"] + figures["planning"]
    figures["arrow out"] = figures["toArrow"] - figures["analysis"] - figures["planning"] - figures["execute"]
    before = calls.count
    op.process(table)
    figures["py4j"] = calls.count - before
    figures["process"] = median_ms(lambda: op.process(table), reps)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and no 1M-row batch")
    args = parser.parse_args()
    sizes = (1_000, 10_000, 100_000) if args.quick else (1_000, 10_000, 100_000, 1_000_000)
    select = chain("sql", [{"sql": QUERY}])
    aggregate = chain("aggregate", [{"sql": "SELECT id, k, v FROM input"},
                                    {"key": ["k"], "partial_aggregate": {"n": ["v", "count"], "s": ["v", "sum"]}}])
    runner = SparkRunner.running()
    assert runner is not None and runner.session is not None
    calls = Py4jCalls(runner.session)
    print(f"Spark {runner.session.version}, master {runner.session.sparkContext.master}; "
          "milliseconds per batch, medians")
    columns = ["arrow in", "analysis", "planning", "execute", "arrow out", "process", "py4j"]
    print(f"{'chain':<10} {'rows':>9} " + " ".join(f"{c:>9}" for c in columns) + f" {'rows/s':>11}")
    for name, op in (("select", select), ("aggregate", aggregate)):
        for n in sizes:
            table = batch(n)
            op.process(table)  # warm: the plan's code is generated and cached
            figures = breakdown(op, table, calls, 3 if args.quick or n >= 1_000_000 else 7)
            print(f"{name:<10} {n:>9,} " + " ".join(f"{figures[c]:>9.1f}" for c in columns[:-1])
                  + f" {figures['py4j']:>9} {n / figures['process'] * 1000:>11,.0f}")
    runner.stop()


if __name__ == "__main__":
    main()
