"""01-quickstart in a real JupyterLab, driven in Debian's chromium by Playwright.

Opens a copy of the notebook, runs every cell, and watches the page while the first job runs:
the dashboard must render (its Bokeh charts too) and change while the job runs: busy slots, a
growing row count, a filling result table.
"""
from __future__ import annotations

import shutil
import time

import pytest

from .conftest import ARTIFACTS, CELLS_DONE, GRID_ROWS, ROOT, chromium, open_notebook, screenshot

NOTEBOOK = "01-quickstart.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

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
    tableRows: (""" + GRID_ROWS + """)(board),
    sourceRows: Number((board.querySelector('.streamlab-source-rows') || {dataset: {rows: -1}}).dataset.rows),
  };
}"""


def test_quickstart_runs_and_its_dashboard_moves(jupyterlab):
    from playwright.sync_api import sync_playwright

    base, token, root = jupyterlab
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, root / NOTEBOOK)
    samples = []
    with sync_playwright() as p:
        browser = chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        try:
            open_notebook(page, base, token, root, NOTEBOOK)
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
    # two counts between none and all: it grew while the job ran (a loaded CI machine samples the
    # page only every second or two, and the job's rows take about ten)
    counts = sorted({s["rows"] for s in running if 0 < s["rows"] < 9000})
    assert len(counts) >= 2, f"the row count did not grow while the job ran: {counts}"
    assert max(s["tableRows"] for s in running) >= 5, "the result table did not fill while the job ran"
    final = samples[-1]
    assert (final["state"], final["rows"], final["sourceRows"]) == ("FINISHED", 9000, 10000), final
    assert (ARTIFACTS / "quickstart-dashboard-running.png").exists()
