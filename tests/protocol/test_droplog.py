import logging

from cluster.protocol.droplog import DropLog


def test_the_first_drops_are_logged_then_counted_in_one_summary_per_interval(caplog):
    now = [0.0]
    drops = DropLog(logging.getLogger("droptest"), "jobmanager", first=3, interval=10, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "droptest"):
        for _ in range(1000):
            drops.drop("malformed message", b"peer", "bad or missing signature (wrong cluster secret?)")
        drops.drop("malformed message", b"peer", "unknown op 'x'")  # another reason is logged on its own
        assert len(caplog.records) == 4
        now[0] = 10.0
        drops.flush()
    assert len(caplog.records) == 5 and drops.dropped == 1001
    assert "997 more dropped" in caplog.records[-1].getMessage()


def test_invented_peer_ids_cannot_grow_its_counters():
    drops = DropLog(logging.getLogger("droptest"), "x", max_keys=8, clock=lambda: 0.0)
    for i in range(10_000):
        drops.drop("malformed message", i.to_bytes(4, "big"), "garbage")
    assert len(drops._counts) == 9 and drops.dropped == 10_000
