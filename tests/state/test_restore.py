"""Restore: at another parallelism (key groups move between subtasks), across backends, and only
the key groups a subtask owns."""
from __future__ import annotations

import pyarrow as pa
import pytest

from cluster.state.key_groups import key_group_range, key_groups_of, operator_index_for_key_group
from cluster.state.snapshot_format import (KeyCodec, SnapshotFileWriter, StateFormatError,
                                          encode_value)

from .conftest import KINDS, MAX_PARALLELISM, contents

STATES = ("count", "last")


def keyed_rows(n=3000):
    """(key, key group) of n two-column keys, grouped as the runtime groups them."""
    users = [f"user-{i % 1000}" for i in range(n)]
    shards = [i // 1000 for i in range(n)]
    groups = key_groups_of(pa.table({"user": users, "shard": shards}), ["user", "shard"],
                           MAX_PARALLELISM)
    return list(zip(zip(users, shards), groups.tolist()))


def run_at_parallelism_2(make_backend, kind, tmp_path):
    """Two subtasks fill their keys and write a snapshot each; returns the files and the state."""
    rows = keyed_rows()
    subtasks = [make_backend(kind, key_group_range(MAX_PARALLELISM, 2, i)) for i in range(2)]
    for key, group in rows:
        owner = subtasks[operator_index_for_key_group(group, MAX_PARALLELISM, 2)]
        owner.put("count", group, key, len(key[0]))
        owner.put("last", group, key, {"user": key[0], "history": [key[1]] * 3})
    files = []
    for index, subtask in enumerate(subtasks):
        files.append(tmp_path / f"subtask-{index}")
        subtask.snapshot().write(files[-1])
    expected = {}
    for subtask in subtasks:
        expected.update(contents(subtask, STATES))
    return files, expected, dict(rows)


@pytest.mark.parametrize("writer_kind", KINDS)
@pytest.mark.parametrize("new_parallelism", [3, 1, 2])
def test_restore_at_a_new_parallelism(writer_kind, kind, new_parallelism, make_backend, tmp_path):
    files, expected, group_of = run_at_parallelism_2(make_backend, writer_kind, tmp_path)
    assert len(expected) == 2 * 3000
    restored = {}
    for index in range(new_parallelism):
        owned = key_group_range(MAX_PARALLELISM, new_parallelism, index)
        subtask = make_backend(kind, owned)
        subtask.restore(files)
        mine = contents(subtask, STATES)
        assert all(group_of[key] in owned for _, key in mine), f"subtask {index} got others' keys"
        assert not restored.keys() & mine.keys(), "a key restored into two subtasks"
        restored.update(mine)
        # the restored state is live state: readable by key group and writable
        some_key = next(key for _, key in mine)
        assert subtask.get("count", group_of[some_key], some_key) == len(some_key[0])
    assert restored == expected


def test_restore_reads_only_the_batches_of_its_key_groups(kind, make_backend, tmp_path):
    # small batches, then one byte of a batch holding key group 100 corrupted: a subtask that
    # does not own group 100 must not even read that batch
    path = tmp_path / "snap"
    writer = SnapshotFileWriter(path, MAX_PARALLELISM, rows_per_batch=10)
    for g in range(MAX_PARALLELISM):
        writer.add_run(g, "s", KeyCodec().encode_many([g * 10 + i for i in range(10)]),
                       [encode_value(f"MARK-{g}-{i}") for i in range(10)])
    writer.finish()
    data = bytearray(path.read_bytes())
    at = data.index(b"MARK-100-3")
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))

    low = make_backend(kind, range(0, 64))
    low.restore([path])
    assert contents(low, ["s"]) == {
        ("s", g * 10 + i): f"MARK-{g}-{i}" for g in range(64) for i in range(10)}
    high = make_backend(kind, range(64, 128))
    with pytest.raises(StateFormatError, match="checksum"):
        high.restore([path])


def test_restore_of_a_range_that_straddles_batches(kind, make_backend, tmp_path):
    path = tmp_path / "snap"
    writer = SnapshotFileWriter(path, MAX_PARALLELISM, rows_per_batch=7)
    for g in range(0, MAX_PARALLELISM, 3):
        writer.add_run(g, "s", KeyCodec().encode_many([g * 100 + i for i in range(5)]),
                       [encode_value(g)] * 5)
    writer.finish()
    subtask = make_backend(kind, range(31, 62))
    subtask.restore([path])
    assert contents(subtask, ["s"]) == {
        ("s", g * 100 + i): g for g in range(33, 62, 3) for i in range(5)}


@pytest.mark.parametrize("writer_kind", KINDS)
def test_every_key_and_value_type_crosses_backends(writer_kind, kind, make_backend, tmp_path):
    keys = [0, -5, 2**63 - 1, 1.5, "", "é", b"\x00raw", True, None, (), ("a", (1, 2.5), None)]
    values = [{"nested": [1, (2, 3)]}, 0, "", b"", 1e300, [None], frozenset({1}), (), -1, "x", 7]
    writer = make_backend(writer_kind)
    writer.put_many("s", [k % 128 for k in range(len(keys))], keys, values)
    writer.put("t", 127, "other state", "t")
    writer.snapshot().write(tmp_path / "snap")
    reader = make_backend(kind)
    reader.restore([tmp_path / "snap"])
    assert contents(reader, ["s", "t"]) == contents(writer, ["s", "t"])
    assert len(contents(reader, ["s", "t"])) == len(keys) + 1
