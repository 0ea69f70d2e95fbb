"""The Spark stages of a chain's subtasks in one process, fused into one Spark job at a time
(cluster/spark/fusion.py), on the test session's real SparkSession: each subtask gets
exactly its own rows, in order; plans that mix partitions run a job per subtask batch."""
from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

from cluster.spark.chain import SparkChain
from cluster.spark.fusion import FusionGroup, is_narrow, split_by_partition
from cluster.spark.memory import BatchMemory
from cluster.spark.stage import SparkStage

from .harness import spark_chains


def job_chains(*args, **kwargs):
    """spark_chains whose every batch is a Spark job: small rounds would run in the driver without
    one, each subtask's batch its own (test_small_rounds_run_in_the_driver_each_subtask_its_own)."""
    return spark_chains(*args, config={"execution.spark.local-batch-rows": 0}, **kwargs)


def rows(subtask: int, n: int, start: int = 0) -> pa.Table:
    seq = (np.arange(n, dtype=np.int64) + start) * 2 + subtask  # subtask 0 even ids, subtask 1 odd
    return pa.table({"id": seq, "v": seq % 7})


def run_subtasks(subtasks: list[SparkChain], inputs: list[list[pa.Table]], fuse: bool = True,
                 paced: bool = False) -> list[pa.Table]:
    """Each subtask as its task does it: a thread that owns its Spark stage, submits its tables one
    by one as they come and flushes at the end (``paced``: after each table, as a slow source's
    rows come once the last are through); the stages in one fusion group (as task.py joins them).
    Every subtask's output, in its order."""
    results: list = [None] * len(subtasks)
    errors: list = []
    groups: list = []
    # Fused: the group's rounds wait until every subtask's first table waits, so the first round
    # carries them all whatever the threads' timing (on a busy machine one subtask could otherwise
    # send all its tables through Spark before the other sent one, and no job would be fused).
    joined = threading.Barrier(len(subtasks), timeout=120, action=lambda: groups and groups[0].lock.acquire())
    first_in = threading.Barrier(len(subtasks), timeout=120, action=lambda: groups and groups[0].lock.release())

    def task(i):
        try:
            chain = subtasks[i]
            stage = SparkStage(chain.process, chain.cancel_jobs, chain.spec.where(), 1_000_000, 64 << 20, 1,
                               chain.ctx.cancelled, lambda: None)
            if fuse:
                stage.group = FusionGroup.join((chain.ctx.job_id, 0, chain.spec.uid), stage, chain)
                groups.append(stage.group)
            joined.wait()
            out = []
            try:
                for n, table in enumerate(inputs[i]):
                    stage.submit([table])
                    if n == 0:
                        first_in.wait()
                    out += stage.flush() if paced else stage.take_results()
                out += stage.flush()
            finally:
                stage.close()
            results[i] = pa.concat_tables(out) if out else None
        except BaseException as exc:
            errors.append(exc)
            joined.abort()  # the other subtasks stop waiting for this one
            first_in.abort()
    threads = [threading.Thread(target=task, args=(i,)) for i in range(len(subtasks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    if errors:
        raise errors[0]
    return results


def test_small_rounds_run_in_the_driver_each_subtask_its_own(spark):
    """Once the plan is kept, a round small enough runs each subtask's batch without a Spark job
    (spark_local) rather than one job for both: each still gets exactly its own rows."""
    subtasks = spark_chains("SELECT id, v * 10 AS w FROM input WHERE v <> 3", "fused small")
    inputs = [[rows(s, 50 + i, start=10_000 * i) for i in range(30)] for s in range(2)]
    try:
        results = run_subtasks(subtasks, inputs, paced=True)
        for table, got in zip([pa.concat_tables(i) for i in inputs], results):
            expected = table.filter(pa.compute.not_equal(table["v"], 3))
            assert got.column("id").to_pylist() == expected["id"].to_pylist()
            assert got.column("w").to_pylist() == [v * 10 for v in expected["v"].to_pylist()]
        # all but the first few (before a plan was kept) ran in the driver
        assert sum(chain.local_batch_count for chain in subtasks) >= 50
    finally:
        close(subtasks)


def close(subtasks):
    for chain in subtasks:
        chain.close()


def test_fused_subtasks_get_their_own_rows_in_order(spark):
    subtasks = job_chains("SELECT id, v * 10 AS w FROM input WHERE v <> 3", "fused")
    # many small tables (as a source polls them): while a job runs, both subtasks' next ones wait
    inputs = [[rows(s, 300 + i, start=10_000 * i) for i in range(40)] for s in range(2)]
    inputs[1].insert(5, rows(1, 120_000, start=900_000))  # one cut into several partitions
    try:
        results = run_subtasks(subtasks, inputs)
        for table, got in zip([pa.concat_tables(i) for i in inputs], results):
            expected = table.filter(pa.compute.not_equal(table["v"], 3))
            assert got.column_names == ["id", "w"]
            assert got.column("id").to_pylist() == expected["id"].to_pylist()
            assert got.column("w").to_pylist() == [v * 10 for v in expected["v"].to_pylist()]
        assert sum(chain.fused_jobs for chain in subtasks) >= 1, "no job carried both subtasks' batches"
    finally:
        close(subtasks)
    assert ("fused", 0, "sql-1") not in FusionGroup._registry  # the last stage to close removed the group


def test_a_fused_job_takes_no_more_than_the_budget_for_batches_in_the_jvm(spark):
    """Two subtasks' waiting batches together over the TaskManager's budget (spark_memory): the job
    takes what fits, the rest goes in the next one; every subtask still gets all its rows."""
    subtasks = job_chains("SELECT id, v FROM input", "budget")
    memory = BatchMemory(40_000)  # 2,500 rows of two int64 columns
    inputs = [[rows(s, 1_000, start=1_000 * i) for i in range(12)] for s in range(2)]
    job_bytes: list[int] = []
    for chain in subtasks:
        chain.memory = memory
        process, process_parts = chain.process, chain.process_parts
        chain.process = lambda table, process=process: job_bytes.append(table.nbytes) or process(table)
        chain.process_parts = lambda tables, group, process_parts=process_parts: \
            job_bytes.append(sum(t.nbytes for t in tables)) or process_parts(tables, group)
    try:
        results = run_subtasks(subtasks, inputs)
        for tables, got in zip(inputs, results):
            assert got.column("id").to_pylist() == pa.concat_tables(tables)["id"].to_pylist()
        assert max(job_bytes) <= 40_000, job_bytes
        assert sum(job_bytes) == 2 * 12 * 16_000
        assert sum(chain.fused_jobs for chain in subtasks) >= 1
    finally:
        close(subtasks)


def test_a_plan_with_an_exchange_runs_one_job_per_subtask_batch(spark):
    subtasks = job_chains("SELECT v, count(*) AS n FROM input GROUP BY v", "grouped")
    inputs = [[rows(s, 700, start=1_000 * i) for i in range(10)] for s in range(2)]
    try:
        results = run_subtasks(subtasks, inputs)
        for tables, got in zip(inputs, results):
            counts: dict = {}
            for v, n in zip(got.column("v").to_pylist(), got.column("n").to_pylist()):
                counts[v] = counts.get(v, 0) + n  # one row per v and batch
            values = pa.concat_tables(tables)["v"].to_numpy()
            assert counts == {int(v): int((values == v).sum()) for v in np.unique(values)}
        assert sum(chain.fused_jobs for chain in subtasks) == 0
    finally:
        close(subtasks)


def test_without_fusion_each_subtask_runs_its_own_jobs(spark):
    subtasks = job_chains("SELECT id FROM input", "alone")
    inputs = [[rows(s, 50, start=100 * i) for i in range(5)] for s in range(2)]
    try:
        results = run_subtasks(subtasks, inputs, fuse=False)
        assert [r.column("id").to_pylist() for r in results] == \
            [pa.concat_tables(i)["id"].to_pylist() for i in inputs]
        assert sum(chain.fused_jobs for chain in subtasks) == 0
    finally:
        close(subtasks)


@pytest.mark.parametrize("tree,narrow", [
    ("*(1) Project [id#0L, (v#1L * 10) AS w#4L]\n+- *(1) Filter NOT (v#1L = 3)\n"
     "   +- *(1) Scan ExistingRDD arrow[id#0L,v#1L]", True),
    ("*(2) HashAggregate(keys=[v#1L], functions=[count(1)])\n+- Exchange hashpartitioning(v#1L, 2)\n"
     "   +- *(1) HashAggregate(keys=[v#1L], functions=[partial_count(1)])\n      +- *(1) Scan ExistingRDD[id#0L,v#1L]",
     False),
    ("CollectLimit 2\n+- *(1) Scan ExistingRDD[id#0L,v#1L]", False),
    ("*(1) Project [id#0L, Subquery subquery#5, [id=#20] AS m#6L]\n:  +- Subquery subquery#5, [id=#20]\n"
     ":     +- *(2) HashAggregate(keys=[], functions=[max(v#1L)])\n+- *(1) Scan ExistingRDD[id#0L,v#1L]", False),
])
def test_only_partition_keeping_plans_are_fused(tree, narrow):
    assert is_narrow(tree) is narrow


def test_split_by_partition_cuts_the_tagged_output_per_batch():
    out = pa.table({"x": [1, 2, 3, 4, 5], "__streamlab_partition__": pa.array([0, 0, 2, 3, 3], pa.int32())})
    parts = split_by_partition(out, [(0, 1), (1, 2), (2, 4)])  # the second batch's partition had no rows left
    assert [[t.column("x").to_pylist() for t in p] for p in parts] == [[[1, 2]], [], [[3, 4, 5]]]
    assert all(t.column_names == ["x"] for p in parts for t in p)


def test_a_batch_run_on_another_subtasks_thread_counts_under_its_own_job_group(spark):
    """A fused round's worker runs its fellow subtasks' batches (each in a job of its own when the
    plan mixes partitions): every job must be in the job group of the subtask whose batch it is,
    which its metrics count and its cancellation cancels."""
    first, second = job_chains("SELECT v, count(*) AS n FROM input GROUP BY v", "groups")
    try:
        for chain in (first, second, first, second, first):  # one thread, as one worker's rounds
            assert chain.process(rows(chain.ctx.subtask, 50))
        assert [(c.metrics()["spark-jobs"], c.metrics()["spark-batches"]) for c in (first, second)] == [(3, 3), (2, 2)]
    finally:
        close([first, second])


def test_a_subtask_joins_its_group_while_a_round_runs(spark):
    """A subtask's task joins its fusion group as it opens, and its source reads nothing before:
    joining must not wait for the round that another subtask's worker runs meanwhile (under the
    group's lock, held here as a round holds it). When 5M rows of the stateless .sql benchmark
    began, one subtask waited 300-450 ms so for the other's first job. Leaving does wait: a round
    may hold the leaving stage's batch."""
    subtasks = job_chains("SELECT id FROM input", "joining")
    key = ("joining", 0, "sql-1")
    stages = [SparkStage(c.process, c.cancel_jobs, c.spec.where(), 1_000_000, 64 << 20, 1, c.ctx.cancelled,
                         lambda: None) for c in subtasks]
    try:
        group = stages[0].group = FusionGroup.join(key, stages[0], subtasks[0])
        joined, left = threading.Event(), threading.Event()
        with group.lock:  # a round runs
            threading.Thread(target=lambda: (FusionGroup.join(key, stages[1], subtasks[1]), joined.set()),
                             daemon=True).start()
            assert joined.wait(5), "joining waited for the round"
            threading.Thread(target=lambda: (group.leave(stages[1]), left.set()), daemon=True).start()
            assert not left.wait(0.3), "leaving did not wait for the round"
        assert left.wait(5)
        assert [stage for stage, _ in group.members] == [stages[0]]
    finally:
        for stage in stages:
            stage.close()
        close(subtasks)
    assert key not in FusionGroup._registry
