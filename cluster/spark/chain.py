"""The Spark runner: one SparkSession per TaskManager, and Spark operator chains on it.

The session is started and warmed up (a first query) in the background when the TaskManager
starts, because Spark's start costs 5-15 s here; a task deployed earlier waits for it and says
so. Every task gets its own ``newSession()`` (its own temp views and SQL conf, one shared JVM).

Consecutive ``.spark``/``.sql`` operators of one task run as ONE Spark plan per batch: the batch
goes in as Arrow, every step only adds to the DataFrame's plan, and one ``toArrow()`` runs it; a
chain of SQL steps is analysed once per TaskManager, for every job's chains (spark_plans.py). The
settings come from ../shared/notes/spark.md (measured here): Arrow in as Arrow data
(localRelationThreshold=0), few shuffle partitions, adaptive execution off so that a batch is one
Spark job.
"""
from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Union

import cloudpickle
import pyarrow as pa

from cluster.conf import TaskConfig
from cluster.graph.job_graph import OperatorSpec, missing_column

from cluster.operators.base import Operator, OperatorContext, TaskCancelled, UserFunctionError
from cluster.spark.arrow import ArrowBridge, JvmRefs, by_pyspark
from cluster.spark.fusion import PARTITION_COLUMN, FusionGroup
from cluster.spark.helpers import classpath_entry
from cluster.spark.local import LocalBatches
from cluster.spark.memory import BatchMemory, budget_of_heap
from cluster.spark.plans import INPUT_VIEW, BatchJobs, CachedPlan, PlanCache, PlanTemplate

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


# How long py4j's finalizer thread sleeps when no Java object waits to be released (py4j's own: 1 s).
# A Java object that Python drops or detaches (a batch's DataFrames and Arrow bytes, spark_arrow's
# JvmRefs) stays referenced in the JVM until that thread tells the JVM so: a second of batches then
# outlived the young collections and was promoted, and at 1M rows/s the old generation filled every
# ~10 s, with full collections of 110-190 ms in the latency's p99. An idle wake-up costs microseconds.
PY4J_RELEASE_POLL_S = 0.01


def _prompt_py4j_release() -> None:
    import py4j.clientserver
    if getattr(py4j.clientserver, "DEFAULT_WORKER_SLEEP_TIME", None) is None:
        log.warning("py4j has no DEFAULT_WORKER_SLEEP_TIME: Java objects are released at its pace")
        return
    py4j.clientserver.DEFAULT_WORKER_SLEEP_TIME = PY4J_RELEASE_POLL_S


def driver_host(config: TaskConfig) -> str:
    """Where the session's driver is reached: loopback in local mode; on a Spark cluster the
    TaskManager's advertised host, which the executors connect back to."""
    return "127.0.0.1" if config.spark_local else config.host


def spark_conf(config: TaskConfig) -> dict[str, str]:
    conf = {
        "spark.master": config.spark_master,
        "spark.driver.memory": config.spark_driver_memory,
        "spark.app.name": "streamlab-taskmanager",
        "spark.ui.enabled": "false",
        "spark.driver.host": driver_host(config),
        "spark.driver.bindAddress": "127.0.0.1" if config.spark_local else (config.bind_host or config.host),
        # the Python of executors' workers (pandas UDFs): this interpreter, which must exist at the
        # same path on every Spark worker host
        "spark.pyspark.python": sys.executable,
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.localRelationThreshold": "0",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "250000",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.log.level": "WARN",
        "spark.ui.showConsoleProgress": "false",
        # The parallel collector, not G1: per-batch work makes short-lived garbage only, and G1's
        # concurrent threads took CPU from the batches (5M rows of the stateless .sql benchmark:
        # a fresh JVM's first job 1.0-1.1 M rows/s with G1, 1.3-1.5 M with this; later jobs 2.15 M
        # and 2.2-2.3 M). A user's own spark.driver.extraJavaOptions (taskmanager.spark.conf) wins.
        "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
    }
    if config.spark_local:
        # A task's result up to this size goes to the driver in the task's own status message, not
        # through the block manager (stored, then fetched over a loopback connection, one more copy
        # each): 16 MB holds a partition of MAX_PARTITION_ROWS rows 64 bytes wide. In two pairs of
        # stateless benchmark runs the JVM took 7% less CPU per row, and rows/s rose 1-6% (Spark's
        # default: 1 MB).
        conf["spark.task.maxDirectResultSize"] = "16m"
    else:
        for key, value in (("spark.executor.cores", config.spark_executor_cores),
                           ("spark.executor.memory", config.spark_executor_memory),
                           ("spark.cores.max", config.spark_cores_max)):
            if value:  # 0 or empty: Spark's default
                conf[key] = str(value)
    return conf | config.spark_properties


def with_jvm_helpers(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with streamlab's Java helpers (spark_jvm) on the driver's class path, after the user's own entries
    (compiled first if this machine has not yet)."""
    entry = classpath_entry()
    if entry is None:
        return conf
    given = conf.get("spark.driver.extraClassPath")
    return conf | {"spark.driver.extraClassPath": os.pathsep.join([given, entry]) if given else entry}


class SparkRunner:
    """The TaskManager's SparkSession: started once, shared by every slot."""

    _instance: Optional["SparkRunner"] = None
    _lock = threading.Lock()
    # The cluster's directory, set by the TaskManager: the TaskManagers of one machine start
    # their JVMs a few at a time (see _start_slot). None: no coordination.
    lock_dir: Optional[Path] = None
    # The TaskManager's own configuration, set by it: the session is the TaskManager's, so its
    # master and driver address are its own even when a job's task starts the session (lazy
    # startup), whose job configuration is the JobManager's (another taskmanager.host).
    taskmanager_config: Optional[TaskConfig] = None

    def __init__(self, config: TaskConfig):
        self.config = config
        self.ready = threading.Event()
        self.error: Optional[str] = None
        self.session: Optional[SparkSession] = None
        self.started_at = time.monotonic()
        self.queued = False  # waiting for another TaskManager's JVM start to end before starting its own
        self.startup_seconds: Optional[float] = None
        self.memory = BatchMemory(budget_of_heap(config.spark_driver_memory))  # every Spark job of the TaskManager
        self.plans = PlanCache()  # every job's .sql chains
        self.local_batches: Optional[LocalBatches] = None  # small batches without a Spark job, if it loaded
        self.batch_jobs: Optional[BatchJobs] = None  # a batch of a kept plan as a job in one call, if it loaded
        self._thread = threading.Thread(target=self._start, name="spark-start", daemon=True)

    @classmethod
    def get(cls, config: TaskConfig) -> "SparkRunner":
        """The session, started by the first caller: a task, or the TaskManager at its start."""
        with cls._lock:
            if cls._instance is None:
                cls._instance = SparkRunner(cls.taskmanager_config or config)
                cls._instance._thread.start()
            return cls._instance

    @classmethod
    def running(cls) -> Optional["SparkRunner"]:
        return cls._instance

    def status(self) -> str:
        """What a task waiting for the session shows in its job's status."""
        waited = f"starting Spark ({time.monotonic() - self.started_at:.0f} s"
        return waited + (", after another TaskManager's)" if self.queued else ")")

    def _start(self) -> None:
        os.environ.setdefault("SPARK_LOCAL_IP", driver_host(self.config))
        # Python workers (UDFs) must run this interpreter, which has pandas and pyarrow.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        slot = None
        try:
            slot = self._start_slot()
            log.info("starting the SparkSession")
            from pyspark.sql import SparkSession
            _prompt_py4j_release()
            builder = SparkSession.builder
            for key, value in with_jvm_helpers(spark_conf(self.config)).items():
                builder = builder.config(key, value)
            session = builder.getOrCreate()
            session.createDataFrame(pa.table({"warm": [1, 2]})).selectExpr("sum(warm)").toArrow()
            self.local_batches = LocalBatches.load(session)
            self.batch_jobs = BatchJobs.load(session)
            self.session = session
            # What Python holds by now (pyspark, py4j, pandas: some 100k objects) lives as long as the
            # TaskManager: out of the collector's sight, a full collection, which stops every task
            # of the process, took 50-110 ms here with them and next to nothing without
            gc.freeze()
            self.startup_seconds = time.monotonic() - self.started_at
            log.info("SparkSession ready in %.1f s", self.startup_seconds)
        except Exception as exc:  # reported to every task that needs Spark
            self.error = f"the TaskManager's SparkSession failed to start: {type(exc).__name__}: {exc}"
            log.exception("SparkSession failed to start")
        finally:
            if slot is not None:
                slot.close()  # releases the lock
            self.queued = False
            self.ready.set()

    def _start_slot(self):
        """A lock file of the cluster directory held while this JVM starts, one per two cores.

        A JVM start is CPU-bound for seconds: two at once on 2 cores made both ready after
        135 s where one alone took 50 s (a loaded machine; see bench/first_spark_cell.py), so
        one after the other makes the first TaskManager ready soonest and the last no later.
        The kernel drops the lock of a process that dies."""
        if self.lock_dir is None:
            return None
        import fcntl
        files = [open(self.lock_dir / f"spark-start-{i}.lock", "a")
                 for i in range(max(1, (os.cpu_count() or 1) // 2))]
        while True:
            for f in files:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                for other in files:
                    if other is not f:
                        other.close()
                return f
            if not self.queued:
                self.queued = True
                log.info("another TaskManager's JVM is starting: this one starts after it")
            time.sleep(0.1)

    def session_for_task(self, cancelled: threading.Event, waiting: Callable[[str], None]):
        if not self.ready.is_set():
            while not self.ready.wait(0.05):
                waiting(self.status())  # the seconds count up in the dashboard's header
                if cancelled.is_set():
                    raise TaskCancelled()
            waiting("")
        if self.error:
            raise RuntimeError(self.error)
        if self.session is None:
            raise RuntimeError("the TaskManager's SparkSession is marked ready but was never set")
        return self.session.newSession()

    def stop(self) -> None:
        if self.session is not None:
            self.session.stop()


# the job group last set on this thread's (pinned) JVM thread, whichever chain set it
_thread_job_group = threading.local()


class SparkChain(Operator, kind="spark"):
    """Consecutive Spark operators of one task, fused into one Spark plan per batch.

    Each step is a ``.spark(fn)`` (fn: DataFrame -> DataFrame) or a ``.sql(query)`` over the view
    ``input``, which is the previous step's DataFrame. ``process`` may run on several threads at
    once (the task's Spark stage, cluster/spark/stage.py): each thread has a Spark
    session of its own (its own view ``input``) and sets the task's job group on its JVM thread."""

    def __init__(self, specs: list[OperatorSpec], ctx: OperatorContext):
        super().__init__(specs[0], ctx)
        # each step is SQL over the view "input" (a keyed aggregation's pre-aggregation too) or a function
        self.steps: list[tuple[OperatorSpec, Union[str, Callable]]] = [(spec, _step(spec)) for spec in specs]
        self.timings = BatchTimings()
        self._outputs_checked = False  # the columns consumers key by, checked once per attempt
        self._local = threading.local()
        self.fused_jobs = 0  # jobs this subtask ran with other subtasks' batches in them (spark_fusion)
        # the analysed plan of the steps over an input schema, re-used for later batches and by
        # later jobs (spark_plans): SQL steps only
        self._reuse_plans = all(isinstance(step, str) for _, step in self.steps)
        self.plans_reused = 0
        self.local_batch_count = 0  # batches run in the driver without a Spark job (spark_local)

    def open(self) -> None:
        runner = SparkRunner.get(self.ctx.config)
        self._task_session = runner.session_for_task(self.ctx.cancelled, self.ctx.set_detail)
        self.memory = runner.memory
        self.plans = runner.plans
        self.local_batches = runner.local_batches
        self.batch_jobs = runner.batch_jobs
        self.local_rows = self.ctx.config.spark_local_batch_rows
        self.group = f"streamlab-{self.ctx.execution_id}"
        self.bridge = ArrowBridge(self._task_session.sparkContext.defaultParallelism)
        # The input schema the client knew (a source's declared schema, a generator's sample).
        # Analysis only (no Spark job, no row read): a wrong column fails the task here, naming the
        # step, and the job's sources have not read yet (a task opens its inputs only once its
        # consumers have opened). A plan an earlier job analysed over this schema needs none.
        schema = self.params.get("input_schema")
        if schema is not None:
            empty = pa.ipc.read_schema(pa.py_buffer(schema)).empty_table()
            if self._cached(empty.schema, False) is None:
                session = self._session()
                with JvmRefs(session) as refs:
                    self._plan(session, refs.add(session.createDataFrame(empty)._jdf), refs)

    def _session(self):
        """This thread's session (views are per session), with this task's job group set on the
        thread: a fused round's worker runs other subtasks' batches too (spark_fusion), and a group
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

    def _plan(self, session, jdf, refs: JvmRefs, columns: Optional[list] = None):
        """The steps' plan over ``jdf`` (a Java DataFrame), analysed step by step so that an error
        names its step; the columns consumers key by are checked on the first batch. ``columns``
        gets each step's output columns."""
        from pyspark.sql import DataFrame
        for spec, step in self.steps:
            try:
                if isinstance(step, str):
                    jdf.createOrReplaceTempView(INPUT_VIEW)
                    jdf = refs.add(session._jsparkSession.sql(step))  # parsed and analysed here
                else:
                    df = step(DataFrame(jdf, session))
                    if not isinstance(df, DataFrame):
                        raise TypeError(f"the function must return a Spark DataFrame, got {type(df).__name__}")
                    jdf = df._jdf  # not released: the function may keep its DataFrame for later batches
                if not self._outputs_checked or columns is not None:
                    output = list(jdf.columns())
                    if not self._outputs_checked:
                        self._check_consumers(spec, output)
                    if columns is not None:
                        columns.append(tuple(output))
            except (TaskCancelled, UserFunctionError):
                raise
            except Exception as exc:
                raise UserFunctionError(f"{spec.where()} failed in Spark: {type(exc).__name__}: "
                                        f"{_first_line(exc)}", spec.name, spec.call_site) from exc
        if any(isinstance(step, str) for _, step in self.steps):
            # analysed: the view has done its work, and left in the session's catalog it kept the
            # batch (its Arrow bytes) in the JVM until the next batch's view or the session's end
            refs.add(session._jsparkSession.catalog()).dropTempView(INPUT_VIEW)
        self._outputs_checked = True
        return jdf

    @staticmethod
    def _check_consumers(spec: OperatorSpec, columns: list[str]) -> None:
        """The key columns the step's consumers need (given by the client, which could not know a
        Spark step's output) against the step's analysed output."""
        for column, what, consumer in spec.params.get("consumer_columns") or ():
            if column not in columns:
                raise UserFunctionError(missing_column(consumer, column, what, columns,
                                                       of=f" (the output of {spec.where()})"))

    def process(self, table: pa.Table) -> list[pa.Table]:
        """One Spark job over ``table``, on the calling thread's session."""
        if table.num_rows == 0:
            return []
        session = self._session()
        with self.memory.hold(table.nbytes, self.ctx.cancelled), JvmRefs(session) as refs:
            started = time.perf_counter()
            if self.runs_locally(table.schema, table.num_rows) and (local := self._local_batch(session, table)):
                out, written = local
                self.timings.add(table.num_rows, written - started, 0.0, time.perf_counter() - written)
                return [out]
            if (kept := self._kept_plan_job(session, [table], False, started)) is not None:
                return [kept[0]]
            jdf_in = self.bridge.to_jvm(session, table, refs)
            planned = time.perf_counter()
            jdf = self._reused(session, jdf_in, table.schema, False, refs)
            if jdf is None:
                columns: list = []
                jdf = self._keep(session, self._plan(session, jdf_in, refs, columns), columns, table.schema, False, refs)
            ran = time.perf_counter()
            out = self._run(session, jdf, refs)
        self.timings.add(table.num_rows, planned - started, ran - planned, time.perf_counter() - ran)
        return [out]

    def process_parts(self, tables: list[pa.Table], fusion: FusionGroup):
        """One Spark job over the batches of several subtasks (spark_fusion): its output, each row
        tagged with its partition, and each table's partitions; no output (None) when the plan
        does not keep partitions apart."""
        session = self._session()
        with self.memory.hold(sum(t.nbytes for t in tables), self.ctx.cancelled), JvmRefs(session) as refs:
            started = time.perf_counter()
            if (kept := self._kept_plan_job(session, tables, True, started)) is not None:
                self.fused_jobs += 1
                return kept
            jdf_in, ranges = self.bridge.parts_to_jvm(session, tables, refs)
            planned = time.perf_counter()
            jdf = self._reused(session, jdf_in, tables[0].schema, True, refs)
            if jdf is None:
                columns: list = []
                jdf = self._plan(session, jdf_in, refs, columns)
                if not fusion.check_plan(jdf, refs):
                    return None, ranges
                tag = refs.add(session._jvm.org.apache.spark.sql.functions.spark_partition_id())
                jdf = self._keep(session, refs.add(jdf.withColumn(PARTITION_COLUMN, tag)), columns, tables[0].schema,
                                 True, refs)
            ran = time.perf_counter()
            out = self._run(session, jdf, refs)
        self.timings.add(sum(t.num_rows for t in tables), planned - started, ran - planned, time.perf_counter() - ran)
        self.fused_jobs += 1
        return out, ranges

    def _kept_plan_job(self, session, tables: list[pa.Table], tagged: bool,
                       started: float) -> Optional[tuple[pa.Table, list[tuple[int, int]]]]:
        """The tables through the plan kept for their schema as one Spark job in a single call into
        the JVM (spark_plans.BatchJobs): the output and each table's partitions; None when no plan
        is kept or the helper is missing, for the Python way."""
        schema = tables[0].schema
        if self.batch_jobs is None or by_pyspark(schema) or (template := self._cached(schema, tagged)) is None:
            return None
        path, ranges = self.bridge.write(session, tables)
        written = time.perf_counter()
        try:
            done = self.batch_jobs.run(session, template, self.bridge.spark_schema(schema), path,
                                       self.bridge.output_file(session))
        except Exception as exc:
            raise self._failed(exc) from exc
        if done is None:  # released meanwhile: the Python way analyses the plan again
            return None
        out, bind = done
        self.plans_reused += 1
        self.timings.add(sum(t.num_rows for t in tables), written - started, bind,
                         time.perf_counter() - written - bind)
        return out, ranges

    def runs_locally(self, schema: pa.Schema, rows: int) -> bool:
        """Whether a batch of ``rows`` rows of ``schema`` may run in the driver without a Spark job
        (spark_local): a plan of projections and filters over it is kept, for fused rounds or not.
        Only asks (a fused round's worker asks it of the leader's chain): never raises."""
        if self.local_batches is None or rows > self.local_rows or not self._reuse_plans or by_pyspark(schema):
            return False
        for tagged in (False, True):
            cached = self.plans.get(self._plan_key(tagged, schema))
            if cached is not None and cached.template is not None:
                return cached.template.local
        return False

    def _local_batch(self, session, table: pa.Table) -> Optional[tuple[pa.Table, float]]:
        """The batch's output by spark_local, and when its Arrow file was written; None: it needs a
        Spark job (no kept plan of its own yet, or one that Spark cannot run locally)."""
        template = self._cached(table.schema, False)
        if template is None or not template.local or self.local_batches is None:
            return None
        path, _ = self.bridge.write(session, [table])
        written = time.perf_counter()
        try:
            out = self.local_batches.run(session, template, path, self.bridge.output_file(session))
        except Exception as exc:
            raise self._failed(exc) from exc
        if out is None:
            return None
        self.local_batch_count += 1
        return out, written

    def _plan_key(self, tagged: bool, schema: pa.Schema) -> tuple:
        # without metadata, which Spark ignores: pandas' differs from table to table (a RangeIndex's
        # bounds), and a schema's hash includes it where its equality does not
        return tuple(step for _, step in self.steps), tagged, schema.remove_metadata() if schema.metadata else schema

    def _cached(self, schema: pa.Schema, tagged: bool) -> Optional[PlanTemplate]:
        """The re-usable plan of the steps over ``schema`` that a batch of this chain or an earlier
        job analysed, if any; its consumers are checked against its columns."""
        if not self._reuse_plans or by_pyspark(schema):
            return None
        cached = self.plans.get(self._plan_key(tagged, schema))
        if cached is None or cached.template is None:
            return None
        if not self._outputs_checked:
            for (spec, _), output in zip(self.steps, cached.columns):
                self._check_consumers(spec, list(output))
            self._outputs_checked = True
        return cached.template

    def _reused(self, session, jdf_in, schema: pa.Schema, tagged: bool, refs: JvmRefs):
        """The plan analysed before over ``jdf_in``, or None: plan this batch."""
        template = self._cached(schema, tagged)
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

    def _keep(self, session, jdf, columns: list, schema: pa.Schema, tagged: bool, refs: JvmRefs):
        """Keep ``jdf``'s analysed plan for later batches of ``schema`` (any job's); ``jdf``."""
        if not self._reuse_plans or by_pyspark(schema):
            return jdf
        key = self._plan_key(tagged, schema)
        if self.plans.get(key) is None:
            try:
                template = PlanTemplate.of(session, jdf, refs, tagged)
            except Exception:
                self._stop_reusing("keeping the analysed plan failed")
                return jdf
            self.plans.put(key, CachedPlan(template, tuple(columns)))
        return jdf

    def _stop_reusing(self, what: str) -> None:
        """Spark's internals are not what spark_plans expects: analyse every batch, as without it."""
        log.warning("%s: %s; each batch is analysed from now on", self.spec.where(), what, exc_info=True)
        self._reuse_plans = False

    def _run(self, session, jdf, refs: JvmRefs) -> pa.Table:
        try:
            return self.bridge.from_jvm(session, jdf, refs)
        except Exception as exc:
            raise self._failed(exc) from exc

    def _failed(self, exc: Exception) -> UserFunctionError:
        names = ", ".join(s.name for s, _ in self.steps)
        return UserFunctionError(f"operator chain [{names}] ({self.spec.call_site}) failed in Spark: "
                                 f"{type(exc).__name__}: {_first_line(exc)}", names, self.spec.call_site)

    def close(self) -> None:
        if hasattr(self, "bridge"):
            self.bridge.close()

    def metrics(self) -> dict:
        # spark-jobs is Spark's own count (its status tracker, by job group), not ours. The Java
        # array's length is asked, not PySpark's list of it: that list is made one py4j call per
        # job id, up to Spark's retained 1,000 jobs at every metrics snapshot of a busy chain
        jobs = len(self._task_session.sparkContext._jsc.statusTracker().getJobIdsForGroup(self.group)) \
            if hasattr(self, "group") else 0
        return self.timings.metrics() | {"spark-jobs": jobs, "spark-fused-jobs": self.fused_jobs,
                                         "spark-plans-reused": self.plans_reused,
                                         "spark-local-batches": self.local_batch_count}


class BatchTimings:
    """Where a Spark chain's batches spend their time, summed: Arrow in (the batch to the JVM),
    plan (views, SQL, analysis of every step), run (optimisation, execution, Arrow out). Any
    thread may add (several jobs run at once) and read."""

    def __init__(self):
        self._lock = threading.Lock()
        self.batches = self.rows = 0
        self.arrow_in = self.plan = self.run = 0.0

    def add(self, rows: int, arrow_in: float, plan: float, run: float) -> None:
        with self._lock:
            self.batches += 1
            self.rows += rows
            self.arrow_in += arrow_in
            self.plan += plan
            self.run += run

    def metrics(self) -> dict:
        with self._lock:
            return {"spark-batches": self.batches, "spark-rows": self.rows,
                    "spark-arrow-in-ms": round(self.arrow_in * 1000), "spark-plan-ms": round(self.plan * 1000),
                    "spark-run-ms": round(self.run * 1000)}


def _step(spec: OperatorSpec) -> Union[str, Callable]:
    if "sql" in spec.params:
        return spec.params["sql"]
    if "partial_aggregate" in spec.params:
        from cluster.operators.keyed import spark_partial_aggregate
        return spark_partial_aggregate(spec.params["key"], spec.params["partial_aggregate"])
    if "window_partial" in spec.params:
        from cluster.operators.windowing.window_operator import spark_window_partials
        return spark_window_partials(spec.params["window_partial"])
    if spec.udf is None:
        raise TypeError(f"Spark step '{spec.name}' has neither SQL nor a function")
    return cloudpickle.loads(spec.udf)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
