"""FlinkHandler, the base of every REST route (Flink's AbstractHandler): the guard, a capped
body, JSON answers, Flink's error shape ``{"errors": ["..."]}``, and the hand-off to the
JobManager's loop.

A handler never touches Dispatcher or JobMaster state: it hands a function to the JobManager's
loop (``endpoint.call_soon``), which runs it and resolves the handler's future through
``IOLoop.add_callback``; no thread waits on the loop, and every answer is computed (and
serialised) on the loop thread, so it reads a consistent state. Handler methods run on the REST
server's IOLoop thread.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
from http import HTTPStatus
from typing import Any, Callable, Optional, Protocol

import tornado.web
from tornado.http1connection import HTTP1Connection
from tornado.ioloop import IOLoop

from cluster.protocol.endpoint import RpcBusy, RpcError

from cluster.jobmanager.rest.security import RequestGuard, RestError
from cluster.jobmanager.rest.views import JobManagerState, NotFound

log = logging.getLogger(__name__)

# How long a handler waits for the JobManager's loop before it answers 503.
LOOP_TIMEOUT_S = 10.0
HEX_ID = re.compile(r"[0-9a-f]{32}")


class RestBackend(Protocol):
    """What a handler reaches through the server that routes to it (server.RestServer; a standby's
    RestForwarder routes only its ForwardHandler, which reaches the guard alone). The savepoint
    methods run on the JobManager's loop thread."""
    guard: RequestGuard
    dispatcher: JobManagerState

    def savepoint_folders(self, job_id: str) -> tuple[str, list[str]]: ...

    def trigger_savepoint(self, job_id: str, target: Optional[str], stop: bool,
                          client_trigger: Optional[str]) -> str: ...

    def savepoint_trigger(self, job_id: str, trigger_id: str) -> str: ...


@tornado.web.stream_request_body
class FlinkHandler(tornado.web.RequestHandler):
    """Base of every route: the guard, a capped body, JSON answers and Flink's error shape."""

    def initialize(self, server: RestBackend) -> None:
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
        elif isinstance(exc, RpcBusy):  # a limit reached: the same request may pass later
            exc = RestError(HTTPStatus.TOO_MANY_REQUESTS, str(exc), headers={"Retry-After": "1"})
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
        if not HEX_ID.fullmatch(value):
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

