"""Leader election and the HA stores: the pure decisions, then the same against a real ZooKeeper."""
from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from cluster.conf import Configuration
from cluster.common.launch import PROJECT_ROOT
from kernel_runtime.deploy.ha import LocalZooKeeper
from tests.conftest import wait_for
from cluster.ha.services import Granted, JoinElection, LeaderRetriever, Leadership, Revoked, ZooKeeperHaServices


def test_the_lowest_latch_leads_and_a_lost_session_revokes_at_once():
    a = Leadership()
    a.latch_created("/flink/x/leaderlatch/latch-0000000003")
    assert a.children_changed(["latch-0000000002", "latch-0000000003"]) == []  # another leads
    assert a.children_changed(["latch-0000000003"]) == [Granted()]
    assert a.children_changed(["latch-0000000003", "latch-0000000004"]) == []  # granted once
    assert a.session_state("SUSPENDED") == [Revoked("the ZooKeeper session is SUSPENDED")]
    assert not a.leading
    assert a.children_changed(["latch-0000000003"]) == []  # never again in this process


def test_a_standby_waits_through_a_suspended_session_and_rejoins_when_it_is_lost():
    b = Leadership()
    b.latch_created("latch-0000000005")
    b.children_changed(["latch-0000000004", "latch-0000000005"])
    assert b.session_state("SUSPENDED") == []
    assert b.session_state("CONNECTED") == []  # the same session: its node is still there
    assert b.session_state("LOST") == []
    assert b.children_changed(["latch-0000000004"]) == []  # no node of ours to decide on
    rejoin = b.session_state("CONNECTED")  # a new session
    assert rejoin == [JoinElection("standby: the ZooKeeper session was LOST; joining the election again")]
    assert b.children_changed(["latch-0000000004"]) == []  # one JoinElection at a time
    b.latch_created("latch-0000000009")
    assert b.children_changed(["latch-0000000009"]) == [Granted()]  # and it can still lead


def test_a_standby_whose_node_vanished_joins_again_once():
    d = Leadership()
    d.latch_created("latch-0000000002")
    assert d.children_changed(["latch-0000000001"]) == [
        JoinElection("standby: our latch node is gone; joining the election again")]
    assert d.children_changed(["latch-0000000001"]) == []


def test_a_leader_whose_latch_node_vanished_steps_down():
    c = Leadership()
    c.latch_created("latch-0000000001")
    assert c.children_changed(["latch-0000000001"]) == [Granted()]
    assert c.children_changed(["latch-0000000002"]) == [Revoked("our latch node is gone (the session expired)")]


def ha_conf(zookeeper, cluster_id: str) -> Configuration:
    return Configuration({"high-availability.type": "zookeeper", "high-availability.zookeeper.quorum": zookeeper.quorum,
                          "high-availability.cluster-id": cluster_id,
                          "high-availability.zookeeper.client.session-timeout": "2 s"}, "the test")


def leader_and_standby(conf: Configuration, tmp_path, revoked: list[str]):
    """Two contenders; the first to join leads once the election decided."""
    first, second = ZooKeeperHaServices(conf, tmp_path), ZooKeeperHaServices(conf, tmp_path)
    for services in (first, second):
        services.start()
        services.contend(on_revoked=revoked.append)
    assert first.wait_for_leadership(10)
    return first, second


def test_with_zookeeper_one_leader_then_the_standby_and_the_stores_survive(zookeeper, tmp_path):
    conf = ha_conf(zookeeper, "election")
    revoked: list[str] = []
    first, second = leader_and_standby(conf, tmp_path, revoked)
    assert not second.wait_for_leadership(1)
    leaders = []
    seen = threading.Event()
    retriever = LeaderRetriever(conf, on_change=lambda info: (leaders.append(info), seen.set()))
    first.publish_leader({"rpc": "tcp://127.0.0.1:1"})
    assert retriever.leader(10) == {"rpc": "tcp://127.0.0.1:1"}
    first.put_job_graph("job-a", {"job_graph": {"name": "a"}, "result_address": None})
    first.checkpoint_triggered("job-a", 7)
    first.checkpoint_completed("job-a", 6, "/x/chk-6")
    first.attempt_deployed("job-a", 3)
    first.close()  # the leader's session ends: the standby leads
    assert second.wait_for_leadership(10)
    assert revoked == ["the ZooKeeper session is LOST"]  # the old leader stepped down itself
    second.publish_leader({"rpc": "tcp://127.0.0.1:2"})
    assert second.job_graphs() == {"job-a": {"job_graph": {"name": "a"}, "result_address": None}}
    assert second.latest_checkpoint("job-a") == (6, "/x/chk-6")
    assert second.checkpoint_counter("job-a") == 7
    assert second.last_attempt("job-a") == 3
    wait = 10.0
    while retriever.leader() != {"rpc": "tcp://127.0.0.1:2"} and wait > 0:
        seen.clear()
        seen.wait(0.5)
        wait -= 0.5
    assert leaders[-1] == {"rpc": "tcp://127.0.0.1:2"}
    second.remove_job("job-a")
    assert second.job_graphs() == {} and second.latest_checkpoint("job-a") is None
    retriever.close()
    second.close()


def expire_session(zookeeper, client) -> None:
    """ZooKeeper's own way to expire a session in a test: a second client with the same session id
    and password connects and closes, which ends the session for the first (it sees LOST)."""
    from kazoo.client import KazooClient
    session_id, password = client.client_id
    twin = KazooClient(hosts=zookeeper.quorum, client_id=(session_id, password))
    twin.start(10)
    twin.stop()
    twin.close()


def test_with_zookeeper_a_standby_whose_session_expired_joins_again_and_can_lead(zookeeper, tmp_path):
    conf = ha_conf(zookeeper, "rejoin")
    revoked: list[str] = []
    leader, standby = leader_and_standby(conf, tmp_path, revoked)
    first_node = standby.leadership.own_node
    expire_session(zookeeper, standby.client)
    latches = f"{standby.root}/leaderlatch"
    wait_for(lambda: standby.leadership.own_node not in (None, first_node), 15, "the standby to join again")
    assert sorted(leader.client.get_children(latches)) == sorted(
        [leader.leadership.own_node, standby.leadership.own_node])  # the expired node is gone
    assert revoked == []  # a standby is never revoked: it stands by again
    leader.close()
    assert standby.wait_for_leadership(10)
    standby.close()


def test_a_missing_quorum_is_a_clear_error(tmp_path):
    conf = Configuration({"high-availability.type": "zookeeper"}, "the test")
    with pytest.raises(ValueError, match="high-availability.zookeeper.quorum: required"):
        ZooKeeperHaServices(conf, tmp_path)


FOLLOWER = """
import json, sys
from cluster.conf import Configuration
from cluster.ha.services import LeaderRetriever
retriever = LeaderRetriever(Configuration(json.loads(sys.argv[1]), "the test"))
print(retriever.leader(10)["rpc"], flush=True)
sys.stdin.readline()  # the leader is gone and ZooKeeper stopped: end without closing the retriever
"""


def test_a_follower_that_never_closed_its_retriever_exits_after_zookeeper_stopped(tmp_path):
    """A script or a notebook kernel that ends without closing its client must not hang on
    kazoo's exit handler once the leader and then ZooKeeper went away."""
    server = LocalZooKeeper(tmp_path / "zk-own").start()
    try:
        conf = ha_conf(server, "exit")
        leader = ZooKeeperHaServices(conf, tmp_path)
        leader.start()
        leader.contend(on_revoked=lambda reason: None)
        assert leader.wait_for_leadership(10)
        leader.publish_leader({"rpc": "tcp://127.0.0.1:1"})
        follower = subprocess.Popen([sys.executable, "-c", FOLLOWER, json.dumps(conf.to_dict())],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                    cwd=PROJECT_ROOT)
        try:
            assert follower.stdout is not None and follower.stdin is not None
            assert follower.stdout.readline().strip() == "tcp://127.0.0.1:1"
            leader.close()  # the leader node goes with the session: the follower's watch fires
            server.stop()
            follower.stdin.write("\n")
            follower.stdin.flush()
            assert follower.wait(20) == 0
        finally:
            follower.kill()
            follower.wait()
    finally:
        server.stop()


def test_with_zookeeper_a_deposed_leaders_writes_are_refused_whole(zookeeper, tmp_path):
    # A leader cut off from ZooKeeper (frozen, partitioned) learns that it was deposed only when its
    # session's end reaches it; its latch node is gone before that. Its writes are checked
    # against that node in the same transaction, so none lands over the new leader's.
    from cluster.ha.services import NotLeader
    conf = ha_conf(zookeeper, "fencing")
    revoked: list[str] = []
    old, new = leader_and_standby(conf, tmp_path, revoked)
    old.put_job_graph("job-f", {"job_graph": {"name": "f"}, "result_address": None})
    old.checkpoint_completed("job-f", 4, "/x/chk-4")
    old.attempt_deployed("job-f", 2)
    old.checkpoint_triggered("job-f", 5)
    wait_for(lambda: new.checkpoint_counter("job-f") == 5, 10, "the counter written asynchronously")
    # the old leader's node goes as with an expired session, seen by the standby first
    new.client.delete(f"{old.root}/leaderlatch/{old.leadership.own_node}")
    assert new.wait_for_leadership(10)
    new.checkpoint_completed("job-f", 6, "/y/chk-6")
    for write in (lambda: old.checkpoint_completed("job-f", 5, "/x/chk-5"),
                  lambda: old.attempt_deployed("job-f", 3),
                  lambda: old.put_job_graph("job-g", {"job_graph": {"name": "g"}, "result_address": None}),
                  lambda: old.remove_job("job-f"),
                  lambda: old.publish_leader({"rpc": "tcp://127.0.0.1:9"})):
        with pytest.raises(NotLeader):
            write()
    old.checkpoint_triggered("job-f", 9)  # refused too, without an answer awaited
    old.client.sync(f"{old.root}/checkpoint-counter/job-f")  # a session's requests are answered in order
    assert new.checkpoint_counter("job-f") == 5
    assert new.latest_checkpoint("job-f") == (6, "/y/chk-6") and new.last_attempt("job-f") == 2
    assert sorted(new.job_graphs()) == ["job-f"] and not new.client.exists(f"{new.root}/leader")
    old.close()
    new.close()
