"""The heap keyed state backend (Flink's HashMapStateBackend): one dict per state and key group.

Dicts per key group make a snapshot a shallow copy per group (values are immutable by contract,
so sharing them is safe) and make restoring at another parallelism a matter of whole groups.
"""
from __future__ import annotations

import pathlib
from typing import Any, Iterator, Sequence

from cluster.state.backend import KeyedStateBackend, StateSnapshot, as_list, check_state_name
from cluster.state.snapshot_format import KeyCodec, SnapshotFileWriter, decode_key, decode_value, encode_value


class _Closed(dict):
    """Stands in for the tables of a closed backend: any use is a clear error."""

    def __missing__(self, state):
        raise RuntimeError("the keyed state backend is closed")

    def __iter__(self):
        raise RuntimeError("the keyed state backend is closed")


class HeapKeyedStateBackend(KeyedStateBackend):

    def __init__(self, key_group_range: range, max_parallelism: int, work_dir: pathlib.Path):
        super().__init__(key_group_range, max_parallelism, work_dir)
        # state name -> key group -> {key: value}; every group of the range exists, so a missing
        # group is a key group outside the range
        self._tables: dict[str, dict[int, dict]] = {}

    def _groups(self, state: str) -> dict[int, dict]:
        try:
            return self._tables[state]
        except KeyError:
            check_state_name(state)
            groups = self._tables[state] = {g: {} for g in self.key_group_range}
            return groups

    def _group(self, state: str, key_group: int) -> dict:
        try:
            return self._groups(state)[key_group]
        except KeyError:
            raise self._range_error([key_group]) from None

    def get(self, state: str, key_group: int, key) -> Any:
        return self._group(state, key_group).get(key)

    def put(self, state: str, key_group: int, key, value) -> None:
        if value is None:
            self._group(state, key_group).pop(key, None)
        else:
            self._group(state, key_group)[key] = value

    def delete(self, state: str, key_group: int, key) -> None:
        self._group(state, key_group).pop(key, None)

    def get_many(self, state: str, key_groups: Sequence[int], keys: Sequence) -> list:
        groups = self._groups(state)
        try:
            pairs = zip(as_list(key_groups), as_list(keys), strict=True)
            return [groups[g].get(k) for g, k in pairs]
        except KeyError:
            raise self._range_error(key_groups) from None

    def put_many(self, state: str, key_groups: Sequence[int], keys: Sequence,
                 values: Sequence) -> None:
        groups = self._groups(state)
        try:
            for g, k, v in zip(as_list(key_groups), as_list(keys), values, strict=True):
                if v is None:
                    groups[g].pop(k, None)
                else:
                    groups[g][k] = v
        except KeyError:
            raise self._range_error(key_groups) from None

    def items(self, state: str) -> Iterator[tuple[Any, Any]]:
        for group in self._groups(state).values():
            yield from group.items()

    def snapshot(self) -> "HeapStateSnapshot":
        copies: dict[int, list[tuple[str, dict]]] = {}
        for state in sorted(self._tables):
            for g, group in self._tables[state].items():
                if group:
                    copies.setdefault(g, []).append((state, group.copy()))
        return HeapStateSnapshot(self.max_parallelism, copies)

    def _restore_rows(self, key_groups: list[int], states: list[str], keys: list[bytes],
                      values: list[bytes]) -> None:
        tables: dict[str, dict[int, dict]] = {}
        for g, state, key, value in zip(key_groups, states, keys, values):
            groups = tables.get(state)
            if groups is None:
                groups = tables[state] = self._groups(state)
            groups[g][decode_key(key)] = decode_value(value)

    def close(self) -> None:
        self._tables = _Closed()


class HeapStateSnapshot(StateSnapshot):
    """Shallow copies of every non-empty key group dict; write() encodes them."""

    def __init__(self, max_parallelism: int, copies: dict[int, list[tuple[str, dict]]]):
        super().__init__(max_parallelism)
        self._copies = copies

    def _write_to(self, writer: SnapshotFileWriter) -> None:
        copies = self._copies
        codec = KeyCodec()
        for g in sorted(copies):
            for state, entries in copies[g]:
                self._check_not_discarded()
                writer.add_run(g, state, codec.encode_many(list(entries.keys())),
                               [encode_value(v) for v in entries.values()])

    def _release(self) -> None:
        self._copies = {}
