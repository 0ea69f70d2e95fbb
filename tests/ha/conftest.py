"""A real ZooKeeper (Debian's ``zookeeper`` package, ``make system-deps``) for the HA tests, started
by the session and stopped after it; HA clusters around it (kernel_runtime/ha_cluster.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from kernel_runtime.ha_cluster import ZK_SERVER, HaLocalCluster, LocalZooKeeper
from tests.conftest import FAST


def ha_cluster(cluster_dir: Path, quorum: str, **config) -> HaLocalCluster:
    return HaLocalCluster(cluster_dir, quorum, FAST | config)


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    if not ZK_SERVER.exists():
        pytest.fail(f"{ZK_SERVER} is missing: install Debian's zookeeper package (make system-deps)")
    server = LocalZooKeeper(tmp_path_factory.mktemp("zookeeper")).start()
    yield server
    server.stop()


