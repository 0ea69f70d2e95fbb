"""Window assignment against a row-by-row reference of Flink's rules."""
from __future__ import annotations

import numpy as np
import pytest

from cluster.graph.windows import (SessionWindows, SlidingWindows, TimeWindow, TumblingWindows, assigner_of, merge_windows, window_start)


def flink_sliding(ts: int, size: int, slide: int, offset: int = 0) -> list[int]:
    """SlidingEventTimeWindows.assignWindows, one timestamp at a time."""
    last = ts - (ts - offset + slide) % slide
    starts, start = [], last
    while start > ts - size:
        starts.append(start)
        start -= slide
    return starts


TIMESTAMPS = np.array([0, 1, 999, 1000, 1001, 4_321, 59_999, 60_000, -1, -1000, -1001, 123_456_789], dtype=np.int64)


def test_tumbling_windows_start_at_multiples_of_the_size_plus_the_offset():
    rows, starts = TumblingWindows(1000).assign(TIMESTAMPS)
    assert rows.tolist() == list(range(len(TIMESTAMPS)))
    assert starts.tolist() == [0, 0, 0, 1000, 1000, 4000, 59_000, 60_000, -1000, -1000, -2000, 123_456_000]
    _, shifted = TumblingWindows(1000, offset=250).assign(np.array([0, 249, 250, 1249, 1250]))
    assert shifted.tolist() == [-750, -750, 250, 250, 1250]
    assert TimeWindow(1000, 2000).max_timestamp == 1999


@pytest.mark.parametrize("size, slide, offset", [(10_000, 1_000, 0), (3_000, 1_000, 500), (2_500, 1_000, 0),
                                                 (1_000, 1_000, 0)])
def test_sliding_windows_match_flinks_rule_for_every_row(size, slide, offset):
    rng = np.random.default_rng(7)
    ts = np.concatenate([TIMESTAMPS, rng.integers(-50_000, 50_000, 500)])
    rows, starts = SlidingWindows(size, slide, offset).assign(ts)
    got: dict[int, list[int]] = {}
    for row, start in zip(rows.tolist(), starts.tolist()):
        got.setdefault(row, []).append(start)
    for row, t in enumerate(ts.tolist()):
        assert sorted(got[row]) == sorted(flink_sliding(t, size, slide, offset)), t


def test_sessions_merge_when_they_overlap_or_touch():
    _, starts = SessionWindows(gap=10).assign(np.array([0, 5, 15, 40, 30]))
    windows = [TimeWindow(s, s + 10) for s in starts.tolist()]
    merged = merge_windows(windows)
    assert [w for w, _ in merged] == [TimeWindow(0, 25), TimeWindow(30, 50)]
    assert merged[0][1] == [TimeWindow(0, 10), TimeWindow(5, 15), TimeWindow(15, 25)]  # 15 touches [5, 15)
    # a late row bridges two sessions: they become one
    bridged = merge_windows([w for w, _ in merged] + [TimeWindow(24, 34)])
    assert [w for w, _ in bridged] == [TimeWindow(0, 50)]


def test_bad_sizes_are_refused_naming_what_is_wrong():
    with pytest.raises(ValueError, match="a session window: gap must be a positive number of milliseconds, got 0"):
        SessionWindows(0)
    with pytest.raises(ValueError, match="a sliding window: slide must be a positive"):
        SlidingWindows(1000, -5)
    with pytest.raises(ValueError, match="offset .1000 ms. must be smaller than the size"):
        TumblingWindows(1000, offset=1000)


def test_assigner_of_builds_each_kind_from_its_params():
    assert assigner_of({"type": "tumbling", "size": 1000}, "here") == TumblingWindows(1000)
    assert assigner_of({"type": "tumbling", "size": 1000, "offset": None}, "here") == TumblingWindows(1000)
    assert assigner_of({"type": "sliding", "size": 1000, "slide": 250, "offset": 100}, "here") == \
        SlidingWindows(1000, 250, 100)
    assert assigner_of({"type": "session", "gap": 300}, "here") == SessionWindows(300)


@pytest.mark.parametrize("spec, message", [
    (None, r"op x: the window assigner must be a dict with a \"type\" \(tumbling, sliding or session\), got None"),
    ({"type": "hopping", "size": 10}, r"op x: unknown window assigner 'hopping' \(tumbling, sliding or session\)"),
    ({"type": "sliding", "size": 10}, r"op x: a sliding window needs its 'slide' \(ms\)"),
    ({"type": "session"}, r"op x: a session window needs its 'gap' \(ms\)"),
    ({"type": "tumbling", "size": -1}, r"op x: a tumbling window: size must be a positive number"),
])
def test_assigner_of_says_what_is_wrong_and_where(spec, message):
    with pytest.raises(ValueError, match=message):
        assigner_of(spec, "op x")


def test_window_start_is_vectorised_flink_arithmetic():
    ts = np.arange(-3000, 3000, 7, dtype=np.int64)
    expected = [t - (t - 0 + 1000) % 1000 for t in ts.tolist()]
    assert window_start(ts, 1000).tolist() == expected
