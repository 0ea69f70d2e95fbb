"""A cluster assembled process by process with the standalone commands (Flink's jobmanager.sh and
taskmanager.sh): `streamlab jobmanager start`, `streamlab taskmanager start --jobmanager HOST:PORT`
from directories of their own, as on separate hosts; a job; `stop`; no process left."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from cluster.protocol.auth import create_secret
from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.client.cluster_info import ClusterInfo

ROOT = Path(__file__).resolve().parents[2]
STREAMLAB = [sys.executable, "-m", "kernel_runtime.cli.main"]
N = 20_000


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*STREAMLAB, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if check and proc.returncode != 0:
        raise AssertionError(f"streamlab {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def listed_pids(directory: Path) -> list[int]:
    path = directory / "cluster.json"
    if not path.exists():
        return []
    pids = json.loads(path.read_text())
    return [p for p in [pids["jobmanager"], *pids["taskmanagers"]] if p]


def events(seq):
    return pd.DataFrame({"user": (seq * 7919) % 13, "amount": (seq % 11).astype("int64")})


@pytest.mark.slow  # processes started one by one, a job through each (~20 s)
@pytest.mark.timeout(300)
def test_a_cluster_assembled_process_by_process(tmp_path):
    jm_dir, tm_dir, intruder_dir = tmp_path / "jm", tmp_path / "tm", tmp_path / "intruder"
    fast = ["-D", "heartbeat.interval=200 ms", "-D", "heartbeat.timeout=2 s"]
    pids: list[int] = []
    try:
        # free ports; binding on every interface while advertising loopback, as in a container
        out = sh("jobmanager", "start", "--cluster-dir", str(jm_dir), "-D", "jobmanager.rpc.port=0",
                 "-D", "rest.port=0", "-D", "jobmanager.bind-host=0.0.0.0", "-D", "rest.bind-address=0.0.0.0",
                 *fast).stdout
        info = ClusterInfo.load(jm_dir)
        assert f"rpc {info.rpc_address}" in out
        host_port = info.rpc_address.removeprefix("tcp://")
        assert host_port.startswith("127.0.0.1:")  # advertised, not the 0.0.0.0 it binds
        pids += listed_pids(jm_dir)
        again = sh("jobmanager", "start", "--cluster-dir", str(jm_dir), check=False)
        assert again.returncode == 1 and "already running" in again.stderr, again.stderr

        # two TaskManagers from one directory of their own, holding a copy of the JobManager's secret
        for _ in range(2):
            out = sh("taskmanager", "start", "--jobmanager", host_port, "--cluster-dir", str(tm_dir),
                     "--secret-file", str(jm_dir / "secret"), "-D", "taskmanager.numberOfTaskSlots=2",
                     "-D", "taskmanager.spark.startup=lazy", "-D", "taskmanager.bind-host=0.0.0.0", *fast).stdout
            assert f"registered at {info.rpc_address}" in out
        tm_pids = listed_pids(tm_dir)
        assert len(tm_pids) == 2 and (tm_dir / "log" / "taskmanager-1.log").exists()
        pids += tm_pids
        assert oct((tm_dir / "secret").stat().st_mode & 0o777) == "0o600"

        # a TaskManager with another secret is refused: its frames fail the signature check
        create_secret(tmp_path / "other-secret")
        refused = sh("taskmanager", "start", "--jobmanager", host_port, "--cluster-dir", str(intruder_dir),
                     "--secret-file", str(tmp_path / "other-secret"), "-D", "taskmanager.spark.startup=lazy",
                     "--timeout", "6", check=False)
        pids += listed_pids(intruder_dir)
        assert refused.returncode != 0 and "did not register" in refused.stderr, refused.stderr
        jm_log = (jm_dir / "log" / "jobmanager.log").read_text()
        assert "wrong cluster secret" in jm_log, jm_log[-2000:]
        sh("taskmanager", "stop", "--cluster-dir", str(intruder_dir))

        client = JobClient(info)
        try:
            overview = client.cluster_overview()
            assert len(overview.taskmanagers) == 2 and overview.overview["slots-total"] == 4
        finally:
            client.close()

        env = StreamEnvironment(parallelism=2, cluster=jm_dir)
        (env.from_generator(events, count=N, batch_size=1_000)
         .key_by("user").aggregate(total=("amount", "sum"), parallelism=2).collect("sums"))
        got = env.execute("standalone keyed sum").to_pandas().sort_values("user").reset_index(drop=True)
        df = events(np.arange(N, dtype=np.int64))
        expected = df.groupby("user", as_index=False).agg(total=("amount", "sum"))
        pd.testing.assert_frame_equal(got[["user", "total"]], expected, check_dtype=False)

        assert "Stopped 2 TaskManager" in sh("taskmanager", "stop", "--cluster-dir", str(tm_dir)).stdout
        assert "Stopped 1 JobManager" in sh("jobmanager", "stop", "--cluster-dir", str(jm_dir)).stdout
        alive = gone(pids, timeout=5)
        assert not alive, f"left running after stop: {alive}"
        assert not (jm_dir / "jobmanager.json").exists() and not (jm_dir / "cluster.json").exists()
        assert not (tm_dir / "cluster.json").exists()
        assert "No TaskManager running" in sh("taskmanager", "stop", "--cluster-dir", str(tm_dir)).stdout
    finally:
        for directory in (tm_dir, intruder_dir, jm_dir):
            role = "jobmanager" if directory is jm_dir else "taskmanager"
            if directory.exists():
                sh(role, "stop", "--cluster-dir", str(directory), check=False)
        for pid in pids:
            if psutil.pid_exists(pid):
                psutil.Process(pid).kill()


def test_bad_input_is_refused_with_what_and_where(tmp_path):
    bad_address = sh("taskmanager", "start", "--jobmanager", "jobmanager-host", "--cluster-dir",
                     str(tmp_path / "a"), check=False)
    assert bad_address.returncode == 2 and "'jobmanager-host' is not HOST:PORT" in bad_address.stderr
    no_secret = sh("taskmanager", "start", "--jobmanager", "jobmanager-host:6123", "--cluster-dir",
                   str(tmp_path / "b"), check=False)
    assert no_secret.returncode == 1 and "no cluster secret" in no_secret.stderr
    bad_key = sh("jobmanager", "start", "--cluster-dir", str(tmp_path / "c"), "-D", "jobmanager.bind-hots=0.0.0.0",
                 check=False)
    assert bad_key.returncode == 1 and "unknown configuration key 'jobmanager.bind-hots' in -D" in bad_key.stderr
    (tmp_path / "not-a-secret").write_text("hello")
    bad_secret = sh("jobmanager", "start", "--cluster-dir", str(tmp_path / "d"), "--secret-file",
                    str(tmp_path / "not-a-secret"), check=False)
    assert bad_secret.returncode == 1 and "not-a-secret is not a hex string" in bad_secret.stderr
    assert not list(tmp_path.glob("*/jobmanager.json"))


def gone(pids: list[int], timeout: float = 10) -> list[psutil.Process]:
    """Waits up to ``timeout`` for the processes to exit; those still running."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return psutil.wait_procs(procs, timeout=timeout)[1]
