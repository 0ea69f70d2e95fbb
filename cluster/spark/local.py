"""Small batches through a ``.sql`` chain in the TaskManager's Spark driver, without a Spark job.

A Spark job costs 20-50 ms of scheduling here however few its rows (the DAG scheduler, task
launch and results, the closure cleaner reading class files), and at low and moderate rates that
fixed cost was most of a row's latency: at 100k rows/s each round of the latency benchmark was
52 ms for some 11,000 rows. Spark has its own way for small local data: a projection or filter over
a ``LocalRelation`` is evaluated while the plan is optimised (its ConvertToLocalRelation rule, with
Spark's interpreted evaluator), which is how PySpark's ``createDataFrame`` and Spark Connect treat
data below ``spark.sql.execution.arrow.localRelationThreshold``. streamlab turns that threshold off
(batches go in as Arrow RDDs, so that big ones run as compiled stages on every core), and here takes
the local way back for batches of at most ``execution.spark.local-batch-rows`` rows whose analysed
plan is a chain of one-child nodes (projections and filters): measured in one session, 8-12 ms for
60 to 10,000 rows against 27-52 ms for a job.

That takes one call into the JVM per batch (jvm/LocalBatch.java, loaded by catalyst.load_helper): through py4j
each of the two dozen steps is a round trip of up to a millisecond on a busy TaskManager, and the
24 kB of a 1,000-row result came back through py4j in 45 ms. Without the helper (no JDK compiler)
every batch runs as a Spark job.

A plan whose optimised form still has something to execute (a sort, an aggregation, a Python UDF)
is marked on its template, and its batches run as Spark jobs from then on.

Thread use: any thread.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

import pyarrow as pa

from cluster.spark import catalyst
from cluster.spark.helpers import HELPER_PACKAGE, read_stream_file

if TYPE_CHECKING:
    from cluster.spark.plans import PlanTemplate

log = logging.getLogger(__name__)


class LocalBatches:
    """The helper class as loaded in a session's JVM."""

    def __init__(self, helper: Any):
        self._run = helper.run

    @classmethod
    def load(cls, session) -> Optional["LocalBatches"]:
        """The helper, if the session's driver has it on its class path."""
        helper = catalyst.load_helper(session, HELPER_PACKAGE, "LocalBatch")
        return None if helper is None else cls(helper)

    def run(self, session, template: "PlanTemplate", in_path: str, out_path: str) -> Optional[pa.Table]:
        """The batch in the Arrow stream file ``in_path`` through ``template``'s plan, in the
        driver; None when the template was released meanwhile, or its plan needs a Spark job
        (then marked: its later batches are not tried here)."""
        with template.root() as root:
            if root is None:
                return None
            with catalyst.spark_errors():  # a Spark error as PySpark raises it from a job
                rows = self._run(catalyst.java_session(session), root, in_path, out_path)
        if rows < 0:
            template.local = False
            log.info("a .sql plan needs a Spark job after optimisation: its batches run as jobs")
            return None
        return read_stream_file(out_path)
