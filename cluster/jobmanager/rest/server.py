"""The Dispatcher's REST server (Flink's RestServerEndpoint), on tornado: the listening sockets,
the thread and IOLoop that serve them, and the RestServer that routes handlers.py's table.

The HTTP server runs its own thread and IOLoop, so no request waits on the JobManager's loop
thread and the loop never waits on a socket; the handlers hand their work to the loop
(base_handler.py). What a request must pass first is security.py's; errors have Flink's shape,
``{"errors": ["..."]}``. A standby JobManager serves the same sockets with a forwarder
(forwarding.py) and hands them over when it wins.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import socket
import threading
from typing import Optional

import tornado.web
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.netutil import bind_sockets

from cluster.conf import Configuration, port_candidates

from cluster.jobmanager.rest.handlers import NotFoundHandler, route_table
from cluster.jobmanager.rest.security import RequestGuard
from cluster.jobmanager.rest.views import JobManagerState, job_master
from cluster.conf.options import CheckpointingOptions, RestOptions

log = logging.getLogger(__name__)


def _log_request(handler: tornado.web.RequestHandler) -> None:
    status = handler.get_status()
    level = logging.DEBUG if status < 400 else logging.INFO if status < 500 else logging.ERROR
    log.log(level, "rest: %d %s %s (%.1f ms)", status, handler.request.method, handler.request.uri,
            1000 * handler.request.request_time())


def bind_rest_sockets(conf: Configuration) -> list[socket.socket]:
    """Listening sockets at rest.bind-address on the first free port of rest.bind-port (Flink's
    port list and ranges; not set: rest.port), so JobManagers of one host share one config.yaml."""
    host = conf.get(RestOptions.BIND_ADDRESS) or conf.get(RestOptions.ADDRESS)
    spec = conf.get(RestOptions.BIND_PORT) or str(conf.get(RestOptions.PORT))
    key = "rest.bind-port" if conf.get(RestOptions.BIND_PORT) else "rest.port"
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
    def __init__(self, dispatcher: JobManagerState, conf: Configuration, token: str,
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
        return conf.get(CheckpointingOptions.SAVEPOINT_DIRECTORY), conf.get(CheckpointingOptions.ALLOWED_SAVEPOINT_DIRECTORIES)

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
