"""Every notebook under notebooks/, run once under nbval on a fresh kernel with its own embedded
cluster, then exported and its packages run as jobs.

* nbval: the deterministic cells' outputs must match the saved ones (job ids, ports and durations
  masked by sanitize.cfg); the live cells (tagged nbval-ignore-output) must run.
* Export: what the exported jobs give must be what the notebook gave. nbval runs the notebook with
  cells added before its cluster stops (exporting.augmented: bounded twins of its unbounded cells,
  and a capture of each job's final state and tables), and a plugin of that run
  (executed.py) keeps the notebook as executed. Each package is then run by a runner:
  * a job the notebook ran to FINISHED: the same tables, sorted, row for row (of a changelog, whose
    updates follow the timing of batches, the table it describes: each key's last row);
  * a job the notebook cancelled (an unbounded one): run until its sink has rows (and the runner's
    client holds some: a savepoint completes only once it acknowledged them), cancelled, then the
    same columns and, for a table per key, the same keys. Its values are compared on its bounded
    twin, exported and compared as a finished job;
  * a job that failed (or a cell that raised before submitting): the run fails with the same cause.
  Every %%stream cell of the notebook (read here with nbformat, not by the exporter) must have a
  package unless it is tagged skip-export: a cell the exporter dropped fails the test. A new
  notebook is covered by the glob. Runners: session mode for every notebook, application mode for
  the one whose jobs end in every way (APPLICATION_NOTEBOOKS).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from kernel_runtime.export.package import export_notebook
from kernel_runtime.export.slicing import SKIP_TAG

from .exporting import (NOTEBOOKS, ROOT, ApplicationRunner, SessionRunner, augmented, cell_error, masked,
                        sorted_rows, stream_cells, tags)

pytestmark = pytest.mark.slow  # a fresh kernel and cluster per notebook, and its packages run


@dataclass
class NotebookRun:
    returncode: int  # nbval's
    output: str
    seen: Path  # what the capture cell wrote: jobs.json and each sink's table
    executed: nbformat.NotebookNode
    twins: dict[int, int]  # cell index -> its bounded twin's

    @property
    def captured(self) -> bool:
        return (self.seen / "jobs.json").exists()

    @property
    def jobs(self) -> dict:
        return json.loads((self.seen / "jobs.json").read_text())


def run_under_nbval(notebook: Path, workdir: Path) -> NotebookRun:
    seen, executed = workdir / "seen", workdir / "executed.ipynb"
    seen.mkdir()
    nb, twins = augmented(notebook, seen)
    # beside the original: nbval starts the kernel in the notebook's directory, as a reader's would
    copy = notebook.with_name(f".under-test-{os.getpid()}-{notebook.name}")
    nbformat.write(nb, str(copy))
    try:
        # a pytest of its own: nbval collects notebooks only when asked to, and compares outputs
        # with its own rules, which belong to that run and not to this test session
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "--nbval-cell-timeout=300",
             "--nbval-sanitize-with", str(Path(__file__).with_name("sanitize.cfg")), "-p", "tests.notebooks.executed",
             "-p", "no:cacheprovider", "-o", "addopts=", "-q", str(copy)],
            cwd=ROOT, capture_output=True, text=True, timeout=560,
            env={**os.environ, "STREAMLAB_EXECUTED_NOTEBOOK": str(executed)})
    finally:
        copy.unlink()
    ran = nbformat.read(str(executed), as_version=4) if executed.exists() else nb
    return NotebookRun(run.returncode, run.stdout[-8000:] + run.stderr[-2000:], seen, ran, twins)


@pytest.fixture(scope="module")
def notebook_runs(tmp_path_factory):
    """Each notebook run once under nbval, for its own test and for the export test's runners."""
    runs: dict[Path, NotebookRun] = {}

    def run(notebook: Path) -> NotebookRun:
        if notebook not in runs:
            runs[notebook] = run_under_nbval(notebook, tmp_path_factory.mktemp(notebook.stem))
        return runs[notebook]
    return run


@pytest.mark.timeout(600)
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[n.stem for n in NOTEBOOKS])
def test_notebook_runs_and_matches_its_saved_outputs(notebook, notebook_runs):
    run = notebook_runs(notebook)
    assert run.returncode == 0, run.output
    assert " passed" in run.output and " failed" not in run.output


# Application mode starts a cluster of its own for every package (a JobManager, TaskManagers and
# their Spark): a minute or more each on two cores. It runs the packages of the notebook whose
# jobs end in all three ways (finished, failed, cancelled while unbounded); session mode runs
# every notebook's.
APPLICATION_NOTEBOOKS = ("02-keyed-streams-and-backpressure",)
RUNS = [(kind, n) for n in NOTEBOOKS for kind in ("session", "application")
        if kind == "session" or n.stem in APPLICATION_NOTEBOOKS]


def make_runner(kind: str, request, tmp_path):
    if kind == "session":
        # the worker's session cluster, the notebooks' shape (2 TaskManagers x 2 slots), checked
        # at rest after each package's run
        return SessionRunner(request.getfixturevalue("cluster"))
    return ApplicationRunner(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("kind", "notebook"), RUNS, ids=[f"{kind}-{n.stem}" for kind, n in RUNS])
def test_exported_jobs_give_what_the_notebook_gives(kind, notebook, notebook_runs, request, tmp_path):
    runner = make_runner(kind, request, tmp_path)
    run = notebook_runs(notebook)
    assert run.captured, f"{notebook.name}: its run ended before the capture cell:\n{run.output[-4000:]}"
    seen, jobs, executed, twins = run.seen, run.jobs, run.executed, run.twins
    copy = tmp_path / notebook.name  # the notebook as executed: unnamed cells are named by their number
    nbformat.write(executed, str(copy))
    packages = export_notebook(copy, tmp_path / "packages")
    # every %%stream cell has its package, but those tagged skip-export (a cell the exporter drops fails)
    cells = dict(stream_cells(executed))
    wanted = {i for i, cell in cells.items() if SKIP_TAG not in tags(cell)}
    exported = [package.cell.index for package, _ in packages]
    missing = sorted(wanted - set(exported))
    assert not missing, f"{notebook.name}: %%stream cells without a package: " + "; ".join(
        f"cell #{i}: {cells[i].source.lstrip().splitlines()[0]}" for i in missing)
    assert sorted(exported) == sorted(wanted), f"{notebook.name}: packages of cells {exported}, wanted {wanted}"
    compared, bounded = set(), set()  # cell indices: finished jobs compared row for row; twins to compare
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
            # a notebook refuses a query Spark's analyser refuses in the cell (its planner session is up);
            # the exported job, a script without one, has its first task refuse it with Spark's same message
            cause = cause.split(": Spark refuses the query: ", 1)[-1]
            assert cause in masked(ran.output), f"{where}: expected {cause!r} in\n{ran.output[-3000:]}"
        elif job["state"] == "FAILED":
            ran = runner.run(directory, out)
            assert ran.returncode != 0, f"{where}: the exported job ran, the notebook's failed"
            headline = masked(job["failure"]).splitlines()[0]
            assert headline in masked(ran.output), f"{where}: expected {headline!r} in\n{ran.output[-3000:]}"
        elif job["state"] == "FINISHED" and package.cell.index not in twins:
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
            compared.add(package.cell.index)
        else:  # an unbounded job (CANCELED, or FINISHED by a stop with savepoint): run until it has rows;
            # its values by its bounded twin
            twin = twins.get(package.cell.index)
            assert twin is not None, f"{where}: unbounded, and no bounded twin to compare values on (bounded_twin " \
                                     "bounds the generators of a cell; give another source a count there)"
            bounded.add(twin)
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
    # the twins of the unbounded jobs ran to FINISHED, in the notebook and exported, with the same values
    assert bounded <= compared, f"{notebook.name}: bounded twins not compared as finished jobs: {bounded - compared}"
