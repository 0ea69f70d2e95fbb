"""A standby JobManager's REST endpoint answers for the leader, and as the leader once it wins.

Real ZooKeeper, real JobManager and TaskManager processes: the standby forwards each request to
the REST address the leader published (the leader checks the token), answers 503 while no leader
is known or the known one is dead, and keeps its address when it becomes the leader itself.
Also: rest.bind-port's first free port, with real sockets.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from email.message import Message
from typing import Optional

import pandas as pd
import pytest

from cluster.conf import Configuration
from cluster.ha.services import LATCH_PREFIX, cluster_root, make_client
from cluster.jobmanager.rest.server import bind_rest_sockets
from cluster.protocol.auth import load_secret, rest_token
from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.deploy.ha import free_port
from tests.conftest import wait_for

from .conftest import ha_cluster


def call(address: str, path: str, token: Optional[str], method: str = "GET",
         body: Optional[dict] = None) -> tuple[int, Message, dict]:
    """status, headers (names case-insensitive), JSON body of a request to ``address+path`` (an
    error status is an answer too)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    request = urllib.request.Request(address + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.headers, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.headers, json.loads(error.read())


# ---------------------------------------------------------------------- rest.bind-port
def test_rest_binds_the_first_free_port_of_rest_bind_port():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        conf = Configuration({"rest.bind-port": f"{taken},{taken}-{taken},0"})
        sockets = bind_rest_sockets(conf)
        try:
            assert sockets[0].getsockname()[1] not in (taken, 0)
        finally:
            for s in sockets:
                s.close()
        with pytest.raises(OSError, match=rf"no free port in rest.bind-port '{taken}-{taken}' at 127.0.0.1"):
            bind_rest_sockets(Configuration({"rest.bind-port": f"{taken}-{taken}"}))
        # not set: rest.port is bound, and named when it is taken
        with pytest.raises(OSError, match=rf"no free port in rest.port '{taken}'"):
            bind_rest_sockets(Configuration({"rest.port": taken}))


# ---------------------------------------------------------------------- standby answers
def test_a_standby_answers_503_until_a_leader_is_elected_then_leads_at_the_same_address(zookeeper, tmp_path):
    ha = ha_cluster(tmp_path / "ha-nobody", zookeeper.quorum)
    conf = Configuration.from_file(ha.cluster_dir / "config.yaml")
    # a contender of the test's own holds the lowest latch node: the JobManager stands by, and no
    # leader publishes its addresses
    contender = make_client(conf)
    contender.start()
    try:
        contender.ensure_path(f"{cluster_root(conf)}/leaderlatch")
        contender.create(f"{cluster_root(conf)}/leaderlatch/{LATCH_PREFIX}", ephemeral=True, sequence=True)
        name = ha.start_jobmanager()
        address = ha.standby_rest(name)
        token = rest_token(load_secret(ha.cluster_dir / "secret"))
        status, headers, body = call(address, "/overview", token)
        assert status == 503, body
        assert body["errors"][0].startswith("No JobManager leads yet")
        assert headers["Retry-After"] == "1"
        contender.stop()  # its latch node goes: the JobManager leads
        statuses = []

        def led_at_the_same_address():
            statuses.append(call(address, "/overview", token)[0])  # refused connections raise here
            return statuses[-1] == 200
        wait_for(led_at_the_same_address, 30, "the standby to answer as the leader")
        assert set(statuses) <= {200, 503}
        info = ha.leader()
        assert info.rest_address == address
        assert "Via" not in call(address, "/overview", token)[1]  # the leader's own answer
        assert not list(ha.cluster_dir.glob("jobmanager-standby-*.json"))
    except BaseException:
        print(ha.log_tails())
        raise
    finally:
        contender.stop()
        contender.close()
        ha.stop()


@pytest.mark.slow
def test_a_standby_answers_for_the_leader_and_as_the_new_leader_after_a_kill(zookeeper, tmp_path):
    # one config.yaml for both JobManagers of this host: each binds the first free port of the list
    ports = [free_port(), free_port()]
    while ports[1] == ports[0]:
        ports[1] = free_port()
    ha = ha_cluster(tmp_path / "ha-rest", zookeeper.quorum, **{"rest.bind-port": f"{ports[0]},{ports[1]}"})
    try:
        ha.start_jobmanager()
        ha.info = leader = ha.leader()
        standby = ha.start_jobmanager()
        address = ha.standby_rest(standby)
        assert (leader.rest_address, address) == tuple(f"http://127.0.0.1:{p}" for p in ports)
        ha.start_taskmanager()
        ha.start_taskmanager()
        token = leader.rest_token
        wait_for(lambda: call(leader.rest_address, "/overview", token)[2]["taskmanagers"] == 2, 60,
                 "two TaskManagers")
        client = JobClient(leader)
        env = StreamEnvironment(parallelism=1, cluster=ha.cluster_dir)
        env.from_generator(lambda seq: pd.DataFrame({"seq": seq}), rate=20, batch_size=10).print()
        job_id = env.execute_async("answered by a standby", client=client).job_id
        client.close()
        wait_for(lambda: call(leader.rest_address, f"/jobs/{job_id}/status", token)[2].get("status") == "RUNNING",
                 60, "the job running")

        for path in ("/overview", "/jobs", f"/jobs/{job_id}/status"):
            at_leader, through_standby = call(leader.rest_address, path, token), call(address, path, token)
            assert through_standby[0] == at_leader[0] == 200, path
            assert through_standby[2] == at_leader[2], path
            assert through_standby[1]["Content-Type"] == at_leader[1]["Content-Type"]
            assert through_standby[1]["Via"].startswith("1.1 streamlab-standby")
        assert job_id in [j["id"] for j in call(address, "/jobs", token)[2]["jobs"]]

        # the leader decides on the token; the standby passes its answer on, challenge included
        for wrong in ("not-the-token", None):
            refused, refused_at_leader = call(address, "/overview", wrong), call(leader.rest_address, "/overview", wrong)
            assert refused[0] == refused_at_leader[0] == 401
            assert refused[2] == refused_at_leader[2]
            assert refused[1]["WWW-Authenticate"] == refused_at_leader[1]["WWW-Authenticate"]

        # a body and its type reach the leader, whose checks of it answer
        bad_field = call(address, f"/jobs/{job_id}/savepoints", token, "POST", {"target-dir": "/tmp"})
        assert bad_field[0] == 400
        assert bad_field[2] == call(leader.rest_address, f"/jobs/{job_id}/savepoints", token, "POST",
                                    {"target-dir": "/tmp"})[2]
        assert "unknown field(s) target-dir" in bad_field[2]["errors"][0]

        pid = json.loads((ha.cluster_dir / "jobmanager.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        ha.process_of(pid)[1].wait(5)
        answers: list[tuple[int, dict]] = []

        def answered_as_leader():
            status, headers, body = call(address, "/overview", token)  # a refused connection raises
            answers.append((status, body))
            return status == 200 and "Via" not in headers and body["taskmanagers"] == 2
        wait_for(answered_as_leader, 60, "the standby's address to answer as the new leader with both TaskManagers")
        took = time.monotonic() - killed_at
        between = [body for status, body in answers if status != 200]
        assert all(status in (200, 503) for status, _ in answers), answers
        # the dead leader's session holds the latch for the session timeout: meanwhile the standby says so
        assert any("does not answer" in body["errors"][0] for body in between), between
        new_leader = ha.leader(30, not_pid=pid)
        assert new_leader.rest_address == address
        assert not (ha.cluster_dir / f"jobmanager-standby-{ha.jobmanagers[standby].pid}.json").exists()
        wait_for(lambda: job_id in [j["id"] for j in call(address, "/jobs", token)[2]["jobs"]], 30,
                 "the recovered job listed at the new leader")
        print(f"kill to the standby's address answering as leader with both TaskManagers: {took:.2f} s "
              f"({len(between)} answers of 503 before)")
    except BaseException:
        print(ha.log_tails())
        raise
    finally:
        ha.stop()
