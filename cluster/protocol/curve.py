"""CurveZMQ between hosts: encryption and mutual authentication of every TCP socket.

``security.ssl.internal.enabled: true`` (Flink's switch for encrypting its internal connections)
turns it on; off, sockets behave as before (loopback clusters need no keys). Flink hands every
process one keystore and truststore; here every process derives the same two CURVE key pairs from
the cluster secret (HMAC with a label of its own, as the REST token is derived), so the keys are
made when the secret is (``cluster start``, ``jobmanager create-secret``), live in the cluster
directory with it (0600) and reach another host with ``--secret-file``. Servers prove they hold
the server key pair by completing the handshake; clients prove they hold the client pair to our
ZAP handler, which accepts that one public key only. A refused peer is logged: by the ZAP handler
(a peer with the server's public key but not the client pair) or by a socket monitor (a peer that
knows neither, or speaks plaintext, fails the handshake before ZAP is asked).
"""
from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import os
import queue
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import zmq
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from cluster.protocol.codec import Codec
from cluster.protocol.droplog import DropLog

log = logging.getLogger("streamlab.curve")

ENABLED_KEY = "security.ssl.internal.enabled"
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN_PREFIX = b"streamlab:"  # + the server's public key: one domain per cluster
_SERVER_LABEL = b"streamlab-curve-server"
_CLIENT_LABEL = b"streamlab-curve-client"
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def _key_pair(secret: bytes, label: bytes) -> tuple[bytes, bytes]:
    secret_key = z85.encode(hmac.new(secret, label, hashlib.sha256).digest())
    return zmq.curve_public(secret_key), secret_key


@dataclass(frozen=True)
class CurveKeys:
    """The cluster's two CURVE key pairs (Z85), derived from the cluster secret."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def from_secret(cls, secret: bytes) -> "CurveKeys":
        if not zmq.has("curve"):
            raise RuntimeError(f"{ENABLED_KEY} is true but this libzmq has no CURVE support")
        return cls(*_key_pair(secret, _SERVER_LABEL), *_key_pair(secret, _CLIENT_LABEL))

    @property
    def zap_domain(self) -> bytes:
        return ZAP_DOMAIN_PREFIX + self.server_public

    def __repr__(self) -> str:  # never a secret key in a log line
        return f"CurveKeys(server={self.server_public.decode()}, client={self.client_public.decode()})"


def curve_keys(conf, secret: bytes) -> Optional[CurveKeys]:
    """The keys when the configuration turns CurveZMQ on, else None."""
    return CurveKeys.from_secret(secret) if conf[ENABLED_KEY] else None


def serve(sock: zmq.Socket, keys: CurveKeys) -> None:
    """Make ``sock`` a CURVE server (before it binds) whose clients must hold the cluster's keys."""
    _guard_for(sock.context).admit(keys).watch(sock)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.server_public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.server_secret)
    sock.setsockopt(zmq.ZAP_DOMAIN, keys.zap_domain)


def dial(sock: zmq.Socket, keys: CurveKeys) -> None:
    """Make ``sock`` a CURVE client (before it connects) that talks to cluster servers only."""
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.client_public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.client_secret)


class _Guard:
    """A context's ZAP handler and the monitor of its CURVE servers, on one daemon thread."""

    def __init__(self, ctx: zmq.Context):
        self.ctx = ctx
        # a client in one process may serve results to several clusters: a domain per cluster
        self._allowed: dict[bytes, bytes] = {}
        self._zap = ctx.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(ZAP_ENDPOINT)  # bound before any server socket binds: no peer slips by
        self._monitors: queue.SimpleQueue = queue.SimpleQueue()
        # a refused peer retries every reconnect interval: its refusals must not flood the log,
        # whichever of the process's contexts (guards) sees them
        self.refusals = _REFUSALS
        self._thread = threading.Thread(target=self._run, name="curve-zap", daemon=True)
        self._thread.start()

    def admit(self, keys: CurveKeys) -> "_Guard":
        self._allowed[keys.zap_domain] = keys.client_public  # one dict store: safe beside the thread
        return self

    def watch(self, sock: zmq.Socket) -> None:
        address = f"inproc://curve-monitor-{os.getpid()}-{next(_monitor_numbers)}"
        sock.monitor(address, _HANDSHAKE_FAILED)
        self._monitors.put(address)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._zap, zmq.POLLIN)
        sockets = [self._zap]
        try:
            while True:
                while not self._monitors.empty():
                    mon = self.ctx.socket(zmq.PAIR)
                    mon.setsockopt(zmq.LINGER, 0)
                    mon.connect(self._monitors.get())
                    sockets.append(mon)
                    poller.register(mon, zmq.POLLIN)
                events = dict(poller.poll(100))
                self.refusals.flush()
                for sock in events:
                    try:
                        if sock is self._zap:
                            self._authenticate(sock.recv_multipart())
                        else:
                            self._report(parse_monitor_message(sock.recv_multipart()))
                    except zmq.ContextTerminated:
                        raise
                    except Exception:
                        log.exception("CurveZMQ guard: error handling a request")
        except zmq.ContextTerminated:
            for sock in sockets:  # else the context's term() waits for them forever
                sock.close(0)

    def _authenticate(self, request: list[bytes]) -> None:
        version, request_id, domain, address, _identity, mechanism, *credentials = request
        key = z85.encode(credentials[0]) if mechanism == b"CURVE" and credentials else b""
        if not domain.startswith(ZAP_DOMAIN_PREFIX):  # not a socket of ours: not ours to judge
            self._zap.send_multipart([version, request_id, b"200", b"OK", b"", b""])
            return
        if key and self._allowed.get(domain) == key:
            self._zap.send_multipart([version, request_id, b"200", b"OK", b"cluster", b""])
            return
        reason = (f"its client key {key.decode()} is not this cluster's" if key else
                  f"it offered {mechanism.decode(errors='replace')}, not CURVE")
        self.refusals.drop("refused connection", _Named(f"the peer at {address.decode(errors='replace')}"),
                           f"{reason} ({ENABLED_KEY} is false on its side, or it holds another cluster's secret)")
        self._zap.send_multipart([version, request_id, b"400", b"not a key of this cluster", b"", b""])

    def _report(self, event: Mapping[str, Any]) -> None:
        if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return  # the ZAP handler said why
        # a failed handshake names our endpoint only: the peer never proved who it is
        self.refusals.drop("refused connection", _Named(f"a peer of {event['endpoint'].decode(errors='replace')}"),
                           f"the handshake failed ({zmq.Event(event['event']).name}, code {event['value']:#x}): "
                           f"the peer does not hold this cluster's keys, or does not use CurveZMQ ({ENABLED_KEY})")


class _Named(str):
    """A peer as DropLog names it: its text, unquoted."""

    def __repr__(self) -> str:
        return str(self)


_REFUSALS = DropLog(log, "CurveZMQ")  # one log budget per process (DropLog is thread-safe)
_monitor_numbers = itertools.count()
_guards: dict[int, _Guard] = {}
_guards_lock = threading.Lock()


def _guard_for(ctx: zmq.Context) -> _Guard:
    with _guards_lock:
        guard = _guards.get(id(ctx))
        if guard is None or guard.ctx is not ctx:  # a new context at a dead one's id
            guard = _guards[id(ctx)] = _Guard(ctx)
        return guard


def broadcast_keys(codec: Codec) -> CurveKeys:
    """The keys of a socket that broadcasts (the JobManager's events): CURVE whether or not
    the cluster turns it on. A signature decides what a receiver accepts, not who may read, and a
    publisher sends to whoever connects; with the handshake only holders of the secret subscribe."""
    return codec.curve if codec.curve is not None else CurveKeys.from_secret(codec.secret)


def cluster_codec(conf, secret: bytes) -> Codec:
    """The codec of a cluster process or client: signs with the secret, and carries the CURVE keys
    when ``conf`` turns CurveZMQ on."""
    return Codec(secret, curve=curve_keys(conf, secret))
