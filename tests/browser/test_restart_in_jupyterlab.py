"""03-checkpoints-and-recovery in a real JupyterLab, driven in Debian's chromium by Playwright.

The notebook SIGKILLs a TaskManager of its running job, which restarts from a checkpoint. The
dashboard's header must then say why attempt 2 runs, without looking like a failure: when it
restarted, after what, and which checkpoint it restored (the checkpoint the job's details name).
"""
from __future__ import annotations

import re

import pytest

from .conftest import CELLS_DONE, poll_page, screenshot, tutorial_running

NOTEBOOK = "03-checkpoints-and-recovery.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

HEADER = """() => {
  const board = document.querySelector('.streamlab-dashboard');
  const header = board && board.querySelector('.streamlab-status');
  if (!header) { return null; }
  const part = cls => { const e = header.querySelector(cls); return e ? e.textContent : null; };
  return {state: part('.streamlab-state'), attempt: part('.streamlab-attempt'), restart: part('.streamlab-restart'),
          cause: part('.streamlab-cause')};
}"""


def test_a_killed_taskmanager_is_explained_in_the_header_of_the_restarted_job(jupyterlab):
    with tutorial_running(jupyterlab, NOTEBOOK) as page:
        seen = poll_page(page, HEADER, lambda h: bool(h and h["restart"]), "the header never explained the restart",
                         "restart-timeout.png")
        screenshot(page, "restart-explained-in-header.png")
        # the notebook runs on to its end; the restored checkpoint its job's details name
        page.wait_for_function(f"() => ({CELLS_DONE})().done === ({CELLS_DONE})().total", timeout=240_000)
        restored = page.evaluate("""() => {
          const counts = document.querySelector('.streamlab-dashboard .streamlab-checkpoint-counts');
          return counts ? counts.dataset.restoredId : null; }""")
        final = page.evaluate(HEADER)
    assert seen["attempt"] == "attempt 2" and seen["cause"] is None, seen  # news, not a failure in red
    match = re.fullmatch(r"restarted \d\d:\d\d:\d\d after (.+); restored checkpoint (\d+)", seen["restart"])
    assert match, seen
    assert "TaskManager" in match[1] or "tm-" in match[1], seen
    assert final["state"] == "FINISHED" and final["restart"] == seen["restart"], final
    assert match[2] == restored, (seen, restored)  # the checkpoint view names the same one
