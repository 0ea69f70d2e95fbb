"""StateBackendLoader: the keyed state backend a subtask gets for `state.backend.type`.

The factory lives apart from cluster.state.backend (the contract every backend implements) so
that the contract never imports its implementations: heap and rocksdb import backend, this
module imports them. RocksDB is imported only when a job asks for it (rocksdict loads a native
library).
"""
from __future__ import annotations

import pathlib

from cluster.state.backend import KeyedStateBackend

BACKEND_TYPES = ("hashmap", "heap", "rocksdb")


def create_backend(kind: str, key_group_range: range, max_parallelism: int,
                   work_dir: pathlib.Path) -> KeyedStateBackend:
    """kind: the value of `state.backend.type`, "hashmap" (default; "heap" too) or "rocksdb"."""
    name = str(kind).strip().lower()
    if name in ("hashmap", "heap"):
        from cluster.state.heap import HeapKeyedStateBackend
        return HeapKeyedStateBackend(key_group_range, max_parallelism, work_dir)
    if name == "rocksdb":
        from cluster.state.rocksdb import RocksDBKeyedStateBackend
        return RocksDBKeyedStateBackend(key_group_range, max_parallelism, work_dir)
    raise ValueError(f"state.backend.type {kind!r} is not one of: hashmap (or heap), rocksdb")
