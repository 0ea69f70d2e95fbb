"""Backends under test: every test taking ``kind`` runs against both, on real files in tmp dirs.

``make_backend`` builds backends and closes whatever the test left open, so a RocksDB directory
never outlives its test.
"""
from __future__ import annotations

import pytest

from cluster.state.loader import create_backend

KINDS = ("hashmap", "rocksdb")
MAX_PARALLELISM = 128


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture
def make_backend(tmp_path):
    made = []

    def make(kind: str, key_groups: range = range(MAX_PARALLELISM),
             max_parallelism: int = MAX_PARALLELISM):
        backend = create_backend(kind, key_groups, max_parallelism, tmp_path / f"work-{len(made)}")
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def contents(backend, states=("count",)) -> dict:
    """{(state, key): value} of every state named."""
    return {(state, key): value for state in states for key, value in backend.items(state)}
