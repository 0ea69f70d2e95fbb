"""What the export test (test_notebooks.py) needs: the cells it adds to a notebook before nbval
runs it, the runners of exported packages, and the comparisons.

Added before the notebook's cluster stops: cells that cancel the jobs it left running (unbounded
ones), the bounded twins of its unbounded %%stream cells (their generators read only the first
PREFIX rows), a cell that waits for the twins, and one that writes each job's final state and
collected tables (the magic's handles by job name). Runners: session mode (`streamlab run` against
a session cluster) and application mode (`streamlab run-application`, a cluster per package,
checked gone after each run).
"""
from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pandas as pd
import psutil

from kernel_runtime import JobClient
from kernel_runtime.client.cluster_info import ClusterInfo
from kernel_runtime.export.magic_arguments import parse_stream_args
from kernel_runtime.export.slicing import SKIP_TAG

from ..conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

PREFIX = 1_234  # the rows of each unbounded generator that a cell's bounded twin reads

# Added to the notebook before its twins: the jobs it left running (unbounded ones), cancelled as
# of now (what the capture did before the twins were added), so the twins find free slots
CANCEL_RUNNING = """\
from kernel_runtime.notebook.magic import StreamMagics as _StreamMagics
_magics = next(c for c in get_ipython().configurables if isinstance(c, _StreamMagics))
for _handle in list(_magics.jobs.values()):
    if _handle.job_status().state not in ("FINISHED", "FAILED", "CANCELED"):
        _handle.cancel()
        while _handle.job_status().state not in ("FINISHED", "FAILED", "CANCELED"):
            import time; time.sleep(0.1)
"""

# Added after the twins: each twin finished (a %%stream cell returns while its job runs)
WAIT_FOR_TWINS = """\
for _name in {names!r}:
    _magics.jobs[_name].wait(300)
"""

# Appended to the notebook: what each job the notebook's cells submitted ended with.
CAPTURE = """\
import json as _json, pathlib as _pathlib
from kernel_runtime.notebook.magic import StreamMagics as _StreamMagics
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
        return [sys.executable, "-m", "kernel_runtime.cli.main", "run", "--cluster-dir", str(self.cluster.cluster_dir),
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
                _client_holds_rows(client, job_id, output)
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


def _client_holds_rows(client: JobClient, job_id: str, output: Path) -> None:
    """Once rows reached the sink: a savepoint, which completes only when the job's client has
    acknowledged every row its collect sinks sent before the barrier (CollectSink), so the client
    holds the rows seen at the sink before the job is cancelled."""
    client.trigger_savepoint(job_id, str(output.with_name(output.name + "-savepoint")), timeout=120)


def _sink_records(details: dict) -> int:
    last = details["vertices"][-1]["id"]
    return sum(s["metrics"].get("records-in", 0) or 0 for s in details["subtasks"] if s["vertex_id"] == last)


class ApplicationRunner:
    """`streamlab run-application PACKAGE -- --output OUT`: a cluster of the package's own, started
    by the command, its TaskManagers by the active ResourceManager, gone when the job ends. The
    script's main() runs in the JobManager, so what it prints (and a cause) is in the JobManager's
    log and .out, which count as the run's output."""

    def __init__(self, workdir: Path):
        self.workdir = workdir

    def _command(self, package: Path, output: Path, cluster_dir: Path, *options: str) -> list[str]:
        return [sys.executable, "-m", "kernel_runtime.cli.main", "run-application", "--cluster-dir", str(cluster_dir),
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
            wait_for(lambda: _sink_records(client.job_details(job_id)) > 0, 120, f"rows at the sink of {name!r}")
            _client_holds_rows(client, job_id, output)  # main()'s client
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
    wait_for(lambda: not [p.pid for p in psutil.process_iter() if of_cluster(p)], 30,
             f"every process of {cluster_dir} to end")


def stream_cells(nb: nbformat.NotebookNode) -> list[tuple[int, nbformat.NotebookNode]]:
    """The notebook's %%stream and %%stream_sql cells that run a job (not --explain, not --dry-run),
    by index among all its cells."""
    return [(i, c) for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and re.match(r"%%stream(_sql)?(\s|$)", c.source.lstrip())
            and not {"--explain", "--dry-run"} & set(c.source.lstrip().partition("\n")[0].split())]


def tags(cell) -> set[str]:
    return set(cell.metadata.get("tags", []))


def bounded_twin(cell, index: int) -> nbformat.NotebookNode | None:
    """The cell with ``count=PREFIX`` given to each generator that has no count, under a name of
    its own (its parallelism and checkpoint interval kept); None if the cell has no unbounded
    generator. Positions are the ast's: UTF-8 bytes of the body."""
    first, _, body = cell.source.lstrip().partition("\n")
    if first.startswith("%%stream_sql"):
        return None  # a query: its views' generators are bounded where they are defined
    calls = [n for n in ast.walk(ast.parse(body)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "from_generator" and not any(k.arg in ("count", None) for k in n.keywords)]
    if not calls:
        return None
    lines = body.encode().splitlines(keepends=True)
    starts = [sum(len(line) for line in lines[:i]) for i in range(len(lines) + 1)]
    inserts = []
    for call in calls:
        given = [*call.args, *call.keywords]
        if given:
            last = max(given, key=lambda n: (n.end_lineno, n.end_col_offset))
            inserts.append((starts[last.end_lineno - 1] + last.end_col_offset, f", count={PREFIX}"))
        else:  # from_generator(): before its ")"
            inserts.append((starts[call.end_lineno - 1] + call.end_col_offset - 1, f"count={PREFIX}"))
    text = body.encode()
    for at, what in sorted(inserts, reverse=True):
        text = text[:at] + what.encode() + text[at:]
    args = parse_stream_args(first[len("%%stream"):].strip())
    options = ["--name", f"{args.name or f'cell #{index}'} (first {PREFIX} rows)"]
    if args.parallelism:
        options += ["--parallelism", str(args.parallelism)]
    if args.checkpoint_interval:
        options += ["--checkpoint-interval", args.checkpoint_interval]
    return nbformat.v4.new_code_cell(f"%%stream {shlex.join(options)}\n{text.decode()}")


IGNORE_OUTPUT = "nbval-ignore-output"  # the added cells' outputs (the twins' dashboards) are not compared


def augmented(notebook: Path, out: Path) -> tuple[nbformat.NotebookNode, dict[int, int]]:
    """The notebook with the bounded twins of its unbounded %%stream cells and the capture cell
    (writing to ``out``) added before its cluster stops; the twins by cell index (cell -> twin)."""
    nb = nbformat.read(str(notebook), as_version=4)
    twins = [(cell, twin) for i, cell in stream_cells(nb) if not tags(cell) & {SKIP_TAG, "raises-exception"}
             and (twin := bounded_twin(cell, i)) is not None]
    names = [parse_stream_args(t.source.partition("\n")[0][len("%%stream"):].strip()).name for _, t in twins]
    added = [nbformat.v4.new_code_cell(CANCEL_RUNNING), *(t for _, t in twins),
             nbformat.v4.new_code_cell(WAIT_FOR_TWINS.format(names=names)),
             nbformat.v4.new_code_cell(CAPTURE.format(out=str(out)))]
    for cell in added:
        cell.metadata["tags"] = [IGNORE_OUTPUT]
    stops = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip() == "%stream_cluster stop"]
    at = stops[-1] if stops else len(nb.cells)
    nb.cells[at:at] = added
    index = {id(c): i for i, c in enumerate(nb.cells)}
    return nb, {index[id(cell)]: index[id(twin)] for cell, twin in twins}


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
