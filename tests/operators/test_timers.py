"""The timer service: due timers in order, deduplicated, deleted, and restored (rescaled) from a
snapshot by either backend."""
from __future__ import annotations

import pytest

from cluster.operators.timers import EVENT_TIME, PROCESSING_TIME, Timer, TimerService
from cluster.state.loader import create_backend

MAX_PARALLELISM = 8


@pytest.fixture(params=["hashmap", "rocksdb"])
def kind(request):
    return request.param


def backend_of(kind, tmp_path, groups=range(MAX_PARALLELISM)):
    return create_backend(kind, groups, MAX_PARALLELISM, tmp_path / kind / str(groups.start))


def test_due_timers_come_in_timestamp_order_once(kind, tmp_path):
    timers = TimerService(backend_of(kind, tmp_path))
    timers.register(EVENT_TIME, 1, "a", 300, (0, 301))
    timers.register_many(EVENT_TIME, [2, 1, 2], ["b", "a", "b"], [100, 300, 100], [None, (0, 301), None])
    timers.register(PROCESSING_TIME, 3, "c", 50)
    assert timers.pending(EVENT_TIME) == 2 and timers.next_time(EVENT_TIME) == 100
    assert timers.pop_due(EVENT_TIME, 99) == []
    assert timers.pop_due(EVENT_TIME, 1000) == [Timer(100, 2, "b", None), Timer(300, 1, "a", (0, 301))]
    assert timers.pop_due(EVENT_TIME, 1000) == []
    assert timers.pop_due(PROCESSING_TIME, 50) == [Timer(50, 3, "c", None)]
    assert list(timers.backend.items("_timers/event")) == []


def test_a_deleted_timer_does_not_fire(kind, tmp_path):
    timers = TimerService(backend_of(kind, tmp_path))
    timers.register(EVENT_TIME, 0, ("k", 1), 10)
    timers.register(EVENT_TIME, 0, ("k", 2), 10)
    timers.delete(EVENT_TIME, 0, ("k", 1), 10)
    timers.delete(EVENT_TIME, 0, ("k", 9), 10)  # never registered: nothing happens
    assert timers.next_time(EVENT_TIME) == 10
    assert timers.pop_due(EVENT_TIME, 10) == [Timer(10, 0, ("k", 2), None)]
    assert timers.next_time(EVENT_TIME) is None


def test_timers_restore_from_a_snapshot_at_another_parallelism(kind, tmp_path):
    timers = TimerService(backend_of(kind, tmp_path))
    for group in range(MAX_PARALLELISM):
        timers.register(EVENT_TIME, group, f"k{group}", 100 + group, (group, group + 10))
    path = tmp_path / "snapshot"
    timers.backend.snapshot().write(path)
    # two subtasks now: each gets the timers of its half of the key groups
    halves = []
    for groups in (range(0, 4), range(4, 8)):
        other = "rocksdb" if kind == "hashmap" else "hashmap"
        restored = TimerService(backend_of(other, tmp_path, groups))
        restored.backend.restore([path])
        restored.restore()
        halves.append(restored.pop_due(EVENT_TIME, 10_000))
    assert halves[0] == [Timer(100 + g, g, f"k{g}", (g, g + 10)) for g in range(4)]
    assert halves[1] == [Timer(100 + g, g, f"k{g}", (g, g + 10)) for g in range(4, 8)]
