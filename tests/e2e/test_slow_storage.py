"""Slow storage never stalls the JobManager: disk work runs on its storage executor.

A savepoint whose ``_metadata`` is a named pipe blocks whoever reads it until someone writes to
the pipe, as a hung network file system would. While the JobManager waits for it longer than
``heartbeat.timeout``, its loop must go on hearing heartbeats (no TaskManager declared lost) and
answering requests.
"""
from __future__ import annotations

import os
import threading
import time


from cluster.protocol.endpoint import RpcError
from kernel_runtime import JobClient, StreamEnvironment
from tests.conftest import FAST, rest

from .heartbeats import wait_for_heartbeats

HEARTBEAT_TIMEOUT_S = int(FAST["heartbeat.timeout"].split()[0])


def test_storage_blocked_longer_than_the_heartbeat_timeout_loses_no_taskmanager(cluster, tmp_path):
    savepoint = tmp_path / "savepoint-on-a-hung-disk"
    savepoint.mkdir()
    os.mkfifo(savepoint / "_metadata")
    log = cluster.cluster_dir / "log" / "jobmanager.log"
    lost_before = log.read_text().count(" lost")
    _, before = rest(cluster, "/taskmanagers")

    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir,
                            config={"execution.savepoint.path": str(savepoint)})
    env.from_generator(count=10).collect()
    outcome: dict = {}
    client = JobClient(cluster.info, timeout=60)

    def submit():
        try:
            outcome["handle"] = env.execute_async("from a hung disk", client=client)
        except Exception as exc:  # expected: the savepoint turns out to be garbage
            outcome["error"] = exc
    submitter = threading.Thread(target=submit)
    submitter.start()
    ids = {tm["id"] for tm in before["taskmanagers"]}
    try:
        # the loop goes on hearing both TaskManagers, and answering, while its storage hangs for
        # more than twice heartbeat.timeout: heartbeats received that long after the submission
        wait_for_heartbeats(cluster, ids, after=time.time() + 2.5 * HEARTBEAT_TIMEOUT_S)
        status, overview = rest(cluster, "/overview")
        assert status == 200 and overview["taskmanagers"] == 2
        assert submitter.is_alive(), "the submission should still wait for the savepoint's metadata"
    finally:
        with open(savepoint / "_metadata", "w") as pipe:  # the disk comes back, with garbage
            pipe.write("not json")
        submitter.join(30)
        client.close()
    assert isinstance(outcome.get("error"), RpcError)
    assert "cannot start from savepoint" in str(outcome["error"]) and "not valid JSON" in str(outcome["error"])
    # had a heartbeat been missed, expiry would run right after the loop woke: a heartbeat of
    # each, received after the storage came back, shows the loop has run past that
    wait_for_heartbeats(cluster, ids, after=time.time() + 0.5)
    assert log.read_text().count(" lost") == lost_before
    _, after = rest(cluster, "/taskmanagers")
    assert {tm["id"] for tm in after["taskmanagers"]} == {tm["id"] for tm in before["taskmanagers"]}
