"""A JobManager killed with SIGKILL: its TaskManagers notice the silence (heartbeat.timeout),
cancel their tasks, free their slots and keep trying to register, so a JobManager back at the
same address finds them idle; ``cluster start`` ends what a killed cluster left behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from cluster.conf import Configuration
from kernel_runtime import JobClient, LocalCluster, StreamEnvironment
from kernel_runtime.client.cluster_info import ClusterInfo
from tests.conftest import rest, start_cluster, wait_for

pytestmark = pytest.mark.slow

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

    # after heartbeat.timeout each TaskManager says it lost the JobManager and cancels its tasks
    logs = [own_cluster.cluster_dir / "log" / f"taskmanager-{i}.log" for i in range(len(own_cluster.taskmanagers))]
    wait_for(lambda: all("JobManager lost: no heartbeat answer for" in p.read_text()
                         and "cancelling 2 task(s)" in p.read_text() for p in logs), 60,
             "both TaskManagers cancelling their tasks after the JobManager's loss")

    def task_threads() -> list[str]:  # the writing threads still alive in their processes
        return [name for name in _sizes(out) if int(name.split("-")[1]) in
                {t.id for t in psutil.Process(int(name.split("-")[0])).threads()}]
    wait_for(lambda: not task_threads(), 60, "every task thread ended")
    settled = _sizes(out)  # no thread is left to write: nothing may grow from here on
    for proc in own_cluster.taskmanagers:
        assert psutil.Process(proc.pid).is_running()

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
    proc = subprocess.run([sys.executable, "-m", "kernel_runtime.cli.main", *args], cwd=ROOT, env=env,
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
        subprocess.run([sys.executable, "-m", "kernel_runtime.cli.main", "cluster", "stop"], cwd=ROOT, env=env,
                       capture_output=True, timeout=60)
        foreign.kill()
        foreign.wait()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
