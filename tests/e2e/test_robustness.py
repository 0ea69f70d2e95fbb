"""Garbage, unauthenticated and malformed input to every listening socket: dropped, logged, survived."""
from __future__ import annotations

import json
import os
import socket
import urllib.error

import msgpack
import pytest
import zmq

from cluster.protocol import messages as m
from cluster.protocol.codec import Codec
from kernel_runtime import StreamEnvironment
from tests.conftest import rest


def _zmq_garbage(address: str, secret: bytes) -> None:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(address)
    header = msgpack.packb({"op": "cancel-job", "job_id": 12}, use_bin_type=True)
    good = Codec(secret)
    for frames in (
        [b""],
        [b"garbage"],
        [os.urandom(32), b"\x81\xa2op\xa9list-jobs"],                     # forged signature
        Codec(os.urandom(32)).encode(m.ShutdownCluster()),                 # wrong secret
        Codec(os.urandom(32)).encode(m.SubmitJob({"job_id": "x"}, None)),  # wrong secret, code-carrying op
        [good._mac([header]), header],                                     # signed, but a bad field type
        [good._mac([b"\xc1"]), b"\xc1"],                                   # signed, undecodable msgpack
        good.encode(m.BufferResponse("no/such/channel/0/0", 0), payload=[b"not arrow"]),
        good.encode(m.AddCredit("no/such/channel/0/0", 5)),
        good.encode(m.RegistrationSuccess(1)),                             # valid but not for this socket
    ):
        sock.send_multipart(frames)
    sock.close()


def _tcp_garbage(address: str) -> None:
    host, port = address.replace("tcp://", "").replace("http://", "").rsplit(":", 1)
    for payload in (os.urandom(4096), b"\xff" * 64, b"GET / HTTP/1.1\r\n\r\n", b"\x00\x00\x00"):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(payload)


def _raw_http(address: str, request: bytes) -> bytes:
    """The first bytes the HTTP server answers to a raw request."""
    host, port = address.replace("http://", "").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        return s.recv(4096)


def test_garbage_to_every_socket_is_dropped_and_the_cluster_keeps_serving(cluster, client):
    secret = cluster.info.secret
    _, tms = rest(cluster, "/taskmanagers")
    data_addresses = [tm["path"] for tm in tms["taskmanagers"]]
    result_address = client.results.address
    for address in [cluster.info.rpc_address, *data_addresses, result_address]:
        _zmq_garbage(address, secret)
        _tcp_garbage(address)
    _tcp_garbage(cluster.info.rest_address)
    # malformed REST paths are answered with an error each, as the client sent them
    for path, code in (("/jobs/not-a-job", 400), ("/jobs/" + "0" * 32, 404), ("/%%%", 404), ("/%00", 404)):
        with pytest.raises(urllib.error.HTTPError) as answer:
            rest(cluster, path)
        assert answer.value.code == code, (path, answer.value)
    assert rest(cluster, "/jobs/overview?x=%00")[0] == 200
    # a raw NUL in the request line (urllib refuses to send one): refused with a 4xx, not a hang up
    assert _raw_http(cluster.info.rest_address, b"GET /jobs/overview?x=\x00 HTTP/1.1\r\nHost: x\r\n\r\n")[:10] \
        in (b"HTTP/1.1 4", b"HTTP/1.0 4"), "a NUL in the request line was not refused with a 4xx"

    # still serving: every process is alive and a job runs to the right result
    _, overview = rest(cluster, "/overview")
    assert overview["taskmanagers"] == 2 and overview["slots-total"] == 4
    env = StreamEnvironment(parallelism=4, cluster=cluster.cluster_dir)
    env.from_generator(count=2_000).key_by("seq").count().collect()
    out = env.execute_async("after garbage", client=client).wait(30).to_pandas()
    assert len(out) == 2_000 and (out["count"] == 1).all()
    jm_log = (cluster.cluster_dir / "log" / "jobmanager.log").read_text()
    assert "dropped malformed message" in jm_log and "bad or missing signature" in jm_log
    assert "field 'job_id' is not" in jm_log
    assert "does not handle registration-success" in jm_log or "no handler for registration-success" in jm_log
    assert all(proc.poll() is None for proc in [cluster.jobmanager, *cluster.taskmanagers])


def test_unauthenticated_rest_cannot_submit_code(cluster):
    # the REST API offers no job submission at all: code only enters through signed messages
    import urllib.error
    import urllib.request
    req = urllib.request.Request(cluster.info.rest_address + "/jars/upload", data=b"{}", method="POST",
                                 headers={**cluster.info.rest_headers, "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=5)
        raise AssertionError("POST /jars/upload was accepted")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404
        assert json.loads(exc.read())["errors"]
