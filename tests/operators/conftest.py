"""The ``redis_url`` fixture: a real redis-server for the whole session (a missing binary fails, never skips)."""
from __future__ import annotations

import pytest
import redis

from .harness import RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    try:
        server = RedisServer(tmp_path_factory.mktemp("redis"))
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()  # each test starts from an empty database
    client.close()
    return redis_server.url
