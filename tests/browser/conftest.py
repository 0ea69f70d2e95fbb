"""A real JupyterLab and Debian's chromium for the browser tests (Playwright drives the page).

The fixture starts JupyterLab itself: a token, news off, fresh settings and workspace folders,
the BokehJS server extension on. Screenshots go to test-artifacts/ (CI keeps them).
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from kernel_runtime.deploy.ha import free_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


def api(base: str, token: str, path: str, method: str = "GET"):
    request = urllib.request.Request(f"{base}{path}", method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
        return json.loads(body) if body else None


@pytest.fixture
def jupyterlab(tmp_path):
    """A JupyterLab of the test's own; yields (base URL, token, root folder). Tests copy the
    notebooks they open into the root folder."""
    with start_jupyterlab(tmp_path) as lab:
        yield lab


@contextlib.contextmanager
def start_jupyterlab(tmp_path: Path):
    """The fixture's JupyterLab, for the benchmarks too (bench/lab_panel.py)."""
    root = tmp_path / "work"
    root.mkdir()
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
        {"ServerApp": {"jpserver_extensions": {"kernel_runtime.notebook.widgets.bokeh_resources": True}}}))
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


# the rows a dashboard's results grid draws: Perspective's datagrid keeps its table (a
# regular-table, which draws the rows in view) in its shadow root. Use as `(GRID_ROWS)(board)`.
GRID_ROWS = """(board) => [...board.querySelectorAll('.streamlab-results perspective-viewer-datagrid')]
  .map(g => g.shadowRoot ? g.shadowRoot.querySelectorAll('regular-table tbody tr').length : 0)
  .reduce((a, b) => a + b, 0)"""


def screenshot(page, name: str) -> None:
    page.evaluate("() => { const b = document.querySelector('.streamlab-dashboard');"
                  " if (b) { b.scrollIntoView({block: 'start'}); } }")
    page.screenshot(path=str(ARTIFACTS / name))




def chromium(playwright):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (make system-deps)")
    ARTIFACTS.mkdir(exist_ok=True)
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)


def open_notebook(page, base: str, token: str, root: Path, notebook: str) -> None:
    """Open a notebook of the root folder, wait for its kernel and clear the saved outputs (so a
    counted cell is one that ran now)."""
    code_cells = sum(c["cell_type"] == "code" for c in json.loads((root / notebook).read_text())["cells"])
    page.goto(f"{base}/lab/tree/{notebook}?token={token}")
    page.wait_for_function(f"() => window.jupyterapp && ({CELLS_DONE})().total === {code_cells}",
                           timeout=60_000)
    page.wait_for_function(KERNEL_READY, timeout=60_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
    page.wait_for_function(f"() => ({CELLS_DONE})().done === 0")


@contextlib.contextmanager
def tutorial_running(jupyterlab, notebook: str, until: Optional[str] = None):
    """A copy of a tutorial (notebooks/) opened in chromium, all its cells started (not awaited);
    yields the page. ``until``: the copy ends before the cell of that id (a job the test looks at
    keeps running). The browser closes after."""
    from playwright.sync_api import sync_playwright
    base, token, root = jupyterlab
    tutorial = json.loads((ROOT / "notebooks" / notebook).read_text())
    if until is not None:
        tutorial["cells"] = tutorial["cells"][:[c.get("id") for c in tutorial["cells"]].index(until)]
    (root / notebook).write_text(json.dumps(tutorial))
    with sync_playwright() as p:
        browser = chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            open_notebook(page, base, token, root, notebook)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            page.wait_for_function(f"() => ({CELLS_DONE})().running > 0", timeout=30_000)
            yield page
        finally:
            browser.close()


def poll_page(page, probe: str, done: Callable[[Any], bool], what: str, shot: str, timeout: float = 300):
    """What ``probe`` (a JS function) reads of the page, once ``done`` says it is what the test waits
    for; a screenshot ``shot`` and a failure naming ``what`` if it never is."""
    seen = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = page.evaluate(probe)
        if done(seen):
            return seen
        time.sleep(0.25)
    screenshot(page, shot)
    pytest.fail(f"{what}: {seen}")
