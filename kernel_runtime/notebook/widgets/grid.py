"""The results grid: Perspective's viewer and engine in the page, fed rows by the kernel.

perspective-python's own widget keeps its table in the kernel and the page asks the kernel for
every view of it; a kernel busy in a cell (``job.wait()``, the tutorials' next cell) answers
nothing, so the grid stayed empty while the job ran, which is when it matters. The dashboard
pushes instead (feed.py: the kernel's main thread applies updates, in a blocking wait too), so
this widget does: its ``data`` trait holds the rows the client keeps as Arrow IPC, set by the
dashboard when they change; the page loads them into Perspective's in-page engine (its WebAssembly
worker) and its viewer, which sorts, filters and charts them there. ``config`` carries the
settings the chart toggle picks.

Perspective's module (6 MB, its WebAssembly inside) is not in the widget: it is imported from the
Jupyter server (the server extension of bokeh_resources.py serves it), one URL the browser
evaluates once for every grid of the page. As the widget's own module, anywidget imports it from a
blob URL per widget, and the second grid of a page failed (its custom elements defined twice).
"""
from __future__ import annotations

import json

import anywidget
import traitlets
from perspective.widget import __version__ as PERSPECTIVE_VERSION

from kernel_runtime.notebook.widgets.bokeh_resources import ENABLE, PERSPECTIVE_ROUTE

_MODULE = """
const base = (() => {
  try { return JSON.parse(document.getElementById("jupyter-config-data").textContent).baseUrl || "/"; }
  catch (e) { return "/"; }
})();
const root = new URL(base + ROUTE + "/static/", window.location.origin).href;

function addStyle() {
  if (document.getElementById("streamlab-perspective-css")) { return; }
  const link = Object.assign(document.createElement("link"), {
    id: "streamlab-perspective-css", rel: "stylesheet", href: root + "perspective-anywidget.css?v=VERSION"});
  document.head.appendChild(link);
}

function bytes(view) {
  return view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength);
}

export default {
  async render({ model, el }) {
    addStyle();
    let perspective;
    try {
      perspective = await import(root + "perspective-anywidget.js?v=VERSION");
    } catch (error) {
      const note = Object.assign(document.createElement("pre"), {className: "streamlab-grid-missing"});
      note.textContent = "The results grid needs Perspective's module, which the Jupyter server did not serve at " +
        root + " (" + error + "). Enable streamlab's server extension: ENABLE, then restart Jupyter.";
      el.appendChild(note);
      return;
    }
    const engine = await perspective.worker();
    const viewer = document.createElement("perspective-viewer");
    viewer.style.height = "100%";
    el.style.height = "100%";
    el.appendChild(viewer);
    let table = null;
    let chain = Promise.resolve();
    const queue = (step) => { chain = chain.then(step).catch((error) => console.error("streamlab grid:", error)); };
    const load = async () => {
      const data = model.get("data");
      if (!data || !data.byteLength) { return; }
      if (table !== null) {
        try { await table.replace(bytes(data)); return; }
        catch (error) { /* other columns: a table of their own, below */ }
      }
      const old = table;
      table = await engine.table(bytes(data));
      await viewer.load(table);
      if (old === null) {
        await viewer.restore({...model.get("config"), title: model.get("title"), settings: false});
      } else {
        await old.delete();
      }
    };
    const configure = async () => { if (table !== null) { await viewer.restore(model.get("config")); } };
    const loaded = () => queue(load);
    const configured = () => queue(configure);
    model.on("change:data", loaded);
    model.on("change:config", configured);
    queue(load);
    return () => {
      model.off("change:data", loaded);
      model.off("change:config", configured);
      queue(async () => { await viewer.delete(); if (table !== null) { await table.delete(); } });
    };
  }
};
"""


class ResultsGrid(anywidget.AnyWidget):
    """Only the kernel's main thread sets its traits (the dashboard's updates and controls)."""

    _esm = (_MODULE.replace("ROUTE", json.dumps(PERSPECTIVE_ROUTE)).replace("VERSION", PERSPECTIVE_VERSION)
            .replace("ENABLE", ENABLE))
    data = traitlets.Bytes(b"").tag(sync=True)  # the rows: an Arrow IPC stream (result_table.for_the_grid)
    # the viewer's settings (perspective-viewer's restore()): plugin, group_by, columns, aggregates, sort
    config = traitlets.Dict().tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
