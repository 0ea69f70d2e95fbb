"""The checkpoint coordinator, barrier alignment and metadata storage, without processes."""
import json

import pytest

from cluster.checkpoint.barriers import Barrier, BarrierAligner
from cluster.checkpoint.coordinator import CheckpointCoordinator
from cluster.checkpoint.storage import CheckpointFormatError, read_metadata, write_metadata
from cluster.protocol.messages import Message, TriggerCheckpoint


def _coordinator(**kw):
    args = dict(interval_ms=500, timeout_ms=1000, min_pause_ms=0, max_concurrent=1, retained=2) | kw
    return CheckpointCoordinator(**args)


def test_checkpoint_completes_when_every_participant_acknowledged():
    c = _coordinator()
    p = c.trigger(0, ["a", "b"], lambda n: f"/chk-{n}")
    assert c.acknowledge(p.checkpoint_id, "a", {"x": 1}, 5) is None
    assert c.acknowledge(p.checkpoint_id, "a", {"x": 1}, 6) is None  # duplicate
    assert c.acknowledge(p.checkpoint_id, "b", {}, 7) is p
    done, dropped = c.complete(p, 8, size=10)
    assert (done.checkpoint_id, done.directory, dropped) == (1, "/chk-1", [])
    assert c.records[1].status == "COMPLETED" and c.records[1].acknowledged == 2


def test_max_concurrent_and_min_pause():
    c = _coordinator(min_pause_ms=100)
    p = c.trigger(0, ["a"], str)
    assert "max-concurrent" in c.why_not_trigger(10)
    c.complete(c.acknowledge(p.checkpoint_id, "a", {}, 20), 20, 0)
    assert "min-pause" in c.why_not_trigger(50)
    assert c.why_not_trigger(121) is None


def test_timeout_and_decline_abort_and_are_counted():
    c = _coordinator(max_concurrent=2)
    first = c.trigger(0, ["a"], str)
    second = c.trigger(600, ["a", "b"], str)
    assert [p.checkpoint_id for p in c.expire(1500)] == [first.checkpoint_id]
    aborted = c.decline(second.checkpoint_id, "b", "disk full", 1600)
    assert aborted is second and "declined by b: disk full" in c.records[second.checkpoint_id].failure
    assert c.counts == {"completed": 0, "failed": 2} and not c.pending


def test_retention_keeps_the_newest_and_savepoints_apart():
    c = _coordinator(retained=2)
    dropped_all = []
    for i in range(4):
        p = c.trigger(i * 10, ["a"], str)
        _, dropped = c.complete(c.acknowledge(p.checkpoint_id, "a", {}, i * 10 + 1), i * 10 + 2, 0)
        dropped_all += [d.checkpoint_id for d in dropped]
    s = c.trigger(100, ["a"], str, kind="savepoint")
    c.complete(c.acknowledge(s.checkpoint_id, "a", {}, 101), 102, 0)
    assert [d.checkpoint_id for d in c.completed] == [3, 4] and dropped_all == [1, 2]
    assert [d.checkpoint_id for d in c.savepoints] == [5] and c.latest().checkpoint_id == 4


def test_completion_subsumes_older_pending_checkpoints_and_calls_back():
    c = _coordinator(max_concurrent=3)
    outcomes = []
    old = c.trigger(0, ["a", "b"], str)
    old.on_done.append(lambda done, reason: outcomes.append((done, reason)))
    new = c.trigger(1, ["a"], str)
    c.complete(c.acknowledge(new.checkpoint_id, "a", {}, 2), 3, 0)
    assert outcomes == [(None, "subsumed by checkpoint 2")] and not c.pending


def test_exactly_once_alignment_blocks_until_every_channel_delivered():
    a = BarrierAligner(["x", "y", "z"], exactly_once=True)
    b1 = Barrier(1, 0, "checkpoint", "/d")
    assert a.on_barrier("x", b1).snapshot is None and a.blocked == {"x"}
    assert a.on_barrier("y", b1).snapshot is None and a.blocked == {"x", "y"}
    assert a.on_end_of_partition("z").snapshot == b1 and a.blocked == frozenset()


def test_at_least_once_never_blocks():
    a = BarrierAligner(["x", "y"], exactly_once=False)
    b1 = Barrier(1, 0, "checkpoint", "/d")
    a.on_barrier("x", b1)
    assert a.blocked == frozenset()
    assert a.on_barrier("y", b1).snapshot == b1


def test_newer_barrier_aborts_the_alignment_of_an_older_one():
    a = BarrierAligner(["x", "y"], exactly_once=True)
    a.on_barrier("x", Barrier(1, 0, "checkpoint", "/1"))
    result = a.on_barrier("y", Barrier(2, 0, "checkpoint", "/2"))
    assert result.aborted == 1 and result.snapshot is None and a.blocked == {"y"}
    assert a.on_barrier("x", Barrier(1, 0, "checkpoint", "/1")).snapshot is None  # stale
    assert a.on_barrier("x", Barrier(2, 0, "checkpoint", "/2")).snapshot.checkpoint_id == 2


def test_metadata_is_written_last_and_checked(tmp_path):
    body = {"job_id": "j", "checkpoint_id": 3, "kind": "checkpoint", "operators": {}}
    path = write_metadata(tmp_path / "chk-3", body)
    assert read_metadata(tmp_path / "chk-3") == body
    document = json.loads(path.read_text())
    document["body"]["checkpoint_id"] = 4
    path.write_text(json.dumps(document))
    with pytest.raises(CheckpointFormatError, match="checksum"):
        read_metadata(tmp_path / "chk-3")
    path.write_text(path.read_text()[:20])
    with pytest.raises(CheckpointFormatError, match="not valid JSON"):
        read_metadata(tmp_path / "chk-3")
    (tmp_path / "chk-9").mkdir()
    with pytest.raises(CheckpointFormatError, match="missing"):
        read_metadata(tmp_path / "chk-9")


def test_a_barrier_travels_whole_from_its_trigger_to_the_next_task():
    barrier = Barrier.of(TriggerCheckpoint("job", "e1", 7, 1234, "savepoint", "/cp/7"))
    assert barrier == Barrier(7, 1234, "savepoint", "/cp/7")
    wire = barrier.on_channel("job/0/1/0/0").to_wire()
    received = Message.from_wire(wire)
    assert received.channel == "job/0/1/0/0" and Barrier.of(received) == barrier
