"""Joins of two streams on a real cluster against pandas: the window join and the temporal join
(the interval join runs through TaskManager kills in test_event_time_exactly_once.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from kernel_runtime import StreamEnvironment
from kernel_runtime.api import Duration, Time, TumblingEventTimeWindows, WatermarkStrategy

N = 6_000


def strategy(column: str) -> WatermarkStrategy:
    return WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(300)).with_timestamp_column(column)


def clicks(seq):
    """Out of order within the bound: odd rows 250 ms behind."""
    return pd.DataFrame({"user": seq % 7, "page": seq % 13, "ts": seq * 20 - (seq % 2) * 250, "seq": seq})


def views(seq):
    return pd.DataFrame({"user": seq % 7, "ad": seq % 5, "vts": seq * 30 + 7})


def rates(seq):
    """A new rate per currency every 700 ms of event time."""
    return pd.DataFrame({"currency": seq % 3, "rate": 1.0 + (seq % 17) / 10, "rts": seq * 700 + 1})


def orders(seq):
    return pd.DataFrame({"currency": seq % 3, "amount": seq % 100, "ts": seq * 50 + 3, "seq": seq})


def test_a_window_join_pairs_the_rows_of_a_key_and_window(cluster, client):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    a = env.from_generator(clicks, count=N, name="clicks", watermark_strategy=strategy("ts"))
    b = env.from_generator(views, count=N // 2, name="views", watermark_strategy=strategy("vts"))
    a.join(b).where("user").equal_to("user").window(TumblingEventTimeWindows.of(Time.seconds(1))).apply().collect()
    result = env.execute_async("window join", client=client).wait(120).to_pandas()
    left, right = clicks(np.arange(N, dtype=np.int64)), views(np.arange(N // 2, dtype=np.int64))
    left["start"], right["start"] = left.ts - left.ts % 1_000, right.vts - right.vts % 1_000
    pairs = left.merge(right, on=["user", "start"])
    pairs["window_start"] = pd.to_datetime(pairs.start, unit="ms")
    pairs["window_end"] = pd.to_datetime(pairs.start + 1_000, unit="ms")
    columns = ["user", "page", "ts", "seq", "ad", "vts", "window_start", "window_end"]
    assert list(result.columns) == columns  # both sides' columns, the key once, then the window
    order = ["seq", "vts"]
    pd.testing.assert_frame_equal(result.sort_values(order).reset_index(drop=True),
                                  pairs[columns].sort_values(order).reset_index(drop=True), check_dtype=False)


def test_a_temporal_join_takes_the_version_valid_at_each_rows_time(cluster, client):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    o = env.from_generator(orders, count=N, name="orders", watermark_strategy=strategy("ts"))
    r = env.from_generator(rates, count=N * 50 // 700 + 3, name="rates", watermark_strategy=strategy("rts"))
    o.key_by("currency").temporal_join(r.key_by("currency")).collect()
    result = env.execute_async("temporal join", client=client).wait(120).to_pandas()
    left = orders(np.arange(N, dtype=np.int64))
    right = rates(np.arange(N * 50 // 700 + 3, dtype=np.int64))
    expected = pd.merge_asof(left.sort_values("ts"), right.sort_values("rts"), left_on="ts", right_on="rts",
                             by="currency", direction="backward").dropna(subset=["rate"])
    assert len(expected) < N  # the first orders of a currency came before its first rate: an inner join drops them
    columns = ["currency", "amount", "ts", "seq", "rate", "rts"]
    pd.testing.assert_frame_equal(result[columns].sort_values("seq").reset_index(drop=True),
                                  expected[columns].sort_values("seq").reset_index(drop=True), check_dtype=False)
