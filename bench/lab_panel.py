"""What the Streams side panel costs a running job: its throughput with the panel open and
refreshing (once a second) vs closed.

A real JupyterLab (the browser tests' own, tests/browser/conftest.py) and Debian's chromium: a
notebook starts an embedded 2 x 2 cluster and one unbounded keyed job at full speed; after a
warm-up the bench alternates windows with the panel shown and collapsed (collapsed, it must not
refresh at all: the panel's refresh count is read to show it), measuring the source's records out
per second over each window through the server's own API. Everything shares the machine's cores, as in real use:
the page's rendering, the Jupyter server's JobManager requests, the kernel and the cluster.

    .venv/bin/python bench/lab_panel.py [--window 15] [--rounds 4] [--warmup 30]

Needs the lab extension built and installed (make setup) and /usr/bin/chromium (make system-deps).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.browser.conftest import CELLS_DONE, CHROMIUM, CHROMIUM_FLAGS, api, open_notebook, start_jupyterlab  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--window", type=float, default=15.0, help="Seconds measured per window.")
parser.add_argument("--rounds", type=int, default=4, help="Pairs of windows, open then closed and closed then open in turn.")
parser.add_argument("--warmup", type=float, default=30.0, help="Seconds the job runs before the first window.")
parser.add_argument("--settle", type=float, default=2.0, help="Seconds after each toggle before measuring.")
args = parser.parse_args()

NOTEBOOK = "bench-lab-panel.ipynb"
JOB = "bench keyed count"
CELLS = [
    "%load_ext kernel_runtime",
    "%stream_cluster start --taskmanagers 2 --slots 2",
    "import pandas as pd\n\ndef users(seq):\n    return pd.DataFrame({'user': seq % 1000})",
    f'%%stream --name "{JOB}" --parallelism 2 --mode update -o job\n'
    'env.from_generator(users).key_by("user").count().collect()',
]

PANEL = """() => { const w = [...window.jupyterapp.shell.widgets('left')].find(w => w.id === 'streamlab-streams');
                   return w ? {visible: w.isVisible, refreshes: w.refreshCount} : null; }"""


def source_rows(base: str, token: str) -> tuple[float, int, str]:
    """(time, records out of the job's source vertices, job state), from the server extension."""
    clusters = api(base, token, "/streamlab/api/clusters")["clusters"]
    found = [(c["id"], j) for c in clusters for j in c["jobs"] if j["name"] == JOB]
    if not found:
        raise RuntimeError(f"the job {JOB!r} is not listed: {json.dumps(clusters)[:500]}")
    cid, job = found[0]
    detail = api(base, token, f"/streamlab/api/clusters/{cid}/jobs/{job['id']}")
    targets = {e["target"] for e in detail["edges"]}
    rows = sum(v["records_out"] for v in detail["vertices"] if v["id"] not in targets)
    return time.monotonic(), rows, detail["job"]["state"]


def set_panel(page, shown: bool) -> None:
    if shown:
        page.evaluate("() => window.jupyterapp.commands.execute('streamlab:show-panel')")
    else:
        page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
    page.wait_for_function(f"() => ({PANEL})().visible === {str(shown).lower()}", timeout=10_000)


def main() -> None:
    from playwright.sync_api import sync_playwright

    print(f"window {args.window:g} s, {args.rounds} rounds (panel open, then closed); {os.cpu_count()} cores")
    with start_jupyterlab(Path(tempfile.mkdtemp(prefix="bench-lab-panel-"))) as (base, token, root):
        cells = [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": c}
                 for c in CELLS]
        (root / NOTEBOOK).write_text(json.dumps({"cells": cells, "nbformat": 4, "nbformat_minor": 5, "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}))
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            try:
                open_notebook(page, base, token, root, NOTEBOOK)
                if not page.evaluate("() => window.jupyterapp.hasPlugin('streamlab-labext:panel')"):
                    sys.exit("JupyterLab did not load streamlab-labext: run `make setup`")
                page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
                page.wait_for_function(f"() => ({CELLS_DONE})().done === {len(CELLS)}", timeout=180_000)
                deadline = time.monotonic() + 120
                while source_rows(base, token)[1] == 0:
                    if time.monotonic() > deadline:
                        sys.exit("the job produced no rows in 120 s")
                    time.sleep(0.5)
                time.sleep(args.warmup)  # its throughput climbs for a while after the start
                rates: dict[bool, list[float]] = {True: [], False: []}
                print(f"{'panel':>7} {'rows/s':>10} {'panel refreshes':>16}")
                for round_ in range(args.rounds):
                    # open-closed, then closed-open: a drift in throughput favours neither
                    for shown in ((True, False) if round_ % 2 == 0 else (False, True)):
                        set_panel(page, shown)
                        time.sleep(args.settle)
                        refreshes0 = page.evaluate(PANEL)["refreshes"]
                        t0, rows0, _ = source_rows(base, token)
                        time.sleep(args.window)
                        t1, rows1, state = source_rows(base, token)
                        refreshes = page.evaluate(PANEL)["refreshes"] - refreshes0
                        if state != "RUNNING":
                            sys.exit(f"the job is {state}: the measurement is void")
                        rate = (rows1 - rows0) / (t1 - t0)
                        rates[shown].append(rate)
                        print(f"{'open' if shown else 'closed':>7} {rate:>10,.0f} {refreshes:>16}")
                        if not shown and refreshes:
                            print(f"        ! the collapsed panel refreshed {refreshes} times")
            finally:
                browser.close()
    opened, closed = statistics.mean(rates[True]), statistics.mean(rates[False])
    spread = max(statistics.pstdev(rates[True]), statistics.pstdev(rates[False]))
    # each round's open window beside its closed one: a load that drifts (other work on the
    # machine) moves both alike, so the median of these ratios is the steadier figure
    pairs = [o / c for o, c in zip(rates[True], rates[False])]
    print(f"mean rows/s: panel open {opened:,.0f}, closed {closed:,.0f}; open/closed = {opened / closed:.3f} "
          f"(window-to-window spread ±{spread:,.0f} rows/s)")
    print(f"open/closed per round: {', '.join(f'{r:.2f}' for r in pairs)}; median {statistics.median(pairs):.3f}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
