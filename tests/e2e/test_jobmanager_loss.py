"""A JobManager killed with SIGKILL: its TaskManagers notice the silence (heartbeat.timeout),
cancel their tasks, free their slots and keep trying to register, so a JobManager back at the
same address finds them idle; ``cluster start`` ends what a killed cluster left behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cluster.conf import Configuration
from kernel_runtime import JobClient, LocalCluster, StreamEnvironment
from kernel_runtime.local_cluster import ClusterInfo
from tests.conftest import rest, start_cluster, wait_for

pytestmark = pytest.mark.slow

HEARTBEAT_TIMEOUT_S = 2.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def own_cluster(tmp_path):
    local = start_cluster(tmp_path / "c", **{"taskmanager.spark.startup": "lazy"})
    yield local
    local.stop()


def _sizes(folder: Path) -> dict[str, int]:
    return {f.name: f.stat().st_size for f in folder.iterdir()}


def test_taskmanagers_stop_their_tasks_and_wait_for_a_new_jobmanager(own_cluster, tmp_path):
    out = tmp_path / "out"
    out.mkdir()

    def write_through(df):  # the TaskManager side's own record of every batch it processes
        import os
        import threading
        with open(out / f"{os.getpid()}-{threading.get_native_id()}", "a") as f:
            f.write(f"{len(df)}\n")
        return df

    client = JobClient(own_cluster.info)
    env = StreamEnvironment(parallelism=4, cluster=own_cluster.cluster_dir)
    env.from_generator(rate=2_000, batch_size=20).map_batches(write_through).print()  # needs no JobManager
    env.execute_async("orphaned", client=client)
    wait_for(lambda: len(list(out.iterdir())) == 4 and min(_sizes(out).values()) > 50, 30,
             "all 4 subtasks writing")
    client.close()
    rpc_address = own_cluster.info.rpc_address
    os.kill(own_cluster.jobmanager.pid, signal.SIGKILL)
    own_cluster.jobmanager.wait(5)

    # after heartbeat.timeout (+ a check interval and a loaded machine's slack) nothing writes
    time.sleep(HEARTBEAT_TIMEOUT_S + 1.5)
    settled = _sizes(out)
    time.sleep(2.0)
    assert _sizes(out) == settled, "tasks still running after the JobManager was lost"
    for name in settled:  # and the task threads themselves are gone from their processes
        pid, thread = map(int, name.split("-"))
        assert thread not in {t.id for t in psutil.Process(pid).threads()}, f"task thread {thread} of {pid} lives"
    for i, proc in enumerate(own_cluster.taskmanagers):
        assert psutil.Process(proc.pid).is_running()
        log = (own_cluster.cluster_dir / "log" / f"taskmanager-{i}.log").read_text()
        assert "JobManager lost: no heartbeat answer for" in log and "cancelling 2 task(s)" in log

    # the TaskManagers kept trying: a JobManager back at the same address gets both, all slots free
    port = int(rpc_address.rsplit(":", 1)[1])
    Configuration(own_cluster.conf.to_dict() | {"jobmanager.rpc.port": port}, "test").write(
        own_cluster.cluster_dir / "config.yaml")
    (own_cluster.cluster_dir / "jobmanager.json").unlink()
    own_cluster.jobmanager = own_cluster._spawn("cluster.jobmanager", "jobmanager")
    own_cluster._write_pids()
    wait_for(lambda: (own_cluster.cluster_dir / "jobmanager.json").exists(), 30, "the new JobManager")
    own_cluster._info = ClusterInfo.load(own_cluster.cluster_dir)
    wait_for(lambda: (o := rest(own_cluster, "/overview")[1])["taskmanagers"] == 2 and
             o["slots-available"] == o["slots-total"] == 4, 20, "both TaskManagers back, every slot free")
    assert _sizes(out) == settled
    client = JobClient(own_cluster.info)
    env = StreamEnvironment(parallelism=4, cluster=own_cluster.cluster_dir)
    env.from_generator(count=1_000, batch_size=50).map_batches(lambda df: df).collect()
    assert sorted(env.execute_async("after", client=client).wait(60).to_pandas()["seq"]) == list(range(1_000))
    client.close()


def _streamlab(args, env):
    proc = subprocess.run([sys.executable, "-m", "kernel_runtime.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"streamlab {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_cluster_start_ends_the_stale_processes_of_its_directory(tmp_path):
    directory = tmp_path / "cluster"
    env = dict(os.environ, STREAMLAB_CLUSTER_DIR=str(directory),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    start = ["cluster", "start", "-n", "2", "-D", "jobmanager.rpc.port=0", "-D", "rest.port=0",
             "-D", "taskmanager.spark.startup=lazy"]
    foreign = subprocess.Popen(["sleep", "120"])  # a pid the system could have reused
    try:
        _streamlab(start, env)
        pids = json.loads((directory / "cluster.json").read_text())
        os.kill(pids["jobmanager"], signal.SIGKILL)
        wait_for(lambda: not _alive(pids["jobmanager"]), 10, "the JobManager gone")
        stale = list(pids["taskmanagers"])
        assert all(_alive(p) for p in stale)
        pids["taskmanagers"].append(foreign.pid)
        (directory / "cluster.json").write_text(json.dumps(pids))

        output = _streamlab(start, env)
        assert f"Ended 2 stale process(es) of a previous cluster in {directory}" in output
        assert not any(_alive(p) for p in stale)
        assert foreign.poll() is None, "a process that is not the cluster's was ended"
        new = json.loads((directory / "cluster.json").read_text())
        assert not set(new["taskmanagers"]) & set(stale) and all(_alive(p) for p in new["taskmanagers"])
    finally:
        subprocess.run([sys.executable, "-m", "kernel_runtime.cli", "cluster", "stop"], cwd=ROOT, env=env,
                       capture_output=True, timeout=60)
        foreign.kill()
        foreign.wait()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
