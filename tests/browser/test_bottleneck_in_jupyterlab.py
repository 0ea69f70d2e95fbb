"""02-keyed-streams-and-backpressure in a real JupyterLab, driven in Debian's chromium by Playwright.

Its first job's slow step holds the job back and back-pressures the source. The dashboard's job
graph must draw it as Flink's job graph does: the slow step red and named the bottleneck, the
source (which only waits for it) grey to black and not named; so must its back pressure table, and
its header must say it in words.
"""
from __future__ import annotations

import re

import pytest

from .conftest import ARTIFACTS, poll_page, tutorial_running

NOTEBOOK = "02-keyed-streams-and-backpressure.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

# The first dashboard's job graph and back pressure table, as the page shows them
GRAPH = """() => {
  const board = document.querySelector('.streamlab-dashboard');
  if (!board) { return null; }
  const vertices = [...board.querySelectorAll('.streamlab-graph g.streamlab-vertex')].map(g => ({
    texts: [...g.querySelectorAll('text')].map(t => t.textContent),
    fill: g.querySelector('rect').getAttribute('fill'),
    state: g.dataset.state, bottleneck: g.dataset.bottleneck}));
  const rows = [...board.querySelectorAll('.streamlab-backpressure table tr')].slice(1).map(tr => ({
    text: tr.textContent, bottleneck: !!tr.querySelector('[data-bottleneck]')}));
  const named = board.querySelector('.streamlab-bottleneck-text');
  return {vertices, rows, named: named && {vertex: named.dataset.vertex, text: named.textContent}};
}"""


def hsl(color: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"hsl\((\d+), (\d+)%, (\d+)%\)", color or "")
    return tuple(int(v) for v in match.groups()) if match else (-1, -1, -1)


def drawn_as_flink_draws_it(graph) -> bool:
    if not graph:
        return False
    # a vertex by one of its operators' names (the lines after its figures)
    by_name = {name: next((v for v in graph["vertices"] if name in v["texts"][2:]), None)
               for name in ("enrich (slow)", "clicks")}
    slow, source = by_name["enrich (slow)"], by_name["clicks"]
    if not slow or not source or slow["state"] != "RUNNING" or source["state"] != "RUNNING":
        return False
    slow_hue, slow_saturation, _ = hsl(slow["fill"])
    _, source_saturation, source_lightness = hsl(source["fill"])
    return (slow["bottleneck"] == "1" and 0 <= slow_hue <= 40 and slow_saturation > 0  # red: busy
            and source["bottleneck"] == "0" and source_saturation == 0 and 0 <= source_lightness <= 60)  # dark


def test_the_slow_step_of_notebook_02_is_drawn_red_and_named_and_its_source_is_not(jupyterlab):
    with tutorial_running(jupyterlab, NOTEBOOK) as page:
        seen = poll_page(page, GRAPH, lambda g: drawn_as_flink_draws_it(g) and
                         [r["bottleneck"] for r in g["rows"]] == [False, True, False] and g["named"] is not None,
                         "the slow step was never drawn red and named, nor the source dark", "bottleneck-timeout.png")
        page.locator(".streamlab-dashboard .streamlab-graph").first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "bottleneck-notebook-02-graph.png"))
    assert "slow" in next(r["text"] for r in seen["rows"] if r["bottleneck"])
    # and the header says it in words, with what helps (GET /jobs/<id>/bottleneck)
    assert "enrich (slow)" in seen["named"]["vertex"] and "limits the job" in seen["named"]["text"]
