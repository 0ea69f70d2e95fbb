"""The ZooKeeper history check of the leader fault tests (zookeeper_history.py) on writes made
here by two ZooKeeper sessions of our own: a write of a leader by a session that does not hold the
leader node is found, and the leader's own are not."""
from __future__ import annotations

import uuid

from kazoo.client import KazooClient

from .zookeeper_history import leader_writes


def test_a_write_of_a_leader_by_another_session_is_found(zookeeper):
    root = f"/flink/history-{uuid.uuid4().hex[:8]}"
    leader, other = KazooClient(hosts=zookeeper.quorum), KazooClient(hosts=zookeeper.quorum)
    leader.start()
    other.start()
    try:
        leader.create(f"{root}/leader", b"{}", ephemeral=True, makepath=True)
        leader.create(f"{root}/checkpoints/job", b"1", makepath=True)
        other.set(f"{root}/checkpoints/job", b"2")  # a second leader acting
        leader.set(f"{root}/checkpoints/job", b"3")
        leader.stop()  # its session closes: no one leads
        other.set(f"{root}/checkpoints/job", b"4")
    finally:
        leader.close()
        other.stop()
        other.close()
    writes, wrong = leader_writes(zookeeper.directory / "data", root)
    assert [w.op for w in writes] == ["create", "setData", "setData", "setData"]
    assert len(wrong) == 2, wrong
    assert "while the leader was 0x" in wrong[0] and "while the leader was no one" in wrong[1]
