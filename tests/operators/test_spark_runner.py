"""The TaskManager's SparkSession (cluster/spark/chain.py's SparkRunner), in the test process."""
from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pyarrow as pa

from cluster.conf import TaskConfig
from cluster.spark.runner import PY4J_RELEASE_POLL_S, SparkRunner
from cluster.spark.fusion import FusionGroup

from ..conftest import wait_for
from .harness import spark_chains


def test_java_objects_python_drops_are_released_in_the_jvm_at_our_pace():
    # py4j's own pace is a release every second, which kept a second of batches alive in the JVM:
    # its finalizer thread sleeps our poll instead (how long a release waits is
    # bench/py4j_release.py's figure, not a test's: a loaded machine moves it)
    import py4j.clientserver
    session = SparkRunner.get(TaskConfig.from_dict({})).session_for_task(threading.Event(), lambda detail: None)
    assert py4j.clientserver.DEFAULT_WORKER_SLEEP_TIME == PY4J_RELEASE_POLL_S < 1
    # the JVM's side of what Python holds: not py4j's queue, which its finalizer thread may have
    # emptied again by the time a test looks (it did, under load)
    bindings = session.sparkContext._gateway.java_gateway_server.getGateway().getBindings()
    settle(session.sparkContext._gateway._gateway_client.finalizer_deque)
    for _ in range(5):
        # by the objects' own ids, not a count of bindings: py4j may release an older object
        # while a round creates its own (CI: 19 more bound after 20 created)
        objects = [session._jvm.java.util.ArrayList() for _ in range(20)]
        ids = [obj._target_id for obj in objects]
        assert all(bindings.containsKey(i) for i in ids)
        del objects
        gc.collect()
        wait_for(lambda: not any(bindings.containsKey(i) for i in ids), 30,
                 f"the dropped Java objects released "
                 f"({sum(bool(bindings.containsKey(i)) for i in ids)} of 20 still bound)")


def settle(pending) -> None:
    """Until py4j's finalizer thread has taken every release waiting (the last may be in flight)."""
    wait_for(lambda: not pending, 30, "py4j's finalizer thread to send the releases")


def test_a_spark_batch_leaves_no_java_object_bound_after_its_job():
    """Every Java object a batch's job reached from Python (its DataFrames, its Arrow batches, the
    result server) is released when the job ends, with Python's cyclic collector off: py4j's proxies
    are reference cycles, which would otherwise hold them (and the batch's bytes) in the JVM."""
    fused, alone = spark_chains("SELECT id, v * 2 AS w FROM input WHERE v < 5", "released")
    group = FusionGroup(("released",))
    session, _ = alone._session(), fused._session()  # each chain's session lives as long as it does
    bindings = session.sparkContext._gateway.java_gateway_server.getGateway().getBindings()
    table = pa.table({"id": np.arange(1000, dtype=np.int64), "v": np.arange(1000, dtype=np.int64) % 7})
    pending = session.sparkContext._gateway._gateway_client.finalizer_deque
    gc.disable()
    try:
        alone.process(table)  # the first batches' analysed plans are kept for the chains' life (spark_plans)
        fused.process_parts([table, table], group)
        settle(pending)
        before = bindings.size()
        for _ in range(5):
            assert alone.process(table)[0].num_rows == 1000 * 5 // 7 + 1
            out, _ = fused.process_parts([table, table], group)
            assert out.num_rows == 2 * (1000 * 5 // 7 + 1)
        settle(pending)
        # every release sent has reached the JVM (the last in flight once the queue is empty)
        wait_for(lambda: bindings.size() <= before, 30,
                 f"the Java objects of 10 jobs unbound ({bindings.size() - before} still bound)")
    finally:
        gc.enable()
        for chain in (fused, alone):
            chain.close()


def test_a_shorter_batch_after_a_longer_one_gives_its_own_rows_only():
    """A thread's batch file is overwritten in place (spark_arrow), not emptied first: what a longer
    batch left past a shorter one's end is neither read nor kept."""
    (chain,) = spark_chains("SELECT id, v FROM input", "overwritten", parallelism=1)
    try:
        for n in (120_000, 1_000, 7):
            table = pa.table({"id": np.arange(n, dtype=np.int64), "v": np.arange(n, dtype=np.int64) * 3})
            (out,) = chain.process(table)
            assert out.sort_by("id").equals(table), n
        # the batch's file and the file of its output when it ran in the driver (spark_local)
        assert chain.bridge._paths and chain.local_batch_count == 2
        for path in chain.bridge._paths:
            assert os.path.getsize(path) < 2_000  # the 7 rows' stream, not the 120,000's 1.9 MB
    finally:
        chain.close()
