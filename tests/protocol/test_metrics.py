"""A task's counters restored from a checkpoint, at the same or another parallelism."""
from cluster.protocol.metrics import COUNTERS, restored_counters


def entry(subtask, parallelism, records):
    return {"subtask": subtask, "parallelism": parallelism, "records-in": records, "records-out": records,
            "bytes-in": 2 * records, "bytes-out": 2 * records, "records-sent": 3 * records}


def test_a_subtask_gets_its_own_counters_back():
    entries = [entry(0, 2, 100), entry(1, 2, 7)]
    assert restored_counters(entries, 1, 2) == {"records-in": 7, "records-out": 7, "bytes-in": 14, "bytes-out": 14,
                                                "records-sent": 21}


def test_rescaled_the_vertex_keeps_its_totals():
    entries = [entry(i, 3, 10 ** i) for i in range(3)]
    for parallelism in (1, 2, 4):
        restored = [restored_counters(entries, i, parallelism) for i in range(parallelism)]
        for name in COUNTERS:
            assert sum(r[name] for r in restored) == sum(e[name] for e in entries)


def test_a_subtask_without_an_entry_starts_at_zero():
    assert restored_counters([], 0, 1) == dict.fromkeys(COUNTERS, 0)


def test_a_checkpoint_from_before_a_counter_existed_restores_it_as_zero():
    old = {"subtask": 0, "parallelism": 1, "records-in": 5, "records-out": 5, "bytes-in": 9, "bytes-out": 9}
    assert restored_counters([old], 0, 1)["records-sent"] == 0
