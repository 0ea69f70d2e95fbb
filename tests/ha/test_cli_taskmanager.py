"""``streamlab taskmanager start`` on an HA cluster: a TaskManager added from the CLI follows the
leader that the HA keys of its directory name, with ``--jobmanager zk`` or with no --jobmanager at
all (as ``python -m cluster.taskmanager`` did, and docs/deployment.md says); without HA keys the missing
address is a usage error naming the directory's config.yaml."""
from __future__ import annotations

import subprocess
import sys
from contextlib import closing

from cluster.conf import Configuration
from cluster.protocol.auth import create_secret
from kernel_runtime import JobClient, StreamEnvironment
from tests.conftest import rest, wait_for

from .conftest import ha_cluster, shown_and_stopped


def streamlab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_runtime.cli.main", *args], capture_output=True, text=True,
                          timeout=120)


def test_taskmanagers_started_by_the_cli_follow_the_leader(zookeeper, tmp_path):
    directory = tmp_path / "ha-cli"
    with shown_and_stopped(ha_cluster(directory, zookeeper.quorum)) as ha:
        ha.start_jobmanager()
        ha.info = ha.leader()
        try:
            for how in ([], ["--jobmanager", "zk"]):
                done = streamlab("taskmanager", "start", "--cluster-dir", str(directory), *how)
                assert done.returncode == 0, done.stderr
                assert "registered at the leader in ZooKeeper" in done.stdout, done.stdout
            wait_for(lambda: rest(ha, "/overview")[1]["taskmanagers"] == 2, 60, "both TaskManagers registered")
            env = StreamEnvironment(parallelism=4, cluster=directory)  # every slot of the two
            env.from_generator(count=4_000, batch_size=100).collect("rows")
            with closing(JobClient(ha.info)) as client:
                result = env.execute_async("on the CLI's TaskManagers", client=client).wait(timeout=120)
            assert result.state == "FINISHED"
            assert sorted(result.results["rows"]["seq"]) == list(range(4_000))
        finally:
            stopped = streamlab("taskmanager", "stop", "--cluster-dir", str(directory))
        assert stopped.returncode == 0, stopped.stderr


def test_without_ha_keys_a_taskmanager_needs_the_jobmanager_address(tmp_path):
    Configuration({}, "test").write(tmp_path / "config.yaml")
    create_secret(tmp_path / "secret")
    for how in ([], ["--jobmanager", "zk"]):
        done = streamlab("taskmanager", "start", "--cluster-dir", str(tmp_path), *how)
        assert done.returncode == 2, done.stdout
        assert f"{tmp_path / 'config.yaml'} has high-availability.type: none" in done.stderr, done.stderr
        assert "--jobmanager HOST:PORT" in done.stderr
    assert not list((tmp_path / "log").glob("taskmanager-*"))  # nothing was started
