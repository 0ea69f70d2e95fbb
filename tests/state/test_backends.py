"""Reads and writes of both backends: single and batched, range checks, key types, close."""
from __future__ import annotations

import numpy as np
import pytest

from cluster.state.backend import KeyGroupRangeError, UnsupportedKeyError
from cluster.state.loader import create_backend
from cluster.state.heap import HeapKeyedStateBackend
from cluster.state.rocksdb import RocksDBKeyedStateBackend

from .conftest import contents


def test_get_put_delete(kind, make_backend):
    backend = make_backend(kind)
    assert backend.get("count", 5, "a") is None
    backend.put("count", 5, "a", 1)
    backend.put("count", 6, ("b", 2), {"n": [1, 2]})
    backend.put("count", 5, "a", 2)
    assert backend.get("count", 5, "a") == 2
    assert backend.get("count", 6, ("b", 2)) == {"n": [1, 2]}
    backend.delete("count", 5, "a")
    backend.delete("count", 5, "never-there")
    assert backend.get("count", 5, "a") is None
    assert contents(backend) == {("count", ("b", 2)): {"n": [1, 2]}}


def test_put_of_none_deletes(kind, make_backend):
    backend = make_backend(kind)
    backend.put("s", 1, "k", "v")
    backend.put("s", 1, "k", None)
    backend.put_many("s", [2, 3], ["x", "y"], ["vx", "vy"])
    backend.put_many("s", [2], ["x"], [None])
    assert contents(backend, ["s"]) == {("s", "y"): "vy"}


def test_get_many_put_many(kind, make_backend):
    backend = make_backend(kind)
    groups = np.arange(1000, dtype=np.int64) % 128  # key groups come as numpy arrays
    keys = [f"k{i}" for i in range(1000)]
    backend.put_many("count", groups, keys, list(range(1000)))
    assert backend.get_many("count", groups, keys) == list(range(1000))
    assert backend.get_many("count", [3, 4], ["k3", "absent"]) == [3, None]
    assert backend.get_many("count", [], []) == []
    # later entries of one batch win, as if put one by one
    backend.put_many("count", [7, 7], ["k7", "k7"], ["first", "second"])
    assert backend.get("count", 7, "k7") == "second"
    assert len(contents(backend)) == 1000


def test_states_and_key_groups_are_separate_namespaces(kind, make_backend):
    backend = make_backend(kind)
    backend.put("a", 1, "k", "a1")
    backend.put("ab", 1, "k", "ab1")  # a state name that extends another one
    backend.put("a", 2, "k", "a2")
    assert backend.get("a", 1, "k") == "a1"
    assert backend.get("ab", 1, "k") == "ab1"
    assert backend.get("a", 2, "k") == "a2"
    assert backend.get("other", 1, "k") is None
    assert sorted(backend.items("a")) == [("k", "a1"), ("k", "a2")]
    assert list(backend.items("other")) == []


def test_every_supported_key_type_round_trips(kind, make_backend):
    backend = make_backend(kind)
    keys = [0, -5, 2**63 - 1, 1.5, "", "é", b"\x00raw", True, None, (), ("a", (1, 2.5), None)]
    backend.put_many("s", [1] * len(keys), keys, [repr(k) for k in keys])
    assert backend.get_many("s", [1] * len(keys), keys) == [repr(k) for k in keys]
    assert sorted(map(repr, dict(backend.items("s")))) == sorted(map(repr, keys))


def test_key_groups_outside_the_range_are_refused(kind, make_backend):
    backend = make_backend(kind, range(10, 20))
    backend.put("s", 10, "k", 1)
    with pytest.raises(KeyGroupRangeError, match=r"key group 20 is not in .*\[10, 20\)"):
        backend.put("s", 20, "k", 1)
    with pytest.raises(KeyGroupRangeError, match="key group 9 "):
        backend.get_many("s", [10, 9], ["k", "k"])
    with pytest.raises(KeyGroupRangeError, match="key group 3 "):
        backend.put_many("s", [11, 3], ["a", "b"], [1, 2])
    with pytest.raises(KeyGroupRangeError):
        backend.get("s", 0, "k")


def test_batches_of_unequal_lengths_are_refused(kind, make_backend):
    backend = make_backend(kind)
    with pytest.raises(ValueError):
        backend.put_many("s", [1, 2], ["a"], [1, 2])
    with pytest.raises(ValueError):
        backend.get_many("s", [1], ["a", "b"])


def test_rocksdb_refuses_keys_it_cannot_encode_deterministically(make_backend):
    backend = make_backend("rocksdb")
    with pytest.raises(UnsupportedKeyError, match=r"numpy.int64.*\.tolist\(\)"):
        backend.put("s", 1, np.int64(3), 1)
    with pytest.raises(UnsupportedKeyError, match="2361183241434822606848"):
        backend.get("s", 1, 2**71)


def test_state_names_must_be_non_empty_short_strings(kind, make_backend):
    backend = make_backend(kind)
    with pytest.raises(ValueError, match="non-empty"):
        backend.put("", 1, "k", 1)
    with pytest.raises(ValueError, match="longer than 255 bytes"):
        backend.put("x" * 256, 1, "k", 1)


def test_factory_accepts_flink_names(tmp_path):
    assert isinstance(create_backend("hashmap", range(4), 4, tmp_path), HeapKeyedStateBackend)
    assert isinstance(create_backend(" Heap ", range(4), 4, tmp_path), HeapKeyedStateBackend)
    rocks = create_backend("RocksDB", range(4), 4, tmp_path / "r")
    assert isinstance(rocks, RocksDBKeyedStateBackend)
    rocks.close()
    with pytest.raises(ValueError, match="'filesystem' is not one of: hashmap .*rocksdb"):
        create_backend("filesystem", range(4), 4, tmp_path)


def test_invalid_ranges_and_max_parallelism_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not in \\[1, 32768\\]"):
        create_backend("hashmap", range(4), 40000, tmp_path)
    with pytest.raises(ValueError, match="not a contiguous range within \\[0, 128\\)"):
        create_backend("hashmap", range(100, 130), 128, tmp_path)
    with pytest.raises(ValueError, match="contiguous"):
        create_backend("hashmap", range(0, 10, 2), 128, tmp_path)


def test_close_removes_the_rocksdb_directory_and_only_it(tmp_path):
    work_dir = tmp_path / "subtask-0"
    backend = create_backend("rocksdb", range(128), 128, work_dir)
    backend.put_many("s", list(range(128)), list(range(128)), ["x" * 100] * 128)
    assert backend.db_path.is_dir() and backend.db_path.parent == work_dir
    assert any(backend.db_path.iterdir())
    backend.close()
    assert not backend.db_path.exists()
    assert work_dir.is_dir()  # the caller's directory stays
    backend.close()  # twice is harmless


def test_closed_backends_refuse_use(kind, make_backend):
    backend = make_backend(kind)
    backend.put("s", 1, "k", 1)
    backend.close()
    with pytest.raises(Exception, match="closed"):
        backend.get("s", 1, "k")
    with pytest.raises(Exception, match="closed"):
        backend.snapshot()
