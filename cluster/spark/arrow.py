"""Arrow batches into and out of the TaskManager's JVM with few py4j calls.

PySpark's ``createDataFrame(pyarrow.Table)`` and ``DataFrame.toArrow()`` made 68 py4j calls per
batch of a one-step ``.sql`` chain (configuration reads, schema round trips as JSON, call-site
bookkeeping that walks the Python stack), each a thread switch into the JVM and back under the
GIL that the task thread needs at the same time. The batch itself goes the same way here, by the
same JVM entry points PySpark uses (an Arrow stream file read by ``PythonSQLUtils``, and
``collectAsArrowToPython``'s socket), with what does not change from batch to batch (the Spark
schema of an Arrow schema) worked out once. These are PySpark's internal entry points, reached
through catalyst.py (the "Arrow bridge" it probes). Tables with timestamps take PySpark's own path,
which localises them.
"""
from __future__ import annotations

import math
import os
import tempfile
import threading
from typing import Any, TypeVar

import pyarrow as pa

from cluster.spark import catalyst

# A batch of this many rows or more is cut into one Arrow batch (one Spark partition, one task) per
# core, so that both cores work on it; a smaller one is a single task, which schedules faster.
SPLIT_ROWS = 50_000
MAX_PARTITION_ROWS = 250_000  # spark.sql.execution.arrow.maxRecordsPerBatch, as PySpark cuts

T = TypeVar("T")


def by_pyspark(schema: pa.Schema) -> bool:
    """Whether a table of ``schema`` goes to the JVM by PySpark's own path (timestamps, which it
    localises), not ArrowBridge's file: such a batch's plan is not kept, nor fused with others."""
    return any(pa.types.is_timestamp(field.type) for field in schema)


class JvmRefs:
    """The Java objects one Spark job reached through py4j, released in the JVM when it is done.

    py4j's proxy of a Java object caches its methods, and each cached method points back at the
    proxy: a reference cycle, so Python frees a proxy (and py4j then lets the JVM free the object)
    only at a cyclic garbage collection, seconds later. A batch's DataFrames reach its Arrow bytes:
    kept that long, a second of batches outlived the JVM's young collections and filled the old
    generation. Only the job's thread uses one, as ``with JvmRefs(session) as refs``; ``add``
    returns what it is given."""

    def __init__(self, session):
        self._detach = catalyst.detacher(session)
        self._refs: list[Any] = []

    def add(self, obj: T) -> T:
        if catalyst.is_java_object(obj):
            self._refs.append(obj)
        return obj

    def __enter__(self) -> "JvmRefs":
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def release(self) -> None:
        refs, self._refs = self._refs, []
        for obj in refs:
            self._detach(obj)


class ArrowBridge:
    """One per Spark chain; ``to_jvm``/``from_jvm`` may run on several threads at once."""

    def __init__(self, cores: int):
        self.cores = max(1, cores)
        self._schemas: dict[pa.Schema, str] = {}  # Arrow schema -> Spark schema as JSON
        self._local = threading.local()
        self._lock = threading.Lock()
        self._paths: list[str] = []  # every thread's batch file
        # PythonSQLUtils' static methods, looked up once: each lookup by name (``jvm.PythonSQLUtils``,
        # then the method) is a reflection round trip into the JVM, four per batch otherwise
        self._read_arrow: Any = None
        self._to_dataframe: Any = None

    def to_jvm(self, session, table: pa.Table, refs: JvmRefs) -> Any:
        """The table as a Java DataFrame of ``session``."""
        if by_pyspark(table.schema):
            return refs.add(catalyst.public_frame(session, table))
        return self.parts_to_jvm(session, [table], refs)[0]

    def parts_to_jvm(self, session, tables: list[pa.Table], refs: JvmRefs) -> tuple[Any, list[tuple[int, int]]]:
        """Tables of one schema (without timestamps) as one Java DataFrame, and for each table the
        range of partitions its rows are in: one partition per Arrow batch, in order."""
        schema = self.spark_schema(tables[0].schema)
        path, ranges = self.write(session, tables)
        if self._to_dataframe is None:
            self._read_arrow, self._to_dataframe = catalyst.arrow_reader(session)
        batches = refs.add(self._read_arrow(path))  # read whole: the file is free again
        return refs.add(self._to_dataframe(batches, schema, catalyst.java_session(session))), ranges

    def spark_schema(self, schema: pa.Schema) -> str:
        """The Spark schema of an Arrow schema (without timestamps), as JSON."""
        spark = self._schemas.get(schema)
        if spark is None:
            from pyspark.sql.pandas.types import from_arrow_schema
            spark = self._schemas[schema] = from_arrow_schema(schema).json()
        return spark

    def write(self, session, tables: list[pa.Table]) -> tuple[str, list[tuple[int, int]]]:
        """Tables of one schema as this thread's Arrow stream file (its path), and for each table
        the range of batches its rows are in."""
        path = self._file(session, "in")
        ranges = []
        partitions = 0
        # Overwritten in place, never emptied first: ext4 writes a file that is truncated to zero
        # and written again out to disk when it is closed (its auto_da_alloc guard against lost
        # renames), 48 MB of disk writes per 2M-row batch and 39 ms where this takes 8.
        with open(path, "r+b", buffering=0) as raw:
            with pa.ipc.new_stream(pa.PythonFile(raw, mode="w"), tables[0].schema) as writer:
                for table in tables:
                    rows = table.num_rows
                    chunk = rows if rows < SPLIT_ROWS else min(MAX_PARTITION_ROWS, math.ceil(rows / self.cores))
                    first = partitions
                    for batch in table.to_batches(max_chunksize=max(1, chunk)):
                        writer.write_batch(batch)
                        partitions += 1
                    ranges.append((first, partitions))
            raw.truncate(raw.tell())  # a longer batch's tail, after this one's end of stream
        return path, ranges

    def output_file(self, session) -> str:
        """This thread's file for a batch's output written by the JVM (local.py)."""
        return self._file(session, "out")

    def from_jvm(self, session, jdf, refs: JvmRefs) -> pa.Table:
        """Run the Java DataFrame's plan and take its rows as one Arrow table."""
        return catalyst.collect_arrow(session, jdf, refs)

    def _file(self, session, kind: str) -> str:
        paths = getattr(self._local, "paths", None)
        if paths is None:
            paths = self._local.paths = {}
        path = paths.get(kind)
        if path is None:
            directory = catalyst.temp_dir(session) or tempfile.gettempdir()
            fd, path = tempfile.mkstemp(prefix=f"streamlab-batch-{kind}-", suffix=".arrow", dir=directory)
            os.close(fd)
            paths[kind] = path
            with self._lock:
                self._paths.append(path)
        return path

    def close(self) -> None:
        """Remove the batch files (once no thread converts any more)."""
        with self._lock:
            paths, self._paths = self._paths, []
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
