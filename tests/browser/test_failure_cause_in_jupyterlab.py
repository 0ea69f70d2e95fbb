"""A failing %%stream cell in a real JupyterLab, in Debian's chromium: the dashboard's header says
the root cause in one line, naming the cell line, without a frame of streamlab; the user's
traceback is one click away; `.wait()` shows the same line. Screenshot: failure-cause.png."""
from __future__ import annotations

import json
import time

import pytest

from .conftest import ARTIFACTS, CELLS_DONE, chromium, open_notebook, screenshot

NOTEBOOK = "failing-cell.ipynb"
CELLS = [
    "%load_ext kernel_runtime\nimport pandas as pd",
    "%%stream -o job\n"
    "def shout(df):\n"
    "    return df.assign(city=df.cty.str.upper())\n"
    "\n"
    "cities = env.from_generator(lambda seq: pd.DataFrame({'city': ['Oslo', 'Lima'] * (len(seq) // 2)}),\n"
    "                            count=100, batch_size=10)\n"
    "cities.map_batches(shout, name='shout').collect()",
    "job.wait(120)",
]
CAUSE = "AttributeError: 'DataFrame' object has no attribute 'cty', in operator 'shout' (In [{n}], line 3)"
FRAMEWORK = ("cluster/", "kernel_runtime/", "task.py", "client.py", "threading", "py4j", "ipykernel_")

BOARD = """() => {
  const board = document.querySelector('.streamlab-dashboard');
  if (!board) { return null; }
  const state = board.querySelector('.streamlab-state');
  const header = board.querySelector('.streamlab-status');
  const cause = board.querySelector('.streamlab-failure');
  const details = board.querySelector('details.streamlab-traceback');
  return {state: state ? state.dataset.state : '', header: header ? header.innerText : '',
          cause: cause ? cause.innerText : '', details: !!details, open: !!(details && details.open),
          trace: details ? details.querySelector('pre').textContent : ''};
}"""
# the execution count of the %%stream cell, as its prompt shows it ("[3]:")
STREAM_CELL_COUNT = """() => Number(document.querySelectorAll('.jp-Notebook .jp-CodeCell')[1]
  .querySelector('.jp-InputArea-prompt').textContent.replace(/[^0-9]/g, ''))"""


def notebook() -> dict:
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "cells": [{"cell_type": "code", "id": f"cell-{i}", "metadata": {}, "execution_count": None,
                       "outputs": [], "source": source} for i, source in enumerate(CELLS)]}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_header_of_a_failed_job_says_its_root_cause_and_the_cell_line(jupyterlab):
    from playwright.sync_api import sync_playwright

    base, token, root = jupyterlab
    (root / NOTEBOOK).write_text(json.dumps(notebook()))
    with sync_playwright() as p:
        browser = chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            open_notebook(page, base, token, root, NOTEBOOK)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")  # not awaited
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                board, cells = page.evaluate(BOARD), page.evaluate(CELLS_DONE)
                if board and board["state"] == "FAILED" and board["details"] and cells["done"] == len(CELLS):
                    break
                time.sleep(0.25)
            else:
                screenshot(page, "failure-cause-timeout.png")
                pytest.fail(f"the job did not fail in the page: {page.evaluate(BOARD)} {page.evaluate(CELLS_DONE)}")
            closed = board
            page.locator(".streamlab-dashboard details.streamlab-traceback summary").first.click()
            page.wait_for_function("() => document.querySelector('details.streamlab-traceback').open")
            board = page.evaluate(BOARD)
            screenshot(page, "failure-cause.png")
            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            wait_error = "\n".join(errors.nth(i).inner_text() for i in range(errors.count()))
            n = page.evaluate(STREAM_CELL_COUNT)
        finally:
            browser.close()

    headline = CAUSE.format(n=n)
    assert headline in closed["header"], closed["header"]
    assert "not restarted" not in closed["header"] and "restart-strategy.type is none" in closed["cause"]
    assert not closed["open"] and board["open"]  # the traceback is behind one click
    assert f"In [{n}], line 3, in shout\n    return df.assign(city=df.cty.str.upper())" in board["trace"]
    assert board["trace"].rstrip().endswith("AttributeError: 'DataFrame' object has no attribute 'cty'")
    for name in FRAMEWORK:
        assert name not in board["header"] + board["cause"] + board["trace"], name
    # .wait() in the next cell: the same line, the user's traceback below it, no client frames
    assert f"JobExecutionError: {headline}" in wait_error, wait_error
    assert f"In [{n}], line 3, in shout" in wait_error
    for name in FRAMEWORK:
        assert name not in wait_error, name
    assert (ARTIFACTS / "failure-cause.png").exists()
