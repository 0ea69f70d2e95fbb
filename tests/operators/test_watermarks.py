"""Watermark generation and the input valve, with Flink's semantics and an injected clock."""
from __future__ import annotations

import pytest

from cluster.graph.event_time import NO_WATERMARK
from cluster.operators.windowing.watermarks import BoundedOutOfOrderness, SplitWatermarks, WatermarkValve


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_watermark_trails_the_largest_timestamp_by_the_bound_and_one_ms():
    gen = BoundedOutOfOrderness(200)
    assert gen.on_periodic_emit()[0] < NO_WATERMARK + 1 + 200  # nothing seen: as low as it goes
    gen.on_batch(1_000)
    gen.on_batch(900)  # out of order: the watermark does not go back
    assert gen.on_periodic_emit() == (799, False)
    monotonous = BoundedOutOfOrderness(0)
    monotonous.on_batch(5_000)
    assert monotonous.on_periodic_emit() == (4_999, False)


def test_per_split_watermarks_take_the_slowest_split_that_is_not_idle():
    clock = Clock()
    splits = SplitWatermarks(100, idle_timeout=5.0, clock=clock)
    assert splits.on_periodic_emit() is None  # no split yet
    splits.assigned(["t-0", "t-1"])
    splits.on_batch("t-0", 10_000)
    # t-1 has had no row: it holds the watermark back (its records may be older)
    assert splits.on_periodic_emit()[0] < 0
    splits.on_batch("t-1", 2_000)
    assert splits.on_periodic_emit() == (1_899, False)
    clock.now = 3.0
    splits.on_batch("t-0", 12_000)
    clock.now = 6.0  # t-1 idle, t-0 not: t-0 alone decides
    assert splits.on_periodic_emit() == (11_899, False)
    clock.now = 9.0  # both idle: idle, at the smallest
    assert splits.on_periodic_emit() == (1_899, True)
    splits.assigned(["t-0"])  # t-1 read to its end: it counts no more
    splits.on_batch("t-0", 13_000)
    assert splits.on_periodic_emit() == (12_899, False)


def test_a_split_without_rows_for_the_idle_timeout_is_idle_until_its_next_row():
    clock = Clock()
    gen = BoundedOutOfOrderness(0, idle_timeout=2.0, clock=clock)
    gen.on_batch(10)
    clock.now = 1.9
    assert gen.on_periodic_emit() == (9, False)
    clock.now = 2.0
    assert gen.on_periodic_emit() == (9, True)
    gen.on_batch(20)
    assert gen.on_periodic_emit() == (19, False)
    with pytest.raises(ValueError, match="idle timeout must be > 0"):
        BoundedOutOfOrderness(0, idle_timeout=0)


def test_the_valve_gives_the_minimum_over_its_channels_and_never_goes_back():
    valve = WatermarkValve(["a", "b"])
    assert valve.on_watermark("a", 100) is None  # b has said nothing yet
    assert valve.on_watermark("b", 50) == 50
    assert valve.on_watermark("b", 40) is None  # a channel's watermark does not go back
    assert valve.on_watermark("b", 150) == 100
    assert valve.current == 100


def test_an_idle_channel_does_not_hold_the_watermark_back_and_realigns_when_caught_up():
    valve = WatermarkValve(["a", "b"])
    valve.on_watermark("a", 100)
    valve.on_watermark("b", 10)
    assert valve.current == 10
    assert valve.on_idle("b") == 100  # b held it back; idle, it no longer does
    assert valve.on_watermark("b", 500) is None  # ignored while b is idle, as Flink
    valve.on_active("b")  # back at 10, behind the 100 given out: it does not count until it catches up
    assert valve.on_watermark("a", 300) == 300
    assert valve.on_watermark("b", 200) is None and valve.current == 300
    assert valve.on_watermark("b", 400) is None  # caught up: it counts again, and a (300) is the minimum
    assert valve.on_watermark("a", 500) == 400


def test_when_every_channel_is_idle_the_highest_watermark_seen_is_final():
    valve = WatermarkValve(["a", "b"])
    valve.on_watermark("a", 30)
    valve.on_watermark("b", 70)
    assert valve.current == 30
    assert valve.on_idle("b") is None  # b was not the minimum
    assert valve.on_idle("a") == 70 and valve.idle
