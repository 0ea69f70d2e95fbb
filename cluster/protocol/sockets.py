"""ZeroMQ sockets as every process of the cluster makes them, and the addresses peers reach them at.

The RPC endpoints (cluster.protocol.endpoint), the data plane between TaskManagers, the events
socket and the clients all open their sockets here, so that each one gets the same limits
(no linger, a message size cap) and CURVE when the cluster's codec carries keys. Any thread may
call these functions; the socket each returns belongs to the thread that uses it.
"""
from __future__ import annotations

import itertools
import os
import socket

import zmq

from cluster.protocol import curve
from cluster.protocol.codec import Codec

MAX_MESSAGE_BYTES = 512 * 1024 * 1024


def make_socket(ctx: zmq.Context, kind: int) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    return sock


def bind_socket(sock: zmq.Socket, address: str, codec: Codec) -> str:
    """Bind a TCP socket, as a CURVE server when the cluster's codec carries keys; the bound address."""
    if codec.curve is not None:
        curve.serve(sock, codec.curve)
    sock.bind(address)
    return bound_address(sock)


def connect_socket(sock: zmq.Socket, address: str, codec: Codec) -> None:
    """Connect a TCP socket, as a CURVE client when the cluster's codec carries keys."""
    if codec.curve is not None:
        curve.dial(sock, codec.curve)
    sock.connect(address)


def bind_broadcast(sock: zmq.Socket, address: str, codec: Codec) -> str:
    """Bind a publishing socket: always a CURVE server (curve.broadcast_keys says why)."""
    curve.serve(sock, curve.broadcast_keys(codec))
    sock.bind(address)
    return bound_address(sock)


def subscribe_to(sock: zmq.Socket, address: str, codec: Codec) -> None:
    """Connect a subscribing socket to a publisher bound by ``bind_broadcast``."""
    curve.dial(sock, curve.broadcast_keys(codec))
    sock.connect(address)


_inproc_numbers = itertools.count()  # inproc names must be unique while an old one is still closing


def inproc_pair(ctx: zmq.Context, name: str) -> tuple[zmq.Socket, zmq.Socket]:
    """A PULL socket for a thread that polls, and the PUSH through which other threads hand it
    work or wake it (the PUSH is not thread-safe: its users share it under a lock)."""
    address = f"inproc://{name}-{os.getpid()}-{next(_inproc_numbers)}"
    recv = ctx.socket(zmq.PULL)
    recv.bind(address)
    send = ctx.socket(zmq.PUSH)
    send.connect(address)
    return recv, send


def bound_address(sock: zmq.Socket) -> str:
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def local_address_towards(address: str) -> str:
    """This host's address on the route to ``tcp://HOST:PORT``: where a peer in that network
    reaches us (127.0.0.1 when HOST is this machine's loopback)."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    family = socket.AF_INET6 if host.startswith("[") else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:  # UDP connect sends nothing
            probe.connect((host.strip("[]"), int(port)))
            return probe.getsockname()[0]
    except OSError:  # a name this host cannot resolve (yet): loopback, as before hosts
        return "127.0.0.1"


def advertised_address(sock: zmq.Socket, host: str) -> str:
    """The bound socket's address as peers reach it: ``tcp://host:<bound port>``. A socket bound
    to 0.0.0.0 in a container is reached at its Service name or pod IP, never at 0.0.0.0."""
    port = bound_address(sock).rsplit(":", 1)[1]
    return f"tcp://{host}:{port}"
