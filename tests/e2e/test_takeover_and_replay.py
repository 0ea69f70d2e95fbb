"""A TaskManager's identity cannot be taken over, and a captured signed message cannot be replayed.

The attacker here shares the machine: it can read a TaskManager's id (GET /taskmanagers) and may
have captured signed frames, but it does not know the cluster secret.
"""
from __future__ import annotations

import time

import zmq

from cluster.protocol import messages as m
from cluster.protocol.codec import Codec
from kernel_runtime import StreamEnvironment
from tests.conftest import FAST, rest, wait_for

from .heartbeats import wait_for_heartbeats

HEARTBEAT_TIMEOUT_S = float(FAST["heartbeat.timeout"].split()[0])


def _dealer(address: str, identity: bytes | None = None) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(address)
    return sock


def _answer(sock: zmq.Socket, codec: Codec, timeout_s: float) -> m.Message:
    assert sock.poll(int(timeout_s * 1000)), "no answer from the JobManager"
    return codec.decode(sock.recv_multipart())[0]


def _registered(cluster) -> set[str]:
    _, body = rest(cluster, "/taskmanagers")
    return {tm["id"] for tm in body["taskmanagers"]}


def _jm_log(cluster) -> str:
    return (cluster.cluster_dir / "log" / "jobmanager.log").read_text(errors="replace")


def _count_job(cluster, client, name: str) -> None:
    env = StreamEnvironment(parallelism=4, cluster=cluster.cluster_dir)
    env.from_generator(count=2_000).key_by("seq").count().collect()
    out = env.execute_async(name, client=client).wait(20).to_pandas()
    assert len(out) == 2_000 and (out["count"] == 1).all()


def _running_job(cluster, client, name: str):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    env.from_generator(rate=2_000, batch_size=100).key_by("seq").count().collect()
    return env.get_job_graph(name)


def _wait_running(handle) -> None:
    wait_for(lambda: handle.status == "RUNNING" and len(handle.results) > 100, 20, "job running")


def _replay(cluster, frames: list, times: int = 5) -> None:
    """Resend captured bytes from a connection of its own, as a process without the secret would,
    and wait until the JobManager has refused them all."""
    before = _jm_log(cluster).count("dropped replayed message")
    sock = _dealer(cluster.info.rpc_address)
    try:
        for _ in range(times):
            sock.send_multipart(frames)
        wait_for(lambda: _jm_log(cluster).count("dropped replayed message") >= before + times, 10,
                 "the replays refused")
        # a fresh request on the same connection: its answer comes after any a replay was given
        codec = Codec(cluster.info.secret)
        sock.send_multipart(codec.encode(m.RequestClusterOverview(), cid=424242))
        answer, cid, _ = codec.decode(sock.recv_multipart()) if sock.poll(10_000) else (None, None, None)
        assert isinstance(answer, m.ClusterOverview) and cid == 424242, f"a replayed request was answered: {answer}"
    finally:
        sock.close()


def test_connections_claiming_the_taskmanagers_ids_take_nothing_over(cluster, client):
    ids = _registered(cluster)
    assert len(ids) == 2
    imposters = [_dealer(cluster.info.rpc_address, tm_id.encode()) for tm_id in sorted(ids)]
    try:
        # held while the real TaskManagers go on heartbeating, as in the reported takeover
        wait_for_heartbeats(cluster, ids, after=time.time() + 1.0)
        _count_job(cluster, client, "while imposters are connected")  # the JobManager reaches the real ones
        for sock in imposters:
            assert not sock.poll(0), "an imposter received the TaskManager's traffic"
    finally:
        for sock in imposters:
            sock.close()
    # heartbeats from both, received later than heartbeat.timeout after the imposters were there:
    # a TaskManager the JobManager had stopped hearing would have been declared lost by then
    wait_for_heartbeats(cluster, ids, after=time.time() + HEARTBEAT_TIMEOUT_S + 0.5)
    assert _registered(cluster) == ids
    _, overview = rest(cluster, "/overview")
    assert overview["taskmanagers"] == 2 and overview["slots-total"] == 4
    _count_job(cluster, client, "after the imposters left")


def test_a_signed_message_speaking_for_another_taskmanager_is_dropped(cluster):
    # even a holder of the secret on another connection cannot disconnect a TaskManager
    victim = sorted(_registered(cluster))[0]
    codec = Codec(cluster.info.secret)
    sock = _dealer(cluster.info.rpc_address)
    try:
        sock.send_multipart(codec.encode(m.DisconnectTaskManager(victim, "forged")))
        sock.send_multipart(codec.encode(m.HeartbeatFromTaskManager(victim, [], "")))
        wait_for(lambda: _jm_log(cluster).count(f"speaks for {victim}") >= 2, 10, "the forged messages dropped")
    finally:
        sock.close()
    assert f"TaskManager {victim} disconnected: forged" not in _jm_log(cluster)
    wait_for_heartbeats(cluster, [victim], after=time.time())  # still registered, still heard


def test_a_replayed_savepoint_trigger_takes_no_second_savepoint(cluster, client, tmp_path):
    handle = client.submit(_running_job(cluster, client, "replayed savepoint"))
    try:
        _wait_running(handle)
        codec = Codec(cluster.info.secret)
        captured = codec.encode(m.TriggerSavepoint(handle.job_id, str(tmp_path), False), cid=1)
        sock = _dealer(cluster.info.rpc_address)
        try:
            sock.send_multipart(captured)  # the original request: one savepoint
            assert isinstance(_answer(sock, codec, 60), m.SavepointCompleted)
        finally:
            sock.close()
        _replay(cluster, captured)
        assert len(list(tmp_path.iterdir())) == 1, [p.name for p in tmp_path.iterdir()]
        assert handle.status == "RUNNING"
    finally:
        handle.cancel()
        wait_for(lambda: handle.status == "CANCELED", 20, "job cancelled")


def test_a_replayed_cancel_does_not_cancel_a_new_job(cluster, client):
    graph = _running_job(cluster, client, "replayed cancel")
    codec = Codec(cluster.info.secret)
    captured = codec.encode(m.CancelJob(graph.job_id), cid=1)
    sock = _dealer(cluster.info.rpc_address)
    try:
        sock.send_multipart(captured)  # sent before the job exists: answered with an error
        answer = _answer(sock, codec, 10)
        assert isinstance(answer, m.ErrorResponse) and graph.job_id in answer.message
    finally:
        sock.close()
    handle = client.submit(graph)
    try:
        _wait_running(handle)
        _replay(cluster, captured)  # refused, and then a later request answered: the JobManager's state is as of after them
        assert rest(cluster, f"/jobs/{handle.job_id}")[1]["state"] == "RUNNING"
        assert handle.status == "RUNNING"
    finally:
        handle.cancel()
        wait_for(lambda: handle.status == "CANCELED", 20, "job cancelled")
