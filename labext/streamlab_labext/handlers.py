"""The routes of the lab extension's server API under ``<base_url>streamlab/api/``, the contract
with the TypeScript side (labext/src): GET clusters, GET clusters/<cid>/jobs/<jid>, POST
.../cancel, .../savepoint, .../stop, GET .../state, GET kernels/<kernel id>/cluster, POST export. Authenticated
as every Jupyter route (token or cookie with XSRF); errors are ``{"message": ...}``
(jupyter_server's APIHandler)."""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.httpclient import HTTPClientError

from kernel_runtime.client.cluster_info import ClusterNotRunning

from . import clusters
from .clusters import ClusterRefused, JobManagerError, KnownCluster

if TYPE_CHECKING:
    from . import StreamlabLab

ROUTE = "streamlab/api"


class StreamlabHandler(APIHandler):
    def initialize(self, lab: "StreamlabLab") -> None:
        self.lab = lab

    def body(self, fields: tuple[str, ...]) -> dict:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError as exc:
            raise web.HTTPError(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, "request body must be a JSON object")
        unknown = sorted(set(body) - set(fields))
        if unknown:
            raise web.HTTPError(400, f"unknown field(s) {', '.join(unknown)} in the request body; "
                                     f"expected {', '.join(fields)}")
        return body

    @staticmethod
    def optional_str(body: dict, name: str) -> Optional[str]:
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            raise web.HTTPError(400, f"field {name!r} of the request body must be a string or null, "
                                     f"not {json.dumps(value)}")
        return value

    async def cluster(self, cid: str) -> KnownCluster:
        known = await self.lab.known_clusters()
        if cid not in known:
            raise web.HTTPError(403, f"cluster {cid!r} is not one this server may show: only the clusters of "
                                     "its kernels and those of StreamlabLab.cluster_dirs are")
        return known[cid]

    async def on_jobmanager(self, action) -> Any:
        """``action``'s result; the JobManager's refusal or absence as an HTTP error."""
        try:
            return await action
        except JobManagerError as exc:
            raise web.HTTPError(exc.status, f"JobManager: {exc}") from None
        except ClusterNotRunning as exc:
            raise web.HTTPError(503, f"JobManager not reachable: {exc}") from None
        except (OSError, asyncio.TimeoutError, HTTPClientError) as exc:
            raise web.HTTPError(503, f"JobManager not reachable: {type(exc).__name__}: {exc}") from None

    def reply(self, body: dict) -> None:
        self.finish(json.dumps(body))


class ClustersHandler(StreamlabHandler):
    @web.authenticated
    async def get(self) -> None:
        self.reply(await self.lab.cluster_list.get())


class JobHandler(StreamlabHandler):
    @web.authenticated
    async def get(self, cid: str, jid: str) -> None:
        self.reply(await self.on_jobmanager(clusters.job_detail(await self.cluster(cid), jid)))


class CancelHandler(StreamlabHandler):
    @web.authenticated
    async def post(self, cid: str, jid: str) -> None:
        self.body(())
        await self.on_jobmanager(clusters.cancel(await self.cluster(cid), jid))
        self.reply({"ok": True})


class SavepointHandler(StreamlabHandler):
    stop = False

    @web.authenticated
    async def post(self, cid: str, jid: str) -> None:
        target = self.optional_str(self.body(("target_directory",)), "target_directory")
        known = await self.cluster(cid)
        self.reply({"location": await self.on_jobmanager(clusters.savepoint(known, jid, target, self.stop))})


class StopHandler(SavepointHandler):
    stop = True


class StateHandler(StreamlabHandler):
    """?operator=NAME[&key=K][&fresh=true][&limit=N]: the operator's keyed state, as the
    JobManager's GET /jobs/<id>/state gives it, its first N rows (200)."""

    @web.authenticated
    async def get(self, cid: str, jid: str) -> None:
        operator = self.get_query_argument("operator", "")
        if not operator:
            raise web.HTTPError(400, "give the operator whose state to show: ?operator=<its name or uid>")
        fresh = self.get_query_argument("fresh", "false")
        if fresh not in ("true", "false"):
            raise web.HTTPError(400, f"fresh must be true or false, not {fresh!r}")
        limit = self.get_query_argument("limit", str(clusters.STATE_ROWS))
        if not limit.isdigit():
            raise web.HTTPError(400, f"limit must be a number of rows, not {limit!r}")
        known = await self.cluster(cid)
        self.reply(await self.on_jobmanager(clusters.keyed_state(
            known, jid, operator, self.get_query_argument("key", None), fresh == "true", int(limit))))


class KernelClusterHandler(StreamlabHandler):
    @web.authenticated
    async def get(self, kernel_id: str) -> None:
        listed = await self.lab.cluster_list.get()
        mine = [c for c in listed["clusters"] if c["kernel_id"] == kernel_id]
        self.reply({"cluster": mine[0] if mine else None})


class ExportHandler(StreamlabHandler):
    @web.authenticated
    async def post(self) -> None:
        from kernel_runtime.export.package import export_notebook, slug
        from kernel_runtime.export.slicing import ExportError
        body = self.body(("path", "cell", "output"))
        path = self.optional_str(body, "path")
        if not path:
            raise web.HTTPError(400, "field 'path' (the notebook, relative to the server root) is required")
        cell, output = self.optional_str(body, "cell"), self.optional_str(body, "output")
        notebook = self.inside_root(path, "path")
        if not notebook.is_file():
            raise web.HTTPError(404, f"no notebook {path!r} under the server root")
        if output:
            target = self.inside_root(output, "output")
        else:  # one job's package is named after the job (its --name), a whole notebook's after the notebook
            target = notebook.parent / slug(cell) if cell else notebook.with_suffix("")
        loop = asyncio.get_running_loop()
        try:  # it reads and writes files: off the server's loop
            written = await loop.run_in_executor(None, export_notebook, notebook, target, cell)
        except ExportError as exc:
            raise web.HTTPError(400, f"export: {exc}") from None
        root = self.root()
        # what it wrote, and from which file: the notebook as saved on disk
        self.reply({"packages": [os.path.relpath(os.path.realpath(d), root) for _, d in written],
                    "files": [sorted(p.name for p in Path(d).iterdir() if p.is_file()) for _, d in written],
                    "notebook": path})

    def root(self) -> str:
        return os.path.realpath(os.path.expanduser(self.settings["server_root_dir"]))

    def inside_root(self, relative: str, field: str) -> Path:
        root = self.root()
        resolved = os.path.realpath(os.path.join(root, relative.lstrip("/")))
        if not Path(resolved).is_relative_to(root):
            raise web.HTTPError(403, f"field {field!r}: {relative!r} is outside the server root")
        return Path(resolved)


def handlers(base_url: str, lab: "StreamlabLab") -> list:
    cluster, job = r"/clusters/(?P<cid>[0-9a-f]+)", r"/jobs/(?P<jid>[0-9A-Za-z]+)"
    routes = [
        (r"/clusters", ClustersHandler),
        (cluster + job, JobHandler),
        (cluster + job + r"/cancel", CancelHandler),
        (cluster + job + r"/savepoint", SavepointHandler),
        (cluster + job + r"/stop", StopHandler),
        (cluster + job + r"/state", StateHandler),
        (r"/kernels/(?P<kernel_id>[0-9A-Za-z-]+)/cluster", KernelClusterHandler),
        (r"/export", ExportHandler),
    ]
    return [(url_path_join(base_url, ROUTE) + path, handler, {"lab": lab}) for path, handler in routes]
