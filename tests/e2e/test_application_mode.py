"""Application mode with real processes: `streamlab run-application` starts a JobManager that runs
the package's main(), starts the TaskManagers its job needs, answers REST while it runs and takes
every process of the cluster down when the job ended; its exit code says how it ended (0
FINISHED, 1 FAILED, 2 CANCELED)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pandas as pd
import psutil
import pytest

from kernel_runtime.client.cluster_info import ClusterInfo, ClusterNotRunning

from ..conftest import wait_for

ROWS = 20_000

JOB = '''
"""A job package's script: generator -> key_by -> count -> collect (or a failing map, or unbounded)."""
import argparse
from pathlib import Path

from kernel_runtime import StreamEnvironment


def explode(df):
    if (df.seq >= 3_000).any():
        raise ValueError("bad row in the application's input")
    return df


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--output")
    parser.add_argument("--mode", choices=["count", "fail", "forever"], default="count")
    args = parser.parse_args(argv)
    env = StreamEnvironment.get_execution_environment()
    count = None if args.mode == "forever" else {ROWS}
    stream = env.from_generator(lambda seq: {{"key": seq % 7, "seq": seq}}, count=count, rate=8_000, batch_size=500)
    if args.mode == "fail":
        stream = stream.map_batches(explode, name="explode")
    stream.key_by("key").count().collect(name="counts")
    result = env.execute("application " + args.mode)
    if args.output:
        Path(args.output).mkdir(parents=True, exist_ok=True)
        for sink, frame in result.results.items():
            frame.to_parquet(Path(args.output) / (sink + ".parquet"))


if __name__ == "__main__":
    main()
'''.format(ROWS=ROWS)

CONFIG = """\
parallelism.default: 2
heartbeat.interval: 200 ms
heartbeat.timeout: 2 s
taskmanager.spark.startup: lazy
"""

# Runs `run-application --detached` as a subreaper, so that the JobManager the command leaves
# running becomes this process's child when the command exits, and its exit code can be read.
SUBREAPER = """
import ctypes, os, re, subprocess, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
cli = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(cli.stdout + cli.stderr, flush=True)
print("CLI EXIT", cli.returncode, flush=True)
jm = int(re.search(r"\\(pid (\\d+)\\)", cli.stdout).group(1))
print("JOBMANAGER EXIT", os.waitstatus_to_exitcode(os.waitpid(jm, 0)[1]), flush=True)
"""


def package(tmp_path: Path) -> Path:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "job.py").write_text(textwrap.dedent(JOB))
    (pkg / "config.yaml").write_text(CONFIG)
    return pkg


def run_application(pkg: Path, cluster_dir: Path, *args: str, detached: bool = False) -> list[str]:
    return [sys.executable, "-m", "kernel_runtime.cli.main", "run-application", str(pkg), "--slots", "2",
            "--cluster-dir", str(cluster_dir), *(["--detached"] if detached else []), "--", *args]


def rest(cluster_dir: Path, path: str) -> dict:
    info = ClusterInfo.load(cluster_dir)
    req = urllib.request.Request(info.rest_address + path, headers=info.rest_headers)
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def cluster_processes(cluster_dir: Path) -> set[int]:
    """The JobManager and everything below it (TaskManagers, their Spark JVMs), now."""
    info = json.loads((cluster_dir / "jobmanager.json").read_text())
    jm = psutil.Process(info["pid"])
    return {jm.pid, *(p.pid for p in jm.children(recursive=True))}


def gone(pids: set[int]) -> bool:
    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    return not any(alive(p) for p in pids)


def watch_while_running(proc: subprocess.Popen, cluster_dir: Path) -> tuple[set[int], list[dict]]:
    """Until the command ends: the cluster's processes seen, and REST's job lists answered."""
    pids: set[int] = set()
    answers: list[dict] = []
    while proc.poll() is None:
        if (cluster_dir / "jobmanager.json").exists():
            try:
                pids |= cluster_processes(cluster_dir)
                answers.append(rest(cluster_dir, "/jobs/overview"))
            except (OSError, psutil.Error, ValueError, ClusterNotRunning):
                pass  # the cluster is going down
        time.sleep(0.1)
    return pids, answers


def test_finished_application_exits_0_with_the_right_result_and_leaves_no_process(tmp_path):
    pkg, cluster_dir, out = package(tmp_path), tmp_path / "app", tmp_path / "out"
    proc = subprocess.Popen(run_application(pkg, cluster_dir, "--output", str(out)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids, answers = watch_while_running(proc, cluster_dir)
    output = proc.stdout.read()
    assert proc.returncode == 0, output
    assert "FINISHED" in output and "exit code 0" in output
    # REST answered while the job ran, and the active ResourceManager had started TaskManagers
    assert any(job["state"] == "RUNNING" for a in answers for job in a["jobs"]), answers[-3:]
    assert len(pids) >= 2
    got = pd.read_parquet(out / "counts.parquet").sort_values("key").reset_index(drop=True)
    expected = pd.DataFrame({"key": pd.RangeIndex(ROWS) % 7}).groupby("key").size().rename("count").reset_index()
    pd.testing.assert_frame_equal(got[["key", "count"]], expected, check_dtype=False)
    wait_for(lambda: gone(pids), 10, "every process of the application cluster to end")


def test_failed_application_exits_1_and_prints_the_cause(tmp_path):
    pkg, cluster_dir = package(tmp_path), tmp_path / "app"
    proc = subprocess.Popen(run_application(pkg, cluster_dir, "--mode", "fail"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids, _ = watch_while_running(proc, cluster_dir)
    output = proc.stdout.read()
    assert proc.returncode == 1, output
    assert "FAILED" in output and "ValueError: bad row in the application's input" in output
    assert pids and json.loads((cluster_dir / "application.json").read_text())["exit_code"] == 1
    wait_for(lambda: gone(pids), 10, "every process of the application cluster to end")


@pytest.mark.slow  # over 20 s here: two CLI processes besides the cluster
def test_cancelled_detached_application_ends_its_jobmanager_with_2_and_leaves_no_process(tmp_path):
    pkg, cluster_dir = package(tmp_path), tmp_path / "app"
    reaper = subprocess.Popen([sys.executable, "-c", SUBREAPER,
                               *run_application(pkg, cluster_dir, "--mode", "forever", detached=True)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        while not lines or not lines[-1].startswith("CLI EXIT"):
            line = reaper.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        assert lines[-1].strip() == "CLI EXIT 0", "".join(lines)
        (job_id,) = [line.split("JobID ")[1].split()[0] for line in lines if "JobID" in line]
        assert rest(cluster_dir, f"/jobs/{job_id}")["state"] == "RUNNING"
        pids = cluster_processes(cluster_dir)
        assert len(pids) >= 2  # the JobManager and the TaskManager started for the job
        cancel = subprocess.run([sys.executable, "-m", "kernel_runtime.cli.main", "cancel", job_id,
                                 "--cluster-dir", str(cluster_dir)], capture_output=True, text=True, timeout=60)
        assert cancel.returncode == 0, cancel.stderr
        rest_of_output = reaper.communicate(timeout=60)[0]
        assert "JOBMANAGER EXIT 2" in rest_of_output, rest_of_output
        outcome = json.loads((cluster_dir / "application.json").read_text())
        assert [j["state"] for j in outcome["jobs"]] == ["CANCELED"] and outcome["exit_code"] == 2
        wait_for(lambda: gone(pids), 10, "every process of the application cluster to end")
    finally:
        if reaper.poll() is None:
            reaper.kill()
