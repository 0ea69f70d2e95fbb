"""A signed frame captured on its way to the leader cannot be resent to the leader that replaces it.

The attacker shares the machine without the cluster secret: it captured the bytes of a savepoint
trigger that a token holder sent, the leader then died, and it resends the same bytes to the new
leader. The new leader's replay window never saw them; what refuses them is its floor (a frame
signed before the receiver existed was made for another, cluster/protocol/codec.py).
"""
from __future__ import annotations

import os
import signal

import pytest
import zmq

from cluster.protocol import messages as m
from cluster.protocol.codec import Codec
from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.client.cluster_info import ClusterInfo
from tests.conftest import rest, wait_for

from .conftest import ha_cluster, shown_and_stopped
from .test_zookeeper_ha import answered, leader_pid

pytestmark = pytest.mark.slow


def _dealer(address: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock


def _log(ha, name: str) -> str:
    return (ha.cluster_dir / "log" / f"{name}.log").read_text(errors="replace")


def test_a_savepoint_trigger_replayed_to_the_new_leader_is_refused(zookeeper, tmp_path):
    savepoints = tmp_path / "savepoints"
    savepoints.mkdir()
    with shown_and_stopped(ha_cluster(tmp_path / "ha-replay", zookeeper.quorum)) as ha:
        ha.start_jobmanager()
        ha.info = ha.leader()
        standby = ha.start_jobmanager()
        ha.start_taskmanager()
        wait_for(lambda: rest(ha, "/overview")[1]["taskmanagers"] == 1, 60, "the TaskManager")
        env = StreamEnvironment(parallelism=2, cluster=ha.cluster_dir,
                                config={"execution.checkpointing.interval": "500 ms"})
        env.from_generator(rate=2_000, batch_size=100).key_by("seq").count().collect()
        client = JobClient(ClusterInfo.load(ha.cluster_dir))
        try:
            handle = env.execute_async("replayed across a failover", client=client)
            handle.wait_for_rows(200, timeout=60)
            codec = Codec(ha.info.secret)
            captured = codec.encode(m.TriggerSavepoint(handle.job_id, str(savepoints), False), cid=1)
            sock = _dealer(ha.info.rpc_address)
            try:
                sock.send_multipart(captured)  # the token holder's own request: one savepoint
                assert sock.poll(60_000), "no answer from the leader"
                assert isinstance(codec.decode(sock.recv_multipart())[0], m.SavepointCompleted)
            finally:
                sock.close()
            assert len(list(savepoints.iterdir())) == 1

            pid = leader_pid(ha)
            os.kill(pid, signal.SIGKILL)
            ha.process_of(pid)[1].wait(5)
            ha.info = ha.leader(60, not_pid=pid)
            wait_for(lambda: (answered(ha, f"/jobs/{handle.job_id}") or {}).get("state") == "RUNNING", 60,
                     "the job RUNNING under the new leader")

            sock = _dealer(ha.info.rpc_address)
            try:
                for _ in range(3):
                    sock.send_multipart(captured)
                wait_for(lambda: _log(ha, standby).count("dropped replayed message") >= 3, 30,
                         "the new leader to refuse the resent frames")
                # a fresh request on the same connection: its answer comes after any a replay was given
                fresh = Codec(ha.info.secret)
                sock.send_multipart(fresh.encode(m.RequestClusterOverview(), cid=7))
                assert sock.poll(30_000), "no answer to a fresh request"
                answer, cid, _ = fresh.decode(sock.recv_multipart())
                assert isinstance(answer, m.ClusterOverview) and cid == 7, f"a replayed request was answered: {answer}"
            finally:
                sock.close()
            assert "before this receiver started" in _log(ha, standby)
            assert len(list(savepoints.iterdir())) == 1, [p.name for p in savepoints.iterdir()]
            assert rest(ha, f"/jobs/{handle.job_id}")[1]["state"] == "RUNNING"
            handle.cancel()
            wait_for(lambda: handle.status == "CANCELED", 30, "the job cancelled")
        finally:
            client.close()
