"""Source and sink connectors: what ``env.from_source(...)`` and ``stream.sink_to(...)`` take.

A connector is a description (an operator kind of cluster.graph.operator_kinds.KINDS, its
parameters, an optional function); the TaskManagers' operators (cluster/operators/) do the work.

The factories below check their arguments where they are called, so a wrong argument is reported
at the user's line, and keep only plain data in ``params`` (it travels as msgpack):

    env.from_source(FileSource.csv("data/", schema={"user": "string", "amount": "int64"}))
    env.from_source(FileSource.csv("data/", schema="user string, amount bigint"))  # Spark's DDL
    stream.sink_to(FileSink.parquet("out/", rows_per_file=100_000))
    env.from_source(RedisStreamSource("redis://127.0.0.1:6379", ["events"], bounded=True))
    stream.sink_to(RedisStreamSink("redis://127.0.0.1:6379", "results", maxlen=10_000))
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Literal, NoReturn, Optional, Sequence, overload

from cluster.graph.job_graph import GraphValidationError

from kernel_runtime.api.checks import call_site
from kernel_runtime.api.schema import SchemaLike, schema_type_names

__all__ = ["Connector", "FileSource", "FileSink", "DiscardingSink", "RedisStreamSource", "RedisStreamSink"]


@dataclass(frozen=True)
class Connector:
    kind: str
    name: str
    params: dict = field(default_factory=dict)
    fn: Optional[Callable] = None


class _Check:
    """Argument checks that name the factory, the user's line and the argument."""

    def __init__(self, factory: str):
        self.where = f"{factory} ({call_site()})"

    def fail(self, argument: str, expected: str, value) -> NoReturn:
        raise GraphValidationError(f"{self.where}: {argument} must be {expected}, got {value!r}")

    @overload
    def integer(self, argument: str, value, low: int = 1, optional: Literal[False] = False) -> int: ...
    @overload
    def integer(self, argument: str, value, low: int = 1, *, optional: bool) -> Optional[int]: ...

    def integer(self, argument: str, value, low: int = 1, optional: bool = False) -> Optional[int]:
        if value is None and optional:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            self.fail(argument, f"an integer >= {low}", value)
        return value

    def number(self, argument: str, value) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            self.fail(argument, "a positive number", value)
        return float(value)

    @overload
    def text(self, argument: str, value, optional: Literal[False] = False) -> str: ...
    @overload
    def text(self, argument: str, value, optional: bool) -> Optional[str]: ...

    def text(self, argument: str, value, optional: bool = False) -> Optional[str]:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value:
            self.fail(argument, "a non-empty string", value)
        return value

    def flag(self, argument: str, value) -> bool:
        if not isinstance(value, bool):
            self.fail(argument, "True or False", value)
        return value

    def path(self, argument: str, value) -> str:
        if not isinstance(value, (str, os.PathLike)) or not str(value):
            self.fail(argument, "a path (str or os.PathLike)", value)
        # the TaskManagers do not share the client's working directory
        return os.path.abspath(os.path.expanduser(str(value)))

    def schema(self, value) -> Optional[dict]:
        return schema_type_names(value, self.where)

    def redis_url(self, value) -> str:
        if not isinstance(value, str) or not value.startswith(("redis://", "rediss://", "unix://")):
            self.fail("url", "a Redis URL (redis://host:port/db, rediss://..., unix://...)", value)
        return value


class FileSource(Connector):
    """Files as a source (Flink's FileSource): CSV, JSON lines or Parquet.

    ``path`` is a file, a directory (all files below it) or a glob; names starting with "." or "_"
    are skipped. ``watch=True`` keeps looking for new files every ``monitor_interval`` seconds
    (Flink's monitorContinuously) and makes the source unbounded: move finished files into the
    directory (write them under a hidden name, then rename), a file is read once. ``schema``
    types the columns: a dict of column -> Spark or Arrow type name ("bigint", "int64"), a Spark
    DDL string ("user string, amount bigint"), a pyspark StructType or a pyarrow Schema. A CSV or
    JSON record that does not fit it is malformed: the job fails naming file and line, unless it reads
    ``stream.get_side_output("malformed")`` (columns source, position, raw, reason). Without a
    schema CSV columns are strings (as Spark reads CSV) and JSON types come from the first records.
    """

    @classmethod
    def csv(cls, path, schema: SchemaLike = None, *, watch: bool = False, monitor_interval: float = 1.0,
            batch_size: int = 1000, delimiter: str = ",", header: bool = True,
            name: str = "csv source") -> "FileSource":
        check = _Check("FileSource.csv")
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            check.fail("delimiter", "one character", delimiter)
        if not check.flag("header", header) and schema is None:
            check.fail("schema", "given when header=False (it names the columns)", schema)
        return cls._files(check, "csv", path, schema, watch, monitor_interval, batch_size, name,
                          delimiter=delimiter, header=header)

    @classmethod
    def json_lines(cls, path, schema: SchemaLike = None, *, watch: bool = False, monitor_interval: float = 1.0,
                   batch_size: int = 1000, name: str = "json source") -> "FileSource":
        """One JSON object per line (JSON Lines, as Spark's spark.read.json reads)."""
        return cls._files(_Check("FileSource.json_lines"), "json", path, schema, watch, monitor_interval,
                          batch_size, name)

    @classmethod
    def parquet(cls, path, schema: SchemaLike = None, *, watch: bool = False, monitor_interval: float = 1.0,
                batch_size: int = 1000, name: str = "parquet source") -> "FileSource":
        """Parquet files; with ``schema``, only those columns, cast to those types (a file that
        cannot be cast fails the job)."""
        return cls._files(_Check("FileSource.parquet"), "parquet", path, schema, watch, monitor_interval,
                          batch_size, name)

    @classmethod
    def _files(cls, check: _Check, fmt: str, path, schema, watch, monitor_interval, batch_size, name,
               **options) -> "FileSource":
        params = {"path": check.path("path", path), "format": fmt, "schema": check.schema(schema),
                  "watch": check.flag("watch", watch),
                  "monitor_interval": check.number("monitor_interval", monitor_interval),
                  "batch_size": check.integer("batch_size", batch_size)}
        return cls(kind="file-source", name=check.text("name", name), params=params | options)


class FileSink(Connector):
    """Files as a sink (Flink's FileSink): a directory of Parquet part files
    ``part-<subtask>-<n>.parquet`` of at most ``rows_per_file`` rows each. A part file is written
    under a hidden in-progress name and renamed when committed, so readers of the directory
    (pandas.read_parquet, Spark, a watching FileSource) never see a partial file."""

    COMPRESSIONS = ("snappy", "zstd", "gzip", "lz4", "brotli", "none")

    @classmethod
    def parquet(cls, path, rows_per_file: int = 1_000_000, *, compression: str = "snappy",
                name: str = "parquet sink") -> "FileSink":
        check = _Check("FileSink.parquet")
        if compression not in cls.COMPRESSIONS:
            check.fail("compression", f"one of {', '.join(cls.COMPRESSIONS)}", compression)
        params = {"path": check.path("path", path), "rows_per_file": check.integer("rows_per_file", rows_per_file),
                  "compression": compression}
        return cls(kind="file-sink", name=check.text("name", name), params=params)


def DiscardingSink(name: str = "discard") -> Connector:
    """Flink's DiscardingSink: every row is dropped (a job run for its figures or side effects)."""
    return Connector(kind="discarding-sink", name=_Check("DiscardingSink").text("name", name))


class RedisStreamSource(Connector):
    """Entries of Redis Streams as rows: one column per field (plus ``id_field``, the entry id).

    ``streams`` are spread over the source's subtasks. Reading starts after ``start_id`` ("0": from
    the first entry, "$": only entries added from now on). ``bounded=True`` stops at each stream's
    last entry at the start, ``count`` after that many entries of each stream; otherwise the source
    is unbounded. ``batch_size`` entries are read per stream at a time. ``schema`` (as FileSource's)
    parses the values; an entry that does not fit it is malformed (see FileSource).
    Without a schema: the fields of the first entry, as text."""

    def __init__(self, url: str, streams: str | Sequence[str], *, schema: SchemaLike = None,
                 start_id: str = "0", bounded: bool = False, count: Optional[int] = None, batch_size: int = 1000,
                 id_field: Optional[str] = None, name: str = "redis source"):
        check = _Check("RedisStreamSource")
        keys = [streams] if isinstance(streams, str) else streams
        if not isinstance(keys, (list, tuple)) or not keys or not all(isinstance(k, str) and k for k in keys) \
                or len(set(keys)) != len(keys):
            check.fail("streams", "a stream key or a list of distinct stream keys", streams)
        if start_id not in ("0", "$") and not _is_entry_id(start_id):
            check.fail("start_id", 'an entry id ("1700000000000-0"), "0" or "$"', start_id)
        schema = check.schema(schema)
        id_field = check.text("id_field", id_field, optional=True)
        if id_field is not None and schema is not None and id_field in schema:
            check.fail("id_field", "a name that is not also a schema field", id_field)
        super().__init__(kind="redis-stream-source", name=check.text("name", name), params={
            "url": check.redis_url(url), "streams": list(keys), "schema": schema, "start_id": start_id,
            "bounded": check.flag("bounded", bounded), "count": check.integer("count", count, optional=True),
            "batch_size": check.integer("batch_size", batch_size), "id_field": id_field})


class RedisStreamSink(Connector):
    """Rows as entries of one Redis Stream (XADD): the columns are the fields, the values their
    text form, null values left out. ``maxlen`` trims the stream (``approximate``: Redis's "~",
    cheaper, may keep a few more)."""

    def __init__(self, url: str, stream: str, *, maxlen: Optional[int] = None, approximate: bool = True,
                 name: str = "redis sink"):
        check = _Check("RedisStreamSink")
        super().__init__(kind="redis-stream-sink", name=check.text("name", name), params={
            "url": check.redis_url(url), "stream": check.text("stream", stream),
            "maxlen": check.integer("maxlen", maxlen, optional=True),
            "approximate": check.flag("approximate", approximate)})


def _is_entry_id(value) -> bool:
    if not isinstance(value, str):
        return False
    ms, _, seq = value.partition("-")
    return ms.isdigit() and (seq == "" or seq.isdigit())
