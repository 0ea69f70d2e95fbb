"""BokehJS for the dashboard's charts, without internet and without megabytes in the notebook
(and Perspective's module for its results grid, served the same way: grid.py).

Bokeh's default loader fetches BokehJS from a CDN (unreachable offline and behind many
firewalls); inline resources add about 8 MB to every saved notebook. Instead:

* a Jupyter server extension (this module) serves Bokeh's own static folder at
  ``<base_url>streamlab/bokeh/static/``: enable it with
  ``jupyter server extension enable --sys-prefix kernel_runtime.notebook.widgets.bokeh_resources``;
* ``%load_ext kernel_runtime`` displays a small loader (a few hundred bytes) that adds those
  scripts to the page unless BokehJS is there already. The loader is asynchronous, so it runs in
  the cell before the first chart; being an output of that cell, it runs again whenever the page
  is opened anew, not once per kernel.
"""
from __future__ import annotations

import json

from kernel_runtime.notebook.widgets import in_kernel

ROUTE = "streamlab/bokeh"
PERSPECTIVE_ROUTE = "streamlab/perspective"
LOAD_MIME_TYPE = "application/vnd.bokehjs_load.v0+json"  # jupyter_bokeh runs it as a script
ENABLE = "jupyter server extension enable --sys-prefix kernel_runtime.notebook.widgets.bokeh_resources"

_LOADER = """(function () {
  if (window.Bokeh !== undefined || window._streamlabBokehLoading) { return; }
  window._streamlabBokehLoading = true;
  var base = "/";
  try { base = JSON.parse(document.getElementById("jupyter-config-data").textContent).baseUrl || "/"; }
  catch (e) {}
  var here = document.currentScript;
  FILES.forEach(function (file) {
    var script = document.createElement("script");
    script.src = base + ROUTE + "/" + file;
    script.async = false;  // keep their order: bokeh.min.js first
    script.onerror = function () {
      window._streamlabBokehLoading = false;
      var text = "The dashboard charts need BokehJS, which the Jupyter server did not serve at " +
        script.src + ". Enable streamlab's server extension: ENABLE, then restart Jupyter.";
      console.error(text);
      if (here && here.parentNode) {
        var note = document.createElement("pre");
        note.textContent = text;
        here.parentNode.appendChild(note);
      }
    };
    document.head.appendChild(script);
  });
})();"""


def bokeh_files() -> list[str]:
    """BokehJS's scripts relative to its static folder's parent, versioned against stale caches."""
    import bokeh
    from bokeh.resources import Resources
    return [f"{path}?v={bokeh.__version__}" for path in Resources(mode="server", root_url="").js_files]


def loader_js() -> str:
    return (_LOADER.replace("FILES", json.dumps(bokeh_files())).replace("ROUTE", json.dumps(ROUTE))
            .replace("ENABLE", ENABLE))


def display_loader() -> None:
    """Show the loader as an output of the current cell (in a kernel only: a terminal has no page)."""
    if not in_kernel():
        return
    from IPython.display import publish_display_data
    js = loader_js()
    publish_display_data({"application/javascript": js, LOAD_MIME_TYPE: js, "text/plain": ""})


# --------------------------------------------------------------------------- Jupyter server side
def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "kernel_runtime.notebook.widgets.bokeh_resources"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from bokeh.util.paths import bokehjs_path
    from jupyter_server.utils import url_path_join
    from tornado.web import StaticFileHandler

    from perspective.widget import _STATIC as perspective_static

    web_app = serverapp.web_app
    base = web_app.settings["base_url"]
    pattern = url_path_join(base, ROUTE, "static/(.*)")
    grid = url_path_join(base, PERSPECTIVE_ROUTE, "static/(.*)")
    # public libraries, as Jupyter's own /static is: no login needed to fetch them
    web_app.add_handlers(".*$", [(pattern, StaticFileHandler, {"path": str(bokehjs_path())}),
                                 (grid, StaticFileHandler, {"path": str(perspective_static)})])
    serverapp.log.info("streamlab: serving BokehJS at %s and Perspective at %s", pattern, grid)
