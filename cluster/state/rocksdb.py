"""The RocksDB keyed state backend (Flink's EmbeddedRocksDBStateBackend), on rocksdict.

RocksDB key: key group (2 bytes, big-endian) | state name length (1 byte) | state name | key
(KeyCodec bytes); value: pickled. RocksDB orders keys bytewise, so a key group is one contiguous
range and each state one range inside it: a snapshot iterates in key group order, and the key and
value bytes go to the snapshot file as they are (nothing decoded on write, nothing encoded on
restore).

The write-ahead log is off, as in Flink: the working directory is deleted on close and state comes
back from checkpoints, never from this directory.

Snapshot: a RocksDB iterator created on the task thread. An iterator reads an implicit snapshot as
of its creation, so taking it is O(1) and the writer thread walks a consistent view while the task
keeps writing. rocksdict's Snapshot object is not used: in 0.3.29 its items()/iter() ignore the
snapshot (only snapshot[key] honours it) and see later writes.
"""
from __future__ import annotations

import pathlib
import shutil
import tempfile
import weakref
from typing import Any, Iterator, Optional, Sequence, cast

from rocksdict import Options, Rdict, WriteBatch, WriteOptions
from rocksdict.rocksdict import RdictItems  # not re-exported by the package's __all__

from cluster.state.backend import KeyedStateBackend, StateSnapshot, as_list, check_state_name
from cluster.state.snapshot_format import (ROWS_PER_BATCH, KeyCodec, SnapshotFileWriter, decode_key, decode_value, encode_value)


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_keep_log_file_num(1)
    return options


class RocksDBKeyedStateBackend(KeyedStateBackend):

    def __init__(self, key_group_range: range, max_parallelism: int, work_dir: pathlib.Path):
        super().__init__(key_group_range, max_parallelism, work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # our own fresh directory inside work_dir: close() deletes it and nothing else
        self.db_path = pathlib.Path(tempfile.mkdtemp(prefix="rocksdb-", dir=self.work_dir))
        self._db = Rdict(str(self.db_path), _options())
        self._write_options = WriteOptions()
        # rocksdict's stub declares disable_wal a method; at runtime it is a settable attribute
        self._write_options.disable_wal = True  # type: ignore[method-assign, assignment]
        self._db.set_write_options(self._write_options)
        self._codec = KeyCodec()
        self._prefixes: dict[str, dict[int, bytes]] = {}
        self._snapshots: "weakref.WeakSet[RocksDBStateSnapshot]" = weakref.WeakSet()
        self._closed = False

    def _prefix(self, state: str) -> dict[int, bytes]:
        """key group -> RocksDB key prefix of `state`, for every key group of the range."""
        try:
            return self._prefixes[state]
        except KeyError:
            check_state_name(state)
            name = state.encode()
            tail = bytes([len(name)]) + name
            prefixes = self._prefixes[state] = {
                g: g.to_bytes(2, "big") + tail for g in self.key_group_range}
            return prefixes

    def _db_keys(self, state: str, key_groups: Sequence[int], keys: Sequence) -> list[bytes]:
        prefix = self._prefix(state)
        encoded = self._codec.encode_many(as_list(keys))
        try:
            return [prefix[g] + k for g, k in zip(as_list(key_groups), encoded, strict=True)]
        except KeyError:
            raise self._range_error(key_groups) from None

    def get(self, state: str, key_group: int, key) -> Any:
        return self.get_many(state, (key_group,), (key,))[0]

    def put(self, state: str, key_group: int, key, value) -> None:
        (db_key,) = self._db_keys(state, (key_group,), (key,))
        if value is None:
            self._db.delete(db_key)
        else:
            self._db.put(db_key, encode_value(value))

    def delete(self, state: str, key_group: int, key) -> None:
        self.put(state, key_group, key, None)

    def get_many(self, state: str, key_groups: Sequence[int], keys: Sequence) -> list:
        # rocksdict's stub wants a List[Union[str, int, float, bytes, bool]] (invariant); bytes keys are fine
        found = self._db.get(self._db_keys(state, key_groups, keys))  # type: ignore[arg-type]
        if found is None:
            raise RuntimeError(f"RocksDB multi-get for state {state!r} returned nothing, not one value per key")
        return [None if raw is None else decode_value(raw) for raw in found]

    def put_many(self, state: str, key_groups: Sequence[int], keys: Sequence,
                 values: Sequence) -> None:
        batch = WriteBatch(raw_mode=True)
        for db_key, value in zip(self._db_keys(state, key_groups, keys), values, strict=True):
            if value is None:
                batch.delete(db_key)
            else:
                batch.put(db_key, encode_value(value))
        self._db.write(batch, self._write_options)

    def items(self, state: str) -> Iterator[tuple[Any, Any]]:
        prefix = self._prefix(state)
        cursor = self._db.iter()
        for g in self.key_group_range:
            start = prefix[g]
            cursor.seek(start)
            while cursor.valid():
                db_key = cursor.key()
                if not db_key.startswith(start):
                    break
                yield decode_key(db_key[len(start):]), decode_value(cursor.value())
                cursor.next()

    def snapshot(self) -> "RocksDBStateSnapshot":
        snapshot = RocksDBStateSnapshot(self.max_parallelism, self._db.items())
        self._snapshots.add(snapshot)
        return snapshot

    def _restore_rows(self, key_groups: list[int], states: list[str], keys: list[bytes],
                      values: list[bytes]) -> None:
        batch = WriteBatch(raw_mode=True)
        for g, state, key, value in zip(key_groups, states, keys, values):
            batch.put(self._prefix(state)[g] + key, value)
        self._db.write(batch, self._write_options)

    def close(self) -> None:
        """Discards pending snapshots, closes RocksDB and deletes its directory. A snapshot being
        written on another thread stops at its next run with an error."""
        if self._closed:
            return
        self._closed = True
        for snapshot in list(self._snapshots):
            snapshot.discard()
        self._db.close()
        shutil.rmtree(self.db_path, ignore_errors=True)


class RocksDBStateSnapshot(StateSnapshot):
    """Holds an iterator positioned at the first key, pinned to the state as of snapshot()."""

    def __init__(self, max_parallelism: int, items: RdictItems):
        super().__init__(max_parallelism)
        self._items: Optional[RdictItems] = items

    def _write_to(self, writer: SnapshotFileWriter) -> None:
        items = self._items
        self._check_not_discarded()  # discard() may have dropped the iterator since write()
        if items is None:
            raise RuntimeError("state snapshot discarded while being written")
        run_prefix: Optional[bytes] = None
        key_group, state = 0, ""
        keys: list[bytes] = []
        values: list[bytes] = []
        start = 0
        # the database is opened in raw mode (see _options): keys and values are bytes
        for db_key, value in cast(Iterator[tuple[bytes, bytes]], items):
            # a run is one (key group, state): the rows that share a key prefix
            if run_prefix is None or not db_key.startswith(run_prefix) or len(keys) >= ROWS_PER_BATCH:
                if keys:
                    writer.add_run(key_group, state, keys, values)
                    keys, values = [], []
                    self._check_not_discarded()
                start = 3 + db_key[2]
                run_prefix = db_key[:start]
                key_group = int.from_bytes(db_key[:2], "big")
                state = db_key[3:start].decode()
            keys.append(db_key[start:])
            values.append(value)
        if keys:
            writer.add_run(key_group, state, keys, values)

    def _release(self) -> None:
        self._items = None
