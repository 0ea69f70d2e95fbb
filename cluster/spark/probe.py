"""The fast paths tried once when the TaskManager's SparkSession starts, before any task uses them.

Each path (the Arrow bridge, the kept plan, the local batch, the BatchJob) runs a small ``.sql``
step over three rows by the very code a chain's batches take; catalyst.probe compares each one's
rows with PySpark's public path and turns off, with a warning, a path that fails or differs. A
few milliseconds each, once per TaskManager, on a session of its own (its own view ``input``).

Thread use: the runner's start thread.
"""
from __future__ import annotations

from typing import Callable, Optional

import pyarrow as pa

from cluster.spark import catalyst
from cluster.spark.arrow import ArrowBridge, JvmRefs
from cluster.spark.local import LocalBatches
from cluster.spark.plans import INPUT_VIEW, BatchJobs, PlanTemplate

SAMPLE = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": pa.array([10, 20, 30], pa.int64())})
QUERY = f"SELECT id, v * 2 AS w FROM {INPUT_VIEW} WHERE id > 1"  # a projection over a filter: every path takes it


def working_paths(session, local_batches: Optional[LocalBatches], batch_jobs: Optional[BatchJobs]) -> frozenset[str]:
    """The fast paths that give PySpark's rows on this session's Spark (catalyst.FAST_PATHS' names)."""
    probing = session.newSession()
    catalyst.frame(probing, catalyst.public_frame(probing, SAMPLE)).createOrReplaceTempView(INPUT_VIEW)
    expected = probing.sql(QUERY).toArrow()
    bridge = ArrowBridge(1)
    planned: list = []  # the Arrow bridge's analysed plan, which the kept plan keeps
    kept: list[PlanTemplate] = []  # what the helpers' paths run

    def template() -> PlanTemplate:
        if not kept:
            raise RuntimeError("no kept plan to run")
        return kept[0]

    with JvmRefs(probing) as refs:
        def arrow_bridge() -> pa.Table:
            jdf = bridge.to_jvm(probing, SAMPLE, refs)
            catalyst.register_view(jdf, INPUT_VIEW)
            planned.append(refs.add(catalyst.sql(probing, QUERY)))
            return bridge.from_jvm(probing, planned[0], refs)

        def kept_plan() -> pa.Table:
            made = PlanTemplate.of(probing, planned[0], refs)
            if made is None:
                raise RuntimeError("the plan of a projection over a filter was not kept")
            kept.append(made)
            bound = made.bind(probing, bridge.to_jvm(probing, SAMPLE, refs), refs)
            if bound is None:
                raise RuntimeError("the kept plan was released")
            return bridge.from_jvm(probing, bound, refs)

        def local_batch(helper: LocalBatches) -> pa.Table:
            path, _ = bridge.write(probing, [SAMPLE])
            out = helper.run(probing, template(), path, bridge.output_file(probing))
            if out is None:
                raise RuntimeError("a projection over a filter needed a Spark job")
            return out

        def batch_job(helper: BatchJobs) -> pa.Table:
            path, _ = bridge.write(probing, [SAMPLE])
            done = helper.run(probing, template(), bridge.spark_schema(SAMPLE.schema), path,
                              bridge.output_file(probing))
            if done is None:
                raise RuntimeError("the kept plan was released")
            return done[0]

        trials: dict[str, Optional[Callable[[], pa.Table]]] = {
            catalyst.ARROW_BRIDGE: arrow_bridge, catalyst.KEPT_PLAN: kept_plan,
            catalyst.LOCAL_BATCH: None if local_batches is None else lambda: local_batch(local_batches),
            catalyst.BATCH_JOB: None if batch_jobs is None else lambda: batch_job(batch_jobs)}
        try:
            return catalyst.probe(probing.version, trials, expected)
        finally:
            for made in kept:
                made.release()
            bridge.close()
            probing.catalog.dropTempView(INPUT_VIEW)
