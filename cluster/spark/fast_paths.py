"""How a Spark chain's batches skip work: its analysed plan kept for later batches and later jobs
(plans.py), a batch of a kept plan as one Spark job in a single call into the JVM (plans.BatchJobs),
and a small batch in the driver without a Spark job (local.py).

Which of them a chain may use is the runner's probe's word (catalyst.probe, at the session's
start), and ``SQL steps only`` (a ``.spark`` function may build a different plan each time); a
kept plan that Spark's internals refuse to keep or re-use turns re-use off for the chain. A
failure inside Spark's internals while a batch runs raises as it is: the chain then takes PySpark's
public path (chain.SparkChain).

Thread use: any of the chain's threads (its Spark stage runs several jobs at once); the counters
are read for metrics only.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Optional

import pyarrow as pa

from cluster.spark.arrow import ArrowBridge, JvmRefs, by_pyspark
from cluster.spark.local import LocalBatches
from cluster.spark.plans import BatchJobs, CachedPlan, PlanCache, PlanTemplate
from cluster.spark.steps import BatchTimings, ChainSteps

log = logging.getLogger(__name__)


class FastPaths:
    def __init__(self, steps: ChainSteps, plans: PlanCache, keep_plans: bool, local_batches: Optional[LocalBatches],
                 batch_jobs: Optional[BatchJobs], local_rows: int, bridge: ArrowBridge, timings: BatchTimings,
                 where: str):
        self.steps, self.plans, self.bridge, self.timings, self.where = steps, plans, bridge, timings, where
        self.local_batches = local_batches  # small batches without a Spark job, if it loaded and works
        self.batch_jobs = batch_jobs  # a batch of a kept plan as a job in one call, if it loaded and works
        self.local_rows = local_rows
        self.reuse_plans = keep_plans and steps.sql_only
        self.plans_reused = 0
        self.local_batch_count = 0  # batches run in the driver without a Spark job

    def key(self, tagged: bool, schema: pa.Schema) -> tuple:
        # without metadata, which Spark ignores: pandas' differs from table to table (a RangeIndex's
        # bounds), and a schema's hash includes it where its equality does not
        return self.steps.key, tagged, schema.remove_metadata() if schema.metadata else schema

    def cached(self, schema: pa.Schema, tagged: bool) -> Optional[PlanTemplate]:
        """The re-usable plan of the steps over ``schema`` that a batch of this chain or an earlier
        job analysed, if any; its consumers are checked against its columns."""
        if not self.reuse_plans or by_pyspark(schema):
            return None
        cached = self.plans.get(self.key(tagged, schema))
        if cached is None or cached.template is None:
            return None
        self.steps.check_kept(cached.columns)
        return cached.template

    def reused(self, session, jdf_in, schema: pa.Schema, tagged: bool, refs: JvmRefs) -> Optional[Any]:
        """The plan analysed before over ``jdf_in``, or None: plan this batch."""
        template = self.cached(schema, tagged)
        if template is None:
            return None
        try:
            jdf = template.bind(session, jdf_in, refs)
        except Exception:
            self._stop_reusing("re-using the analysed plan failed")
            return None
        if jdf is not None:  # None: released, the least recently used of the TaskManager's plans
            self.plans_reused += 1
        return jdf

    def keep(self, session, jdf, columns: list, schema: pa.Schema, tagged: bool, refs: JvmRefs) -> Any:
        """Keep ``jdf``'s analysed plan for later batches of ``schema`` (any job's); ``jdf``."""
        if not self.reuse_plans or by_pyspark(schema):
            return jdf
        key = self.key(tagged, schema)
        if self.plans.get(key) is None:
            try:
                template = PlanTemplate.of(session, jdf, refs, tagged)
            except Exception:
                self._stop_reusing("keeping the analysed plan failed")
                return jdf
            self.plans.put(key, CachedPlan(template, tuple(columns)))
        return jdf

    def _stop_reusing(self, what: str) -> None:
        """Spark's internals are not what plans.py expects: analyse every batch, as without it."""
        log.warning("%s: %s; each batch is analysed from now on", self.where, what, exc_info=True)
        self.reuse_plans = False

    def job(self, session, tables: list[pa.Table], tagged: bool,
            started: float) -> Optional[tuple[pa.Table, list[tuple[int, int]]]]:
        """The tables through the plan kept for their schema as one Spark job in a single call into
        the JVM (plans.BatchJobs): the output and each table's partitions; None when no plan is
        kept or the helper is missing, for the Python way."""
        schema = tables[0].schema
        if self.batch_jobs is None or by_pyspark(schema) or (template := self.cached(schema, tagged)) is None:
            return None
        path, ranges = self.bridge.write(session, tables)
        written = time.perf_counter()
        with self.steps.running():
            done = self.batch_jobs.run(session, template, self.bridge.spark_schema(schema), path,
                                       self.bridge.output_file(session))
        if done is None:  # released meanwhile: the Python way analyses the plan again
            return None
        out, bind = done
        self.plans_reused += 1
        self.timings.add(sum(t.num_rows for t in tables), written - started, bind,
                         time.perf_counter() - written - bind)
        return out, ranges

    def runs_locally(self, schema: pa.Schema, rows: int) -> bool:
        """Whether a batch of ``rows`` rows of ``schema`` may run in the driver without a Spark job
        (local.py): a plan of projections and filters over it is kept, for fused rounds or not.
        Only asks (a fused round's worker asks it of the leader's chain): never raises."""
        if self.local_batches is None or rows > self.local_rows or not self.reuse_plans or by_pyspark(schema):
            return False
        for tagged in (False, True):
            cached = self.plans.get(self.key(tagged, schema))
            if cached is not None and cached.template is not None:
                return cached.template.local
        return False

    def local(self, session, table: pa.Table) -> Optional[tuple[pa.Table, float]]:
        """The batch's output by local.py, and when its Arrow file was written; None: it needs a
        Spark job (no kept plan of its own yet, or one that Spark cannot run locally)."""
        template = self.cached(table.schema, False)
        if template is None or not template.local or self.local_batches is None:
            return None
        path, _ = self.bridge.write(session, [table])
        written = time.perf_counter()
        with self.steps.running():
            out = self.local_batches.run(session, template, path, self.bridge.output_file(session))
        if out is None:
            return None
        self.local_batch_count += 1
        return out, written
