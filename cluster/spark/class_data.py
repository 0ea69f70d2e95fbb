"""A class data sharing archive of the TaskManager's Spark JVM (the JDK's AppCDS, dynamic archive).

Most of a Spark JVM's start is loading, parsing and verifying some 13,000 classes from Spark's jars,
and again on every TaskManager start. A dynamic archive holds them as the JVM had them after a
session's first queries; a JVM started with it maps the file instead. Measured on this 2-core
machine (JDK 17, C1 only): a local session's start took 9.6-11.0 s of JVM CPU without it and
6.0-6.3 s with it, its first small queries 8.8-10.5 s and 5.5-5.8 s.

The archive is made once per machine (``python -m cluster.spark archive``, from ``make setup``) by
a session with the TaskManager's own class path, and kept in the helpers' cache beside their jar.
The JVM takes it only when its class path, the jars' sizes and times and the JVM itself are those
it was made with, and otherwise starts as without it, silently; the name of the archive hashes
the same, so a new JDK, Spark or helpers jar looks for (and ``make setup`` makes) a new one. A
machine without one starts its JVMs as before.

Thread use: any thread.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Optional

from cluster.spark.helpers import cache_root, classpath_entry, spark_jars

JAVA_OPTIONS = "spark.driver.extraJavaOptions"
CLASS_PATH = "spark.driver.extraClassPath"


def java_binary() -> Optional[Path]:
    """The ``java`` that Spark's launcher runs: JAVA_HOME's, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_path(conf: dict[str, str]) -> Optional[Path]:
    """Where the archive for a driver of this configuration is (made or not); None without a JVM."""
    java = java_binary()
    if java is None:
        return None
    from pyspark import __version__ as spark_version
    jars = spark_jars().resolve()
    digest = hashlib.sha256(f"{spark_version}\0{jars}".encode())
    # the JVM refuses an archive when a jar of its class path is not the file it was made with (its
    # size and time): Spark's jars installed again at the same path (a venv made anew) need a new one
    for jar in sorted(os.scandir(jars), key=lambda entry: entry.name):
        stat = jar.stat()
        digest.update(f"\0{jar.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    # the JVM's own library decides whether an archive fits, and the jars added before Spark's
    parts = [str(java), str(java.parent.parent / "lib" / "server" / "libjvm.so"),
             *filter(None, conf.get(CLASS_PATH, "").split(os.pathsep))]
    for part in parts:
        try:
            stat = os.stat(part)
        except OSError:
            digest.update(f"\0{part}\0missing".encode())
            continue
        digest.update(f"\0{part}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return cache_root() / f"spark-driver-{digest.hexdigest()[:16]}.jsa"


def with_jvm_helpers(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with streamlab's Java helpers (helpers.py) on the driver's class path, after the user's own entries
    (compiled first if this machine has not yet)."""
    entry = classpath_entry()
    if entry is None:
        return conf
    given = conf.get(CLASS_PATH)
    return conf | {CLASS_PATH: os.pathsep.join([given, entry]) if given else entry}


def driver_conf(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` for a Spark driver of this machine: the helpers' jar on its class path, then the
    archive made for that class path, if made. The TaskManagers' sessions and the client's SQL
    planner both start so: the planner's class path is a TaskManager's, so that it maps the same
    archive (its first analysis in 5.7 s instead of 12.4 s here)."""
    return with_class_data(with_jvm_helpers(conf))


def with_class_data(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with the archive among the driver's Java options, if this machine has made it."""
    archive = archive_path(conf)
    if archive is None or not archive.is_file():
        return conf
    return conf | {JAVA_OPTIONS: f"{conf.get(JAVA_OPTIONS, '')} -XX:SharedArchiveFile={archive}".strip()}


def dumping_into(conf: dict[str, str], staging: Path) -> dict[str, str]:
    """``conf`` for the JVM that makes the archive: it writes its classes into ``staging`` as it exits."""
    # its warnings (signed jars and old class files are not archived) are expected: errors only. It
    # runs for seconds, and what C2 would compile is not archived: C1 only
    options = (f"{conf.get(JAVA_OPTIONS, '')} -XX:ArchiveClassesAtExit={staging} -Xlog:cds*=error"
               " -XX:TieredStopAtLevel=1").strip()
    return conf | {JAVA_OPTIONS: options}
