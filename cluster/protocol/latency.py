"""End-to-end latency as the runtime measures it: from a row's ingestion (the wall clock when its
source task read it) to its delivery (when its sink was given it), per row, as p50/p90/p99 over
the last interval.

Every batch carries the ingestion time of its oldest rows (``BufferResponse.ingested_ms`` between
tasks; a task's outputs carry the oldest of the inputs they came from, through its chain and its
Spark stage). A sink task adds what its rows waited to a LatencyHistogram: counts per bucket, eight
buckets per doubling (within 9 % of the value), over two rotating halves of the interval, so that
a report covers between one and two halves. The reports of several sinks and subtasks merge by
adding their buckets (``merged``), then ``percentiles`` reads them. Flink's latency markers measure
the channels only; Spark's Real-Time Mode reports e2eLatencyMs P50-P99 per micro-batch.

Where rows carry event time (the stream's rowtime column reaches the sink), the sink also counts
each row's event-time lag, the wall clock minus its event time, in a histogram of its own.

Thread use: ``record`` and ``record_many`` on the task thread; ``snapshot`` from any thread (it reads dicts swapped whole).
"""
from __future__ import annotations

import math
import time
from typing import Callable, Optional

import numpy as np

PER_DOUBLING = 8
INTERVAL_S = 10.0  # a report covers the last 5-10 s


def oldest_of(a: int, b: int) -> int:
    """The older of two ingestion times, 0 standing for unknown."""
    return b if not a or (b and b < a) else a


def buckets_of(ms: np.ndarray) -> np.ndarray:
    """The bucket of each latency; 0 holds everything up to 1 ms."""
    values = np.maximum(np.asarray(ms, dtype=np.float64), 1.0)
    return (values > 1) * (1 + np.floor(np.log2(values) * PER_DOUBLING)).astype(np.int64)


def bucket_of(ms: float) -> int:
    """buckets_of for one latency, without numpy's cost per call (a slow stream's batch is a row)."""
    value = float(ms)
    return 0 if value <= 1 else 1 + math.floor(math.log2(value) * PER_DOUBLING)


def bucket_value(bucket: int) -> float:
    """A bucket's value: the middle of its range (geometric), in ms."""
    if bucket <= 0:
        return 1.0
    return 2 ** ((bucket - 0.5) / PER_DOUBLING)


class LatencyHistogram:
    def __init__(self, clock: Callable[[], float] = time.monotonic, interval_s: float = INTERVAL_S):
        self._clock, self._half = clock, interval_s / 2
        self._started = clock()
        self._previous: dict[int, int] = {}
        self._current: dict[int, int] = {}

    def _rotate(self) -> None:
        now = self._clock()
        if now - self._started >= 2 * self._half:  # nothing for a whole interval: both halves are old
            self._previous, self._current, self._started = {}, {}, now
        elif now - self._started >= self._half:
            self._previous, self._current, self._started = self._current, {}, self._started + self._half

    def record(self, ms: float, rows: int) -> None:
        self._add({bucket_of(ms): rows})

    def record_many(self, ms: np.ndarray) -> None:
        """One row per value (an event-time lag per row)."""
        if len(ms):
            buckets, rows = np.unique(buckets_of(ms), return_counts=True)
            self._add(dict(zip(buckets.tolist(), rows.tolist())))

    def _add(self, counts: dict[int, int]) -> None:
        self._rotate()
        # swapped whole: a reader on another thread sees the one or the other
        self._current = merged([self._current, counts])

    def snapshot(self) -> dict[str, int]:
        """Rows per bucket over the last interval, bucket numbers as text (the metrics travel as JSON)."""
        previous, current = self._previous, self._current
        if self._clock() - self._started >= 2 * self._half:
            return {}
        return {str(b): n for b, n in sorted(merged([previous, current]).items())}


def merged(reports: list[dict]) -> dict[int, int]:
    out: dict[int, int] = {}
    for report in reports:
        for bucket, rows in report.items():
            out[int(bucket)] = out.get(int(bucket), 0) + int(rows)
    return out


def percentiles(buckets: dict[int, int], quantiles: tuple[float, ...] = (0.5, 0.9, 0.99)) -> Optional[list[float]]:
    """The quantiles of the rows in ``buckets``, in ms (each its bucket's middle); None without rows."""
    total = sum(buckets.values())
    if total == 0:
        return None
    out, seen, order = [], 0, sorted(buckets.items())
    want = iter(quantiles)
    q = next(want, None)
    for bucket, rows in order:
        seen += rows
        while q is not None and seen >= q * total:
            out.append(round(bucket_value(bucket), 1))
            q = next(want, None)
    while q is not None:  # rounding left a quantile past the last row: the largest
        out.append(round(bucket_value(order[-1][0]), 1))
        q = next(want, None)
    return out
