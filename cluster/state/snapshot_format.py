"""The one snapshot file format of keyed state, shared by every backend (Flink's unified savepoint
format): a heap checkpoint restores into RocksDB and back, at any parallelism.

A snapshot file is an Arrow IPC file with four columns, sorted by key group:

    key_group int32 | state string | key binary (KeyCodec) | value binary (pickle)

* The schema metadata says what the file is: format name, format version and max parallelism.
  A reader refuses another format, version or max parallelism (key groups would mean other keys).
* Each record batch carries, in its custom metadata, the first and last key group it holds and a
  CRC-32 of its content. A reader skips batches outside its key group range without reading them
  and verifies the ones it reads: a corrupt or truncated file is a StateFormatError naming the
  file and what is wrong, never wrong state.
* Keys are encoded with msgpack, not pickle: pickle's output depends on object identity (its memo
  writes a repeated object once), so two equal tuples can pickle differently, and RocksDB looks
  keys up by their bytes. The encoding is part of the format: RocksDB stores exactly these bytes.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import zlib
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

FORMAT_NAME = b"streamlab-keyed-state"
FORMAT_VERSION = 1
# Flink's upper bound of max parallelism; it also makes a key group fit in 2 bytes.
MAX_PARALLELISM_LIMIT = 1 << 15

ROWS_PER_BATCH = 65_536
BYTES_PER_BATCH = 8 << 20

_FORMAT_KEY = b"streamlab.format"
_VERSION_KEY = b"streamlab.format.version"
_MAX_PARALLELISM_KEY = b"streamlab.max_parallelism"
_CRC_KEY = b"crc32"
_FIRST_KEY = b"first_key_group"
_LAST_KEY = b"last_key_group"

COLUMNS = pa.schema([
    ("key_group", pa.int32()),
    ("state", pa.string()),
    ("key", pa.binary()),
    ("value", pa.binary()),
])


class StateFormatError(ValueError):
    """A snapshot file that cannot be restored: corrupt, truncated, or of another format or max
    parallelism. The message names the file and what is wrong."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"keyed state snapshot {path}: {problem}")
        self.path = path


class UnsupportedKeyError(TypeError):
    pass


def encode_value(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


decode_value = pickle.loads


def decode_key(data: bytes) -> Any:
    return msgpack.unpackb(data, use_list=False, raw=False)


class KeyCodec:
    """Deterministic key bytes: equal keys of the same types always give the same bytes.

    A Packer is not thread-safe: each backend and each snapshot writer has its own codec.
    """

    SUPPORTED = "int (64-bit), float, str, bytes, bool, None or tuples of them"

    def __init__(self) -> None:
        self._pack = msgpack.Packer(use_bin_type=True).pack

    def encode_many(self, keys: Sequence) -> list[bytes]:
        pack = self._pack
        try:
            return [pack(key) for key in keys]
        except (TypeError, OverflowError, ValueError):
            raise self._unsupported(keys) from None

    def encode(self, key: Any) -> bytes:
        return self.encode_many((key,))[0]

    def _unsupported(self, keys: Sequence) -> UnsupportedKeyError:
        for key in keys:
            try:
                self._pack(key)
            except (TypeError, OverflowError, ValueError) as e:
                return UnsupportedKeyError(
                    f"state key {key!r} of type {type(key).__name__} cannot be encoded ({e}); "
                    f"keys must be {self.SUPPORTED} (convert numpy scalars with .tolist())")
        return UnsupportedKeyError(f"state keys cannot be encoded; keys must be {self.SUPPORTED}")


def check_max_parallelism(max_parallelism: int) -> None:
    if not 1 <= max_parallelism <= MAX_PARALLELISM_LIMIT:
        raise ValueError(f"max parallelism {max_parallelism} is not in [1, {MAX_PARALLELISM_LIMIT}]")


def _content(column: pa.Array) -> list:
    # The logical bytes of a column: what the writer built and what the reader mapped may differ
    # in padding and capacity, never in content. Columns here are never sliced (offset 0).
    n = len(column)
    buffers = column.buffers()
    if pa.types.is_int32(column.type):
        return [buffers[1].slice(0, 4 * n)]
    offsets = buffers[1].slice(0, 4 * (n + 1))
    end = int(np.frombuffer(offsets, dtype=np.int32)[n])
    return [offsets] + ([buffers[2].slice(0, end)] if buffers[2] is not None else [])


def _checksum(batch: pa.RecordBatch) -> int:
    crc = 0
    for column in batch.columns:
        for part in _content(column):
            crc = zlib.crc32(part, crc)
    return crc


class SnapshotFileWriter:
    """Writes one snapshot file from runs of rows given in key group order.

    The file appears at `path` only once complete (written beside it, then renamed), so a crash or
    an aborted snapshot never leaves a partial file under the final name.
    """

    def __init__(self, path: Path, max_parallelism: int, rows_per_batch: int = ROWS_PER_BATCH,
                 bytes_per_batch: int = BYTES_PER_BATCH):
        check_max_parallelism(max_parallelism)
        self.path = Path(path)
        self.max_parallelism = max_parallelism
        self.rows_per_batch = rows_per_batch
        self.bytes_per_batch = bytes_per_batch
        self._partial = self.path.with_name(self.path.name + ".inprogress")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        schema = COLUMNS.with_metadata({
            _FORMAT_KEY: FORMAT_NAME,
            _VERSION_KEY: str(FORMAT_VERSION).encode(),
            _MAX_PARALLELISM_KEY: str(max_parallelism).encode(),
        })
        self._sink = pa.OSFile(str(self._partial), "wb")
        self._writer = ipc.new_file(self._sink, schema)
        self._groups: list[int] = []
        self._states: list[str] = []
        self._keys: list[bytes] = []
        self._values: list[bytes] = []
        self._pending_bytes = 0
        self._last_group = -1
        self._key_groups: set[int] = set()
        self.entries = 0

    def add_run(self, key_group: int, state: str, keys: list[bytes], values: list[bytes]) -> None:
        """Rows of one key group and one state; key groups must not decrease from run to run."""
        if key_group < self._last_group:
            raise ValueError(f"key group {key_group} after {self._last_group}: a snapshot file "
                             f"is written in key group order")
        if not 0 <= key_group < self.max_parallelism:
            raise ValueError(f"key group {key_group} is not in [0, {self.max_parallelism})")
        self._last_group = key_group
        step = self.rows_per_batch
        for start in range(0, len(keys), step):
            chunk = keys[start:start + step]
            chunk_values = values[start:start + step]
            self._groups.extend([key_group] * len(chunk))
            self._states.extend([state] * len(chunk))
            self._keys.extend(chunk)
            self._values.extend(chunk_values)
            self._pending_bytes += sum(map(len, chunk)) + sum(map(len, chunk_values))
            if len(self._keys) >= self.rows_per_batch or self._pending_bytes >= self.bytes_per_batch:
                self._flush()

    def _flush(self) -> None:
        if not self._keys:
            return
        batch = pa.record_batch([
            pa.array(self._groups, pa.int32()),
            pa.array(self._states, pa.string()),
            pa.array(self._keys, pa.binary()),
            pa.array(self._values, pa.binary()),
        ], schema=COLUMNS)
        self._writer.write_batch(batch, custom_metadata={
            _CRC_KEY: str(_checksum(batch)).encode(),
            _FIRST_KEY: str(self._groups[0]).encode(),
            _LAST_KEY: str(self._groups[-1]).encode(),
        })
        self._key_groups.update(self._groups)
        self.entries += len(self._keys)
        self._groups, self._states, self._keys, self._values = [], [], [], []
        self._pending_bytes = 0

    def finish(self) -> dict:
        self._flush()
        self._writer.close()
        self._sink.close()
        os.replace(self._partial, self.path)
        return {"bytes": self.path.stat().st_size, "entries": self.entries,
                "key_groups": sorted(self._key_groups)}

    def abort(self) -> None:
        # must not mask the error that made us abort
        with contextlib.suppress(pa.ArrowException, OSError):
            self._writer.close()
        self._sink.close()
        self._partial.unlink(missing_ok=True)


def read_key_groups(path: Path, max_parallelism: int, key_groups: range
                    ) -> Iterator[tuple[list[int], list[str], list[bytes], list[bytes]]]:
    """Rows of the snapshot file whose key group is in `key_groups`, as column lists, one tuple per
    record batch read. Batches wholly outside the range are skipped unread."""
    path = Path(path)
    if not key_groups:
        return
    first_wanted, last_wanted = key_groups[0], key_groups[-1]
    try:
        source = pa.memory_map(str(path), "r")
    except FileNotFoundError:
        raise  # a missing file is a clear error of its own, not a format problem
    except (pa.ArrowException, OSError) as e:
        raise StateFormatError(path, f"cannot be opened ({e})") from e
    with source:
        reader = _open(path, source, max_parallelism)
        for index in range(reader.num_record_batches):
            try:
                batch, metadata = reader.get_batch_with_custom_metadata(index)
            except (pa.ArrowException, OSError) as e:
                raise StateFormatError(path, f"record batch {index} cannot be read ({e})") from e
            first, last = _group_span(path, index, metadata, max_parallelism)
            if last < first_wanted or first > last_wanted:
                continue
            groups = _verified_groups(path, index, batch, metadata, first, last)
            start = int(np.searchsorted(groups, first_wanted, side="left"))
            end = int(np.searchsorted(groups, last_wanted, side="right"))
            if start < end:
                rows = batch.slice(start, end - start)
                yield tuple(column.to_pylist() for column in rows.columns)


def _open(path: Path, source, max_parallelism: int) -> ipc.RecordBatchFileReader:
    try:
        reader = ipc.open_file(source)
    except (pa.ArrowException, OSError) as e:
        raise StateFormatError(
            path, f"not a complete Arrow IPC file, truncated or corrupt ({e})") from e
    metadata = reader.schema.metadata or {}
    if metadata.get(_FORMAT_KEY) != FORMAT_NAME:
        raise StateFormatError(path, "not a keyed state snapshot (no streamlab format marker)")
    version = metadata.get(_VERSION_KEY, b"?").decode(errors="replace")
    if version != str(FORMAT_VERSION):
        raise StateFormatError(path, f"format version {version}, this reader knows {FORMAT_VERSION}")
    if not reader.schema.remove_metadata().equals(COLUMNS):
        raise StateFormatError(path, f"unexpected columns {reader.schema.remove_metadata()}")
    written = metadata.get(_MAX_PARALLELISM_KEY, b"?").decode(errors="replace")
    if written != str(max_parallelism):
        raise StateFormatError(
            path, f"written with max parallelism {written}, restoring with {max_parallelism}: "
                  f"key groups of another max parallelism hold other keys")
    return reader


def _group_span(path: Path, index: int, metadata: Optional[pa.KeyValueMetadata],
                max_parallelism: int) -> tuple[int, int]:
    if metadata is None:
        raise StateFormatError(path, f"record batch {index} has no key group span")
    try:
        first, last = int(metadata[_FIRST_KEY]), int(metadata[_LAST_KEY])
    except (TypeError, KeyError, ValueError):
        raise StateFormatError(path, f"record batch {index} has no key group span") from None
    if not 0 <= first <= last < max_parallelism:
        raise StateFormatError(path, f"record batch {index} has key groups {first}..{last}, "
                                     f"outside [0, {max_parallelism})")
    return first, last


def _verified_groups(path: Path, index: int, batch: pa.RecordBatch,
                     metadata: pa.KeyValueMetadata, first: int, last: int) -> np.ndarray:
    try:
        batch.validate(full=True)
    except pa.ArrowException as e:
        raise StateFormatError(path, f"record batch {index} is corrupt ({e})") from e
    expected = metadata.get(_CRC_KEY)
    if expected is None or str(_checksum(batch)).encode() != expected:
        raise StateFormatError(path, f"record batch {index} fails its checksum (corrupt file)")
    groups = batch.column(0).to_numpy()
    if len(groups) == 0 or groups[0] != first or groups[-1] != last or np.any(np.diff(groups) < 0):
        raise StateFormatError(path, f"record batch {index} is not sorted by key group "
                                     f"within {first}..{last}")
    return groups


def read_entries(paths: Sequence[Path], max_parallelism: int, key: Optional[bytes] = None
                 ) -> Iterator[tuple[str, bytes, bytes]]:
    """Every (state, encoded key, pickled value) of snapshot files, across all key groups, for
    looking at state rather than restoring it; ``key`` (KeyCodec bytes) keeps one key's entries.
    Read and verified as a restore reads them."""
    every_group = range(max_parallelism)
    for path in paths:
        for _, states, keys, values in read_key_groups(Path(path), max_parallelism, every_group):
            for state, encoded, value in zip(states, keys, values):
                if key is None or encoded == key:
                    yield state, encoded, value
