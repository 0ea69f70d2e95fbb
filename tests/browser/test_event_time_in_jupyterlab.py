"""04-event-time-and-windows in a real JupyterLab, driven in Debian's chromium by Playwright.

Its first job sends rows too late for their windows to a side output: the dashboard's event-time
view must list them, the window's count of late rows and its newest five, each with its event time,
the watermark that made it late and its columns. A later job reads a watched folder with one file
at parallelism 2, so one source subtask reads nothing and no window fires: its dashboard must say
which window waits and that it waits for that subtask (the notebook runs up to where it cancels
that job, so it stays running).
"""
from __future__ import annotations

import pytest

from .conftest import ARTIFACTS, poll_page, tutorial_running

NOTEBOOK = "04-event-time-and-windows.ipynb"
CANCEL_WAITING = "c3e5a7b9"  # the cell that cancels the job whose window waits

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# Each dashboard's late rows and window waits, as the page shows them
EVENT_TIME = """() => [...document.querySelectorAll('.streamlab-dashboard')].map(board => {
  const late = board.querySelector('.streamlab-late-rows');
  const rows = late ? [...late.nextElementSibling.querySelectorAll('tr')].slice(1).map(
    tr => [...tr.querySelectorAll('td')].map(td => td.textContent)) : [];
  const waits = [...board.querySelectorAll('.streamlab-window-wait')].map(w => ({
    operator: w.dataset.operator, vertex: w.dataset.heldVertex, subtask: w.dataset.heldSubtask, text: w.textContent}));
  return {name: (board.textContent.match(/Job '([^']*)'/) || [])[1] || '',
          late: late && {operator: late.dataset.operator, count: Number(late.dataset.count), text: late.textContent},
          rows, waits};
})"""


def late_listed(boards) -> bool:
    return bool(boards) and boards[0]["late"] is not None and boards[0]["late"]["count"] == 27 \
        and len(boards[0]["rows"]) == 5


def test_notebook_04s_dashboards_list_late_rows_and_say_why_a_window_waits(jupyterlab):
    with tutorial_running(jupyterlab, NOTEBOOK, until=CANCEL_WAITING) as page:
        # the notebook's own cell says 27 rows came too late (nbval checks it); the newest five shown
        boards = poll_page(page, EVENT_TIME, late_listed, "the dashboard never listed the window's 27 late rows",
                           "late-rows-timeout.png")
        page.locator(".streamlab-dashboard .streamlab-late-rows").first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "late-rows-notebook-04.png"))
        late, rows = boards[0]["late"], boards[0]["rows"]
        assert late["operator"] == "window" and 'to side output "late"' in late["text"]
        # the newest first: late clicks of the notebook's generator (seq % 37 == 36, 2.5 s back)
        seqs = [int(next(part for part in row[3].split(", ") if part.startswith("seq=")).removeprefix("seq="))
                for row in rows]
        assert seqs == sorted(seqs, reverse=True) and {s % 37 for s in seqs} == {36}
        assert all(row[2].endswith(" s") for row in rows)  # late by seconds, not milliseconds

        # the job 'waiting' (a running job's open windows wait too, briefly: the first job's may, if
        # it has not finished yet)
        boards = poll_page(page, EVENT_TIME, lambda b: any(board["waits"] for board in b if board["name"] == "waiting"),
                           "the dashboard of 'waiting' never said why its window does not fire",
                           "window-wait-timeout.png")
        (wait,) = next(board["waits"] for board in boards if board["name"] == "waiting")
        page.locator(".streamlab-dashboard", has_text="Job 'waiting'").locator(
            ".streamlab-window-wait").first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "window-wait-notebook-04.png"))
    assert wait["operator"] == "window" and wait["vertex"].startswith("Source: csv source")
    assert f"It waits for subtask {wait['subtask']} of 'Source: csv source" in wait["text"]
    assert "which has no watermark yet" in wait["text"] and "with_idleness" in wait["text"]
