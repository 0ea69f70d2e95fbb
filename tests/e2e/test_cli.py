"""The `streamlab` command from a shell: cluster start/status/stop, run (attached, detached), list, cancel."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
STREAMLAB = [sys.executable, "-m", "kernel_runtime.cli.main"]


def sh(args, env, timeout=120, check=True):
    proc = subprocess.run([*STREAMLAB, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"streamlab {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def shell_env(tmp_path):
    env = dict(os.environ, STREAMLAB_CLUSTER_DIR=str(tmp_path / "cluster"))
    yield env
    sh(["cluster", "stop"], env, check=False)


@pytest.mark.slow  # a cluster and the quickstart through the CLI, with Spark (~30 s)
@pytest.mark.timeout(420)  # the quickstart's .sql step starts each TaskManager's SparkSession (lazy here)
def test_cli_session(shell_env, tmp_path):
    # free ports, so a developer's own cluster on 6123/8081 is never disturbed
    out = sh(["cluster", "start", "--taskmanagers", "2", "--slots", "2", "-D", "jobmanager.rpc.port=0",
              "-D", "rest.port=0", "-D", "taskmanager.spark.startup=lazy"], shell_env).stdout
    assert "2 TaskManager(s) x 2 slot(s)" in out
    status = sh(["cluster", "status"], shell_env).stdout
    assert "TaskManagers: 2  slots: 4 free of 4" in status
    # the REST token for curl and Flink's own client (FLINK_REST_CLIENT_HEADERS)
    token = sh(["cluster", "rest-token"], shell_env).stdout.strip()
    overview = urllib.request.Request(re.search(r"REST (\S+)", status).group(1) + "/overview",
                                      headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(overview, timeout=10) as resp:
        assert json.loads(resp.read())["slots-total"] == 4

    run = sh(["run", "examples/keyed_count.py"], shell_env, timeout=300).stdout
    assert "Job has been submitted with JobID" in run and "keyed count: FINISHED" in run
    # the example's own table: every user's final count
    assert re.search(r"^\s*u0\s+8571$", run, re.M) and re.search(r"^\s*u9\s+8572$", run, re.M)

    detached = sh(["run", "-d", "examples/live_counts.py"], shell_env).stdout
    job_id = re.search(r"JobID ([0-9a-f]{32})", detached).group(1)
    listing = sh(["list"], shell_env).stdout
    assert job_id in listing and "live page counts" in listing
    sh(["cancel", job_id], shell_env)
    wait_for(lambda: "CANCELED" in sh(["list"], shell_env).stdout, 60, "the job cancelled")

    # a savepoint of a running job, then stop-with-savepoint, then start again from it
    detached = sh(["run", "-d", "examples/live_counts.py"], shell_env).stdout
    job_id = re.search(r"JobID ([0-9a-f]{32})", detached).group(1)
    wait_for(lambda: "RUNNING" in sh(["list"], shell_env).stdout, 60, "the job running")
    taken = sh(["savepoint", job_id], shell_env).stdout
    path = re.search(r"Path: file:(\S+)", taken).group(1)
    assert os.path.exists(os.path.join(path, "_metadata"))
    stopped = sh(["stop", job_id], shell_env).stdout
    final = re.search(r"Path: file:(\S+)", stopped).group(1)
    assert "FINISHED" in sh(["list"], shell_env).stdout
    resumed = sh(["run", "-d", "-s", final, "examples/live_counts.py"], shell_env).stdout
    resumed_id = re.search(r"JobID ([0-9a-f]{32})", resumed).group(1)
    sh(["cancel", resumed_id], shell_env)
    # the pipeline edited, its count removed: the count's state fits no operator, and -n leaves it out
    lean = tmp_path / "live_views.py"
    lean.write_text((ROOT / "examples" / "live_counts.py").read_text().replace('.key_by("page").count()', ""))
    # previewed first: nothing submitted, a row per operator, exit 1 where the start would be refused
    jobs = sh(["list"], shell_env).stdout.count("\n")
    preview = sh(["run", "--dry-run", "-s", final, str(lean)], shell_env, check=False)
    assert preview.returncode == 1 and "nothing submitted" in preview.stdout, preview.stdout + preview.stderr
    assert "refused" in preview.stdout and "The start would be refused" in preview.stdout, preview.stdout
    assert re.search(r"^\s*count\s+\S+\s+keyed-count\s+refused$", preview.stdout, re.M), preview.stdout
    assert re.search(r"^\s*page views\s+\S+\s+generator-source\s+restored$", preview.stdout, re.M), preview.stdout
    allowed_preview = sh(["run", "--dry-run", "-s", final, "-n", str(lean)], shell_env).stdout
    assert re.search(r"^\s*count\s+\S+\s+keyed-count\s+dropped$", allowed_preview, re.M), allowed_preview
    assert sh(["list"], shell_env).stdout.count("\n") == jobs  # no job submitted
    refused = sh(["run", "-d", "-s", final, str(lean)], shell_env, check=False)
    assert refused.returncode != 0 and "operator 'count' (uid " in refused.stderr, refused.stderr
    assert "--allow-non-restored-state" in refused.stderr
    allowed = sh(["run", "-d", "-s", final, "-n", str(lean)], shell_env).stdout
    sh(["cancel", re.search(r"JobID ([0-9a-f]{32})", allowed).group(1)], shell_env)
    assert "disposed" in sh(["savepoint", "--dispose", path], shell_env).stdout
    assert not os.path.exists(path)

    bad = sh(["cancel", "0" * 32], shell_env, check=False)
    assert bad.returncode != 0 and "no job with id" in bad.stderr
    assert "stopped" in sh(["cluster", "stop"], shell_env).stdout
    gone = sh(["list"], shell_env, check=False)
    assert gone.returncode != 0 and "no cluster is running" in gone.stderr


def test_bad_configuration_is_refused_naming_the_key(shell_env):
    proc = sh(["cluster", "start", "-D", "taskmanager.numberOfSlots=2"], shell_env, check=False)
    assert proc.returncode != 0 and "unknown configuration key 'taskmanager.numberOfSlots'" in proc.stderr
