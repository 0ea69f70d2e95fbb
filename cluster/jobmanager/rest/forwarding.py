"""A standby JobManager's REST endpoint: it answers for the leader, as Flink's non-leading
JobManagers do ("every JobManager's REST endpoint answers").

Each request is passed on as it came (method, path and query, body, ``Authorization``) to the REST
address the leader published in ZooKeeper, and the leader's status, headers and body go back: the
leader checks the token, so a standby holds no credentials of its own and answers nothing the
leader would refuse. While no leader is known, or the one known does not answer (it died and
ZooKeeper has not ended its session yet), the answer is 503 in Flink's error shape.

The standby still guards what the leader cannot see: the Host header its client sent (a
DNS-rebound name is refused here, since the leader sees the standby's request) and the body size.
Forwarding runs on the server's own IOLoop with tornado's ``AsyncHTTPClient``: no thread waits for
the leader, and the leader's address is read without blocking (``leader_rest``).

When the standby wins, ``hand_over_sockets`` gives its listening sockets to the new leader's
RestServer: a client that knew the standby's address keeps reaching it.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import time
from http import HTTPStatus
from typing import Callable, Optional, cast

import tornado.web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from cluster.conf import Configuration

from cluster.jobmanager.rest.base_handler import LOOP_TIMEOUT_S, FlinkHandler
from cluster.jobmanager.rest.security import RequestGuard, RestError
from cluster.jobmanager.rest.server import HttpServerThread, _log_request

log = logging.getLogger(__name__)

# The leader's own answer may take LOOP_TIMEOUT_S (its loop is busy) before it says 503 itself.
FORWARD_TIMEOUT_S = LOOP_TIMEOUT_S + 5.0
CONNECT_TIMEOUT_S = 2.0
# What a request carries to the leader: the credentials and the body's type; the rest (Host,
# Connection, lengths) belongs to the hop and is made anew by the client.
FORWARDED_REQUEST_HEADERS = ("Authorization", "Content-Type", "Accept")
# Hop-by-hop headers (RFC 9110 section 7.6.1) and those tornado writes itself.
NOT_FORWARDED_RESPONSE_HEADERS = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding",
                                            "te", "trailer", "upgrade", "content-length", "date", "server"})
# How long a stopping forwarder still reads requests of connections it accepted before it stopped.
DRAIN_SETTLE_S = 0.05
METHODS_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


class ForwardHandler(FlinkHandler):
    """Every path and method: the leader's route table decides what exists."""

    @property
    def forwarder(self) -> "RestForwarder":
        # FlinkHandler's ``server`` (the guard, the body cap) is the forwarder here
        return cast("RestForwarder", self.server)

    def prepare(self) -> None:
        self.forwarder.in_flight += 1
        self._counted = True
        try:
            self.server.guard.check(self.request, check_token=False)
        except RestError:
            self._discard_body()
            raise

    async def _forward(self, *args) -> None:
        leader = self.forwarder.leader_rest()
        if leader is None:
            raise RestError(HTTPStatus.SERVICE_UNAVAILABLE,
                            f"No JobManager leads yet: this standby answers for the leader once one is elected "
                            f"in ZooKeeper under {self.forwarder.zookeeper_root}", {"Retry-After": "1"})
        method = self.request.method or "GET"
        headers = {name: value for name in FORWARDED_REQUEST_HEADERS
                   if (value := self.request.headers.get(name)) is not None}
        request = HTTPRequest(leader.rstrip("/") + self.request.uri, method=method, headers=headers,
                              body=bytes(self._body) if self._body or method in METHODS_WITH_BODY else None,
                              follow_redirects=False, allow_nonstandard_methods=True, decompress_response=False,
                              connect_timeout=CONNECT_TIMEOUT_S, request_timeout=FORWARD_TIMEOUT_S)
        try:
            # raise_error=False: the leader's error statuses are answers; no answer at all still raises
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (OSError, HTTPClientError) as exc:  # refused, reset or timed out
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise RestError(HTTPStatus.SERVICE_UNAVAILABLE,
                            f"The leading JobManager at {leader} does not answer ({reason}); a standby "
                            "takes over once ZooKeeper ends the leader's session", {"Retry-After": "1"}) from None
        self.set_status(response.code, response.reason)
        seen: set[str] = set()
        for name, value in response.headers.get_all():
            if name.lower() in NOT_FORWARDED_RESPONSE_HEADERS:
                continue
            # the leader's value replaces our default; a repeated header keeps every value
            (self.add_header if name.lower() in seen else self.set_header)(name, value)
            seen.add(name.lower())
        self.add_header("Via", f"1.1 streamlab-standby:{self.forwarder.port}")
        if response.body and method != "HEAD" and response.code not in (204, 304):
            self.write(response.body)
        self.finish()

    def on_finish(self) -> None:
        self._uncount()

    def on_connection_close(self) -> None:
        self._uncount()

    def _uncount(self) -> None:
        if getattr(self, "_counted", False):
            self._counted = False
            self.forwarder.in_flight -= 1

    get = head = post = delete = patch = put = options = _forward


def _log_forwarded(handler: tornado.web.RequestHandler) -> None:
    if handler.get_status() == HTTPStatus.SERVICE_UNAVAILABLE:
        # no leader to answer for: expected while one is elected, no server error of ours
        log.info("rest (standby): 503 %s %s", handler.request.method, handler.request.uri)
    else:
        _log_request(handler)


class RestForwarder(HttpServerThread):
    """The REST endpoint of a standby JobManager. ``leader_rest()`` gives the leader's REST
    address or None; it is called on this server's IOLoop and must not block."""

    def __init__(self, conf: Configuration, leader_rest: Callable[[], Optional[str]], zookeeper_root: str,
                 sockets: list[socket.socket]):
        self.guard = RequestGuard(conf, token="")  # never asked to check a token (check_token=False)
        self.leader_rest = leader_rest
        self.zookeeper_root = zookeeper_root
        self.dispatcher = None  # FlinkHandler's field; nothing here touches a Dispatcher
        self.in_flight = 0  # requests being forwarded (IOLoop thread only)
        application = tornado.web.Application(
            [(r".*", ForwardHandler, {"server": self})], log_function=_log_forwarded)
        super().__init__(application, sockets, "rest-forward")

    async def _drained(self) -> None:
        # a request forwarded when leadership came is answered, not cut off by the hand-over: the
        # client of a standby address sees an answer (maybe 503) or the new leader, never a reset
        deadline = time.monotonic() + CONNECT_TIMEOUT_S + 1.0
        await asyncio.sleep(DRAIN_SETTLE_S)  # connections accepted just before: their requests arrive
        while self.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
