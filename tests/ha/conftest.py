"""HA clusters (kernel_runtime/deploy/ha.py) around the session's real ZooKeeper (the
``zookeeper`` fixture of tests/conftest.py, which tests/e2e uses too)."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from kernel_runtime.deploy.ha import HaLocalCluster
from tests.conftest import FAST


def ha_cluster(cluster_dir: Path, quorum: str, **config) -> HaLocalCluster:
    return HaLocalCluster(cluster_dir, quorum, FAST | config)


@contextmanager
def shown_and_stopped(ha: HaLocalCluster) -> Iterator[HaLocalCluster]:
    """``ha`` for a test's body: its processes' log tails printed if the body fails, stopped after."""
    try:
        yield ha
    except BaseException:
        print(ha.log_tails())
        raise
    finally:
        ha.stop()
