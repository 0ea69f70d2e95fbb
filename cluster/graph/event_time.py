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
