"""Every tutorial under notebooks/ runs under nbval on a fresh kernel with its own embedded
cluster: the deterministic cells' outputs must match the saved ones (job ids, ports and
durations masked by sanitize.cfg); the live cells (tagged nbval-ignore-output) must run."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.slow  # a fresh kernel and cluster per notebook (~2 min for the six)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[n.stem for n in NOTEBOOKS])
def test_notebook_runs_and_matches_its_saved_outputs(notebook):
    # a pytest of its own: nbval collects notebooks only when asked to, and compares outputs
    # with its own rules, which belong to that run and not to this test session
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "--nbval-cell-timeout=300",
         "--nbval-sanitize-with", str(Path(__file__).with_name("sanitize.cfg")),
         "-p", "no:cacheprovider", "-o", "addopts=", "-q", str(notebook)],
        cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " failed" not in run.stdout
