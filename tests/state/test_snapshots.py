"""Snapshots: what write() writes is the state as of snapshot(), whatever happens afterwards."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from cluster.state.backend import UnsupportedKeyError

from .conftest import contents

N = 20_000


def fill(backend, n=N, state="count"):
    keys = list(range(n))
    backend.put_many(state, [k % 128 for k in keys], keys, [f"value-{k}" for k in keys])


def read_back(make_backend, path, states=("count",)) -> dict:
    reader = make_backend("hashmap")
    reader.restore([path])
    return contents(reader, states)


def test_write_reports_what_it_wrote(kind, make_backend, tmp_path):
    backend = make_backend(kind)
    backend.put_many("a", [3, 3, 90], ["x", "y", "z"], [1, 2, 3])
    backend.put("b", 17, "x", 4)
    path = tmp_path / "chk-1" / "subtask-0"  # folders are made as needed
    stats = backend.snapshot().write(path)
    assert stats == {"bytes": path.stat().st_size, "entries": 4, "key_groups": [3, 17, 90]}
    assert read_back(make_backend, path, ["a", "b"]) == {
        ("a", "x"): 1, ("a", "y"): 2, ("a", "z"): 3, ("b", "x"): 4}


def test_changes_after_snapshot_are_not_written(kind, make_backend, tmp_path):
    backend = make_backend(kind)
    fill(backend, 1000)
    expected = contents(backend)
    snapshot = backend.snapshot()
    backend.put("count", 5, 5, "changed")
    backend.delete("count", 6, 6)
    backend.put("count", 7, "new", "new")
    backend.put("other", 7, "new", "new")
    snapshot.write(tmp_path / "snap")
    assert read_back(make_backend, tmp_path / "snap", ["count", "other"]) == expected
    assert backend.get("count", 5, 5) == "changed"  # the live state moved on


def test_write_on_another_thread_while_the_task_keeps_changing_state(kind, make_backend, tmp_path):
    backend = make_backend(kind)
    fill(backend)
    expected = contents(backend)
    snapshot = backend.snapshot()
    outcome = {}
    writer = threading.Thread(target=lambda: outcome.update(snapshot.write(tmp_path / "snap")))
    writer.start()
    changes_while_writing = 0
    step = 0
    while writer.is_alive():
        # overwrite, delete and add keys the snapshot holds, as a task would
        keys = [(step * 97 + i) % N for i in range(200)]
        groups = [k % 128 for k in keys]
        backend.put_many("count", groups, keys, ["changed"] * 200)
        backend.put_many("count", groups[:50], keys[:50], [None] * 50)
        backend.put("count", step % 128, f"new-{step}", "new")
        step += 1
        changes_while_writing += writer.is_alive()
    writer.join()
    assert changes_while_writing > 0, "the write ended before any change: the test proves nothing"
    assert outcome["entries"] == N
    assert read_back(make_backend, tmp_path / "snap") == expected


def test_two_snapshots_hold_their_own_views(kind, make_backend, tmp_path):
    backend = make_backend(kind)
    backend.put("s", 1, "k", "one")
    first = backend.snapshot()
    backend.put("s", 1, "k", "two")
    second = backend.snapshot()
    backend.put("s", 1, "k", "three")
    second.write(tmp_path / "2")
    first.write(tmp_path / "1")
    assert read_back(make_backend, tmp_path / "1", ["s"]) == {("s", "k"): "one"}
    assert read_back(make_backend, tmp_path / "2", ["s"]) == {("s", "k"): "two"}


@pytest.mark.parametrize("kind, how", [("hashmap", "discard"), ("rocksdb", "discard"),
                                       ("rocksdb", "close")])  # a heap snapshot outlives close()
def test_a_discarded_snapshot_cannot_be_written(kind, how, make_backend, tmp_path):
    backend = make_backend(kind)
    fill(backend, 100)
    snapshot = backend.snapshot()
    snapshot.discard() if how == "discard" else backend.close()
    with pytest.raises(RuntimeError, match="discarded"):
        snapshot.write(tmp_path / "snap")
    assert list(tmp_path.glob("snap*")) == []


def test_a_snapshot_is_written_once(kind, make_backend, tmp_path):
    backend = make_backend(kind)
    snapshot = backend.snapshot()
    snapshot.write(tmp_path / "snap")
    with pytest.raises(RuntimeError, match="already written"):
        snapshot.write(tmp_path / "again")


def test_a_failed_write_leaves_no_file(make_backend, tmp_path):
    # the heap accepts any hashable key; one the file format cannot encode fails the write
    backend = make_backend("hashmap")
    fill(backend, 100)
    backend.put("count", 3, np.int64(3_000), "v")
    with pytest.raises(UnsupportedKeyError, match="numpy.int64"):
        backend.snapshot().write(tmp_path / "snap")
    assert list(tmp_path.glob("snap*")) == []


def test_an_empty_backend_writes_an_empty_snapshot(kind, make_backend, tmp_path):
    stats = make_backend(kind).snapshot().write(tmp_path / "snap")
    assert stats["entries"] == 0 and stats["key_groups"] == []
    assert read_back(make_backend, tmp_path / "snap") == {}
