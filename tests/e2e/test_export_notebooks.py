"""Every notebook under notebooks/, exported (every %%stream cell) and run as jobs, gives what the
notebook gives.

What the notebook gives is found by running it: once, in a real kernel (nbclient, as nbval runs
the tutorials), with one cell added before its cluster stops that writes each job's final state
and collected tables (the magic's handles by job name). The notebook as executed is then exported,
and each package run by a runner against a cluster:
* a job the notebook ran to FINISHED: the same tables, sorted, row for row (of a changelog, whose
  updates follow the timing of batches, the table it describes: each key's last row);
* a job the notebook cancelled (an unbounded one): run until its sink has rows, cancelled, then the
  same columns and, for a table per key, the same keys;
* a job that failed (or a cell that raised before submitting): the run fails with the same cause.
A new notebook is covered by the glob. Runners: session mode (`streamlab run` against a session
cluster) and application mode (`streamlab run-application`, a cluster per package, checked gone
after each run).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pandas as pd
import psutil
import pytest

from kernel_runtime import JobClient
from kernel_runtime.export import export_notebook
from kernel_runtime.local_cluster import ClusterInfo

from ..conftest import start_cluster

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TERMINAL = ("FINISHED", "FAILED", "CANCELED")

# Appended to the notebook: what each job the notebook's cells submitted ended with.
CAPTURE = """\
import json as _json, pathlib as _pathlib
from kernel_runtime.magic import StreamMagics as _StreamMagics
_magics = next(c for c in get_ipython().configurables if isinstance(c, _StreamMagics))
from cluster.graph.operator_kinds import upsert_key as _upsert_key
_out, _jobs = _pathlib.Path({out!r}), {{}}

def _changelog_key(graph, sink):
    # the key of the upsert operator a changelog collect sink reads (None: not a changelog)
    vertices, inputs = {{v.id: v for v in graph.vertices}}, {{e.target: e.source for e in graph.edges}}
    for vertex in graph.vertices:
        for i, op in enumerate(vertex.operators):
            if op.kind == "collect-sink" and op.name == sink and op.params.get("changelog"):
                upstream, vid = vertex.operators[:i], vertex.id
                while True:
                    for before in reversed(upstream):
                        if (key := _upsert_key(before.kind, before.params)):
                            return key
                    vid = inputs.get(vid)
                    if vid is None:
                        return None
                    upstream = vertices[vid].operators
    return None

for _i, (_name, _handle) in enumerate(_magics.jobs.items()):
    _status = _handle.job_status()
    if _status.state not in ("FINISHED", "FAILED", "CANCELED"):  # left running: as of now
        _handle.cancel()
        while (_status := _handle.job_status()).state not in ("FINISHED", "FAILED", "CANCELED"):
            import time; time.sleep(0.1)
    _sinks = {{}}
    for _j, _sink in enumerate([] if _handle.detached else _handle.sinks):
        _handle.results_of(_sink).reset_index(drop=True).to_parquet(_out / f"{{_i}}-{{_j}}.parquet")
        _sinks[_sink] = {{"file": f"{{_i}}-{{_j}}.parquet", "mode": _handle.summary(_sink, rows=0).mode,
                         "changelog_key": _changelog_key(_handle.job_graph, _sink)}}
    _jobs[_name] = {{"state": _status.state, "failure": _status.failure, "sinks": _sinks}}
(_out / "jobs.json").write_text(_json.dumps(_jobs))
"""


@dataclass
class Ran:
    returncode: int
    output: str  # stdout and stderr


class SessionRunner:
    """`streamlab run` against a session cluster."""

    def __init__(self, cluster):
        self.cluster = cluster

    def _command(self, package: Path, output: Path) -> list[str]:
        return [sys.executable, "-m", "kernel_runtime.cli", "run", "--cluster-dir", str(self.cluster.cluster_dir),
                str(package / "job.py"), "--output", str(output)]

    def run(self, package: Path, output: Path) -> Ran:
        done = subprocess.run(self._command(package, output), cwd=package, env=_clean_env(), capture_output=True,
                              text=True, timeout=300)
        return Ran(done.returncode, done.stdout + done.stderr)

    def run_until_rows(self, package: Path, output: Path, name: str) -> Ran:
        client = JobClient(self.cluster.info)
        try:
            before = {j["jid"] for j in client.list_jobs()}
            process = subprocess.Popen(self._command(package, output), cwd=package, env=_clean_env(),
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                job_id = _wait(lambda: next((j["jid"] for j in client.list_jobs() if j["jid"] not in before
                                             and j["name"] == name and j["state"] == "RUNNING"), None),
                               f"job {name!r} running", process)
                _wait(lambda: _sink_records(client.job_details(job_id)) > 0, f"rows at the sink of {name!r}", process)
                time.sleep(2)  # the rows on their way to the client
                client.cancel(job_id)
                out, _ = process.communicate(timeout=60)
            finally:
                if process.poll() is None:
                    process.kill()
            return Ran(process.returncode, out)
        finally:
            client.close()


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLAB_CONTEXT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def _wait(predicate, what: str, process: subprocess.Popen, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if process.poll() is not None:
            raise AssertionError(f"the job ended before {what}: {process.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)
    return value


def _sink_records(details: dict) -> int:
    last = details["vertices"][-1]["id"]
    return sum(s["metrics"].get("records-in", 0) or 0 for s in details["subtasks"] if s["vertex_id"] == last)


@pytest.fixture(scope="module")
def session_cluster(tmp_path_factory):
    # as the notebooks' own: 2 TaskManagers x 2 slots
    local = start_cluster(tmp_path_factory.mktemp("session"), taskmanagers=2, slots=2)
    yield local
    local.stop()


class ApplicationRunner:
    """`streamlab run-application PACKAGE -- --output OUT`: a cluster of the package's own, started
    by the command, its TaskManagers by the active ResourceManager, gone when the job ends. The
    script's main() runs in the JobManager, so what it prints (and a cause) is in the JobManager's
    log and .out, which count as the run's output."""

    def __init__(self, workdir: Path):
        self.workdir = workdir

    def _command(self, package: Path, output: Path, cluster_dir: Path, *options: str) -> list[str]:
        return [sys.executable, "-m", "kernel_runtime.cli", "run-application", "--cluster-dir", str(cluster_dir),
                *options, str(package), "--", "--output", str(output)]

    def _cluster_dir(self, package: Path) -> Path:
        return self.workdir / f"application-{package.name}"

    @staticmethod
    def _output(cluster_dir: Path, printed: str) -> str:
        logs = [cluster_dir / "log" / name for name in ("jobmanager.out", "jobmanager.log")]
        return printed + "".join(p.read_text(errors="replace") for p in logs if p.exists())

    def run(self, package: Path, output: Path) -> Ran:
        cluster_dir = self._cluster_dir(package)
        done = subprocess.run(self._command(package, output, cluster_dir), cwd=package, env=_clean_env(),
                              capture_output=True, text=True, timeout=300)
        _assert_all_gone(cluster_dir)
        return Ran(done.returncode, self._output(cluster_dir, done.stdout + done.stderr))

    def run_until_rows(self, package: Path, output: Path, name: str) -> Ran:
        cluster_dir = self._cluster_dir(package)
        done = subprocess.run(self._command(package, output, cluster_dir, "--detached"), cwd=package,
                              env=_clean_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        info = ClusterInfo.load(cluster_dir)
        jobmanager = psutil.Process(json.loads((cluster_dir / "jobmanager.json").read_text())["pid"])
        client = JobClient(info)
        try:
            (job_id,) = [j["jid"] for j in client.list_jobs() if j["name"] == name]
            deadline = time.monotonic() + 120
            while _sink_records(client.job_details(job_id)) == 0:
                assert time.monotonic() < deadline, f"no rows at the sink of {name!r}"
                time.sleep(0.2)
            time.sleep(2)  # the rows on their way to main()'s client
            client.cancel(job_id)
        finally:
            client.close()
        jobmanager.wait(120)  # the application cluster ends with its job
        _assert_all_gone(cluster_dir)
        return Ran(2, self._output(cluster_dir, done.stdout + done.stderr))


def _assert_all_gone(cluster_dir: Path) -> None:
    """No process of the application's cluster is left (JobManager, started TaskManagers)."""
    def of_cluster(proc: psutil.Process) -> bool:
        try:
            return str(cluster_dir) in " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False
    deadline = time.monotonic() + 30
    while left := [p.pid for p in psutil.process_iter() if of_cluster(p)]:
        assert time.monotonic() < deadline, f"processes of {cluster_dir} left: {left}"
        time.sleep(0.2)


@pytest.fixture(params=["session", "application"])
def runner(request, tmp_path):
    if request.param == "session":
        return SessionRunner(request.getfixturevalue("session_cluster"))
    return ApplicationRunner(tmp_path)


@pytest.fixture(scope="module")
def notebook_runs(tmp_path_factory):
    """Each notebook executed once for all runners: its kept tables, and the notebook as executed."""
    runs: dict[Path, tuple[Path, dict, nbformat.NotebookNode]] = {}

    def run(notebook: Path):
        if notebook not in runs:
            seen = tmp_path_factory.mktemp(notebook.stem)
            executed = execute(notebook, seen)
            runs[notebook] = (seen, json.loads((seen / "jobs.json").read_text()), executed)
        return runs[notebook]
    return run


def execute(notebook: Path, out: Path) -> nbformat.NotebookNode:
    """The notebook run in a fresh kernel, with the capture cell before its cluster stops."""
    from nbclient import NotebookClient
    nb = nbformat.read(str(notebook), as_version=4)
    capture = nbformat.v4.new_code_cell(CAPTURE.format(out=str(out)))
    stops = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip() == "%stream_cluster stop"]
    nb.cells.insert(stops[-1] if stops else len(nb.cells), capture)
    # cells tagged raises-exception may raise; any other error fails the run
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(notebook.parent)}},
                   allow_errors=False).execute()
    return nb


def masked(text: str) -> str:
    """A cause without its places, which differ between a cell ("In [5], line 2") and a script ("job.py:12")."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    text = re.sub(r"\((?:[^()]*(?:In \[\d+\], line \d+|\.py:\d+)[^()]*)\)", "(...)", text)
    return text


def cell_error(cell) -> str | None:
    errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
    return f"{errors[0].ename}: {errors[0].evalue}" if errors else None


def sorted_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(list(frame.columns), ignore_index=True, kind="stable")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[n.stem for n in NOTEBOOKS])
def test_exported_jobs_give_what_the_notebook_gives(notebook, runner, notebook_runs, tmp_path):
    seen, jobs, executed = notebook_runs(notebook)
    copy = tmp_path / notebook.name  # the notebook as executed: unnamed cells are named by their number
    nbformat.write(executed, str(copy))
    packages = export_notebook(copy, tmp_path / "packages")
    assert packages, notebook
    for package, directory in packages:
        where = f"{notebook.name}: {package.cell.label}"
        out = tmp_path / "runs" / directory.name
        job = jobs.get(package.name)
        if job is None:  # the cell raised before it submitted a job
            error = cell_error(executed.cells[package.cell.index])
            assert error is not None, f"{where}: no job and no error in the notebook"
            ran = runner.run(directory, out)
            assert ran.returncode != 0, f"{where}: the exported job ran, the cell raised {error}"
            cause = masked(error).split(": ", 1)[1].splitlines()[0]  # the magic's "ErrorType: message"
            assert cause in masked(ran.output), f"{where}: expected {cause!r} in\n{ran.output[-3000:]}"
        elif job["state"] == "FAILED":
            ran = runner.run(directory, out)
            assert ran.returncode != 0, f"{where}: the exported job ran, the notebook's failed"
            headline = masked(job["failure"]).splitlines()[0]
            assert headline in masked(ran.output), f"{where}: expected {headline!r} in\n{ran.output[-3000:]}"
        elif job["state"] == "FINISHED":
            ran = runner.run(directory, out)
            assert ran.returncode == 0, f"{where}:\n{ran.output[-3000:]}"
            for sink, kept in job["sinks"].items():
                expected, got = pd.read_parquet(seen / kept["file"]), pd.read_parquet(out / f"{sink}.parquet")
                if kept["changelog_key"]:
                    # a changelog's updates follow the batches as they met (timing): what is the
                    # same is the table it describes, the last update of each key
                    key = kept["changelog_key"]
                    assert list(got.columns) == list(expected.columns), f"{where}, sink {sink!r}"
                    expected, got = (f.drop_duplicates(key, keep="last") for f in (expected, got))
                pd.testing.assert_frame_equal(sorted_rows(got), sorted_rows(expected), obj=f"{where}, sink {sink!r}")
        else:  # CANCELED: an unbounded job, run until it has rows
            ran = runner.run_until_rows(directory, out, package.name)
            assert "was cancelled" in ran.output, f"{where}:\n{ran.output[-3000:]}"
            for sink, kept in job["sinks"].items():
                expected = pd.read_parquet(seen / kept["file"])
                got = pd.read_parquet(out / f"{sink}.parquet")
                assert list(got.columns) == list(expected.columns), f"{where}, sink {sink!r}"
                assert len(got) > 0, f"{where}, sink {sink!r}: no rows"
                if kept["mode"].startswith("update by "):
                    key = kept["mode"][len("update by "):].split(", ")
                    assert set(got[key].itertuples(index=False)) == set(expected[key].itertuples(index=False)), \
                        f"{where}, sink {sink!r}: keys {key}"
