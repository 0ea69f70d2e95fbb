"""Keyed state backends: the keyed state of one operator subtask, partitioned by key group.

As in Flink, a subtask owns a contiguous range of key groups; state is addressed by
(state name, key group, key). The caller computes the key group (cluster.state.key_groups), so a
backend never hashes keys. Two backends, chosen by `state.backend.type` (Flink's names; cluster.state.loader):

* "hashmap" (also "heap"): dicts in memory, the fastest; state must fit in memory.
* "rocksdb": an embedded RocksDB (rocksdict) in a working directory, for state larger than memory.

Contract for callers:

* Keys are python natives: int (64-bit), float, str, bytes, bool, None, or tuples of them.
  RocksDB tells keys apart by their encoded bytes, the heap by ==: keys equal in python but of
  different types (1, 1.0, True) are one key on the heap and three in RocksDB. Use one type per
  key column (numpy scalars: convert with .tolist()).
* Values are any picklable object and are IMMUTABLE once put: to change a value, put a new one.
  The heap backend stores and returns the object itself (no copy), and its snapshot shares value
  objects with the live state; mutating a value in place would change a checkpoint being written.
* put(..., None) deletes the key (Flink's ValueState.update(null)); get returns None when absent.
* Checkpoint: `snapshot()` on the task thread at the barrier (cheap, consistent), then
  `write(path)` on another thread while the task goes on changing state. Write or discard every
  snapshot: a RocksDB snapshot pins an iterator (memtables, files) until then; RocksDB's close()
  discards its pending snapshots, a heap snapshot holds its own copies and outlives close().
* Every backend writes and restores the one file format of cluster.state.snapshot_format, so a
  snapshot restores into either backend at any parallelism with the same max parallelism.
"""
from __future__ import annotations

import abc
import pathlib
from typing import Any, Iterator, Sequence

from cluster.state.snapshot_format import (SnapshotFileWriter, StateFormatError, UnsupportedKeyError, check_max_parallelism, read_key_groups)

__all__ = ["KeyedStateBackend", "StateSnapshot", "KeyGroupRangeError", "StateFormatError",
           "UnsupportedKeyError"]

MAX_STATE_NAME_BYTES = 255


class KeyGroupRangeError(ValueError):
    pass


def as_list(values: Sequence) -> list:
    # numpy arrays: python ints are faster dict keys and encode to bytes directly
    tolist = getattr(values, "tolist", None)
    if tolist is not None:
        return tolist()
    return values if isinstance(values, list) else list(values)


def check_state_name(state: str) -> None:
    if not isinstance(state, str) or not state:
        raise ValueError(f"a state name is a non-empty string, not {state!r}")
    if len(state.encode()) > MAX_STATE_NAME_BYTES:
        raise ValueError(f"state name {state[:40]!r}... is longer than {MAX_STATE_NAME_BYTES} bytes")


class StateSnapshot(abc.ABC):
    """A consistent view of a backend's state taken at a checkpoint barrier.

    `write` is the asynchronous part: it may run on any thread, concurrently with the task
    changing the live state, and writes what the state was when `snapshot()` was called.
    """

    def __init__(self, max_parallelism: int):
        self.max_parallelism = max_parallelism
        self._discarded = False
        self._written = False

    def write(self, path: pathlib.Path) -> dict:
        """Writes one snapshot file; returns {"bytes", "entries", "key_groups"}."""
        if self._discarded:
            raise RuntimeError("this state snapshot was discarded; it cannot be written")
        if self._written:
            raise RuntimeError("this state snapshot was already written")
        self._written = True
        try:
            writer = SnapshotFileWriter(pathlib.Path(path), self.max_parallelism)
            try:
                self._write_to(writer)
                return writer.finish()
            except BaseException:
                writer.abort()
                raise
        finally:
            self._release()

    def discard(self) -> None:
        """Releases the snapshot without writing it (checkpoint aborted). A write in progress on
        another thread stops with an error and leaves no file."""
        self._discarded = True
        self._release()

    def _check_not_discarded(self) -> None:
        # called by writers between runs: discard() may come from another thread mid-write
        if self._discarded:
            raise RuntimeError("state snapshot discarded while being written")

    @abc.abstractmethod
    def _write_to(self, writer: SnapshotFileWriter) -> None:
        """Adds every entry to `writer`, in key group order."""

    @abc.abstractmethod
    def _release(self) -> None:
        """Drops what the snapshot holds (copies, iterators)."""


class KeyedStateBackend(abc.ABC):
    """Keyed state of ONE operator subtask, partitioned by key group."""

    def __init__(self, key_group_range: range, max_parallelism: int, work_dir: pathlib.Path):
        check_max_parallelism(max_parallelism)
        if key_group_range.step != 1 or (key_group_range and not (
                0 <= key_group_range[0] and key_group_range[-1] < max_parallelism)):
            raise ValueError(f"key group range {key_group_range} is not a contiguous range within "
                             f"[0, {max_parallelism})")
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.work_dir = pathlib.Path(work_dir)

    @abc.abstractmethod
    def get(self, state: str, key_group: int, key) -> Any:
        """The value of `key`, None when absent."""

    @abc.abstractmethod
    def put(self, state: str, key_group: int, key, value) -> None:
        """Sets the value of `key`; a value of None deletes it."""

    @abc.abstractmethod
    def delete(self, state: str, key_group: int, key) -> None:
        ...

    @abc.abstractmethod
    def get_many(self, state: str, key_groups: Sequence[int], keys: Sequence) -> list:
        """Values of a batch of keys (None when absent), in order: one call per batch."""

    @abc.abstractmethod
    def put_many(self, state: str, key_groups: Sequence[int], keys: Sequence,
                 values: Sequence) -> None:
        """Puts a batch of keys (None values delete); later entries win over earlier ones."""

    @abc.abstractmethod
    def items(self, state: str) -> Iterator[tuple[Any, Any]]:
        """(key, value) of every key of `state` in this subtask, in no particular order. Do not
        change the state while iterating (the heap iterates its live dicts)."""

    @abc.abstractmethod
    def snapshot(self) -> StateSnapshot:
        """The synchronous part of a checkpoint: cheap, consistent; processing continues after."""

    @abc.abstractmethod
    def close(self) -> None:
        """Frees the state; the backend cannot be used afterwards."""

    def restore(self, files: list[pathlib.Path]) -> None:
        """Loads the key groups of self.key_group_range from snapshot files written by any
        subtask at any parallelism, by either backend (same max parallelism)."""
        for path in files:
            for key_groups, states, keys, values in read_key_groups(
                    pathlib.Path(path), self.max_parallelism, self.key_group_range):
                self._restore_rows(key_groups, states, keys, values)

    @abc.abstractmethod
    def _restore_rows(self, key_groups: list[int], states: list[str], keys: list[bytes],
                      values: list[bytes]) -> None:
        """Puts rows read from a snapshot file (encoded keys, pickled values)."""

    def _range_error(self, key_groups: Sequence[int]) -> KeyGroupRangeError:
        outside = next((g for g in as_list(key_groups) if g not in self.key_group_range), None)
        return KeyGroupRangeError(
            f"key group {outside} is not in this subtask's key group range "
            f"[{self.key_group_range.start}, {self.key_group_range.stop}) (max parallelism "
            f"{self.max_parallelism}): the record was routed to the wrong subtask, or its key "
            f"group was computed with another max parallelism")

