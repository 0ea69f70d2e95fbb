"""01-quickstart in a real JupyterLab, driven in Debian's chromium by Playwright.

The test starts JupyterLab itself (a token, news off, fresh settings and workspace folders, the
BokehJS server extension on), opens a copy of the notebook, runs every cell, and watches the
page while the first job runs: the dashboard must render (its Bokeh charts too) and change while
the job runs: busy slots, a growing row count, a filling result table. Screenshots go to
test-artifacts/ (CI keeps them).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
NOTEBOOK = "01-quickstart.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base: str, token: str, path: str, method: str = "GET"):
    request = urllib.request.Request(f"{base}{path}", method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
        return json.loads(body) if body else None


@pytest.fixture
def jupyterlab(tmp_path):
    root = tmp_path / "work"
    root.mkdir()
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, root / NOTEBOOK)
    settings = tmp_path / "settings" / "@jupyterlab"
    for plugin, values in (("apputils-extension/notification", {"fetchNews": "false"}),
                           # every cell stays in the page, so the dashboard can be read while
                           # later cells run (the default drops cells scrolled out of view)
                           ("notebook-extension/tracker", {"windowingMode": "none"})):
        (settings / plugin).parent.mkdir(parents=True, exist_ok=True)
        (settings / f"{plugin}.jupyterlab-settings").write_text(json.dumps(values))
    config = tmp_path / "config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(json.dumps(
        {"ServerApp": {"jpserver_extensions": {"kernel_runtime.widgets.bokeh_resources": True}}}))
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    log = open(tmp_path / "jupyterlab.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         f"--LabApp.user_settings_dir={tmp_path / 'settings'}", f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
         "--LabApp.expose_app_in_browser=True", "--ServerApp.port_retries=0"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                api(base, token, "/api/status")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n" + (tmp_path / "jupyterlab.log").read_text())
                time.sleep(0.3)
        yield base, token, root
    finally:
        try:  # a kernel shut down cleanly stops its embedded cluster
            for session in api(base, token, "/api/sessions"):
                api(base, token, f"/api/sessions/{session['id']}", "DELETE")
        except OSError:
            pass
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        print((tmp_path / "jupyterlab.log").read_text()[-3000:])


# Read from the page: the first dashboard's state (bokeh renders in shadow roots, so charts
# are counted through Playwright's locators, which pierce them).
PAGE_STATE = """() => {
  const board = document.querySelector('.streamlab-dashboard');
  if (!board) { return null; }
  const rows = board.querySelector('.streamlab-row-count');
  const state = board.querySelector('.streamlab-state');
  return {
    state: state ? state.dataset.state : '',
    busySlots: board.querySelectorAll('.streamlab-slot[data-state="busy"]').length,
    rows: rows ? Number(rows.dataset.rows) : -1,
    tableRows: board.querySelectorAll('.streamlab-results table tbody tr').length,
    sourceRows: Number((board.querySelector('.streamlab-source-rows') || {dataset: {rows: -1}}).dataset.rows),
  };
}"""

KERNEL_READY = """() => {
  const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const kernel = panel && panel.sessionContext && panel.sessionContext.session && panel.sessionContext.session.kernel;
  return !!kernel && kernel.status === 'idle' && kernel.connectionStatus === 'connected';
}"""

CELLS_DONE = """() => {
  const cells = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')];
  const prompts = cells.map(c => (c.querySelector('.jp-InputArea-prompt') || {}).textContent || '');
  return {total: cells.length, done: prompts.filter(p => /\\[\\d+\\]/.test(p)).length,
          running: prompts.filter(p => p.includes('*')).length};
}"""


def screenshot(page, name: str) -> None:
    page.evaluate("() => { const b = document.querySelector('.streamlab-dashboard');"
                  " if (b) { b.scrollIntoView({block: 'start'}); } }")
    page.screenshot(path=str(ARTIFACTS / name))


def test_quickstart_runs_and_its_dashboard_moves(jupyterlab):
    from playwright.sync_api import sync_playwright

    base, token, root = jupyterlab
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (make system-deps)")
    ARTIFACTS.mkdir(exist_ok=True)
    samples = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        try:
            code_cells = sum(c["cell_type"] == "code" for c in json.loads((root / NOTEBOOK).read_text())["cells"])
            page.goto(f"{base}/lab/tree/{NOTEBOOK}?token={token}")
            page.wait_for_function(f"() => window.jupyterapp && ({CELLS_DONE})().total === {code_cells}",
                                   timeout=60_000)
            page.wait_for_function(KERNEL_READY, timeout=60_000)
            # the saved outputs and execution counts go, so a counted cell is one that ran now
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
            page.wait_for_function(f"() => ({CELLS_DONE})().done === 0")
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")  # not awaited
            page.wait_for_function(f"() => ({CELLS_DONE})().running > 0", timeout=30_000)

            deadline = time.monotonic() + 300
            shot_taken = False
            while time.monotonic() < deadline:
                state = page.evaluate(PAGE_STATE)
                cells = page.evaluate(CELLS_DONE)
                if state:
                    samples.append(state)
                    if not shot_taken and state["state"] == "RUNNING" and state["rows"] > 2000:
                        screenshot(page, "quickstart-dashboard-running.png")
                        shot_taken = True
                if cells["total"] and cells["done"] == cells["total"] and not cells["running"]:
                    break
                time.sleep(0.25)
            else:
                screenshot(page, "quickstart-timeout.png")
                pytest.fail(f"the notebook did not finish running: {page.evaluate(CELLS_DONE)}")

            charts = page.locator(".streamlab-dashboard").first.locator(".streamlab-throughput canvas").count()
            error_outputs = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            error_text = [error_outputs.nth(i).inner_text() for i in range(error_outputs.count())]
            screenshot(page, "quickstart-dashboard-finished.png")
        finally:
            browser.close()

    assert not error_text, error_text
    assert charts >= 1, "the throughput chart (Bokeh) did not render"
    assert not [e for e in errors if "BokehJS" in e or "Error rendering" in e], errors
    running = [s for s in samples if s["state"] == "RUNNING"]
    assert running, f"the dashboard never showed the job RUNNING: {samples[:3]} ... {samples[-3:]}"
    assert max(s["busySlots"] for s in running) >= 1, "no busy slot shown while the job ran"
    counts = sorted({s["rows"] for s in running if s["rows"] > 0})
    assert len(counts) >= 3, f"the row count did not grow while the job ran: {counts}"
    assert max(s["tableRows"] for s in running) >= 5, "the result table did not fill while the job ran"
    final = samples[-1]
    assert (final["state"], final["rows"], final["sourceRows"]) == ("FINISHED", 9000, 10000), final
    assert (ARTIFACTS / "quickstart-dashboard-running.png").exists()
