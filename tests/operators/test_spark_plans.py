"""A .sql chain's first analysed plan, re-used for later batches and later jobs
(cluster/spark/plans.py), on the test process's TaskManager SparkSession: every batch
still gets exactly its own rows' result; plans that read their input twice, inside an expression,
or read a view are analysed per batch."""
from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cluster.conf import TaskConfig
from cluster.operators.base import UserFunctionError
from cluster.spark.runner import SparkRunner
from cluster.spark.fusion import FusionGroup, split_by_partition
from cluster.spark.plans import PlanCache

from .harness import spark_chains


def job_chains(*args, **kwargs):
    """spark_chains whose every batch is a Spark job: the plans re-used here are bound to each
    batch's input (small batches that run in the driver are test_spark_local.py's)."""
    return spark_chains(*args, config={"execution.spark.local-batch-rows": 0}, **kwargs)


@pytest.fixture(autouse=True)
def plans(spark) -> PlanCache:
    """The TaskManager's plans, empty for each test: a plan another test analysed is not re-used."""
    runner = SparkRunner.get(TaskConfig.from_dict({}))
    runner.ready.wait()
    kept, runner.plans = runner.plans, PlanCache()
    yield runner.plans
    runner.plans = kept


def batch(i: int, n: int = 200) -> pa.Table:
    seq = np.arange(n, dtype=np.int64) + 1_000 * i
    return pa.table({"id": seq, "v": (seq * (i + 3)) % 11})


def test_later_batches_run_the_first_batchs_plan_over_their_own_rows(spark):
    chain, = job_chains("SELECT id, v * 10 AS w FROM input WHERE v <> 3", "plans", parallelism=1)
    try:
        for i in range(6):
            table = batch(i, 100 + 50 * i)
            out, = chain.process(table)
            kept = table.filter(pc.not_equal(table["v"], 3))
            assert out.column_names == ["id", "w"]
            assert out["id"].to_pylist() == kept["id"].to_pylist(), f"batch {i}"
            assert out["w"].to_pylist() == [v * 10 for v in kept["v"].to_pylist()], f"batch {i}"
        assert chain.plans_reused == 5
        assert chain.metrics()["spark-plans-reused"] == 5
    finally:
        chain.close()


def test_fused_rounds_reuse_the_tagged_plan(spark):
    first, second = job_chains("SELECT id, v FROM input WHERE v < 6", "fused-plans")
    group = FusionGroup(("fused-plans",))
    try:
        for i in range(4):
            tables = [batch(2 * i, 300), batch(2 * i + 1, 70_000)]  # the second in several partitions
            out, ranges = first.process_parts(tables, group)
            for table, got in zip(tables, split_by_partition(out, ranges)):  # by each row's partition tag
                assert pa.concat_tables(got).to_pydict() == table.filter(pc.less(table["v"], 6)).to_pydict(), \
                    f"round {i}"
        assert first.plans_reused == 3 and first.fused_jobs == 4
    finally:
        first.close()
        second.close()


def test_a_reused_plan_gathers_nothing_from_batch_to_batch(spark):
    """Each Dataset adds its id to its plan root's tags; the template's root must not keep them."""
    chain, = job_chains("SELECT id, v FROM input WHERE v > 2", "tags", parallelism=1)
    session = chain._session()
    dataset_ids = session._jvm.org.apache.spark.sql.classic.Dataset.DATASET_ID_TAG()
    try:
        for i in range(12):
            chain.process(batch(i))
        assert chain.plans_reused == 11
        template = chain.paths.plans.get(chain.paths.key(False, batch(0).schema)).template
        root = template._path[0][0]
        ids = root.getTagValue(dataset_ids)
        assert not ids.isDefined() or ids.get().size() <= 1, f"{ids.get().size()} datasets' ids on the template"
    finally:
        chain.close()


def test_batches_whose_schemas_differ_only_in_metadata_share_a_plan(spark):
    """pandas' metadata differs from table to table (a RangeIndex's bounds); Spark ignores it."""
    chain, = job_chains("SELECT id, v * 10 AS w FROM input WHERE v <> 3", "metadata", parallelism=1)
    try:
        for i in range(4):
            table = batch(i).replace_schema_metadata({b"pandas": f'{{"index_columns": [{{"start": {i}}}]}}'.encode()})
            out, = chain.process(table)
            kept = table.filter(pc.not_equal(table["v"], 3))
            assert out["w"].to_pylist() == [v * 10 for v in kept["v"].to_pylist()]
        assert chain.plans_reused == 3
    finally:
        chain.close()


def test_plans_that_draw_random_numbers_are_analysed_per_batch(spark):
    """Analysis fixes rand()'s seed: a re-used plan drew the same numbers for every batch."""
    chain, = job_chains("SELECT id, rand() AS r FROM input WHERE rand() < 2", "random", parallelism=1)
    try:
        draws = [chain.process(batch(0))[0]["r"].to_pylist() for _ in range(3)]
        assert len(draws[0]) == batch(0).num_rows
        assert draws[0] != draws[1] and draws[1] != draws[2] and draws[0] != draws[2]
        assert chain.plans_reused == 0
    finally:
        chain.close()


def test_a_new_schema_gets_a_plan_of_its_own(spark):
    chain, = job_chains("SELECT id, v + 1 AS u FROM input", "schemas", parallelism=1)
    try:
        whole = batch(0)
        halves = pa.table({"id": whole["id"], "v": pc.divide(pc.cast(whole["v"], pa.float64()), 2.0)})
        for table in (whole, halves, whole, halves):
            out, = chain.process(table)
            assert out["u"].to_pylist() == [v + 1 for v in table["v"].to_pylist()]
            assert out.schema.field("u").type == table.schema.field("v").type
        assert chain.plans_reused == 2
    finally:
        chain.close()


def test_plans_that_read_the_input_twice_or_in_a_subquery_are_analysed_per_batch(spark):
    queries = {
        "SELECT id FROM input WHERE v = (SELECT max(v) FROM input)":
            lambda t: [i for i, v in zip(t["id"].to_pylist(), t["v"].to_pylist()) if v == max(t["v"].to_pylist())],
        "SELECT a.id FROM input a JOIN input b ON a.id = b.id + 1 ORDER BY a.id":
            lambda t: t["id"].to_pylist()[1:],
    }
    for n, (query, expected) in enumerate(queries.items()):
        chain, = job_chains(query, f"twice-{n}", parallelism=1)
        try:
            for i in range(3):
                table = batch(i, 50 + i)
                out, = chain.process(table)
                assert out["id"].to_pylist() == expected(table), f"{query}, batch {i}"
            assert chain.plans_reused == 0
        finally:
            chain.close()


def test_a_reused_plan_keeps_no_batch_alive_in_the_jvm(spark):
    """After their jobs (and JvmRefs' release) the JVM may free every batch's Arrow bytes, while the
    chain (its session, the template) goes on, as without templates: the batch whose plan became
    the template is held neither by the template's plan nor by the view ``input`` (each held it,
    up to a fused job's 64 MB, for the chain's life), and a later one not by the template's
    arguments, which hold a batch's rdd only while its plan is built."""
    from cluster.spark.arrow import JvmRefs
    from cluster.spark.plans import PlanTemplate
    chain, = job_chains("SELECT id, v FROM input WHERE v > 2", "held", parallelism=1)
    session = chain._session()
    jvm = session._jvm
    weak = {}
    try:
        with JvmRefs(session) as refs:
            first = chain.bridge.to_jvm(session, batch(0), refs)
            weak["the analysed batch"] = jvm.java.lang.ref.WeakReference(refs.add(refs.add(first.logicalPlan()).rdd()))
            template = PlanTemplate.of(session, chain.steps.plan(session, first, refs), refs)
        assert template is not None
        with JvmRefs(session) as refs:
            second = chain.bridge.to_jvm(session, batch(1), refs)
            weak["a later batch"] = jvm.java.lang.ref.WeakReference(refs.add(refs.add(second.logicalPlan()).rdd()))
            out = chain.bridge.from_jvm(session, template.bind(session, second, refs), refs)
            expected = batch(1).filter(pc.greater(batch(1)["v"], 2))
            assert out.to_pydict() == expected.to_pydict()
        deadline = time.monotonic() + 10
        while any(w.get() is not None for w in weak.values()) and time.monotonic() < deadline:
            jvm.System.gc()
            time.sleep(0.1)
        held = [what for what, w in weak.items() if w.get() is not None]
        assert not held, f"the rdd of {held} is still referenced in the JVM"
        template.release()
    finally:
        chain.close()


def filtered(table: pa.Table) -> dict:
    return table.filter(pc.greater(table["v"], 4)).to_pydict()


def test_a_later_jobs_chain_runs_the_plan_an_earlier_job_analysed(plans):
    query = "SELECT id, v FROM input WHERE v > 4"
    earlier, = job_chains(query, "earlier", parallelism=1)
    try:
        for i in range(2):
            assert earlier.process(batch(i))[0].to_pydict() == filtered(batch(i))
        assert earlier.plans_reused == 1
    finally:
        earlier.close()
    assert len(plans) == 1
    later, = job_chains(query, "later", parallelism=1)
    try:
        for i in range(2, 5):
            assert later.process(batch(i, 300))[0].to_pydict() == filtered(batch(i, 300)), f"batch {i}"
        assert later.plans_reused == 3  # its first batch too
    finally:
        later.close()
    other, = job_chains("SELECT id, v FROM input WHERE v > 5", "other", parallelism=1)
    try:
        other.process(batch(0))
        assert other.plans_reused == 0 and len(plans) == 2
    finally:
        other.close()


def test_plans_that_read_a_view_are_analysed_per_batch_and_see_what_it_holds_then(spark):
    """A global temporary view (seen by every session), of constants only, replaced between two
    batches of one chain."""
    query = "SELECT input.id, d.name FROM input JOIN global_temp.plan_dim d ON input.v = d.v ORDER BY input.id"
    spark.sql("CREATE OR REPLACE GLOBAL TEMPORARY VIEW plan_dim AS SELECT 1L AS v, 'one' AS name")
    chain, = job_chains(query, "view", parallelism=1)
    try:
        table = batch(0, 20)
        ones = [i for i, v in zip(table["id"].to_pylist(), table["v"].to_pylist()) if v == 1]
        assert chain.process(table)[0].to_pydict() == {"id": ones, "name": ["one"] * len(ones)}
        spark.sql("CREATE OR REPLACE GLOBAL TEMPORARY VIEW plan_dim AS SELECT 1L AS v, 'uno' AS name")
        assert chain.process(table)[0].to_pydict() == {"id": ones, "name": ["uno"] * len(ones)}
        assert chain.plans_reused == 0
    finally:
        chain.close()
        spark.catalog.dropGlobalTempView("plan_dim")


def test_threads_binding_one_plan_at_once_each_run_their_own_rows(plans):
    """Two subtasks' workers bind the TaskManager's one plan at the same time."""
    chains = job_chains("SELECT id, v FROM input WHERE v > 4", "threads")
    chains[0].process(batch(0))  # the plan both bind
    wrong: list = []

    def run(chain, subtask: int) -> None:
        for i in range(1, 16):
            table = batch(2 * i + subtask, 100 + 7 * i + subtask)
            if chain.process(table)[0].to_pydict() != filtered(table):
                wrong.append((subtask, i))

    threads = [threading.Thread(target=run, args=(chain, n)) for n, chain in enumerate(chains)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not wrong, f"batches given another batch's rows: {wrong}"
        assert [c.plans_reused for c in chains] == [15, 15]
    finally:
        for chain in chains:
            chain.close()


def test_the_least_recently_used_plan_is_released_past_the_capacity(spark):
    runner = SparkRunner.get(TaskConfig.from_dict({}))
    runner.plans = plans = PlanCache(capacity=2)
    queries = [f"SELECT id FROM input WHERE v > {n}" for n in range(3)]
    chains = [job_chains(query, f"lru-{n}", parallelism=1)[0] for n, query in enumerate(queries)]
    try:
        for chain in chains:
            chain.process(batch(0))
        first = chains[0]
        assert len(plans) == 2 and plans.get(first.paths.key(False, batch(0).schema)) is None
        again, = job_chains(queries[0], "lru-again", parallelism=1)
        chains.append(again)
        out, = again.process(batch(1))
        assert out["id"].to_pylist() == [i for i, v in zip(batch(1)["id"].to_pylist(), batch(1)["v"].to_pylist())
                                         if v > 0]
        assert again.plans_reused == 0
    finally:
        for chain in chains:
            chain.close()


def test_a_chain_that_runs_a_plan_it_did_not_analyse_still_checks_its_consumers_columns(plans):
    query = "SELECT id, v AS w FROM input"
    earlier, = job_chains(query, "columns", parallelism=1)
    try:
        earlier.process(batch(0))
    finally:
        earlier.close()
    needs_v = {"consumer_columns": [["v", "key_by column {}", "key_by (test.py:2)"]]}
    keyed, = job_chains(query, "columns-keyed", parallelism=1, params=needs_v)  # its first batch checks
    try:
        with pytest.raises(UserFunctionError, match="key_by column `v` does not exist; the input .* has id, w"):
            keyed.process(batch(1))
    finally:
        keyed.close()
    # at open, against the schema the client knew: the plan is not analysed again there
    with pytest.raises(UserFunctionError, match="key_by column `v` does not exist; the input .* has id, w"):
        job_chains(query, "columns-open", parallelism=1,
                     params={"input_schema": batch(0).schema.serialize().to_pybytes(), **needs_v})


ALL_KINDS = ("SELECT id, v * 10 AS w, upper(name) AS name, CAST(id / 7 AS DECIMAL(12, 2)) AS money, "
             "array(v, v + 1) AS pair FROM input WHERE v <> 3")


def named(i: int, n: int) -> pa.Table:
    table = batch(i, n)
    names = pa.array([None if s % 5 == 0 else f"n{s % 9}" for s in table["id"].to_pylist()], pa.string())
    return table.append_column("name", names)


def test_a_kept_plans_batch_is_one_call_into_the_jvm_and_gives_the_python_ways_rows(spark):
    """spark_plans.BatchJobs (jvm/BatchJob.java) against the Python way (the kept plan bound node by
    node, its Arrow served over a socket) on the same batches: the same tables, schemas included."""
    helper, = job_chains(ALL_KINDS, "batch-job", parallelism=1)
    python, = job_chains(ALL_KINDS, "batch-job-python", parallelism=1)
    python.paths.batch_jobs = None
    client = helper._session().sparkContext._gateway._gateway_client
    send, commands = client.send_command, []
    try:
        for i, n in enumerate((200, 1, 3_000, 60_000)):
            client.send_command = lambda command, *a, **k: (commands.append(command), send(command, *a, **k))[1]
            got = pa.concat_tables(helper.process(named(i, n)))
            client.send_command = send
            expected = pa.concat_tables(python.process(named(i, n)))
            assert got.schema == expected.schema and got.equals(expected), f"batch {i}"
        assert helper.plans_reused == 3 and python.plans_reused == 4  # its first batch ran the helper's plan
        assert helper.metrics()["spark-jobs"] == 4
        commands.clear()
        client.send_command = lambda command, *a, **k: (commands.append(command), send(command, *a, **k))[1]
        helper.process(named(9, 500))
        client.send_command = send
        # one call (and the job group's, set again on this thread after the other chain's batch;
        # py4j's releases of proxies that Python freed meanwhile are no calls)
        calls = [c.split("\n")[1:3] for c in commands if c.startswith("c\n")]
        assert [c for c in calls if c[1] != "setJobGroup"] == [["z:streamlab.BatchJob", "run"]], commands
        assert spark._jvm.streamlab.BatchJob.held() == 0  # a local job's batches went with it
        empty, = helper.process(named(10, 50).filter(pc.equal(named(10, 50)["v"], 3)))
        assert empty.num_rows == 0 and empty.schema == expected.schema
    finally:
        client.send_command = send
        helper.close()
        python.close()


def test_a_runtime_error_in_a_kept_plans_job_fails_the_chain_naming_it(spark):
    chain, = job_chains("SELECT id, 100 DIV v AS q FROM input", "batch-job-error", parallelism=1)
    try:
        good = batch(0).filter(pc.not_equal(batch(0)["v"], 0))
        chain.process(good)
        assert chain.process(good)[0]["q"].to_pylist() == [100 // v for v in good["v"].to_pylist()]
        with pytest.raises(UserFunctionError) as failure:
            chain.process(batch(1))  # v = 0 in some rows: Spark's ANSI division by zero
        message = str(failure.value)
        assert "operator chain [sql] (test.py:1) failed in Spark" in message and "DIVIDE_BY_ZERO" in message
        # the failed local job's input and the output of its partitions that finished are let go
        assert spark._jvm.streamlab.BatchJob.held() == 0
        assert chain.process(good)[0].num_rows == good.num_rows  # the chain goes on
    finally:
        chain.close()


def test_a_template_released_while_a_job_uses_its_root_leaves_the_jvm_when_that_job_is_done(plans):
    chain, = job_chains("SELECT id, v FROM input WHERE v > 4", "release-in-use", parallelism=1)
    try:
        chain.process(batch(0))
        template = chain.paths.cached(batch(0).schema, False)
        assert template is not None
        with template.root() as root:
            template.release()  # evicted by another job's plan meanwhile
            assert root.nodeName() == "Project"  # still in the JVM for this call
            assert template._kept
        assert not template._kept
        with template.root() as root:
            assert root is None
        plans._plans.clear()
        assert chain.process(batch(1))[0].to_pydict() == filtered(batch(1))  # analysed again
    finally:
        chain.close()
