"""Event time as a job states it, shared by the client and the cluster: the two watermarks that
stand for something (nothing seen yet, the end of input), how a time and a lag read as text, and
what a timestamp assigner's result means.

The client reads them too (the watermark views name NO_WATERMARK and MAX_WATERMARK, the schema
sampler runs a timestamp assigner on sample rows), and the client may import the graph but not the
operators; the runtime of event time (watermark generators, the valve, rowtime columns) stays in
cluster.operators.windowing.
"""
from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.common.failures import UserFunctionError

# Flink's Long.MIN_VALUE watermark: nothing seen yet
NO_WATERMARK = -(1 << 63)
# Flink's Long.MAX_VALUE watermark: the end of input, every window fires
MAX_WATERMARK = (1 << 63) - 1


def time_text(ms: int) -> str:
    """An event time or watermark as a UTC date and time to the millisecond, or what it stands for."""
    if ms == NO_WATERMARK:
        return "no watermark"
    if ms == MAX_WATERMARK:
        return "end of input"
    try:
        when = datetime.fromtimestamp(ms / 1000, timezone.utc)
    except (OverflowError, OSError, ValueError):  # beyond what datetime holds: the number itself
        return f"{ms:,} ms"
    return when.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}"


def duration_text(ms: int) -> str:
    """A lag as a person reads it: 350 ms, 1.25 s, 2 min 05 s, 3 h 02 min."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600:,} h {seconds % 3600 // 60:02d} min"


def timestamps_from(result, rows: int, where: str) -> pa.Array:
    """A timestamp assigner's result (a Series, array or list of datetimes or epoch ms) as
    timestamp[ms]."""
    try:
        values = pd.Series(np.asarray(result) if not isinstance(result, pd.Series) else result)
    except Exception as exc:
        raise UserFunctionError(f"{where}: the timestamp assigner must return one timestamp per row, "
                                f"got {type(result).__name__} ({exc})") from None
    if len(values) != rows:
        raise UserFunctionError(f"{where}: the timestamp assigner returned {len(values)} timestamps "
                                f"for {rows} rows")
    if pd.api.types.is_datetime64_any_dtype(values):
        if getattr(values.dt, "tz", None) is not None:
            values = values.dt.tz_convert("UTC").dt.tz_localize(None)
        return pa.array(values.astype("datetime64[ms]"), pa.timestamp("ms"))
    if pd.api.types.is_integer_dtype(values):
        return pa.array(values.to_numpy(dtype=np.int64), pa.int64()).cast(pa.timestamp("ms"))
    raise UserFunctionError(f"{where}: the timestamp assigner must return datetimes or integer epoch "
                            f"milliseconds, got values of type {values.dtype}")


# A source that reads several splits at once (Kafka partitions) says, in a batch's schema
# metadata, which splits it reads now and how many of the batch's rows (in order) came from each,
# so that the timestamps-watermarks operator chained after it keeps a watermark per split
# (Flink's per-split watermarks): JSON {"assigned": [split, ...], "rows": [[split, count], ...]}.
SPLIT_ROWS_METADATA = b"streamlab.split_rows"


# A watermark generator emits every pipeline.auto-watermark-interval, and also, not waiting for
# the interval, once its watermark passes the end of one of the job's event-time windows: a
# tumbling or sliding window's result then leaves as soon as its watermark could (on average half
# the interval sooner: 100 ms at Flink's 200 ms default), and other watermarks keep the interval.
# WINDOW_ENDS_PARAM holds [period, offset] (ms) per kind of window end in the job.
WINDOW_ENDS_PARAM = "window_ends"


def window_ends(specs) -> list[list[int]]:
    """[period, offset] of the ends of every event-time tumbling (period: its size) and sliding
    (period: its slide) window among the operator specs, each once; session windows have no fixed
    ends."""
    ends = set()
    for spec in specs:
        assigner = spec.params.get("assigner")
        if not isinstance(assigner, dict) or spec.params.get("time", "event") != "event":
            continue
        period = {"tumbling": assigner.get("size"), "sliding": assigner.get("slide")}.get(str(assigner.get("type")))
        if isinstance(period, int) and period > 0:
            ends.add((period, (assigner.get("offset") or 0) % period))
    return [list(end) for end in sorted(ends)]


def passes_window_end(ends: list[list[int]], before: int, after: int) -> bool:
    """Whether a watermark moving from ``before`` to ``after`` passes the last timestamp (end - 1)
    of a window ending at offset + n * period for one of ``ends``: a window that fires then."""
    if after <= before:
        return False
    return any((after + 1 - offset) // period > (before + 1 - offset) // period for period, offset in ends)
