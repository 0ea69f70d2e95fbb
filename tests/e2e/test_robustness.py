"""Garbage, unauthenticated and malformed input to every listening socket: dropped, logged, survived."""
from __future__ import annotations

import json
import os
import socket

import msgpack
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


def test_garbage_to_every_socket_is_dropped_and_the_cluster_keeps_serving(cluster, client):
    secret = cluster.info.secret
    _, tms = rest(cluster, "/taskmanagers")
    data_addresses = [tm["path"] for tm in tms["taskmanagers"]]
    result_address = client.results.address
    for address in [cluster.info.rpc_address, *data_addresses, result_address]:
        _zmq_garbage(address, secret)
        _tcp_garbage(address)
    _tcp_garbage(cluster.info.rest_address)
    for path in ("/jobs/not-a-job", "/jobs/" + "0" * 32, "/%%%", "/jobs/overview?x=\x00"):
        try:
            rest(cluster, path)
        except Exception:
            pass  # 404s are the expected answer; the server must only stay up

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
