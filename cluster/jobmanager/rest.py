"""The Dispatcher's REST API, with Flink's paths and JSON field names (views.py builds the JSON).

The HTTP server runs on its own threads; every response is computed on the JobManager's loop
thread (``endpoint.call``), so it reads a consistent state without locks.
"""
from __future__ import annotations

import json
import logging
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from cluster.protocol.endpoint import RpcError

from .views import (backpressure_json, checkpoint_config_json, checkpoint_details_json, checkpoints_json,
                    config_json, exceptions_json, job_json, jobs_overview_json, overview_json, plan_json,
                    savepoint_status_json, taskmanagers_json, vertex_json)

if TYPE_CHECKING:
    from .dispatcher import Dispatcher

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- routing
# a route's ids: the job's, and "sub" for the one within it (vertex, checkpoint or savepoint trigger)
_JOB = r"/jobs/(?P<jid>[0-9a-f]{32})"
_VERTEX = _JOB + r"/vertices/(?P<sub>[0-9a-f]{32})"
_GET_ROUTES = [
    (re.compile(r"^/overview$"), lambda d, jid: overview_json(d)),
    (re.compile(r"^/config$"), lambda d, jid: config_json()),
    (re.compile(r"^/taskmanagers$"), lambda d, jid: taskmanagers_json(d)),
    (re.compile(r"^/jobs$"), lambda d, jid: {"jobs": [{"id": j.job_id, "status": j.state} for j in d.jobs.values()]}),
    (re.compile(r"^/jobs/overview$"), lambda d, jid: jobs_overview_json(d)),
    (re.compile(rf"^{_JOB}$"), lambda d, jid: job_json(d, jid)),
    (re.compile(rf"^{_JOB}/status$"), lambda d, jid: {"status": d.jobs[jid].state}),
    (re.compile(rf"^{_JOB}/plan$"), lambda d, jid: {"plan": plan_json(d.jobs[jid])}),
    (re.compile(rf"^{_JOB}/exceptions$"), lambda d, jid: exceptions_json(d.jobs[jid])),
    (re.compile(rf"^{_JOB}/checkpoints$"), lambda d, jid: checkpoints_json(d, jid)),
    (re.compile(rf"^{_JOB}/checkpoints/config$"), lambda d, jid: checkpoint_config_json(d, jid)),
    (re.compile(rf"^{_JOB}/checkpoints/details/(?P<sub>\d+)$"),
     lambda d, jid, cid: checkpoint_details_json(d, jid, int(cid))),
    (re.compile(rf"^{_JOB}/savepoints/(?P<sub>[0-9a-f]{{32}})$"), lambda d, jid, tid: savepoint_status_json(d, jid, tid)),
    (re.compile(rf"^{_VERTEX}$"), lambda d, jid, vid: vertex_json(d, jid, vid)),
    (re.compile(rf"^{_VERTEX}/backpressure$"), lambda d, jid, vid: backpressure_json(d, jid, vid)),
]


class RestServer:
    def __init__(self, dispatcher: "Dispatcher", host: str, port: int):
        self.dispatcher = dispatcher
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "streamlab"

            def log_message(self, fmt, *args):
                log.debug("rest: " + fmt, *args)

            def do_GET(self):
                server._handle(self, "GET")

            def do_PATCH(self):
                server._handle(self, "PATCH")

            def do_POST(self):
                server._handle(self, "POST")

            def do_DELETE(self):
                server._handle(self, "DELETE")

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="rest", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(req.path)
        path = url.path.rstrip("/") or "/"
        if path.startswith("/v1/"):
            path = path[3:]  # Flink serves every path under /v1 too
        try:
            status, body = self._route(method, path, parse_qs(url.query), req)
        except KeyError:
            status, body = HTTPStatus.NOT_FOUND, {"errors": [f"Job could not be found: {path}"]}
        except (RpcError, ValueError) as exc:
            status, body = HTTPStatus.BAD_REQUEST, {"errors": [str(exc)]}
        except Exception as exc:
            log.exception("rest: %s %s failed", method, path)
            status, body = HTTPStatus.INTERNAL_SERVER_ERROR, {"errors": [f"Internal server error: {exc}"]}
        data = json.dumps(body).encode()
        try:
            req.send_response(status)
            req.send_header("Content-Type", "application/json; charset=UTF-8")
            req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            req.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left before the answer

    def _read_json(self, req: BaseHTTPRequestHandler) -> dict:
        length = int(req.headers.get("Content-Length") or 0)
        if not length:
            return {}
        body = json.loads(req.rfile.read(length))
        if not isinstance(body, dict):
            raise ValueError("the request body must be a JSON object")
        return body

    def _route(self, method: str, path: str, query: dict, req: BaseHTTPRequestHandler) -> tuple[int, dict]:
        endpoint = self.dispatcher.endpoint
        if method == "GET":
            for pattern, view in _GET_ROUTES:
                match = pattern.match(path)
                if match:
                    ids = match.groupdict()
                    return HTTPStatus.OK, endpoint.call(view, self.dispatcher, ids.get("jid"), *(
                        [ids["sub"]] if "sub" in ids else []))
        if method == "PATCH":
            match = re.match(rf"^{_JOB}$", path)
            if match:
                mode = query.get("mode", ["cancel"])[0]
                if mode != "cancel":
                    return HTTPStatus.BAD_REQUEST, {"errors": [f"unsupported mode {mode!r}; use mode=cancel"]}
                endpoint.call(lambda: self.dispatcher.jobs[match["jid"]].cancel())
                return HTTPStatus.ACCEPTED, {}
        if method == "POST":
            match = re.match(rf"^{_JOB}/(savepoints|stop)$", path)
            if match:
                # Flink's asynchronous operations: 202 with a trigger id, then GET .../savepoints/<id>
                body = self._read_json(req)
                stop = match.group(2) == "stop" or bool(body.get("cancel-job"))
                target = body.get("target-directory") or body.get("targetDirectory")
                trigger = endpoint.call(lambda: self.dispatcher.job(match["jid"]).trigger_savepoint_async(target, stop))
                return HTTPStatus.ACCEPTED, {"request-id": trigger}
        return HTTPStatus.NOT_FOUND, {"errors": [f"Not found: {path}"]}

