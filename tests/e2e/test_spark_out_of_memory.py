"""A TaskManager's Spark JVM that runs out of heap: the job fails, naming the option that sizes the
heap, and the TaskManager comes back with a fresh JVM, where the next job runs.

Before, an OutOfMemoryError could kill a thread of Spark's scheduler and leave the JVM alive
without it: the job then waited forever for a result that no thread would compute."""
from __future__ import annotations

import pytest

from kernel_runtime import JobClient, JobExecutionError, StreamEnvironment
from tests.conftest import assert_at_rest, rest, wait_for

# One TaskManager with the least heap Spark starts with; its JVM starts with the cluster (eager).
# Its log tells of the JVM's end and of its own restart (CRITICAL), and py4j logs the calls that
# broke off with it, with their tracebacks.
pytestmark = [pytest.mark.slow, pytest.mark.cluster(
    taskmanagers=1, slots=2, expect_errors=("Spark JVM ran out of memory", "re-executing as", "py4j"),
    **{"taskmanager.spark.driver-memory": "512m"})]


def test_a_spark_step_that_runs_the_heap_out_fails_its_job_and_the_taskmanager_comes_back(own_cluster):
    client = JobClient(own_cluster.info)
    (before,) = rest(own_cluster, "/taskmanagers")[1]["taskmanagers"]
    env = StreamEnvironment(parallelism=1, cluster=own_cluster.cluster_dir)
    # an array of 200M longs per row (1.6 GB): more than the whole 512m heap; `+ k` keeps Spark's
    # optimizer from building it while it plans
    (env.from_generator(lambda s: {"k": s + 1}, count=2)
        .sql("SELECT k, size(sequence(1, 200000000 + k)) AS n FROM input")
        .collect())
    with pytest.raises(JobExecutionError) as info:
        env.execute_async("runs the heap out", client=client).wait(300)
    assert "Spark JVM ran out of memory" in str(info.value), info.value.failure
    assert "taskmanager.spark.driver-memory (512m)" in str(info.value), info.value.failure

    # the TaskManager replaced itself (a new id, a new JVM), and a job runs there
    after = wait_for(lambda: [t for t in rest(own_cluster, "/taskmanagers")[1]["taskmanagers"]
                              if t["id"] != before["id"]], 120, "the TaskManager back with a new id")
    assert len(after) == 1
    env = StreamEnvironment(parallelism=1, cluster=own_cluster.cluster_dir)
    env.from_generator(lambda s: {"k": s + 1}, count=2).sql("SELECT k, k * 10 AS n FROM input").collect()
    out = env.execute_async("after", client=client).wait(300).to_pandas().sort_values("k")
    assert out["n"].tolist() == [10, 20]
    assert_at_rest(own_cluster)
    client.close()
