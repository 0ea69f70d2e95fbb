"""08-streaming-sql in a real JupyterLab, driven in Debian's chromium by Playwright.

Its ``%%stream_sql`` cells (a running aggregate, a windowed one, an interval join of two views
and an aggregation over a join) must each show a dashboard whose job graph names the SQL operators
(the join, the keyed state), whose job finishes, and whose result table fills; the notebook's own
cells compare each result with pandas and must say True.
"""
from __future__ import annotations

import pytest

from .conftest import ARTIFACTS, CELLS_DONE, poll_page, tutorial_running

NOTEBOOK = "08-streaming-sql.ipynb"
REFUSED = "5e165e96"  # the section whose cell is refused: the run stops before it
JOBS = {"revenue per city", "revenue per city (API)", "revenue per second", "paid within 2 s",
        "card payments per city"}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

BOARDS = """() => [...document.querySelectorAll('.streamlab-dashboard')].map(board => ({
  name: (board.textContent.match(/Job '([^']*)'/) || [])[1] || '',
  state: (board.querySelector('.streamlab-state') || {dataset: {}}).dataset.state || '',
  vertices: [...board.querySelectorAll('.streamlab-vertex')].map(v => v.textContent),
  // the rows the results view holds (its grid draws them once scrolled into view)
  tableRows: Number((board.querySelector('.streamlab-row-count') || {dataset: {rows: 0}}).dataset.rows),
}))"""

OUTPUTS = """() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].map(cell =>
  [...cell.querySelectorAll('.jp-OutputArea-output')].map(o => o.textContent).join('\\n'))"""


def all_finished(boards) -> bool:
    """Every job finished and its results view filled: the view is a widget of its own, so its
    last rows can reach the page after the state does."""
    rows = {b["name"]: b["tableRows"] for b in boards}
    return (rows.keys() >= JOBS and all(b["state"] == "FINISHED" for b in boards)
            and all(rows[name] >= 3 for name in JOBS))


def test_notebook_08s_stream_sql_cells_run_with_their_dashboards_and_results(jupyterlab):
    with tutorial_running(jupyterlab, NOTEBOOK, until=REFUSED) as page:
        boards = poll_page(page, BOARDS, all_finished, "the %%stream_sql jobs did not all finish and fill their tables",
                           "stream-sql-timeout.png", timeout=360)
        poll_page(page, CELLS_DONE, lambda c: c["total"] and c["done"] == c["total"] and not c["running"],
                  "the notebook's cells did not all run", "stream-sql-cells-timeout.png")
        outputs = page.evaluate(OUTPUTS)
        join = page.locator(".streamlab-dashboard").nth([b["name"] for b in boards].index("paid within 2 s"))
        join.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "stream-sql-join-dashboard.png"))
    by_name = {b["name"]: b for b in boards}
    texts = lambda name: " ".join(by_name[name]["vertices"])  # noqa: E731
    assert "paid within 2 s: JOIN payments p" in texts("paid within 2 s")
    assert "card payments per city: JOIN" in texts("card payments per city")
    assert "revenue per city: GROUP BY city" in texts("revenue per city")
    # the notebook's own checks against pandas (the joins' among them) said True
    checks = [o for o in outputs if o.strip().endswith("True") or o.strip().endswith("True)")]
    assert len(checks) >= 4 and not any("False" in o for o in checks), outputs
    assert not [o for o in outputs if "Traceback" in o or "Error" in o], outputs
