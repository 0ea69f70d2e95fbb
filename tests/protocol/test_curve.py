"""CurveZMQ (security.ssl.internal.enabled) on real sockets: a client holding the cluster's keys
is served; a client with another cluster's keys, with only the server's public key, or in
plaintext is refused, and the refusal is logged by the serving process."""
from __future__ import annotations

import logging
import time

import pytest
import zmq

from cluster.conf import Configuration
from cluster.protocol import messages as m
from cluster.protocol.codec import Codec
from cluster.protocol.curve import CurveKeys, cluster_codec
from cluster.protocol.endpoint import RpcEndpoint
from cluster.protocol.rpc_client import RpcClient

SECRET = b"c" * 32
OTHER = b"o" * 32


@pytest.fixture
def server():
    conf = Configuration()
    conf.update({"security.ssl.internal.enabled": True}, "test")
    endpoint = RpcEndpoint("curve-test", cluster_codec(conf, SECRET), zmq.Context())  # a guard of its own
    endpoint.handlers[m.RequestControlStats] = lambda msg, peer: m.ControlStats({"served": 1})
    address = endpoint.bind_router("tcp://127.0.0.1:0")
    endpoint.start()
    yield address
    endpoint.stop()


def ask(address: str, codec: Codec, timeout: float = 2.0):
    client = RpcClient(address, codec, timeout, zmq.Context())
    try:
        return client.request(m.RequestControlStats(), expect=m.ControlStats)
    finally:
        client.close()


def wait_for_log(caplog, text: str, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [r.getMessage() for r in caplog.records if text in r.getMessage()]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no log line with {text!r}: {[r.getMessage() for r in caplog.records]}")


def test_the_keys_are_derived_from_the_secret_and_differ_per_cluster_and_role():
    keys = CurveKeys.from_secret(SECRET)
    assert keys == CurveKeys.from_secret(SECRET)
    assert keys.server_public != keys.client_public
    assert CurveKeys.from_secret(OTHER).server_public != keys.server_public
    assert keys.server_secret.decode() not in repr(keys) and keys.client_secret.decode() not in repr(keys)


def test_off_by_default_so_loopback_needs_no_keys():
    assert cluster_codec(Configuration(), SECRET).curve is None


def test_a_client_with_the_cluster_keys_is_served(server):
    assert ask(server, Codec(SECRET, curve=CurveKeys.from_secret(SECRET))).handled == {"served": 1}


def test_a_client_with_another_clusters_keys_is_refused_and_logged(server, caplog):
    caplog.set_level(logging.WARNING, "streamlab.curve")
    # the frame signing secret is right: it is CurveZMQ that refuses
    with pytest.raises(TimeoutError):
        ask(server, Codec(SECRET, curve=CurveKeys.from_secret(OTHER)), timeout=1.5)
    line = wait_for_log(caplog, "the handshake failed")
    assert line.startswith(f"CurveZMQ: dropped refused connection from a peer of {server}: "), line


def test_a_client_that_knows_only_the_server_public_key_is_refused_by_zap(server, caplog):
    caplog.set_level(logging.WARNING, "streamlab.curve")
    good, other = CurveKeys.from_secret(SECRET), CurveKeys.from_secret(OTHER)
    impostor = CurveKeys(good.server_public, other.server_secret, other.client_public, other.client_secret)
    with pytest.raises(TimeoutError):
        ask(server, Codec(SECRET, curve=impostor), timeout=1.5)
    line = wait_for_log(caplog, "refused connection from the peer at 127.0.0.1")
    assert f"its client key {other.client_public.decode()} is not this cluster's" in line


def test_a_plaintext_client_is_refused_and_logged(server, caplog):
    caplog.set_level(logging.WARNING, "streamlab.curve")
    with pytest.raises(TimeoutError):
        ask(server, Codec(SECRET), timeout=1.5)
    wait_for_log(caplog, "the handshake failed")
