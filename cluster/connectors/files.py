"""File connectors: a FileSource (CSV, JSON lines, Parquet), bounded or watching for new files,
and a Parquet FileSink that commits part files exactly once, as Flink's FileSource and FileSink.

Which files a subtask reads is decided by rule, not by talking to the other subtasks: a bounded
source splits the sorted list of files (file i to subtask i % parallelism); a watching source
hashes each path, because subtasks discover new files at different moments and an index into
"the files seen so far" would not agree between them. Files and directories whose names start
with "." or "_" are not data (in-progress files, _SUCCESS markers), as in Hadoop, Flink and
pyarrow, so a directory that a FileSink is writing can be watched safely.
"""
from __future__ import annotations

import contextlib
import csv
import glob
import itertools
import json
import os
import re
import time
import uuid
import zlib
from typing import Generator, Iterator, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from cluster.operators.base import Operator, OperatorSnapshot, SourceOperator
from cluster.connectors.records import MalformedRecords, infer_schema, schema_from_bytes, schema_to_bytes, to_table
from cluster.graph.schema import MalformedInputError, parse_schema

HIDDEN_PREFIXES = (".", "_")
IDLE_WAIT = 0.1  # seconds: the longest an idle poll sleeps, so cancellation stays quick


def list_files(path: str) -> list[str]:
    """The data files a path names (a file, the files below a directory, a glob's matches), sorted."""
    if not glob.has_magic(path) and os.path.isfile(path):
        return [os.path.abspath(path)]  # named explicitly: read even if its name looks hidden
    matches = glob.glob(path, recursive=True) if glob.has_magic(path) else [path]
    found: set[str] = set()
    for match in matches:
        if os.path.isfile(match):
            if not os.path.basename(match).startswith(HIDDEN_PREFIXES):
                found.add(os.path.abspath(match))
            continue
        for root, dirs, files in os.walk(match):
            dirs[:] = [d for d in dirs if not d.startswith(HIDDEN_PREFIXES)]
            found.update(os.path.abspath(os.path.join(root, f)) for f in files if not f.startswith(HIDDEN_PREFIXES))
    return sorted(found)


class _Lines:
    """A binary file's lines as text for csv.reader, remembering which lines make the current record."""

    def __init__(self, f):
        self.f = f
        self.number = 0
        self.lines: list[str] = []
        self.undecodable = False

    def __iter__(self):
        return self

    def __next__(self) -> str:
        data = next(self.f)
        self.number += 1
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = data.decode("utf-8", "replace")
            self.undecodable = True
        if self.number == 1 and text.startswith("\ufeff"):
            text = text[1:]
        self.lines.append(text)
        return text

    def take(self) -> tuple[int, str, bool]:
        """(first line number, raw text, whether it was not UTF-8) of the record just parsed."""
        first = self.number - len(self.lines) + 1
        record = (first, "".join(self.lines).rstrip("\r\n"), self.undecodable)
        self.lines, self.undecodable = [], False
        return record


# Batches as the readers yield them: (records consumed, table); generators, so a reader can be closed
Batches = Generator[tuple[int, pa.Table], None, None]
# A record as the text formats yield it: (line number, raw text, values by column or the reason it is malformed)
Record = tuple[int, str, "dict | str"]


class FileSource(SourceOperator, kind="file-source"):
    """params: path (file, directory or glob), format ("csv", "json", "parquet"), schema (column ->
    type name, or None), batch_size, watch, monitor_interval (seconds), delimiter and header (CSV).

    Position: the files still to read in order (the current one first), how many records of the
    current one were consumed (emitted or reported malformed), the files done, and the schema in
    use (one inferred from the first records must stay the same after a restore)."""

    def open(self) -> None:
        params = self.params
        self.path: str = params["path"]
        self.format: str = params["format"]
        self.batch_size = int(params.get("batch_size") or 1000)
        self.watch = bool(params.get("watch"))
        self.monitor_interval = float(params.get("monitor_interval") or 1.0)
        self.delimiter: str = params.get("delimiter") or ","
        self.header = params.get("header", True)
        self.schema: Optional[pa.Schema] = parse_schema(params.get("schema"), self.spec.where())
        if self.format == "csv" and not self.header and self.schema is None:
            raise ValueError(f"{self.spec.where()}: a CSV source without a header needs a schema")
        if not glob.has_magic(self.path) and not os.path.exists(self.path):
            raise FileNotFoundError(f"{self.spec.where()}: the path {self.path!r} does not exist")
        self._pending: list[str] = []  # files to read, the current one first
        self._offset = 0               # records of the current file consumed
        self._done: list[str] = []
        self._known: set[str] = set()  # pending or done: never read a file twice
        self._reader: Optional[Batches] = None
        self._next_scan = 0.0
        self._discover()

    def _owns(self, index: int, path: str) -> bool:
        p = self.ctx.parallelism
        key = zlib.crc32(path.encode()) if self.watch else index
        return key % p == self.ctx.subtask

    def _discover(self) -> None:
        self._next_scan = time.monotonic() + self.monitor_interval
        new = [f for i, f in enumerate(list_files(self.path)) if self._owns(i, f) and f not in self._known]
        self._pending.extend(new)
        self._known.update(new)

    # ------------------------------------------------------------------ position
    def snapshot_position(self) -> dict:
        return {"pending": list(self._pending), "offset": self._offset, "done": list(self._done),
                "schema": schema_to_bytes(self.schema)}

    def restore_position(self, position: dict) -> None:
        self._close_reader()
        self._pending = list(position["pending"])
        self._offset = int(position["offset"])
        self._done = list(position["done"])
        self._known = set(self._pending) | set(self._done)
        if self.params.get("schema") is None and position.get("schema") is not None:
            self.schema = schema_from_bytes(position["schema"])  # inferred before: keep it

    # ------------------------------------------------------------------ reading
    def poll(self) -> Optional[pa.Table]:
        while True:
            if self._reader is None:
                if not self._pending:
                    return self._idle()
                self._reader = self._read(self._pending[0], self._offset)
            batch = next(self._reader, None)
            if batch is None:
                self._reader = None
                self._done.append(self._pending.pop(0))
                self._offset = 0
                continue
            consumed, table = batch
            self._offset += consumed
            return table

    def _idle(self) -> Optional[pa.Table]:
        if not self.watch:
            return None
        wait = self._next_scan - time.monotonic()
        if wait > 0:
            self.ctx.cancelled.wait(self.waiting(min(IDLE_WAIT, wait)))
        else:
            self._discover()
        return pa.table({})

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def close(self) -> None:
        self._close_reader()

    def _read(self, path: str, skip: int) -> Batches:
        """(records consumed, table) per batch of ``path``, after its first ``skip`` records."""
        if self.format == "parquet":
            return self._read_parquet(path, skip)
        records = self._csv_records(path) if self.format == "csv" else self._json_records(path)
        return self._batches(path, itertools.islice(records, skip, None), text=self.format == "csv")

    def _batches(self, path: str, records: Iterator[Record], text: bool) -> Batches:
        while chunk := list(itertools.islice(records, self.batch_size)):
            malformed = MalformedRecords(self, "line")
            good = [(line, raw, values) for line, raw, values in chunk if isinstance(values, dict)]
            bad = [(line, raw, reason) for line, raw, reason in chunk if isinstance(reason, str)]
            if self.schema is None and good:
                self.schema = infer_schema(_columns([values for _, _, values in good], None), text)
            if self.schema is None:
                table = pa.table({})
            else:
                table, unfit = to_table(_columns([values for _, _, values in good], self.schema), self.schema, text)
                bad += [(good[row][0], good[row][1], reason) for row, reason in unfit.items()]
            for line, raw, reason in sorted(bad):
                malformed.add(path, line, raw, reason)
            malformed.flush()
            yield len(chunk), table

    def _csv_records(self, path: str) -> Iterator[Record]:
        with open(path, "rb") as f:
            lines = _Lines(f)
            reader = csv.reader(lines, delimiter=self.delimiter)
            if self.header:
                columns = self._csv_columns(path, reader)
            elif self.schema is None:  # open() refuses this; here for the type checker and a clear error
                raise ValueError(f"{self.spec.where()}: a CSV source without a header needs a schema")
            else:
                columns = [f.name for f in self.schema]
            lines.take()
            while True:
                fields: list[str] | str  # the fields, or why the line is not valid CSV
                try:
                    fields = next(reader)
                except StopIteration:
                    return
                except csv.Error as exc:
                    fields = f"not valid CSV: {exc}"
                line, raw, undecodable = lines.take()
                if fields == []:  # a blank line is no record
                    continue
                if undecodable:
                    yield line, raw, "not valid UTF-8 text"
                elif isinstance(fields, str):
                    yield line, raw, fields
                elif len(fields) != len(columns):
                    yield line, raw, f"expected {len(columns)} fields, got {len(fields)}"
                else:
                    yield line, raw, dict(zip(columns, fields))

    def _csv_columns(self, path: str, reader) -> list[str]:
        header = next(reader, None)
        if header is None:  # an empty file
            return [f.name for f in self.schema] if self.schema else []
        if self.schema is None:
            self.schema = infer_schema({name: [] for name in header}, text=True)
        missing = [f.name for f in self.schema if f.name not in header]
        if missing:
            raise MalformedInputError(f"{self.spec.where()}: the header of {path} has no column(s) {missing} "
                                      f"(its columns: {header})")
        return header

    @staticmethod
    def _json_records(path: str) -> Iterator[Record]:
        with open(path, "rb") as f:
            for line, data in enumerate(f, 1):
                if not data.strip():
                    continue
                raw = data.decode("utf-8", "replace").rstrip("\r\n")
                try:
                    value = json.loads(data)
                except ValueError as exc:  # also UnicodeDecodeError
                    yield line, raw, f"not valid JSON: {exc}"
                    continue
                if isinstance(value, dict):
                    yield line, raw, value
                else:
                    yield line, raw, f"not a JSON object but {type(value).__name__}"

    def _read_parquet(self, path: str, skip: int) -> Batches:
        with pq.ParquetFile(path) as f:
            names = None
            if self.schema is not None:
                names = self.schema.names
                missing = [n for n in names if n not in f.schema_arrow.names]
                if missing:
                    raise MalformedInputError(f"{self.spec.where()}: {path} has no column(s) {missing} "
                                              f"(its columns: {f.schema_arrow.names})")
            # start at the row group that holds row `skip`, rather than decoding what was read before
            group = 0
            while group < f.num_row_groups and f.metadata.row_group(group).num_rows <= skip:
                skip -= f.metadata.row_group(group).num_rows
                group += 1
            for batch in f.iter_batches(self.batch_size, row_groups=range(group, f.num_row_groups), columns=names):
                table = pa.Table.from_batches([batch])
                if skip:
                    dropped = min(skip, table.num_rows)
                    table, skip = table.slice(dropped), skip - dropped
                    if not table.num_rows:
                        continue
                if self.schema is not None:
                    try:
                        table = table.cast(self.schema)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
                        raise MalformedInputError(f"{self.spec.where()}: {path} does not fit the schema: "
                                                  f"{exc}") from None
                yield table.num_rows, table


def _columns(rows: list[dict], schema: Optional[pa.Schema]) -> dict[str, list]:
    names = schema.names if schema is not None else list(dict.fromkeys(k for row in rows for k in row))
    return {name: [row.get(name) for row in rows] for name in names}


class FileSink(Operator, kind="file-sink"):
    """params: path (a directory), rows_per_file, compression.

    Two-phase commit, as Flink's FileSink: rows go to a hidden in-progress file; ``prepare_commit``
    closes it and hands over the pending files; ``commit`` renames them to
    ``part-<subtask>-<n>.parquet`` atomically, so a reader sees a whole file or none. With
    checkpoints, the barrier prepares (the pending files go into the checkpoint) and the
    checkpoint's completion commits, so only what a completed checkpoint covers is ever visible;
    a restore commits the pending files of the checkpoint it starts from (again: idempotent).
    Without checkpoints, a file is committed when it rolls and at the end of a bounded input."""

    def open(self) -> None:
        self.directory: str = self.params["path"]
        self.rows_per_file = int(self.params.get("rows_per_file") or 1_000_000)
        self.compression: str = self.params.get("compression") or "snappy"
        self.commit_on_roll = not self.ctx.config.checkpointing
        self._prepared: dict[int, list[dict]] = {}  # checkpoint id -> files waiting for its completion
        os.makedirs(self.directory, exist_ok=True)
        self._part = self._first_free_part()
        self._writer: Optional[pq.ParquetWriter] = None
        self._in_progress: Optional[str] = None
        self._rows = 0
        self._pending: list[dict] = []

    def _first_free_part(self) -> int:
        # after the files of earlier runs and attempts, committed or not, so nothing is overwritten
        pattern = re.compile(rf"\.?part-{self.ctx.subtask}-(\d+)\.parquet")
        numbers = [int(m.group(1)) for name in os.listdir(self.directory) if (m := pattern.match(name))]
        return max(numbers, default=-1) + 1

    def process(self, table: pa.Table) -> list[pa.Table]:
        while table.num_rows:
            writer = self._writer if self._writer is not None else self._start(table.schema.remove_metadata())
            take = min(table.num_rows, self.rows_per_file - self._rows)
            writer.write_table(self._conform(table.slice(0, take), writer.schema))
            self._rows += take
            table = table.slice(take)
            if self._rows >= self.rows_per_file:
                self._roll()
                if self.commit_on_roll:
                    self.commit(self.prepare_commit())
        return []

    def _start(self, schema: pa.Schema) -> pq.ParquetWriter:
        name = f".part-{self.ctx.subtask}-{self._part}.parquet.inprogress.{uuid.uuid4().hex[:12]}"
        self._in_progress = os.path.join(self.directory, name)
        self._writer = pq.ParquetWriter(self._in_progress, schema, compression=self.compression)
        return self._writer

    def _conform(self, table: pa.Table, schema: pa.Schema) -> pa.Table:
        if table.schema.equals(schema, check_metadata=False):
            return table
        try:
            return table.select(schema.names).cast(schema)
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            raise ValueError(
                f"{self.spec.where()}: a batch does not fit the schema of the part file being written "
                f"({exc}); batch: {table.schema.to_string(show_schema_metadata=False)}; "
                f"file: {schema.to_string(show_schema_metadata=False)}") from None

    def _roll(self) -> None:
        if self._writer is None:
            return
        in_progress = self._in_progress_path()
        self._writer.close()
        with open(in_progress, "rb") as f:
            os.fsync(f.fileno())  # durable before it can be committed
        final = os.path.join(self.directory, f"part-{self.ctx.subtask}-{self._part}.parquet")
        self._pending.append({"in_progress": in_progress, "final": final, "rows": self._rows})
        self._writer, self._in_progress, self._rows = None, None, 0
        self._part += 1

    def _in_progress_path(self) -> str:
        if self._in_progress is None:
            raise RuntimeError(f"{self.spec.where()}: a part file is open but its in-progress path is unknown")
        return self._in_progress

    def prepare_commit(self) -> list[dict]:
        """Close the file being written and hand over every file waiting for commit (plain data)."""
        self._roll()
        pending, self._pending = self._pending, []
        return pending

    def commit(self, pending: list[dict]) -> None:
        """Make the files visible. Idempotent: a commit replayed after a restore skips what is done."""
        for file in pending:
            if os.path.exists(file["in_progress"]):
                os.replace(file["in_progress"], file["final"])
            elif not os.path.exists(file["final"]):
                raise FileNotFoundError(f"{self.spec.where()}: cannot commit {file['final']}: its in-progress "
                                          f"file {file['in_progress']} is gone")

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        pending = self.prepare_commit()
        self._prepared[checkpoint_id] = pending
        return OperatorSnapshot({"pending": pending})

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        for done in sorted(c for c in self._prepared if c <= checkpoint_id):
            self.commit(self._prepared.pop(done))

    def restore_state(self, handles: list[dict]) -> None:
        # the old subtasks' pending files are committed by the new subtask with their index mod p
        mine = [h for h in handles if h["subtask"] % self.ctx.parallelism == self.ctx.subtask]
        keep: set[str] = set()
        for handle in mine:
            self.commit(handle["pending"])
            keep.update(f["in_progress"] for f in handle["pending"])
        # in-progress files of this subtask that no checkpoint covers belong to a failed attempt
        stray = re.compile(rf"\.part-{self.ctx.subtask}-\d+\.parquet\.inprogress\.")
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if stray.match(name) and path not in keep and path != self._in_progress:
                # the failed attempt's task, still cancelling, may remove its own file first
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)

    def finish(self) -> list[pa.Table]:
        # The end of the input. With checkpoints the sources end only once the final checkpoint
        # completed, so everything prepared is covered, even when that checkpoint's completion
        # notice (JobManager -> this TaskManager) is still on its way behind the end of partition.
        self.notify_checkpoint_complete(max(self._prepared, default=0))
        self.commit(self.prepare_commit())
        return []

    def close(self) -> None:
        # an in-progress file nobody prepared can never be committed
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            try:
                os.remove(self._in_progress_path())
            except FileNotFoundError:
                pass  # a cancelled attempt's file, removed as a stray by the next attempt's restore_state
