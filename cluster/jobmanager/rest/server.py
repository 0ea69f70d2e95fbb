"""The Dispatcher's REST API: Flink's paths and JSON field names (views.py builds the JSON), on tornado.

The HTTP server runs its own thread and IOLoop. A handler never touches Dispatcher or JobMaster
state: it hands a function to the JobManager's loop (``endpoint.call_soon``), which runs it and
resolves the handler's future through ``IOLoop.add_callback``; no thread waits on the loop, and
every answer is computed (and serialised) on the loop thread, so it reads a consistent state.

A local HTTP API that a web page in the user's browser must not be able to drive, as
jupyter_server's (``check_host``, token, body limits) and Flink's are:

* the Host header must name this server (localhost, a loopback address, ``rest.address`` or
  ``rest.allowed-hosts``), so a DNS-rebound name is refused;
* ``Authorization: Bearer <token>`` (the token is derived from the cluster secret) on every
  route, or with ``rest.auth: mutating`` on the mutating ones only;
* a mutating request with a body is JSON (``Content-Type: application/json``): a cross-site form
  cannot send one without a CORS preflight, which this server never grants;
* ``rest.server.max-content-length`` is enforced on the declared length before the body is read,
  and on a chunked body as it streams in, so an oversized body costs no memory;
* savepoint targets stay inside ``state.savepoints.dir`` or ``state.savepoints.allowed-dirs``.

Errors have Flink's shape, ``{"errors": ["..."]}``.
"""
from __future__ import annotations

import asyncio
import errno
import hmac
import ipaddress
import json
import logging
import os
import re
import socket
import threading
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import tornado.web
from tornado.http1connection import HTTP1Connection
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.netutil import bind_sockets

from cluster.checkpoint.storage import local_path
from cluster.conf import Configuration, port_candidates
from cluster.protocol.endpoint import RpcError
from cluster.checkpoint.inspection import decode_entries, encode_key, json_rows, state_frame
from cluster.state.snapshot_format import UnsupportedKeyError

from cluster.jobmanager.rest.views import (NotFound, backpressure_json, checkpoint_config_json, checkpoint_details_json, checkpoints_json, config_json, exceptions_json, job_json, job_master, jobs_overview_json, overview_json, plan_json, savepoint_status_json, taskmanagers_json, vertex_json, vertex_metrics_json, watermarks_json)

if TYPE_CHECKING:
    from cluster.jobmanager.dispatcher import Dispatcher

log = logging.getLogger(__name__)

# How long a handler waits for the JobManager's loop before it answers 503.
LOOP_TIMEOUT_S = 10.0
STATE_TIMEOUT_S = 120.0  # a fresh checkpoint of a job under load, then the read
MUTATING_METHODS = frozenset({"POST", "PATCH", "PUT", "DELETE"})
# Every body a route here reads is a small JSON object (a savepoint request is a few hundred bytes);
# Flink's cap (100 MB by default, sized for jar uploads, which streamlab has none of) applies on top.
MAX_JSON_BODY = 1024 * 1024
_HEX_ID = re.compile(r"[0-9a-f]{32}")
_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


class RestError(tornado.web.HTTPError):
    """An answer other than success, with the text that goes into Flink's ``errors`` list."""

    def __init__(self, status: int, message: str, headers: Optional[dict] = None):
        super().__init__(status)
        self.message = message
        self.headers = headers or {}


# ---------------------------------------------------------------------- request checks
class RequestGuard:
    """Decides, from the request line and headers alone, whether a request may go on."""

    def __init__(self, conf: Configuration, token: str):
        self.token = token
        self.auth = conf["rest.auth"]
        self.max_content_length = min(conf["rest.server.max-content-length"], MAX_JSON_BODY)
        allowed = list(conf["rest.allowed-hosts"])
        self.any_host = "*" in allowed
        self.names = _LOCAL_NAMES | {h.lower() for h in allowed} | {conf["rest.address"].lower()}
        bind = _ip(conf["rest.bind-address"] or conf["rest.address"])
        self.bind_ip = bind
        # bound to every interface: any of the machine's addresses reaches it
        self.any_ip = bind is not None and bind.is_unspecified

    def check(self, request, check_token: bool = True) -> None:
        """``check_token=False``: a standby's forwarder, whose leader checks the token itself."""
        self._check_host(request.host)
        mutating = request.method in MUTATING_METHODS
        if check_token and (mutating or self.auth == "all" or "Authorization" in request.headers):
            self._check_token(request.headers.get("Authorization", ""))
        if mutating:
            self._check_content_type(request.headers)
        self._check_declared_length(request.headers)

    def _check_host(self, host_header: str) -> None:
        if self.any_host:
            return
        host = re.sub(r":\d+$", "", host_header or "").strip().lower()
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        address = _ip(host)
        # A DNS-rebinding page reaches us under its own name; an address literal cannot be rebound.
        if address is not None:
            allowed = address.is_loopback or address == self.bind_ip or self.any_ip
        else:
            allowed = host in self.names
        if not allowed:
            raise RestError(HTTPStatus.FORBIDDEN, f"Host {host_header!r} is not a name of this server; "
                                                  "add it to rest.allowed-hosts to serve it")

    def _check_token(self, authorization: str) -> None:
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(credentials.strip().encode(), self.token.encode()):
            what = "a wrong token" if authorization else "no token"
            raise RestError(HTTPStatus.UNAUTHORIZED,
                            f"Unauthorized: {what}. Send 'Authorization: Bearer <token>' "
                            "(the token: streamlab cluster rest-token)",
                            {"WWW-Authenticate": 'Bearer realm="streamlab"'})

    @staticmethod
    def _check_content_type(headers) -> None:
        has_body = headers.get("Content-Length", "0").strip() not in ("", "0") or "Transfer-Encoding" in headers
        content_type = headers.get("Content-Type")
        if not has_body and content_type is None:
            return
        media_type = (content_type or "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            raise RestError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                            f"Content-Type {content_type!r} is not accepted: send the body as application/json")

    def _check_declared_length(self, headers) -> None:
        declared = headers.get("Content-Length")
        if declared is None:
            return
        try:
            length = int(declared)
        except ValueError:
            raise RestError(HTTPStatus.BAD_REQUEST, f"Content-Length {declared!r} is not a number") from None
        if length > self.max_content_length:
            raise self.too_large()

    def too_large(self) -> RestError:
        return RestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                         f"Request body larger than {self.max_content_length} bytes, the most this API accepts "
                         "(rest.server.max-content-length, and 1 MiB for the JSON bodies of its routes)")


def _ip(text: str):
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


# ---------------------------------------------------------------------- request bodies
def _optional(body: dict, name: str, kind: type, route: str) -> Any:
    """A field of a request body, of the JSON type ``kind``; missing or null: None."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        type_name = {str: "a string", bool: "a boolean"}[kind]
        raise RestError(HTTPStatus.BAD_REQUEST,
                        f"Request body of {route}: field {name!r} must be {type_name}, not {json.dumps(value)}")
    return value


def _check_fields(body: dict, known: tuple[str, ...], route: str) -> None:
    # Flink's strict mapper refuses unknown fields; a misspelt target must not silently fall back
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise RestError(HTTPStatus.BAD_REQUEST, f"Request body of {route}: unknown field(s) {', '.join(unknown)}; "
                                                f"expected {', '.join(known)}")


def _savepoint_options(body: dict, route: str, target_field: str, flag_field: str) -> tuple[Optional[str], bool, Optional[str]]:
    """target directory, the flag (cancel-job or drain), and the client's trigger id."""
    _check_fields(body, (target_field, flag_field, "formatType", "triggerId"), route)
    target = _optional(body, target_field, str, route)
    flag = bool(_optional(body, flag_field, bool, route))
    format_type = _optional(body, "formatType", str, route)
    if format_type is not None and format_type != "CANONICAL":
        raise RestError(HTTPStatus.BAD_REQUEST, f"Request body of {route}: formatType {format_type!r} is not "
                                                "supported; streamlab writes CANONICAL savepoints")
    trigger_id = _optional(body, "triggerId", str, route)
    if trigger_id is not None and not _HEX_ID.fullmatch(trigger_id):
        raise RestError(HTTPStatus.BAD_REQUEST,
                        f"Request body of {route}: triggerId must be 32 hexadecimal characters, not {trigger_id!r}")
    return target, flag, trigger_id


def confined_target(target: str, savepoints_dir: str, allowed_dirs: list[str]) -> str:
    """``target`` as an absolute path, if it is one of the allowed folders or below one; else 400."""
    roots = [os.path.realpath(local_path(d)) for d in [savepoints_dir, *allowed_dirs] if d]
    path = local_path(target)
    if "://" in path:
        raise RestError(HTTPStatus.BAD_REQUEST, f"target directory {target!r}: only local paths are supported")
    if not os.path.isabs(path):
        raise RestError(HTTPStatus.BAD_REQUEST, f"target directory {target!r} must be an absolute path")
    resolved = os.path.realpath(path)  # symlinks and ".." cannot lead out of a root
    if not any(Path(resolved).is_relative_to(root) for root in roots):
        raise RestError(HTTPStatus.BAD_REQUEST,
                        f"target directory {target!r} is outside the savepoint folders "
                        f"({', '.join(roots)}): use a folder below them, or add it to state.savepoints.allowed-dirs")
    return resolved


# ---------------------------------------------------------------------- handlers
@tornado.web.stream_request_body
class FlinkHandler(tornado.web.RequestHandler):
    """Base of every route: the guard, a capped body, JSON answers and Flink's error shape."""

    def initialize(self, server: "RestServer") -> None:
        self.server = server
        self.dispatcher = server.dispatcher
        self._body = bytearray()

    def set_default_headers(self) -> None:
        self.set_header("Server", "streamlab")
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Cache-Control", "no-store")

    def prepare(self) -> None:
        try:
            self.server.guard.check(self.request)
        except RestError:
            self._discard_body()
            raise

    def data_received(self, chunk: bytes) -> None:
        if self._finished:
            return
        if len(self._body) + len(chunk) > self.server.guard.max_content_length:
            self._body = bytearray()
            self._discard_body()
            error = self.server.guard.too_large()
            # answered at once; tornado then reads no further body for this handler and closes the connection
            self.send_error(error.status_code, exc_info=(RestError, error, None))
            return
        self._body += chunk

    def _discard_body(self) -> None:
        """After an early answer: the rest of the body is read and dropped unbuffered until the
        connection closes behind the answer, and tornado adds no bare 400 for a long declared length."""
        connection = self.request.connection
        if isinstance(connection, HTTP1Connection):
            connection.set_max_body_size(2**62)

    def json_body(self) -> dict:
        if not self._body.strip():
            return {}
        try:
            body = json.loads(self._body)
        except ValueError as exc:
            raise RestError(HTTPStatus.BAD_REQUEST, f"Request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise RestError(HTTPStatus.BAD_REQUEST, "Request body must be a JSON object")
        return body

    async def on_loop(self, fn: Callable, *args) -> Any:
        """``fn(*args)`` run on the JobManager's loop thread; this IOLoop serves others meanwhile."""
        io_loop = IOLoop.current()
        future: asyncio.Future = asyncio.get_running_loop().create_future()

        def settle(result, error) -> None:  # IOLoop thread
            if not future.done():
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(result)

        def run() -> None:  # loop thread
            try:
                result, error = fn(*args), None
            except Exception as exc:  # handed to the handler
                result, error = None, exc
            io_loop.add_callback(settle, result, error)

        self.dispatcher.endpoint.call_soon(run)
        try:
            return await asyncio.wait_for(future, LOOP_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise RestError(HTTPStatus.SERVICE_UNAVAILABLE,
                            f"The JobManager did not answer within {LOOP_TIMEOUT_S:g} s") from None

    async def view(self, fn: Callable, *args) -> None:
        """Answer 200 with ``fn(self.dispatcher, *args)``, built and encoded on the loop thread."""
        self.write(await self.on_loop(lambda: json.dumps(fn(self.dispatcher, *args)).encode()))

    def answer(self, status: int, body: dict) -> None:
        self.set_status(status)
        self.finish(json.dumps(body))

    def log_exception(self, typ, value, tb) -> None:
        if not isinstance(value, (tornado.web.HTTPError, NotFound, RpcError)):  # those are answers, not bugs
            log.error("rest: %s %s failed", self.request.method, self.request.path, exc_info=(typ, value, tb))

    def write_error(self, status_code: int, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, NotFound):
            exc = RestError(HTTPStatus.NOT_FOUND, str(exc))
        elif isinstance(exc, RpcError):  # the JobMaster refused, e.g. a savepoint of a job that is not running
            exc = RestError(HTTPStatus.CONFLICT, str(exc))
        if isinstance(exc, RestError):
            status_code, message = exc.status_code, exc.message
            for name, value in exc.headers.items():
                self.set_header(name, value)
        elif status_code == HTTPStatus.METHOD_NOT_ALLOWED:
            allowed = [m for m in ("GET", "PATCH", "POST")
                       if getattr(type(self), m.lower()) is not getattr(tornado.web.RequestHandler, m.lower())]
            self.set_header("Allow", ", ".join(allowed))
            message = f"Method {self.request.method} is not allowed on {self.request.path}"
        elif status_code >= 500:
            message = "Internal server error."
            if exc is not None:
                message += f" {type(exc).__name__}: {exc}"
        else:
            message = self._reason
        self.set_status(status_code)
        self.finish(json.dumps({"errors": [message]}))

    # path parameters, checked as Flink's handlers check theirs: a malformed id is a bad request
    @staticmethod
    def hex_id(value: str, what: str) -> str:
        if not _HEX_ID.fullmatch(value):
            raise RestError(HTTPStatus.BAD_REQUEST,
                            f"Bad request, could not parse parameters: {what} {value!r} is not 32 hexadecimal characters")
        return value

    @staticmethod
    def int_id(value: str, what: str, bits: int = 64) -> int:
        """A Java long (or int, ``bits=32``), as Flink's parameter converters read one."""
        number = int(value) if re.fullmatch(r"-?\d{1,20}", value) else None
        if number is None or not -(2 ** (bits - 1)) <= number < 2 ** (bits - 1):
            raise RestError(HTTPStatus.BAD_REQUEST, f"Bad request, could not parse parameters: {what} {value!r} "
                                                    f"is not a {bits}-bit integer")
        return number


class NotFoundHandler(FlinkHandler):
    """Every path the route table does not name, for every method (after the guard)."""

    def _not_found(self, *args) -> None:
        raise RestError(HTTPStatus.NOT_FOUND, f"Not found: {self.request.path}")

    get = post = patch = put = delete = head = options = _not_found


# -- the cluster
class OverviewHandler(FlinkHandler):
    async def get(self) -> None:
        await self.view(overview_json)


class ConfigHandler(FlinkHandler):
    async def get(self) -> None:
        await self.view(lambda d: config_json())


class TaskManagersHandler(FlinkHandler):
    async def get(self) -> None:
        await self.view(taskmanagers_json)


# -- jobs
class JobsHandler(FlinkHandler):
    async def get(self) -> None:
        await self.view(lambda d: {"jobs": [{"id": j.job_id, "status": j.state} for j in d.jobs.values()]})


class JobsOverviewHandler(FlinkHandler):
    async def get(self) -> None:
        await self.view(jobs_overview_json)


class JobHandler(FlinkHandler):
    async def get(self, job_id: str) -> None:
        await self.view(job_json, self.hex_id(job_id, "job id"))

    async def patch(self, job_id: str) -> None:
        job_id = self.hex_id(job_id, "job id")
        mode = self.get_query_argument("mode", "cancel")
        if mode.lower() == "stop":
            raise RestError(HTTPStatus.BAD_REQUEST, 'The termination mode "stop" has been removed. Use "cancel", '
                                                    f"or POST /jobs/{job_id}/stop for a stop with a savepoint")
        if mode.lower() != "cancel":
            raise RestError(HTTPStatus.BAD_REQUEST, f"Unsupported termination mode {mode!r}; use mode=cancel")
        await self.on_loop(lambda: job_master(self.dispatcher, job_id).cancel())
        self.answer(HTTPStatus.ACCEPTED, {})


class JobStatusHandler(FlinkHandler):
    async def get(self, job_id: str) -> None:
        await self.view(lambda d, jid: {"status": job_master(d, jid).state}, self.hex_id(job_id, "job id"))


class JobPlanHandler(FlinkHandler):
    async def get(self, job_id: str) -> None:
        await self.view(lambda d, jid: {"plan": plan_json(job_master(d, jid))}, self.hex_id(job_id, "job id"))


class JobExceptionsHandler(FlinkHandler):
    async def get(self, job_id: str) -> None:
        job_id = self.hex_id(job_id, "job id")
        given = self.get_query_argument("maxExceptions", None)
        limit = None if given is None else self.int_id(given, "maxExceptions", bits=32)

        def exceptions(d, jid):
            body = exceptions_json(job_master(d, jid))
            history = body["exceptionHistory"]
            if limit is not None and len(history["entries"]) > max(limit, 0):
                history["entries"], history["truncated"] = history["entries"][:max(limit, 0)], True
            return body
        await self.view(exceptions, job_id)


# -- checkpoints and savepoints
class CheckpointsHandler(FlinkHandler):
    async def get(self, job_id: str) -> None:
        await self.view(checkpoints_json, self.hex_id(job_id, "job id"))


class CheckpointConfigHandler(FlinkHandler):
    async def get(self, job_id: str) -> None:
        await self.view(checkpoint_config_json, self.hex_id(job_id, "job id"))


class CheckpointDetailsHandler(FlinkHandler):
    async def get(self, job_id: str, checkpoint_id: str) -> None:
        await self.view(checkpoint_details_json, self.hex_id(job_id, "job id"),
                        self.int_id(checkpoint_id, "checkpoint id"))


class SavepointHandler(FlinkHandler):
    """POST /jobs/<id>/savepoints (``target-directory``, ``cancel-job``), Flink's asynchronous
    operation: 202 with a trigger id, then GET .../savepoints/<trigger id>."""

    stop, target_field, flag_field = False, "target-directory", "cancel-job"

    async def post(self, job_id: str) -> None:
        job_id = self.hex_id(job_id, "job id")
        route = f"POST /jobs/<id>/{'stop' if self.stop else 'savepoints'}"
        target, flag, client_trigger = _savepoint_options(self.json_body(), route, self.target_field, self.flag_field)
        if self.stop and flag:
            raise RestError(HTTPStatus.BAD_REQUEST, f"{route}: drain is not supported (no MAX_WATERMARK to emit); "
                                                    "stop without it")
        if target is not None:
            savepoints_dir, allowed = await self.on_loop(self.server.savepoint_folders, job_id)
            target = confined_target(target, savepoints_dir, allowed)
        trigger = await self.on_loop(self.server.trigger_savepoint, job_id, target, self.stop or flag, client_trigger)
        self.answer(HTTPStatus.ACCEPTED, {"request-id": trigger})


class StopWithSavepointHandler(SavepointHandler):
    """POST /jobs/<id>/stop (``targetDirectory``, ``drain``): a savepoint, then the job ends FINISHED."""

    stop, target_field, flag_field = True, "targetDirectory", "drain"


class SavepointStatusHandler(FlinkHandler):
    async def get(self, job_id: str, trigger_id: str) -> None:
        job_id, trigger_id = self.hex_id(job_id, "job id"), self.hex_id(trigger_id, "trigger id")
        await self.view(lambda d: savepoint_status_json(d, job_id, self.server.savepoint_trigger(job_id, trigger_id)))


# -- keyed state
class JobStateHandler(FlinkHandler):
    """GET /jobs/<id>/state?operator=NAME[&key=K][&fresh=true]: an operator's keyed state at the
    newest completed checkpoint (or one taken now), one row per key (cluster.checkpoint.inspection).
    ``key`` is JSON (``3``, ``"a"``, ``[1, "a"]`` for several key columns) or else a plain string."""

    async def get(self, job_id: str) -> None:
        job_id = self.hex_id(job_id, "job id")
        operator = self.get_query_argument("operator", "")
        if not operator:
            raise RestError(HTTPStatus.BAD_REQUEST, "GET /jobs/<id>/state: give the operator, "
                                                    "?operator=<its name or uid>")
        fresh = self.get_query_argument("fresh", "false").lower()
        if fresh not in ("true", "false"):
            raise RestError(HTTPStatus.BAD_REQUEST, f"GET /jobs/<id>/state: fresh must be true or false, not {fresh!r}")
        key = self.get_query_argument("key", None)
        try:
            encoded = None if key is None else encode_key(_key_argument(key))
        except UnsupportedKeyError as exc:
            raise RestError(HTTPStatus.BAD_REQUEST, f"GET /jobs/<id>/state: key {key!r}: {exc}") from None
        io_loop = IOLoop.current()
        answered: asyncio.Future = asyncio.get_running_loop().create_future()

        def settle(answer, error) -> None:  # IOLoop thread
            if not answered.done():
                answered.set_exception(error) if error is not None else answered.set_result(answer)

        def start() -> None:  # JobManager loop thread
            try:
                job_master(self.dispatcher, job_id).request_keyed_state(
                    operator, encoded, fresh == "true", lambda a, e: io_loop.add_callback(settle, a, e))
            except Exception as exc:  # NotFound, RpcError: answers
                io_loop.add_callback(settle, None, exc)

        self.dispatcher.endpoint.call_soon(start)
        try:
            answer = await asyncio.wait_for(answered, STATE_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise RestError(HTTPStatus.SERVICE_UNAVAILABLE,
                            f"The state of {operator!r} was not read within {STATE_TIMEOUT_S:g} s") from None
        # unpickling and encoding may take a while: not on this IOLoop, which serves every route
        self.write(await io_loop.run_in_executor(None, _state_json, answer))


def _key_argument(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return tuple(value) if isinstance(value, list) else value


def _state_json(answer) -> bytes:
    frame = state_frame(decode_entries(answer.entries, lenient=True), answer.operator)
    columns, rows = json_rows(frame)
    return json.dumps({"checkpoint_id": answer.checkpoint_id, "operator": answer.operator["name"],
                       "uid": answer.operator["uid"], "key_columns": answer.operator["key"],
                       "sources": answer.sources, "columns": columns, "rows": rows}).encode()


# -- vertices
class VertexHandler(FlinkHandler):
    async def get(self, job_id: str, vertex_id: str) -> None:
        await self.view(vertex_json, self.hex_id(job_id, "job id"), self.hex_id(vertex_id, "vertex id"))


class BackpressureHandler(FlinkHandler):
    async def get(self, job_id: str, vertex_id: str) -> None:
        await self.view(backpressure_json, self.hex_id(job_id, "job id"), self.hex_id(vertex_id, "vertex id"))


class WatermarksHandler(FlinkHandler):
    async def get(self, job_id: str, vertex_id: str) -> None:
        await self.view(watermarks_json, self.hex_id(job_id, "job id"), self.hex_id(vertex_id, "vertex id"))


class VertexMetricsHandler(FlinkHandler):
    async def get(self, job_id: str, vertex_id: str) -> None:
        given = self.get_query_argument("get", None)
        names = None if given is None else [n.strip() for n in given.split(",") if n.strip()]
        await self.view(vertex_metrics_json, self.hex_id(job_id, "job id"), self.hex_id(vertex_id, "vertex id"),
                        names or None)


# ---------------------------------------------------------------------- the server
_JOB = r"/jobs/(?P<job_id>[^/]+)"


def route_table(server: "RestServer") -> list:
    """The API's index: Flink's paths (also under /v1, with or without a trailing slash)."""
    routes = [
        (r"/overview", OverviewHandler),
        (r"/config", ConfigHandler),
        (r"/taskmanagers", TaskManagersHandler),
        (r"/jobs", JobsHandler),
        (r"/jobs/overview", JobsOverviewHandler),
        (_JOB, JobHandler),                                              # GET details, PATCH ?mode=cancel
        (_JOB + r"/status", JobStatusHandler),
        (_JOB + r"/plan", JobPlanHandler),
        (_JOB + r"/exceptions", JobExceptionsHandler),
        (_JOB + r"/checkpoints", CheckpointsHandler),
        (_JOB + r"/checkpoints/config", CheckpointConfigHandler),
        (_JOB + r"/checkpoints/details/(?P<checkpoint_id>[^/]+)", CheckpointDetailsHandler),
        (_JOB + r"/savepoints", SavepointHandler),
        (_JOB + r"/savepoints/(?P<trigger_id>[^/]+)", SavepointStatusHandler),
        (_JOB + r"/stop", StopWithSavepointHandler),
        (_JOB + r"/state", JobStateHandler),                              # keyed state, ?operator=
        (_JOB + r"/vertices/(?P<vertex_id>[^/]+)", VertexHandler),
        (_JOB + r"/vertices/(?P<vertex_id>[^/]+)/backpressure", BackpressureHandler),
        (_JOB + r"/vertices/(?P<vertex_id>[^/]+)/watermarks", WatermarksHandler),
        (_JOB + r"/vertices/(?P<vertex_id>[^/]+)/metrics", VertexMetricsHandler),
    ]
    return [(rf"(?:/v1)?{path}/?", handler, {"server": server}) for path, handler in routes]


def _log_request(handler: tornado.web.RequestHandler) -> None:
    status = handler.get_status()
    level = logging.DEBUG if status < 400 else logging.INFO if status < 500 else logging.ERROR
    log.log(level, "rest: %d %s %s (%.1f ms)", status, handler.request.method, handler.request.uri,
            1000 * handler.request.request_time())


def bind_rest_sockets(conf: Configuration) -> list[socket.socket]:
    """Listening sockets at rest.bind-address on the first free port of rest.bind-port (Flink's
    port list and ranges; not set: rest.port), so JobManagers of one host share one config.yaml."""
    host = conf["rest.bind-address"] or conf["rest.address"]
    spec = conf["rest.bind-port"] or str(conf["rest.port"])
    key = "rest.bind-port" if conf["rest.bind-port"] else "rest.port"
    last_error: Optional[OSError] = None
    for port in port_candidates(spec):
        try:
            return bind_sockets(port, host)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise OSError(exc.errno, f"REST: cannot bind {host}:{port} ({key} {spec}): {exc.strerror}") from exc
            last_error = exc
    raise OSError(errno.EADDRINUSE, f"REST: no free port in {key} {spec!r} at {host}: every one is in use "
                                    "(give a list or a range of ports, or 0 for any free one)") from last_error


class HttpServerThread:
    """A tornado application served on given listening sockets by a thread and IOLoop of its own."""

    def __init__(self, application: tornado.web.Application, sockets: list[socket.socket], name: str):
        self.application = application
        self._sockets = sockets
        self.port = sockets[0].getsockname()[1]
        self._io_loop: Optional[IOLoop] = None
        self._stopping = asyncio.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._started.wait(10)

    def stop(self) -> None:
        if self._io_loop is not None:
            self._io_loop.add_callback(self._stopping.set)
            self._thread.join(5)

    def hand_over_sockets(self) -> list[socket.socket]:
        """Stop serving but keep listening: the sockets for the next server. Connections that arrive
        meanwhile wait in the kernel's backlog instead of being refused."""
        kept = [s.dup() for s in self._sockets]
        for s in kept:
            s.setblocking(False)
        self.stop()  # closes our descriptors; the duplicates keep each socket open
        return kept

    async def _serve(self) -> None:
        # our own limit is checked by the handlers (413 in Flink's shape), so tornado's is lifted
        server = HTTPServer(self.application, max_body_size=2**62, idle_connection_timeout=300, body_timeout=300)
        server.add_sockets(self._sockets)
        self._io_loop = IOLoop.current()
        self._started.set()
        await self._stopping.wait()
        server.stop()
        await self._drained()

    async def _drained(self) -> None:
        """After accepting stopped, before the loop ends (and with it every open connection)."""


class RestServer(HttpServerThread):
    def __init__(self, dispatcher: "Dispatcher", conf: Configuration, token: str,
                 sockets: Optional[list[socket.socket]] = None):
        self.dispatcher = dispatcher
        self.guard = RequestGuard(conf, token)
        # a trigger id the client chose -> ours; Flink treats a repeated trigger id as the same
        # operation (loop thread only)
        self._client_triggers: dict[tuple[str, str], str] = {}
        application = tornado.web.Application(
            route_table(self), default_handler_class=NotFoundHandler, default_handler_args={"server": self},
            log_function=_log_request)
        # a standby's forwarder hands over its listening sockets: the address it served keeps answering
        super().__init__(application, sockets if sockets is not None else bind_rest_sockets(conf), "rest")

    # ------------------------------------------------------------------ loop thread
    def savepoint_folders(self, job_id: str) -> tuple[str, list[str]]:
        """Where REST may write this job's savepoints (the job's configuration may widen it)."""
        conf = job_master(self.dispatcher, job_id).conf
        return conf["state.savepoints.dir"], conf["state.savepoints.allowed-dirs"]

    def trigger_savepoint(self, job_id: str, target: Optional[str], stop: bool, client_trigger: Optional[str]) -> str:
        job = job_master(self.dispatcher, job_id)
        if client_trigger is not None and (job_id, client_trigger) in self._client_triggers:
            return client_trigger
        trigger = job.trigger_savepoint_async(target, stop)
        if client_trigger is None:
            return trigger
        self._client_triggers[job_id, client_trigger] = trigger
        return client_trigger

    def savepoint_trigger(self, job_id: str, trigger_id: str) -> str:
        return self._client_triggers.get((job_id, trigger_id), trigger_id)
