"""HA clusters (kernel_runtime/ha_cluster.py) around the session's real ZooKeeper (the
``zookeeper`` fixture of tests/conftest.py, which tests/e2e uses too)."""
from __future__ import annotations

from pathlib import Path

from kernel_runtime.ha_cluster import HaLocalCluster
from tests.conftest import FAST


def ha_cluster(cluster_dir: Path, quorum: str, **config) -> HaLocalCluster:
    return HaLocalCluster(cluster_dir, quorum, FAST | config)
