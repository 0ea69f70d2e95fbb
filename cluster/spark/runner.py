"""The Spark runner: one SparkSession per TaskManager, started and warmed up in the background.

Spark's start costs 5-15 s here, so the session starts when the TaskManager does (the fast
paths' probe warms it), and a task deployed earlier waits for it and says so. Every task gets its own
``newSession()`` (its own temp views and SQL conf, one shared JVM). At its start the session's
fast paths into Spark's internals are probed once (probe.py, catalyst.py): one that does not work
is off for every chain, with a warning. The settings come from ../shared/notes/spark.md (measured
here): Arrow in as Arrow data (localRelationThreshold=0), few shuffle partitions, adaptive
execution off so that a batch is one Spark job.
"""
from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Optional

from cluster.conf import TaskConfig
from cluster.operators.base import TaskCancelled
from cluster.spark import catalyst
from cluster.spark.class_data import JAVA_OPTIONS, driver_conf
from cluster.spark.helpers import cache_root
from cluster.spark.local import LocalBatches
from cluster.spark.memory import BatchMemory, budget_of_heap
from cluster.spark.plans import BatchJobs, PlanCache
from cluster.spark.probe import working_paths

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


# How long py4j's finalizer thread sleeps when no Java object waits to be released (py4j's own: 1 s).
# A Java object that Python drops or detaches (a batch's DataFrames and Arrow bytes, arrow.py's
# JvmRefs) stays referenced in the JVM until that thread tells the JVM so: a second of batches then
# outlived the young collections and was promoted, and at 1M rows/s the old generation filled every
# ~10 s, with full collections of 110-190 ms in the latency's p99. An idle wake-up costs microseconds.
PY4J_RELEASE_POLL_S = 0.01

# How long a JVM start keeps its turn after the session is ready, when a task waits for it (_end_turn).
FIRST_BATCHES_S = 2.0

# C2, the JIT's optimising tier, compiles a method once it has run 10x Java's default thresholds:
# a JVM's start runs Spark's start-up code thousands of times, and C2 compiling it took a third of
# the JVM's CPU while a notebook's first row waited (ready in 4.3 s instead of 5.2-5.5 s, 6.1 s of
# CPU instead of 9 s); a batch's code runs millions of times, and got as fast as before (a GROUP BY
# with string functions over 1M rows: 484-489 ms a batch after warm-up, 520-533 with the defaults).
LATE_C2 = ("-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 "
           "-XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000")


def driver_host(config: TaskConfig) -> str:
    """Where the session's driver is reached: loopback in local mode; on a Spark cluster the
    TaskManager's advertised host, which the executors connect back to."""
    return "127.0.0.1" if config.spark_local else config.host


EXIT_ON_OOM = "-XX:+ExitOnOutOfMemoryError"


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
        JAVA_OPTIONS: f"-XX:+UseParallelGC {LATE_C2}",
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
    conf |= config.spark_properties
    # An OutOfMemoryError ends the JVM, which the TaskManager sees (SparkRunner._watch): thrown in
    # one of Spark's scheduler threads, it had killed that thread only, and the job waited forever
    # for tasks that thread would have started. First, so that a user's own options can turn it off
    # (-XX:-ExitOnOutOfMemoryError: the JVM takes the last of a flag).
    conf[JAVA_OPTIONS] = f"{EXIT_ON_OOM} {conf[JAVA_OPTIONS]}"
    return conf


def session_conf(config: TaskConfig) -> dict[str, str]:
    """The TaskManager's SparkSession's configuration: its own, the helpers' jar, this machine's class data archive."""
    return driver_conf(spark_conf(config))


def _start_seconds_file(config: TaskConfig) -> Optional[Path]:
    """Where the last start of a local session is kept; a cluster master's start varies with the
    cluster, so none is kept for it."""
    if not config.spark_local:
        return None
    return cache_root() / "spark-start-seconds"


def read_start_seconds(config: TaskConfig) -> Optional[float]:
    path = _start_seconds_file(config)
    try:
        return float(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None


def write_start_seconds(config: TaskConfig, seconds: float) -> None:
    path = _start_seconds_file(config)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f"{path.name}.{os.getpid()}")
        staged.write_text(f"{seconds:.1f}")
        staged.replace(path)  # whole: TaskManagers of a machine write it one after the other
    except OSError as exc:
        log.warning("could not keep the SparkSession's start time in %s: %s", path, exc)


# The JVM's exit codes for running out of heap: ExitOnOutOfMemoryError's, and Spark's own
# (SparkExitCode.OOM: an executor's uncaught OutOfMemoryError, local mode's executor being the driver)
OUT_OF_MEMORY_EXIT_CODES = (3, 52)
# How long a task whose call into the JVM broke off waits for the watch to see the JVM's end (the
# socket closes as the process exits: the watch learns of it within milliseconds)
LOST_JVM_WAIT_S = 2.0


def jvm_exit_reason(code: int, driver_memory: str) -> str:
    if code in OUT_OF_MEMORY_EXIT_CODES:
        return (f"the TaskManager's Spark JVM ran out of memory (exit code {code}): raise "
                f"taskmanager.spark.driver-memory ({driver_memory}), or give it smaller batches")
    return f"the TaskManager's Spark JVM exited with code {code}; its output is in the TaskManager's .out file"


def lost_jvm_behind(exc: BaseException) -> Optional[str]:
    """Why the TaskManager's Spark JVM ended, if ``exc`` (a task's failure) is a call into it that
    broke off because it did: the task's failure should say so, not that a socket was refused."""
    from py4j.protocol import Py4JNetworkError  # not a Py4JJavaError (Java's answer): the socket's end
    runner = SparkRunner.running()
    if runner is None or runner.session is None:
        return None
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (Py4JNetworkError, ConnectionError, EOFError)):
            return runner.lost_reason(LOST_JVM_WAIT_S)
        seen = seen.__cause__ or seen.__context__
    return None


class SparkRunner:
    """The TaskManager's SparkSession: started once, shared by every slot."""

    _instance: Optional["SparkRunner"] = None
    _lock = threading.Lock()
    # The cluster's directory, set by the TaskManager: the TaskManagers of one machine start
    # their JVMs a few at a time (see _wait_for_turn). None: no coordination.
    lock_dir: Optional[Path] = None
    # The TaskManager's own configuration, set by it: the session is the TaskManager's, so its
    # master and driver address are its own even when a job's task starts the session (lazy
    # startup), whose job configuration is the JobManager's (another taskmanager.host).
    taskmanager_config: Optional[TaskConfig] = None
    # Called with the new phase when the session's phase changes, on the thread that starts it:
    # the TaskManager tells the ResourceManager at once, which prefers its slots as it gets ready
    on_phase: Optional[Callable[[str], None]] = None
    # Called with what happened when the session's JVM ends while the TaskManager runs, on the
    # thread that watches it: the TaskManager cannot go on without it (TaskExecutor.fatal_error)
    on_lost: Optional[Callable[[str], None]] = None

    def __init__(self, config: TaskConfig, conf: Optional[dict[str, str]] = None):
        self.config = config
        self.conf = conf  # the session's configuration, if not session_conf(config) (class_data.py's archive run)
        self.ready = threading.Event()
        self.error: Optional[str] = None
        self.session: Optional[SparkSession] = None
        self.started_at = time.monotonic()
        # queued (until its turn to start a JVM: _wait_for_turn), starting, ready or failed. Written
        # by the starting thread, read by any (a str: one reference swapped)
        self.phase = "queued"
        self.startup_seconds: Optional[float] = None
        # what the last JVM start of this machine's TaskManagers took (lock to ready), if known
        self.usual_start_s = read_start_seconds(config)
        self.memory = BatchMemory(budget_of_heap(config.spark_driver_memory))  # every Spark job of the TaskManager
        self.plans = PlanCache()  # every job's .sql chains
        self.local_batches: Optional[LocalBatches] = None  # small batches without a Spark job, if it works
        self.batch_jobs: Optional[BatchJobs] = None  # a batch of a kept plan as a job in one call, if it works
        self.fast_paths: frozenset[str] = frozenset()  # catalyst.FAST_PATHS that work here (the start's probe)
        self.lost: Optional[str] = None  # why the session's JVM ended, if it did while in use
        self._lost = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._start, name="spark-start", daemon=True)
        self._turn: Optional[IO] = None  # its turn to start a JVM (_try_turn), if start() got it at once
        self.task_waited = False  # whether a task waited for the start (set by task threads)

    @classmethod
    def get(cls, config: TaskConfig) -> "SparkRunner":
        """The session, started by the first caller: a task, or the TaskManager at its start."""
        with cls._lock:
            if cls._instance is None:
                cls._instance = SparkRunner(cls.taskmanager_config or config).start()
            return cls._instance

    def start(self) -> "SparkRunner":
        # whether it starts a JVM now or queues is known before the TaskManager registers, which
        # says so: the first job's slots go to the TaskManager that starts first
        self._turn = self._try_turn()
        if self._turn is not None:
            self.phase = "starting"
        self._thread.start()
        return self

    @classmethod
    def running(cls) -> Optional["SparkRunner"]:
        return cls._instance

    @classmethod
    def phase_now(cls) -> str:
        """The TaskManager's session's phase, "" if none was started (lazy startup, no Spark task yet)."""
        runner = cls._instance
        return "" if runner is None else runner.phase

    def _enter(self, phase: str) -> None:
        self.phase = phase
        listener = SparkRunner.on_phase
        if listener is not None:
            listener(phase)

    def status(self) -> str:
        """What a task waiting for the session shows in its job's status: how long it has waited,
        and what a JVM start of this machine took last time, once its own has begun."""
        waited = f"starting Spark ({time.monotonic() - self.started_at:.0f} s"
        if self.phase == "queued":
            return waited + ", after another TaskManager's)"
        return waited + (f"; about {self.usual_start_s:.0f} s here)" if self.usual_start_s else ")")

    def _start(self) -> None:
        os.environ.setdefault("SPARK_LOCAL_IP", driver_host(self.config))
        # Python workers (UDFs) must run this interpreter, which has pandas and pyarrow.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        turn = self._turn
        try:
            if turn is None and self.lock_dir is not None:
                turn = self._wait_for_turn()
            jvm_started = time.monotonic()
            self._enter("starting")
            log.info("starting the SparkSession")
            from pyspark.sql import SparkSession
            catalyst.set_release_poll(PY4J_RELEASE_POLL_S)
            builder = SparkSession.builder
            for key, value in (self.conf or session_conf(self.config)).items():
                builder = builder.config(key, value)
            session = builder.getOrCreate()
            created = time.monotonic()
            # no warm-up query of its own: the probe's queries warm the JVM as well, and the paths
            # a task's batches take better (a query before it made the session ready 0.6-0.9 s later,
            # and the first row only 0.3 s sooner after that)
            local_batches, batch_jobs = LocalBatches.load(session), BatchJobs.load(session)
            self.fast_paths = working_paths(session, local_batches, batch_jobs)
            probed = time.monotonic()
            self.local_batches = local_batches if catalyst.LOCAL_BATCH in self.fast_paths else None
            self.batch_jobs = batch_jobs if catalyst.BATCH_JOB in self.fast_paths else None
            self.session = session
            self._watch(session)
            # What Python holds by now (pyspark, py4j, pandas: some 100k objects) lives as long as the
            # TaskManager: out of the collector's sight, a full collection, which stops every task
            # of the process, took 50-110 ms here with them and next to nothing without
            gc.freeze()
            self.startup_seconds = time.monotonic() - self.started_at
            log.info("SparkSession ready in %.1f s (JVM and session %.1f s, fast paths' probe %.1f s)",
                     self.startup_seconds, created - jvm_started, probed - created)
            write_start_seconds(self.config, time.monotonic() - jvm_started)
        except Exception as exc:  # reported to every task that needs Spark
            self.error = f"the TaskManager's SparkSession failed to start: {type(exc).__name__}: {exc}"
            log.exception("SparkSession failed to start")
        finally:
            self.ready.set()
            self._enter("failed" if self.error else "ready")
            if turn is not None:
                self._end_turn(turn)

    def _wait_for_turn(self) -> IO:
        """A JVM start's turn among this machine's TaskManagers (those of lock_dir), waited for.

        A JVM start is CPU-bound for seconds: two at once on 2 cores made both ready after
        135 s where one alone took 50 s (a loaded machine; see bench/first_spark_cell.py), so
        one after the other makes the first TaskManager ready soonest and the last no later."""
        log.info("another TaskManager's JVM is starting: this one starts after it")
        self._enter("queued")  # the same phase, said now: the ResourceManager hears it at once
        while True:
            turn = self._try_turn()
            if turn is not None:
                return turn
            time.sleep(0.1)

    def _try_turn(self) -> Optional[IO]:
        """A free turn: one of lock_dir's lock files (one per two cores), locked, until closed.
        The kernel drops the lock of a process that dies. None if every turn is taken, or
        without a lock_dir (no turns)."""
        if self.lock_dir is None:
            return None
        import fcntl
        files = [open(self.lock_dir / f"spark-start-{i}.lock", "a")
                 for i in range(max(1, (os.cpu_count() or 1) // 2))]
        for f in files:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            for other in files:
                if other is not f:
                    other.close()
            return f
        for f in files:
            f.close()
        return None

    def _end_turn(self, turn: IO) -> None:
        """Let the next TaskManager start its JVM: at once, or FIRST_BATCHES_S later when a task
        waited for this one. A JVM start takes both cores for seconds, and right after this start
        the waiting task's first batches (its plan's analysis, a first call into Spark) need them:
        the quickstart's first row came 0.3-0.4 s sooner (bench/first_spark_cell.py)."""
        if not self.task_waited:
            turn.close()
            return
        timer = threading.Timer(FIRST_BATCHES_S, turn.close)
        timer.daemon = True
        timer.start()

    def session_for_task(self, cancelled: threading.Event, waiting: Callable[[str], None]):
        if not self.ready.is_set():
            self.task_waited = True
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

    def _watch(self, session) -> None:
        """A thread that waits for the session's JVM to end: it does only if it failed (an
        OutOfMemoryError, with ExitOnOutOfMemoryError; a crash; a kill), and then every task that
        needs Spark here fails, so the TaskManager must start again with a new one."""
        proc = getattr(session.sparkContext._gateway, "proc", None)  # PySpark's spark-submit, exec'd into java
        if proc is None:
            return  # a JVM PySpark did not start (PYSPARK_GATEWAY_PORT): not ours to watch

        def wait() -> None:
            code = proc.wait()
            if self._stopping:
                return
            self.lost = jvm_exit_reason(code, self.config.spark_driver_memory)
            self._lost.set()
            log.critical("%s", self.lost)
            if SparkRunner.on_lost is not None:
                SparkRunner.on_lost(self.lost)
        threading.Thread(target=wait, name="spark-jvm-watch", daemon=True).start()

    def lost_reason(self, wait_s: float) -> Optional[str]:
        """Why the JVM ended, waiting up to ``wait_s`` for its end to be seen: a task whose call
        into the JVM broke off asks, since the watch may learn of the exit a moment after it."""
        self._lost.wait(wait_s)
        return self.lost

    def stop(self) -> None:
        """The session stopped, unless its JVM is gone already (ended or killed): then there is
        nothing to stop, and the TaskManager's own stop goes on."""
        self._stopping = True
        if self.session is None or self.lost is not None:
            return
        from py4j.protocol import Py4JError
        try:
            self.session.stop()
        except (Py4JError, OSError) as exc:
            log.warning("the SparkSession did not stop, its JVM unreachable: %s", exc)
