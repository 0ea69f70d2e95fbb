"""Spark operator chains: consecutive ``.spark``/``.sql`` operators of one task as ONE Spark plan
per batch, on the TaskManager's session (runner.py).

The batch goes in as Arrow, every step only adds to the DataFrame's plan, and one ``toArrow()``
runs it; a chain of SQL steps is analysed once per TaskManager, for every job's chains (plans.py).
A fast path into Spark's internals that fails inside them at run time turns this chain to
PySpark's public path (catalyst.py) instead of failing the task.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional, TypeVar

import pyarrow as pa

from cluster.graph.job_graph import OperatorSpec
from cluster.operators.base import Operator, OperatorContext, UserFunctionError
from cluster.spark import catalyst
from cluster.spark.arrow import ArrowBridge, JvmRefs
from cluster.spark.arrow_eval import ArrowPath
from cluster.spark.fast_paths import FastPaths
from cluster.spark.fusion import PARTITION_COLUMN, FusionGroup, split_by_partition
from cluster.spark.runner import SparkRunner
from cluster.spark.steps import BatchTimings, ChainSteps

log = logging.getLogger(__name__)
T = TypeVar("T")


# the job group last set on this thread's (pinned) JVM thread, whichever chain set it
_thread_job_group = threading.local()


class SparkChain(Operator, kind="spark"):
    """Consecutive Spark operators of one task, fused into one Spark plan per batch.

    Each step is a ``.spark(fn)`` (fn: DataFrame -> DataFrame) or a ``.sql(query)`` over the view
    ``input``, which is the previous step's DataFrame (steps.py). A batch takes the fastest path
    that works (fast_paths.py, the Arrow bridge); one that fails inside Spark's internals sends the
    chain to PySpark's public path (``createDataFrame``, ``sql``, ``toArrow``) for good, the batch
    included. ``process`` may run on several threads at once (the task's Spark stage,
    cluster/spark/stage.py): each thread has a Spark session of its own (its own view ``input``)
    and sets the task's job group on its JVM thread."""

    def __init__(self, specs: list[OperatorSpec], ctx: OperatorContext):
        super().__init__(specs[0], ctx)
        self.steps = ChainSteps(specs)
        self.timings = BatchTimings()
        self._local = threading.local()
        self.answered_in_task = 0  # batches Arrow answered on the task thread, with no hand-off (metrics)
        self.fused_jobs = 0  # jobs this subtask ran with other subtasks' batches in them (fusion.py)
        self.paths: Optional[FastPaths] = None  # set by open
        # set by open: batches by Arrow, once it answered as Spark
        self.arrow = ArrowPath(False, self.spec.where(), lambda schema: ())
        self.public = False  # PySpark's public path only: the runner's probe or a failure turned the others off
        self._public_lock = threading.Lock()

    def open(self) -> None:
        runner = SparkRunner.get(self.ctx.config)
        self._task_session = runner.session_for_task(self.ctx.cancelled, self.ctx.set_detail)
        self.memory = runner.memory
        self.group = f"streamlab-{self.ctx.execution_id}"
        self.bridge = ArrowBridge(self._task_session.sparkContext.defaultParallelism)
        self.paths = FastPaths(self.steps, runner.plans, catalyst.KEPT_PLAN in runner.fast_paths,
                               runner.local_batches, runner.batch_jobs, self.ctx.config.spark_local_batch_rows,
                               self.bridge, self.timings, self.spec.where())
        self.public = catalyst.ARROW_BRIDGE not in runner.fast_paths
        paths = self.paths
        # Arrow keeps a naive time as UTC where Spark reads it in the session's time zone
        self.arrow = ArrowPath(self.ctx.config.spark_arrow_projections and self.steps.sql_only and not self.public
                               and catalyst.ansi_mode(self._task_session) and catalyst.utc_session(self._task_session),
                               self.spec.where(), lambda schema: paths.key(False, schema))
        # The input schema the client knew (a source's declared schema, a generator's sample).
        # Analysis only (no Spark job, no row read): a wrong column fails the task here, naming the
        # step, and the job's sources have not read yet (a task opens its inputs only once its
        # consumers have opened). A plan an earlier job analysed over this schema needs none.
        schema = self.params.get("input_schema")
        if schema is not None:
            empty = pa.ipc.read_schema(pa.py_buffer(schema)).empty_table()
            if self.public or self.paths.cached(empty.schema, False) is None:
                self._guarded(lambda public: self._analyse(empty, public))

    def _analyse(self, empty: pa.Table, public: bool) -> None:
        session = self._session()
        with JvmRefs(session) as refs:
            self.steps.plan(session, refs.add(catalyst.public_frame(session, empty)), refs, public=public)

    def _session(self):
        """This thread's session (views are per session), with this task's job group set on the
        thread: a fused round's worker runs other subtasks' batches too (fusion.py), and a group
        set once per thread had counted (and would have cancelled) them under the wrong task."""
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = self._task_session.newSession()
        if getattr(_thread_job_group, "group", None) != self.group:
            session.sparkContext.setJobGroup(self.group, f"streamlab task {self.ctx.task_name}")
            _thread_job_group.group = self.group
        return session

    def cancel_jobs(self) -> None:
        """Any thread: cancel the Spark jobs this task runs (a failed or cancelled task)."""
        try:
            self._task_session.sparkContext.cancelJobGroup(self.group)
        except Exception:
            log.exception("%s: cancelling its Spark jobs failed", self.spec.where())

    def _guarded(self, run: Callable[[bool], T]) -> T:
        """``run(False)``, by the fast paths, unless it fails inside Spark's internals (or did
        before): then ``run(True)``, by PySpark's public path, from now on. Any of its threads."""
        if not self.public:
            try:
                return run(False)
            except Exception as exc:
                if isinstance(exc, UserFunctionError) or not catalyst.internal_failure(exc):
                    raise
                with self._public_lock:
                    first, self.public = not self.public, True
                if first:
                    log.warning("%s: a fast path failed inside Spark's internals (%s: %s): the chain takes "
                                "PySpark's public path from now on", self.spec.where(), type(exc).__name__,
                                catalyst.first_line(exc), exc_info=True)
        return run(True)

    def process(self, table: pa.Table) -> list[pa.Table]:
        """One Spark job over ``table`` (or none: a small batch in the driver), on the calling
        thread's session."""
        if table.num_rows == 0:
            return []
        return self._guarded(lambda public: self._process(table, public))

    def answer_by_arrow(self, table: pa.Table) -> Optional[pa.Table]:
        """The batch's answer by Arrow on the task thread (OperatorChain), once the chain has its
        translation; None: the stage's threads answer it (process)."""
        answered = None if self.public else self.arrow.run(table)
        self.answered_in_task += answered is not None
        return answered

    def _process(self, table: pa.Table, public: bool) -> list[pa.Table]:
        assert self.paths is not None
        if not public and (answered := self.arrow.run(table)) is not None:
            return [answered]
        session = self._session()
        with self.memory.hold(table.nbytes, self.ctx.cancelled), JvmRefs(session) as refs:
            started = time.perf_counter()
            if not public:
                if self.paths.runs_locally(table.schema, table.num_rows) and (local := self.paths.local(session, table)):
                    out, written = local
                    self.timings.add(table.num_rows, written - started, 0.0, time.perf_counter() - written)
                    return [out]
                if (kept := self.paths.job(session, [table], False, started)) is not None:
                    return [kept[0]]
            jdf_in = refs.add(catalyst.public_frame(session, table)) if public else \
                self.bridge.to_jvm(session, table, refs)
            planned = time.perf_counter()
            jdf = None if public else self.paths.reused(session, jdf_in, table.schema, False, refs)
            if jdf is None:
                columns: list = []
                jdf = self.steps.plan(session, jdf_in, refs, columns, public)
                if not public:
                    jdf = self.paths.keep(session, jdf, columns, table.schema, False, refs)
            ran = time.perf_counter()
            out = self._run(session, jdf, refs, public)
            if not public:
                self.arrow.trial(lambda: catalyst.analyzed_plan_json(jdf, refs), table, out)
        self.timings.add(table.num_rows, planned - started, ran - planned, time.perf_counter() - ran)
        return [out]

    def process_parts(self, tables: list[pa.Table], fusion: FusionGroup):
        """One Spark job over the batches of several subtasks (fusion.py): its output, each row
        tagged with its partition, and each table's partitions; no output (None) when the plan
        does not keep partitions apart, or the chain takes the public path (whose batches go in
        as PySpark cuts them)."""
        return self._guarded(lambda public: (None, []) if public else self._process_parts(tables, fusion))

    def _process_parts(self, tables: list[pa.Table], fusion: FusionGroup):
        assert self.paths is not None
        session = self._session()
        with self.memory.hold(sum(t.nbytes for t in tables), self.ctx.cancelled), JvmRefs(session) as refs:
            started = time.perf_counter()
            if (kept := self.paths.job(session, tables, True, started)) is not None:
                self.fused_jobs += 1
                return kept
            jdf_in, ranges = self.bridge.parts_to_jvm(session, tables, refs)
            planned = time.perf_counter()
            jdf = self.paths.reused(session, jdf_in, tables[0].schema, True, refs)
            if jdf is None:
                columns: list = []
                jdf = self.steps.plan(session, jdf_in, refs, columns)
                if not fusion.check_plan(jdf, refs):
                    return None, ranges
                tag = refs.add(catalyst.partition_tag(session))
                jdf = self.paths.keep(session, refs.add(catalyst.with_column(jdf, PARTITION_COLUMN, tag)), columns,
                                      tables[0].schema, True, refs)
            ran = time.perf_counter()
            out = self._run(session, jdf, refs, False)
            if not self.arrow.tried:  # the first batch's own rows of the fused answer
                first = split_by_partition(out, ranges[:1])[0]
                self.arrow.trial(lambda: catalyst.analyzed_plan_json(jdf, refs), tables[0],
                                 pa.concat_tables(first) if first else out.drop_columns([PARTITION_COLUMN]).slice(0, 0),
                                 drop=(PARTITION_COLUMN,))
        self.timings.add(sum(t.num_rows for t in tables), planned - started, ran - planned, time.perf_counter() - ran)
        self.fused_jobs += 1
        return out, ranges

    def runs_locally(self, schema: pa.Schema, rows: int) -> bool:
        """Whether a batch may run in the driver without a Spark job (fast_paths.FastPaths.runs_locally).
        Only asks (a fused round's worker asks it of the leader's chain): never raises."""
        # the Arrow path as run() finds it: a fused round's leader whose fellow subtask made the
        # translation takes it too (else every round it led went to Spark, a cold job's most)
        return not self.public and self.paths is not None and (self.arrow.ready(schema) is not None
                                                               or self.paths.runs_locally(schema, rows))

    def _run(self, session, jdf, refs: JvmRefs, public: bool) -> pa.Table:
        with self.steps.running(public):
            return catalyst.public_arrow(session, jdf) if public else self.bridge.from_jvm(session, jdf, refs)

    @property
    def plans_reused(self) -> int:
        return 0 if self.paths is None else self.paths.plans_reused

    @property
    def local_batch_count(self) -> int:
        return 0 if self.paths is None else self.paths.local_batch_count

    def close(self) -> None:
        if hasattr(self, "bridge"):
            self.bridge.close()

    def metrics(self) -> dict:
        # spark-jobs is Spark's own count (its status tracker, by job group), not ours
        jobs = catalyst.job_count(self._task_session, self.group) if hasattr(self, "group") else 0
        return self.timings.metrics() | {"spark-jobs": jobs, "spark-fused-jobs": self.fused_jobs,
                                         "spark-plans-reused": self.plans_reused,
                                         "spark-local-batches": self.local_batch_count,
                                         "spark-arrow-batches": self.arrow.batches,
                                         "spark-arrow-batches-in-task": self.answered_in_task,
                                         "spark-arrow-handed-back": self.arrow.handed_back}
