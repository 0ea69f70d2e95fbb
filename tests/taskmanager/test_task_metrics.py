"""TaskMetrics: the task thread writes, the TaskManager's loop thread only reads."""
import random
import threading
import time

import pytest

from cluster.taskmanager.task_metrics import BACKPRESSURED, IDLE, WINDOW_S, TaskMetrics, time_shares

SHARES = ("busyTimeMsPerSecond", "backPressuredTimeMsPerSecond", "idleTimeMsPerSecond")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def wait(m: TaskMetrics, clock: Clock, kind: str, seconds: float) -> None:
    m.wait_begin(kind)
    clock.advance(seconds)
    m.wait_end()


def total(snapshot: dict) -> float:
    return sum(snapshot[k] for k in SHARES)


@pytest.mark.parametrize("span,idle,bp", [(1.0, 0.3, 0.25), (3.0, 1.0, 1.0), (0.7, 0.7, 0.0),
                                          (1.2, 0.0, 1.3), (2.0, 1.5, 1.5), (1.0, 0.0, 0.0)])
def test_the_shares_of_a_window_add_up_to_1000_ms(span, idle, bp):
    assert sum(time_shares(span, idle, bp).values()) == pytest.approx(1000, abs=1e-9)


def test_each_window_is_split_by_where_its_time_went():
    clock = Clock()
    m = TaskMetrics(clock)
    wait(m, clock, IDLE, 0.3)
    clock.advance(0.2)                      # busy
    wait(m, clock, BACKPRESSURED, 0.25)
    clock.advance(0.25)                     # busy; the window is 1 s old now
    m.publish()
    assert {k: m.snapshot()[k] for k in SHARES} == {
        "busyTimeMsPerSecond": 450.0, "backPressuredTimeMsPerSecond": 250.0, "idleTimeMsPerSecond": 300.0}


def test_a_sources_empty_poll_is_idle_but_for_the_back_pressure_of_the_flush_inside_it():
    """A source sends what its outputs hold before it waits for input (inside its poll): a wait
    for credit there is back pressure, and the poll's idle time, found after it, leaves it out."""
    clock = Clock()
    m = TaskMetrics(clock)
    started, mark = clock(), m.backpressured_s
    wait(m, clock, BACKPRESSURED, 0.6)     # the flush before the wait found no credit
    clock.advance(0.4)                      # then the poll waited for its next row
    m.add_idle(clock() - started, mark)
    m.publish()
    assert {k: m.snapshot()[k] for k in SHARES} == {
        "busyTimeMsPerSecond": 0.0, "backPressuredTimeMsPerSecond": 600.0, "idleTimeMsPerSecond": 400.0}


def test_every_window_adds_up_to_1000_ms_whoever_closes_it():
    clock, rng = Clock(), random.Random(7)
    m = TaskMetrics(clock)
    for _ in range(2000):
        step = rng.random()
        if step < 0.3:
            wait(m, clock, rng.choice([IDLE, BACKPRESSURED]), rng.expovariate(20))
        elif step < 0.4:
            m.wait_begin(IDLE)              # a long wait, read while it lasts
            clock.advance(rng.uniform(0.5, 3))
            assert total(m.snapshot()) == pytest.approx(1000, abs=1e-9)
            m.wait_end()
        elif step < 0.5:
            m.add_idle(0.01)                # a source's poll that had nothing
        else:
            clock.advance(rng.expovariate(50))  # busy; a long stretch is taken up to the read
            m.publish()
        snapshot = m.snapshot()
        assert total(snapshot) == pytest.approx(1000, abs=1e-9)
        elapsed_ms = (clock.now - m.started) * 1000
        assert snapshot["busy-ms"] + snapshot["idle-ms"] + snapshot["backpressured-ms"] == pytest.approx(elapsed_ms, abs=3)


def test_a_long_busy_stretch_reads_as_busy_before_the_task_thread_rolls_the_window():
    clock = Clock()
    m = TaskMetrics(clock)
    wait(m, clock, IDLE, WINDOW_S)          # a whole window idle
    assert m.snapshot()["idleTimeMsPerSecond"] == 1000.0
    clock.advance(3 * WINDOW_S)             # then a user function runs for 3 s without publishing
    assert m.snapshot()["busyTimeMsPerSecond"] == 1000.0


def test_the_reader_writes_nothing():
    clock = Clock()
    m = TaskMetrics(clock)
    wait(m, clock, BACKPRESSURED, 0.4)
    m.records_in += 5
    m.wait_begin(IDLE)
    fields = dict(vars(m))
    readings = []
    for _ in range(5):
        clock.advance(0.7)
        readings.append(m.snapshot())
    assert vars(m) == fields
    assert all(a is b for a, b in zip(vars(m).values(), fields.values()))
    assert [r["records-in"] for r in readings] == [5] * 5
    assert [r["idle-ms"] for r in readings] == [700, 1400, 2100, 2800, 3500]  # the wait in progress


def test_a_reader_on_another_thread_sees_consistent_growing_figures():
    m = TaskMetrics()
    stop = threading.Event()

    def task_thread():
        while not stop.is_set():
            m.wait_begin(IDLE)
            time.sleep(0.0005)
            m.wait_end()
            m.records_in += 1
            m.wait_begin(BACKPRESSURED)
            time.sleep(0.0002)
            m.wait_end()
            m.publish()

    writer = threading.Thread(target=task_thread)
    writer.start()
    try:
        last, deadline = None, time.monotonic() + 1.5
        while time.monotonic() < deadline:
            snapshot = m.snapshot()
            assert total(snapshot) == pytest.approx(1000, abs=1e-9)
            if last is not None:
                assert snapshot["records-in"] >= last["records-in"]
                # A read between a wait's end and its publication counts the wait up to the read:
                # microseconds, which whole milliseconds can show as one.
                for key in ("idle-ms", "backpressured-ms", "busy-ms"):
                    assert snapshot[key] >= last[key] - 1, key
            last = snapshot
    finally:
        stop.set()
        writer.join()
    assert last["records-in"] > 0 and last["idle-ms"] > 0 and last["backpressured-ms"] > 0


def test_a_restored_task_counts_on_from_its_checkpoints_counters():
    clock = Clock()
    m = TaskMetrics(clock)
    m.restore_counters({"records-in": 5_000, "records-out": 4_000, "bytes-in": 10, "bytes-out": 8,
                        "records-sent": 3_000})
    assert m.snapshot()["records-in"] == 5_000  # published at once, before the task runs
    m.records_in += 100
    m.records_out += 100
    m.records_sent += 50
    m.publish()
    assert m.counters() == {"records-in": 5_100, "records-out": 4_100, "bytes-in": 10, "bytes-out": 8,
                            "records-sent": 3_050}
    assert m.snapshot()["records-sent"] == 3_050
    assert {k: m.snapshot()[k] for k in ("records-in", "records-out")} == {"records-in": 5_100, "records-out": 4_100}
    # a checkpoint taken before sinks counted what they delivered: from 0
    m.restore_counters({"records-in": 1, "records-out": 1, "bytes-in": 1, "bytes-out": 1})
    assert m.counters()["records-sent"] == 0
