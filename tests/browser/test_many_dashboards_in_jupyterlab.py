"""Ten live dashboards in a real JupyterLab, rendered in Debian's chromium, leave the kernel free.

The headless test (tests/kernel_runtime/test_many_dashboards.py) has no frontend: here every
widget update is a comm message the page renders, every Bokeh chart a document patch, and the
page's answers (the widgets' and Bokeh's sync back) come to the kernel as shell messages queued
before the next cell's execute_request. A notebook of the test's own runs an unbounded keyed
job, shows ten live dashboards of it, waits until all of them render and move, then runs
``time.sleep(3)`` and ``%stream_cluster status``: both run to their replies among the page's
traffic, and the boards go on moving after them. How long the cells take is printed (a loaded
machine moves it; bench/dashboards_in_kernel.py measures the kernel's side without a page).
"""
from __future__ import annotations

import json
import time

import pytest

from ..conftest import wait_for
from .conftest import ARTIFACTS, CELLS_DONE, chromium, open_notebook

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

NOTEBOOK = "many-dashboards.ipynb"
DASHBOARDS = 10
CELLS = [
    "%load_ext kernel_runtime",
    "%%stream -o job\n"
    "import pandas as pd\n"
    'env.from_generator(lambda seq: pd.DataFrame({"user": seq % 7}), rate=1000, batch_size=20)'
    '.key_by("user").count().collect()',
    "from IPython.display import display\n"
    "from kernel_runtime.notebook.widgets import Dashboard\n"
    f"boards = [job.dashboard()] + [Dashboard(job) for _ in range({DASHBOARDS - 1})]\n"
    "for board in boards:\n"
    "    display(board)",
    "import time\ntime.sleep(3)\nprint('slept 3 s')",
    "%stream_cluster status",
    "job.cancel()",
]
BOARDS_CELL, SLEEP_CELL, STATUS_CELL, CANCEL_CELL = 2, 3, 4, 5

# After the cancel: the first dashboard's state, and its slots and job graph views (side by side
# when there is room) each a column of its own, their headings apart.
HEADINGS = """(index) => {
  const board = document.querySelectorAll('.jp-Notebook .jp-CodeCell')[index].querySelector('.streamlab-dashboard');
  const box = (selector) => { const r = board.querySelector(selector).getBoundingClientRect();
                              return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
  return {state: board.querySelector('.streamlab-state').dataset.state,
          slots: box('.streamlab-slots'), graph: box('.streamlab-graph')};
}"""

# The dashboards of the cell that shows them: each one's row count (from its result table) and
# its header (the job's duration moves with every update).
BOARDS = """(index) => {
  const cell = document.querySelectorAll('.jp-Notebook .jp-CodeCell')[index];
  return [...cell.querySelectorAll('.streamlab-dashboard')].map(board => {
    const rows = board.querySelector('.streamlab-row-count');
    return {rows: rows ? Number(rows.dataset.rows) : -1,
            status: (board.querySelector('.streamlab-status') || {}).textContent || ''};
  });
}"""

# Starts one cell as a user runs it (select it, run-cell) and times it to the kernel's reply (the
# command's promise settles when the reply arrives); RAN reads the figure once there.
RUN_CELL = """(index) => {
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  panel.content.activeCellIndex = index;
  window._streamlabRan = null;
  const started = performance.now();
  app.commands.execute('notebook:run-cell').then(() => {
    const cell = panel.content.widgets[index];
    window._streamlabRan = {seconds: (performance.now() - started) / 1000, count: cell.model.executionCount,
                            text: cell.outputArea ? cell.outputArea.node.innerText : ''};
  });
}"""
RAN = "() => window._streamlabRan"


def run_cell(page, index: int, timeout: float) -> dict:
    started = time.monotonic()
    page.evaluate(RUN_CELL, index)
    while time.monotonic() - started < timeout:
        if ran := page.evaluate(RAN):
            return ran
        time.sleep(0.1)
    page.screenshot(path=str(ARTIFACTS / "many-dashboards-cell-stuck.png"))
    pytest.fail(f"cell {index} ({CELLS[index].splitlines()[0]}) did not finish in {timeout:g} s")


def notebook(cells: list[str]) -> dict:
    return {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                       "source": source} for source in cells],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}


def test_ten_live_dashboards_in_jupyterlab_leave_the_kernel_free_to_run_cells(jupyterlab):
    from playwright.sync_api import sync_playwright

    base, token, root = jupyterlab
    (root / NOTEBOOK).write_text(json.dumps(notebook(CELLS)))
    with sync_playwright() as p:
        browser = chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            open_notebook(page, base, token, root, NOTEBOOK)
            for index in range(BOARDS_CELL + 1):
                ran = run_cell(page, index, 120)
                assert ran["count"], f"cell {index} did not run: {ran}"

            # Bokeh draws in shadow roots, which Playwright's locators pierce
            charts = page.locator(".jp-Notebook .jp-CodeCell").nth(BOARDS_CELL).locator(".streamlab-throughput canvas")
            deadline = time.monotonic() + 120
            first = boards = page.evaluate(BOARDS, BOARDS_CELL)
            while time.monotonic() < deadline:
                boards = page.evaluate(BOARDS, BOARDS_CELL)
                if len(first) < DASHBOARDS or not all(b["rows"] > 0 for b in first):
                    first = boards
                elif charts.count() >= DASHBOARDS and all(
                        b["rows"] > a["rows"] and b["status"] != a["status"] for a, b in zip(first, boards)):
                    break
                time.sleep(0.5)
            else:
                page.screenshot(path=str(ARTIFACTS / "many-dashboards-not-live.png"), full_page=True)
                pytest.fail(f"not every dashboard rendered and moved ({charts.count()} charts): {first} -> {boards}")
            time.sleep(3)  # the page's own traffic in its steady state, not the first renders

            sleep = run_cell(page, SLEEP_CELL, 60)
            print(f"time.sleep(3): {sleep['seconds']:.2f} s")
            status = run_cell(page, STATUS_CELL, 60)
            # still live after the two cells: every board moves again (a loaded page may hold one
            # board's repaint for a few seconds, so this waits for it rather than sampling once)
            deadline = time.monotonic() + 30
            after = page.evaluate(BOARDS, BOARDS_CELL)
            while not all(b["rows"] > a["rows"] for a, b in zip(boards, after)) and time.monotonic() < deadline:
                time.sleep(0.5)
                after = page.evaluate(BOARDS, BOARDS_CELL)
            page.evaluate("(index) => document.querySelectorAll('.jp-Notebook .jp-CodeCell')[index]"
                          ".scrollIntoView({block: 'start'})", BOARDS_CELL)
            page.screenshot(path=str(ARTIFACTS / "many-dashboards-in-jupyterlab.png"))
            run_cell(page, CANCEL_CELL, 60)
            headings = wait_for(lambda: (h := page.evaluate(HEADINGS, BOARDS_CELL))["state"] == "CANCELED" and h,
                                30, "the dashboard showing the cancel")
            page.evaluate("(index) => document.querySelectorAll('.jp-Notebook .jp-CodeCell')[index]"
                          ".scrollIntoView({block: 'start'})", BOARDS_CELL)
            page.screenshot(path=str(ARTIFACTS / "many-dashboards-after-cancel.png"))
            cells = page.evaluate(CELLS_DONE)
        finally:
            browser.close()

    print(f"%stream_cluster status: {status['seconds']:.2f} s")
    assert sleep["count"] and "slept 3 s" in sleep["text"], sleep  # the cell ran, to its end
    assert status["count"], status
    assert "RUNNING" in status["text"], status["text"][:300]
    assert all(b["rows"] > a["rows"] for a, b in zip(boards, after)), f"the dashboards stopped moving: {boards} -> {after}"
    assert cells["running"] == 0, cells
    slots, graph = headings["slots"], headings["graph"]
    assert graph["left"] >= slots["right"] or graph["top"] >= slots["bottom"], \
        f"after the cancel the slots and the job graph overlap: {headings}"
    assert (ARTIFACTS / "many-dashboards-in-jupyterlab.png").exists()
