"""End-to-end latency buckets (cluster.protocol.latency): pure, clock injected."""
from __future__ import annotations

import numpy as np

from cluster.protocol.latency import LatencyHistogram, bucket_of, bucket_value, merged, oldest_of, percentiles


def test_a_bucket_holds_values_within_nine_percent_of_its_middle():
    for ms in (1.5, 7, 12, 99, 250, 1_234, 60_000):
        assert abs(bucket_value(bucket_of(ms)) - ms) / ms < 0.09
    assert bucket_of(0) == bucket_of(1) == 0


def test_percentiles_of_rows_weigh_each_row():
    buckets = merged([{str(bucket_of(10)): 50}, {str(bucket_of(100)): 40, str(bucket_of(1_000)): 10}])
    p50, p90, p99 = percentiles(buckets)
    assert abs(p50 - 10) < 1 and abs(p90 - 100) < 9 and abs(p99 - 1_000) < 90
    assert percentiles({}) is None


def test_a_report_covers_the_last_interval_only():
    now = [0.0]
    histogram = LatencyHistogram(clock=lambda: now[0], interval_s=10)
    histogram.record(20, 5)
    now[0] = 6  # a new half: the old one still counts
    histogram.record(200, 5)
    assert merged([histogram.snapshot()]) == {bucket_of(20): 5, bucket_of(200): 5}
    now[0] = 11  # the first half is past
    histogram.record(300, 1)
    assert merged([histogram.snapshot()]) == {bucket_of(200): 5, bucket_of(300): 1}
    now[0] = 40  # nothing for a whole interval: nothing to report
    assert histogram.snapshot() == {}


def test_the_oldest_ingestion_wins_and_zero_is_unknown():
    assert oldest_of(0, 5) == 5 and oldest_of(5, 0) == 5 and oldest_of(7, 5) == 5 and oldest_of(0, 0) == 0


def test_many_values_count_a_row_each_in_their_buckets():
    histogram = LatencyHistogram(clock=lambda: 0.0)
    histogram.record_many(np.array([0, 1, 10, 10, 10, 1_000]))
    assert merged([histogram.snapshot()]) == {0: 2, bucket_of(10): 3, bucket_of(1_000): 1}
