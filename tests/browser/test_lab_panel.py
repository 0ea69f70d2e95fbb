"""The lab extension (labext/) in a real JupyterLab, driven in Debian's chromium by Playwright.

A notebook of the test's own starts an embedded cluster of 2 TaskManagers x 2 slots and an
unbounded, rate-limited keyed job. The Streams side panel must list that cluster and the job
RUNNING with a growing records-out count; the status bar must show the kernel's cluster's slots;
the notebook command "Export this %%stream cell as a job" must write a package to disk; the
panel's cancel button must end the job, CANCELED in the panel and in the kernel's job handle. A
second job, started by another cell, is ended by the notebook command "Cancel this cell's job"
(which finds the job in the cell's output).
"""
from __future__ import annotations

import json
import os
import re
import time

import pytest

from ..conftest import wait_for
from .conftest import ARTIFACTS, CELLS_DONE, api, chromium, open_notebook

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

NOTEBOOK = "lab-panel.ipynb"
JOB = "panel keyed count"
OTHER = "cancelled by its cell"
CELLS = [
    "%load_ext kernel_runtime",
    "%stream_cluster start --taskmanagers 2 --slots 2",
    "import pandas as pd\n\ndef users(seq):\n    return pd.DataFrame({'user': seq % 7})",
    f'%%stream --name "{JOB}" --parallelism 2 -o job\n'
    'env.from_generator(users, rate=400, batch_size=20).key_by("user").count().collect()',
    f'%%stream --name "{OTHER}" -o other\n'
    'env.from_generator(users, rate=100, batch_size=10).collect()',
]
STREAM_CELL, OTHER_CELL = 3, 4

# The panel's view of the job (the first cluster of the notebook's kernel that lists it).
PANEL_JOB = """(name) => {
  const panel = document.querySelector('.streamlab-panel');
  if (!panel) { return {panel: false}; }
  const clusters = [...panel.querySelectorAll('.streamlab-cluster')].map(c => ({
    id: c.dataset.clusterId, source: c.dataset.source, name: c.querySelector('.streamlab-cluster-name').textContent,
    error: c.querySelector('.streamlab-cluster-error').hidden ? null : c.querySelector('.streamlab-cluster-error').textContent,
    taskmanagers: c.querySelectorAll('.streamlab-taskmanager').length,
    busySlots: c.querySelectorAll('.streamlab-slot[data-state="busy"]').length}));
  const job = [...panel.querySelectorAll('.streamlab-job')].find(
    j => j.querySelector('.streamlab-job-name').textContent === name);
  return {panel: true, visible: panel.offsetParent !== null, clusters,
          job: job ? {id: job.dataset.jobId, state: job.dataset.state, recordsOut: Number(job.dataset.recordsOut),
                      shownOut: job.querySelector('.streamlab-job-records-out').textContent,
                      backpressure: job.querySelector('.streamlab-job-backpressure').textContent,
                      cluster: job.closest('.streamlab-cluster').dataset.clusterId} : null};
}"""

PANEL_WIDGET = "[...window.jupyterapp.shell.widgets('left')].find(w => w.id === 'streamlab-streams')"
PANEL_SHOWN = f"() => {PANEL_WIDGET}.isVisible"
REFRESHES = f"() => {PANEL_WIDGET}.refreshCount"

STATUS = """() => { const item = document.querySelector('.streamlab-statusbar');
  return item ? {hidden: item.hidden, text: item.textContent} : null; }"""

# Runs code in the notebook's kernel outside any cell and returns what it printed.
KERNEL_PRINT = """async (code) => {
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  const future = kernel.requestExecute({code, store_history: false, silent: false});
  let out = '';
  future.onIOPub = (msg) => {
    if (msg.header.msg_type === 'stream') { out += msg.content.text; }
    if (msg.header.msg_type === 'error') { out += msg.content.ename + ': ' + msg.content.evalue; }
  };
  await future.done;
  return out;
}"""


EDGES = """() => [...document.querySelectorAll('.streamlab-jobview .streamlab-graph-edge')].map(e => ({
  source: e.dataset.source, target: e.dataset.target, strategy: e.dataset.shipStrategy,
  label: e.querySelector('text').textContent, d: e.querySelector('path').getAttribute('d')}))"""


def notebook() -> dict:
    cells = [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": source}
             for source in CELLS]
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                         "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def wait_panel(page, predicate, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = page.evaluate(PANEL_JOB, JOB)
        if predicate(seen):
            return seen
        time.sleep(0.25)
    page.screenshot(path=str(ARTIFACTS / "lab-panel-timeout.png"))
    pytest.fail(f"the Streams panel never showed {what}; last seen: {seen}")


@pytest.fixture
def standing_cluster_down(tmp_path, monkeypatch):
    """A standing cluster named in the server's setting whose JobManager is not running (its
    directory is empty): the panel must show its error beside the working clusters. Set before
    the jupyterlab fixture starts the server (fixtures start in the order a test names them)."""
    config, gone = tmp_path / "config-standing", tmp_path / "standing-down"
    config.mkdir()
    gone.mkdir()
    (config / "jupyter_server_config.json").write_text(json.dumps({"StreamlabLab": {"cluster_dirs": [str(gone)]}}))
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", os.pathsep.join(
        [str(config)] + ([os.environ["JUPYTER_CONFIG_PATH"]] if os.environ.get("JUPYTER_CONFIG_PATH") else [])))
    return gone


# show the main-area widget that ``test`` (a JS expression of w) picks
ACTIVATE = "() => window.jupyterapp.shell.activateById([...window.jupyterapp.shell.widgets('main')].find(w => {test}).id)"


def test_streams_panel_status_bar_export_and_cancel(standing_cluster_down, jupyterlab):
    from playwright.sync_api import sync_playwright

    base, token, root = jupyterlab
    (root / NOTEBOOK).write_text(json.dumps(notebook()))
    with sync_playwright() as p:
        browser = chromium(p)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        errors = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        try:
            open_notebook(page, base, token, root, NOTEBOOK)
            plugins = page.evaluate("() => window.jupyterapp.hasPlugin('streamlab-labext:panel')")
            assert plugins, "JupyterLab did not load streamlab-labext: `make setup` builds and installs it"
            page.evaluate("() => window.jupyterapp.commands.execute('streamlab:show-panel')")
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            page.wait_for_function(f"() => ({CELLS_DONE})().done === {len(CELLS)}", timeout=180_000)

            # The panel: the notebook's embedded cluster, its job RUNNING, records out growing.
            first = wait_panel(page, lambda s: s["job"] and s["job"]["state"] == "RUNNING"
                               and s["job"]["recordsOut"] > 0 and any(c["busySlots"] == 3 for c in s["clusters"]),
                               "the job RUNNING with records out, and both jobs' slots busy")
            second = wait_panel(page, lambda s: s["job"]["recordsOut"] > first["job"]["recordsOut"],
                                "records out growing", timeout=30)
            page.screenshot(path=str(ARTIFACTS / "lab-panel-running.png"))
            cluster = next(c for c in second["clusters"] if c["id"] == second["job"]["cluster"])
            assert (cluster["source"], cluster["name"], cluster["error"]) == ("kernel", NOTEBOOK, None), cluster
            assert cluster["taskmanagers"] == 2 and cluster["busySlots"] == 3, cluster
            assert second["job"]["shownOut"] == f"{second['job']['recordsOut']:,}", second["job"]
            assert second["job"]["backpressure"] in ("ok", "low", "high"), second["job"]
            down = [c for c in second["clusters"] if c["source"] == "setting"]
            assert [c["name"] for c in down] == [standing_cluster_down.name] and down[0]["error"] \
                and down[0]["taskmanagers"] == 0, second["clusters"]
            # what the panel shows is the server's answer, which the JobManager gave
            listed = api(base, token, "/streamlab/api/clusters")["clusters"]
            served = next(j for c in listed if c["id"] == cluster["id"] for j in c["jobs"] if j["name"] == JOB)
            assert served["id"] == second["job"]["id"] and served["records_out"] >= second["job"]["recordsOut"]

            # It refreshes only while shown: collapsed, it asks nothing; shown again, it does.
            refreshes = page.evaluate(REFRESHES)
            page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
            page.wait_for_function(f"() => !({PANEL_SHOWN})()")
            hidden_from = page.evaluate(REFRESHES)
            # the status bar's own refresher (every 2 s, on the page's same timers) asks three more
            # times: long enough for the panel (every 1 s) to have refreshed at least four times
            for _ in range(3):
                with page.expect_request(lambda r: re.search(r"/streamlab/api/kernels/[^/?]+/cluster", r.url),
                                         timeout=30_000):
                    pass
            assert page.evaluate(REFRESHES) == hidden_from, "the collapsed panel kept refreshing"
            page.evaluate("() => window.jupyterapp.commands.execute('streamlab:show-panel')")
            page.wait_for_function(f"() => ({REFRESHES})() > {hidden_from}", timeout=10_000)
            assert refreshes > 0, refreshes

            # The status bar: the current notebook's kernel's cluster, 2 + 1 of its 4 slots in use.
            page.wait_for_function(f"() => ({STATUS})() && ({STATUS})().text === 'Slots: 3/4'"
                                   f" && !({STATUS})().hidden", timeout=20_000)

            # The job view: its graph, a box per vertex with its back pressure.
            page.click(f".streamlab-job[data-job-id='{second['job']['id']}'] .streamlab-job-name")
            page.wait_for_selector(".streamlab-jobview .streamlab-vertex[data-backpressure]", timeout=20_000)
            vertices = page.locator(".streamlab-jobview .streamlab-vertex").count()
            assert vertices >= 2, f"the job view shows {vertices} vertices"
            # drawn as a graph, left to right: an arrow from the source's box to the count's, with its ship strategy
            page.wait_for_function("() => document.querySelectorAll('.streamlab-jobview .streamlab-graph-edge path')"
                                   ".length > 0", timeout=20_000)
            edges = page.evaluate(EDGES)
            assert [e["strategy"] for e in edges] == ["HASH"] and edges[0]["label"] == "HASH", edges
            source, count = (page.locator(f".streamlab-jobview .streamlab-vertex[data-vertex-id='{edges[0][end]}']")
                             .bounding_box() for end in ("source", "target"))
            assert source["x"] + source["width"] <= count["x"], (source, count)  # a column per distance from the source
            x1, x2 = (float(v) for v in re.findall(r"M([\d.]+),.* ([\d.]+),[\d.]+$", edges[0]["d"])[0])
            assert x1 < x2, edges  # from the source's right side to the count's left
            page.locator(".streamlab-jobview .streamlab-graph").screenshot(path=str(ARTIFACTS / "lab-job-graph.png"))
            # each running vertex filled as Flink's job graph fills it, by its busy and back-pressured time
            page.wait_for_function("() => [...document.querySelectorAll('.streamlab-jobview .streamlab-vertex')]"
                                   ".every(v => v.style.backgroundColor && v.dataset.busy !== undefined)",
                                   timeout=20_000)
            # The diagnosis: the JobManager's answers, here the job's end-to-end latency (it ends in a sink)
            page.wait_for_selector(".streamlab-jobview .streamlab-diagnosis-latency[data-p50]", timeout=30_000)
            latency = page.locator(".streamlab-jobview .streamlab-diagnosis-latency").inner_text()
            assert latency.startswith("Latency, ingestion to sink, last seconds: p50 "), latency
            # No bare checkpoint table: this job asked for no checkpoints, and the view says so
            page.wait_for_function("() => { const n = document.querySelector('.streamlab-jobview "
                                   ".streamlab-checkpoints-note'); return n && !n.hidden && "
                                   "n.textContent.startsWith('Checkpointing is off') }", timeout=20_000)
            # Its keyed state: the count's (offered, and filled in), at a checkpoint taken for the look, one row per user
            view = page.locator(".streamlab-jobview")
            page.wait_for_function("() => document.querySelector('.streamlab-jobview .streamlab-state-operator')"
                                   ".value === 'count'", timeout=20_000)
            view.locator(".streamlab-state-fresh").click()
            page.wait_for_selector(".streamlab-jobview .streamlab-state-caption[data-checkpoint-id]:not([data-checkpoint-id=''])",
                                   timeout=60_000)
            state_rows = view.locator(".streamlab-state-row").all_inner_texts()
            assert len(state_rows) == 7, state_rows  # users 0..6, each counted
            assert {int(r.split()[0]) for r in state_rows} == set(range(7)) and all(int(r.split()[1]) > 0 for r in state_rows), state_rows
            page.screenshot(path=str(ARTIFACTS / "lab-panel-job-view.png"))
            page.evaluate(ACTIVATE.format(test="w.node.querySelector('.jp-Notebook')"))

            # Export: the active %%stream cell, after saving, as a package on disk.
            exported = page.evaluate(
                f"""async () => {{ const nb = window.jupyterapp.shell.currentWidget;
                     nb.content.activeCellIndex = {STREAM_CELL};
                     return await window.jupyterapp.commands.execute('streamlab:export-cell'); }}""")
            assert len(exported["packages"]) == 1, exported
            package = root / exported["packages"][0]
            assert {"config.yaml", "job.py", "requirements.txt"} <= {p.name for p in package.iterdir()}, \
                sorted(package.iterdir())
            script = (package / "job.py").read_text()
            assert "def users(seq)" in script and "rate=400" in script, script
            # the first toast loads JupyterLab's toast code on demand: slow on a loaded machine
            page.wait_for_function(f"() => document.body.innerText.includes('Exported \"{JOB}\" to {exported['packages'][0]}')",
                                   timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "lab-panel-exported.png"))

            # Cancel from the panel (it asks first), then CANCELED in the panel and in the handle.
            page.click(f".streamlab-job[data-job-id='{second['job']['id']}'] .streamlab-job-cancel")
            page.click(".jp-Dialog .jp-mod-accept")
            wait_panel(page, lambda s: s["job"] and s["job"]["state"] == "CANCELED", "the job CANCELED")
            page.screenshot(path=str(ARTIFACTS / "lab-panel-canceled.png"))
            # its job view, shown again, offers no action that a cancelled job cannot take
            page.evaluate(ACTIVATE.format(test="w.node.querySelector('.streamlab-jobview')"))
            page.wait_for_function("() => document.querySelector('.streamlab-jobview').dataset.state === 'CANCELED'"
                                   " && document.querySelector('.streamlab-jobview .streamlab-jobview-actions').hidden",
                                   timeout=20_000)
            page.evaluate(ACTIVATE.format(test="w.node.querySelector('.jp-Notebook')"))
            handle = page.evaluate(KERNEL_PRINT, "print(job.status)")
            assert handle.strip() == "CANCELED", handle

            # "Cancel this cell's job" on the other cell: the job its output names ends.
            cancelled = page.evaluate(
                f"""async () => {{ const nb = window.jupyterapp.shell.currentWidget;
                     nb.content.activeCellIndex = {OTHER_CELL};
                     return await window.jupyterapp.commands.execute('streamlab:cancel-cell-job', {{confirm: false}}); }}""")
            assert cancelled["name"] == OTHER and cancelled["cluster_id"] == cluster["id"], cancelled
            wait_for(lambda: page.evaluate(KERNEL_PRINT, "print(other.status)").strip() == "CANCELED", 60,
                     "the other job CANCELED after its cell's cancel")
            assert cancelled["job_id"] == page.evaluate(KERNEL_PRINT, "print(other.job_id)").strip()
            page.wait_for_function(f"() => ({STATUS})().text === 'Slots: 0/4'", timeout=20_000)
        finally:
            browser.close()
    assert not [e for e in errors if "streamlab" in e.lower()], errors
    assert re.match(r"^[0-9a-f]{12}$", cluster["id"]), cluster
