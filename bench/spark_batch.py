"""Where one Spark batch's time goes: the per-batch cost of a Spark chain, phase by phase.

The query of issue 14 (``SELECT id, k, v*2 AS v2 FROM input WHERE v < 500``) and a keyed
aggregation's pre-aggregation (``GROUP BY k``: count, sum), on batches of 1k to 1M rows, in one SparkSession
with the TaskManagers' settings (cluster.spark.chain.spark_conf), by the TaskManager's own
code (SparkChain.process). Each batch is split into:

* arrow in:  the Arrow table to the JVM (createDataFrame);
* analysis:  the steps' views and SQL, analysed (ChainSteps.plan);
* planning:  optimisation and physical planning (QueryExecution.executedPlan);
* execute:   the physical plan run, rows counted in the JVM (no rows back to Python);
* arrow out: toArrow less the execution (the rows back to Python as Arrow);
* py4j:      Python -> JVM calls per batch.

Each on two paths in the same process: PySpark's public one (createDataFrame, a temp view,
session.sql, toArrow: what SparkChain did before) and SparkChain's own (ArrowBridge). The phases
are timed on separate runs of the same batch (execute and arrow out each re-run the plan), so
they add up only roughly to "batch", the whole batch timed on its own.

A third row, "process", is a batch as a TaskManager runs it now (SparkChain.process): the plan
analysed once and bound to each batch in the one call into the JVM that also runs its job
(spark_plans.BatchJobs), and a batch of at most execution.spark.local-batch-rows rows of a plan of
projections and filters run in the driver with no Spark job (spark_local). Its own timings: "arrow
in" the batch's Arrow file, "analysis" the kept plan bound to the batch in the JVM, "execute" the
rest (for a batch in the driver, everything the JVM does with it).

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
from cluster.spark.chain import SparkChain  # noqa: E402
from cluster.spark.runner import SparkRunner  # noqa: E402
from cluster.spark.arrow import JvmRefs  # noqa: E402

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


class PySparkPath:
    """What SparkChain did before ArrowBridge (and any PySpark user does): createDataFrame, a temp
    view, session.sql with its analysis checked through .columns, toArrow. The baseline."""

    name = "pyspark"

    def __init__(self, session, query: str):
        self.session, self.query = session, query

    def to_jvm(self, table):
        return self.session.createDataFrame(table)

    def plan(self, df):
        df.createOrReplaceTempView("input")
        out = self.session.sql(self.query)
        out.columns
        return out

    @staticmethod
    def executed(df):
        return df._jdf.queryExecution().executedPlan()

    def from_jvm(self, df):
        return df.toArrow()


class ChainPath:
    """SparkChain's own path: ArrowBridge in and out, the steps' plan on the Java DataFrame."""

    name = "streamlab"

    def __init__(self, op: SparkChain):
        self.op, self.session = op, op._session()
        self.refs = JvmRefs(self.session)  # kept for the bench's few repetitions

    def to_jvm(self, table):
        return self.op.bridge.to_jvm(self.session, table, self.refs)

    def plan(self, jdf):
        return self.op.steps.plan(self.session, jdf, self.refs)

    @staticmethod
    def executed(jdf):
        return jdf.queryExecution().executedPlan()

    def from_jvm(self, jdf):
        return self.op.bridge.from_jvm(self.session, jdf, self.refs)


def breakdown(path, table: pa.Table, calls: Py4jCalls, reps: int) -> dict:
    data = path.to_jvm(table)  # the batch in the JVM; each phase below plans over it anew
    figures = {
        "arrow in": median_ms(lambda: path.to_jvm(table), reps),
        "analysis": median_ms(lambda: path.plan(data), reps),
        "planning": median_ms(lambda: path.executed(path.plan(data)), reps),
        "execute": median_ms(lambda: path.executed(path.plan(data)).execute().count(), reps),
        "toArrow": median_ms(lambda: path.from_jvm(path.plan(data)), reps),
    }
    figures["planning"] -= figures["analysis"]
    figures["execute"] -= figures["analysis"] + figures["planning"]
    figures["arrow out"] = figures["toArrow"] - figures["analysis"] - figures["planning"] - figures["execute"]

    def whole():
        return path.from_jvm(path.plan(path.to_jvm(table)))
    before = calls.count
    whole()
    figures["py4j"] = calls.count - before
    figures["batch"] = median_ms(whole, reps)
    return figures


def process_figures(op: SparkChain, table: pa.Table, calls: Py4jCalls, reps: int) -> dict:
    """SparkChain.process as a TaskManager runs it, with its own split of the time (BatchTimings)."""
    op.process(table)  # the plan kept
    before, timings = calls.count, op.timings
    op.process(table)
    figures = {"py4j": calls.count - before}
    start = (timings.batches, timings.arrow_in, timings.plan, timings.run)
    figures["batch"] = median_ms(lambda: op.process(table), reps)
    batches = timings.batches - start[0]
    figures["arrow in"] = (timings.arrow_in - start[1]) / batches * 1000
    figures["analysis"] = (timings.plan - start[2]) / batches * 1000
    figures["execute"] = (timings.run - start[3]) / batches * 1000
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and no 1M-row batch")
    args = parser.parse_args()
    sizes = (1_000, 10_000, 100_000) if args.quick else (1_000, 10_000, 100_000, 1_000_000)
    select = chain("sql", [{"sql": QUERY}])
    aggregate = chain("aggregate", [{"key": ["k"], "partial_aggregate": {"n": ["v", "count"], "s": ["v", "sum"]}}])
    runner = SparkRunner.running()
    assert runner is not None and runner.session is not None
    calls = Py4jCalls(runner.session)
    print(f"Spark {runner.session.version}, master {runner.session.sparkContext.master}; "
          "milliseconds per batch, medians")
    columns = ["arrow in", "analysis", "planning", "execute", "arrow out", "batch", "py4j"]
    print(f"{'chain':<10} {'path':<10} {'rows':>9} " + " ".join(f"{c:>9}" for c in columns) + f" {'rows/s':>11}")
    queries = {"select": QUERY, "aggregate": aggregate.steps.pairs[-1][1]}  # the pre-aggregation's own SQL
    for name, op in (("select", select), ("aggregate", aggregate)):
        for n in sizes:
            table = batch(n)
            op.process(table)  # warm: the plan's code is generated and cached
            for path in (PySparkPath(op._session(), queries[name]), ChainPath(op)):
                figures = breakdown(path, table, calls, 3 if args.quick or n >= 1_000_000 else 7)
                print(f"{name:<10} {path.name:<10} {n:>9,} " + " ".join(f"{figures[c]:>9.1f}" for c in columns[:-1])
                      + f" {figures['py4j']:>9} {n / figures['batch'] * 1000:>11,.0f}")
            figures = process_figures(op, table, calls, 3 if args.quick or n >= 1_000_000 else 7)
            print(f"{name:<10} {'process':<10} {n:>9,} "
                  + " ".join(f"{figures[c]:>9.1f}" if c in figures else f"{'-':>9}" for c in columns[:-1])
                  + f" {figures['py4j']:>9} {n / figures['batch'] * 1000:>11,.0f}")
    runner.stop()


if __name__ == "__main__":
    main()
