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

That takes one call into the JVM per batch (jvm/LocalBatch.java): through py4j each of the two
dozen steps is a round trip of up to a millisecond on a busy TaskManager, and the 24 kB of a
1,000-row result came back through py4j in 45 ms. The class is compiled once per machine and Spark
version (``javac`` of the JDK that Spark runs on), into ``~/.cache/streamlab/jvm``, and put on the
driver's class path when the TaskManager's session starts. Without a JDK compiler every batch runs
as a Spark job, as before.

A plan whose optimised form still has something to execute (a sort, an aggregation, a Python UDF)
is marked on its template, and its batches run as Spark jobs from then on.

Thread use: any thread; a template's run holds the template's lock (PlanTemplate.run_local).
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import pyarrow as pa

if TYPE_CHECKING:
    from .spark_plans import PlanTemplate

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "jvm" / "LocalBatch.java"
CLASS = "streamlab.LocalBatch"
JAVA_RELEASE = "17"  # Spark 4's oldest Java
COMPILE_TIMEOUT_S = 300


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "streamlab" / "jvm"


def spark_jars() -> Path:
    from pyspark.find_spark_home import _find_spark_home
    return Path(_find_spark_home()) / "jars"


def javac() -> Optional[str]:
    """The JDK's compiler: Spark's JAVA_HOME's, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").exists():
        return str(Path(home) / "bin" / "javac")
    return shutil.which("javac")


def classpath_entry() -> Optional[str]:
    """The directory of the compiled helper, compiled now if this machine has not yet (a few
    seconds, once); None when it cannot be (no JDK compiler): batches then run as Spark jobs."""
    from pyspark import __version__ as spark_version
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + spark_version.encode()).hexdigest()[:16]
    target = cache_root() / key
    if (target / "streamlab" / "LocalBatch.class").exists():
        return str(target)
    compiler = javac()
    if compiler is None:
        log.warning("no javac (a JDK's compiler) found: every Spark batch runs as a Spark job; "
                    "small ones would run in the driver without one (%s)", SOURCE.name)
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # compiled aside and renamed into place: TaskManagers that start at once each compile
        # their own, and the first rename wins
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=target.parent))
        done = subprocess.run([compiler, "--release", JAVA_RELEASE, "-nowarn", "-cp", str(spark_jars() / "*"),
                               "-d", str(staging), str(SOURCE)], capture_output=True, text=True,
                              timeout=COMPILE_TIMEOUT_S)
        if done.returncode != 0:
            log.warning("compiling %s failed: every Spark batch runs as a Spark job:\n%s", SOURCE.name,
                        done.stderr.strip()[-2000:])
            shutil.rmtree(staging, ignore_errors=True)
            return None
        try:
            staging.rename(target)
        except OSError:  # another TaskManager's compile came first
            shutil.rmtree(staging, ignore_errors=True)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("compiling %s failed (%s): every Spark batch runs as a Spark job", SOURCE.name, exc)
        return None
    return str(target)


class LocalBatches:
    """The helper class as loaded in a session's JVM."""

    def __init__(self, helper: Any):
        self._run = helper.run

    @classmethod
    def load(cls, session) -> Optional["LocalBatches"]:
        """The helper, if the session's driver has it on its class path."""
        from py4j.java_gateway import JavaClass
        helper = session._jvm
        for part in CLASS.split("."):
            helper = getattr(helper, part)
        if not isinstance(helper, JavaClass):
            log.warning("%s is not on the Spark driver's class path: every Spark batch runs as a Spark job", CLASS)
            return None
        return cls(helper)

    def run(self, session, template: "PlanTemplate", in_path: str, out_path: str) -> Optional[pa.Table]:
        """The batch in the Arrow stream file ``in_path`` through ``template``'s plan, in the
        driver; None when the template was released meanwhile, or its plan needs a Spark job
        (then marked: its later batches are not tried here)."""
        from pyspark.errors.exceptions.captured import unwrap_spark_exception
        with unwrap_spark_exception():  # a Spark error as PySpark raises it from a job
            rows = template.run_local(lambda root: self._run(session._jsparkSession, root, in_path, out_path))
        if rows is None:
            return None
        if rows < 0:
            template.local = False
            log.info("a .sql plan needs a Spark job after optimisation: its batches run as jobs")
            return None
        with open(out_path, "rb") as stream:
            return pa.ipc.open_stream(stream.read()).read_all()
