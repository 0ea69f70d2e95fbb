"""streamlab's own Java helpers in the TaskManager's Spark driver (cluster/spark/jvm/*.java).

Each does in one py4j call what took many from Python: through py4j every step is a round trip into
the JVM, up to a millisecond on a TaskManager whose cores are busy. ``LocalBatch`` runs a small
batch in the driver without a Spark job (local.py); ``BatchJob`` runs a batch through a kept
analysed plan as one Spark job (plans.py). They use Spark's internal methods, public in its
bytecode: catalyst.py loads them and probes them at the session's start.

The classes are compiled once per machine and Spark version (``javac`` of the JDK that Spark runs
on), into a jar in ``~/.cache/streamlab/jvm``, and put on the driver's class path when the
TaskManager's session starts. Without a JDK compiler every batch takes the Python way, as before the helpers.

Thread use: any thread.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

import pyarrow as pa

log = logging.getLogger(__name__)

SOURCES = sorted((Path(__file__).parent / "jvm").glob("*.java"))
HELPER_PACKAGE = "streamlab"  # the helpers' Java package (catalyst.load_helper finds them by it)
JAVA_RELEASE = "17"  # Spark 4's oldest Java
COMPILE_TIMEOUT_S = 300
JAR_ENTRY_TIME = (2000, 1, 1, 0, 0, 0)


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


def compiled(jar: Path) -> bool:
    if not jar.is_file():
        return False
    with zipfile.ZipFile(jar) as archive:
        names = set(archive.namelist())
    return all(f"{HELPER_PACKAGE}/{source.stem}.class" in names for source in SOURCES)


def classpath_entry() -> Optional[str]:
    """The jar of the compiled helpers, compiled now if this machine has not yet (a few seconds,
    once); None when they cannot be (no JDK compiler).

    A jar, not a directory of classes: the JVM's class data sharing (class_data.py) refuses a
    class path with a non-empty directory in it. Its entries carry a fixed time and the first
    jar written stays, so the jar's size and time, which a shared archive checks, never change."""
    from pyspark import __version__ as spark_version
    digest = hashlib.sha256(spark_version.encode())
    for source in SOURCES:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    key = digest.hexdigest()[:16]
    target = cache_root() / f"{key}.jar"
    if compiled(target):
        return str(target)
    names = ", ".join(source.name for source in SOURCES)
    compiler = javac()
    if compiler is None:
        log.warning("no javac (a JDK's compiler) found: Spark batches take the slower way without %s", names)
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    # compiled aside, then linked into place: TaskManagers that start at once each compile their
    # own, and the first link wins
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=target.parent))
    try:
        done = subprocess.run([compiler, "--release", JAVA_RELEASE, "-nowarn", "-cp", str(spark_jars() / "*"),
                               "-d", str(staging / "classes"), *map(str, SOURCES)], capture_output=True, text=True,
                              timeout=COMPILE_TIMEOUT_S)
        if done.returncode != 0:
            log.warning("compiling %s failed: Spark batches take the slower way without them:\n%s", names,
                        done.stderr.strip()[-2000:])
            return None
        jar = staging / "helpers.jar"
        with zipfile.ZipFile(jar, "w") as archive:
            for path in sorted((staging / "classes").rglob("*.class")):
                entry = zipfile.ZipInfo(path.relative_to(staging / "classes").as_posix(), JAR_ENTRY_TIME)
                archive.writestr(entry, path.read_bytes())
        try:
            os.link(jar, target)
        except FileExistsError:  # another TaskManager's compile came first
            pass
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("compiling %s failed (%s): Spark batches take the slower way without them", names, exc)
        return None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def read_stream_file(path: str) -> pa.Table:
    """A helper's output: the Arrow stream file it wrote, read whole (the file is re-used by the next batch)."""
    with open(path, "rb") as stream:
        return pa.ipc.open_stream(stream.read()).read_all()
