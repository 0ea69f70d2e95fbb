"""An operator's late rows as pandas (``JobHandle.late_rows``): the sampled rows with their own
columns and types, then when each was late and by how much."""
from __future__ import annotations

import base64

import pandas as pd

from cluster.protocol.metrics import OperatorLateRows


def _typed(values: pd.Series, arrow_type: str) -> pd.Series:
    """A sampled column back in its type (the report carries times as ISO text, bytes as base64)."""
    if arrow_type.startswith("timestamp"):
        return pd.to_datetime(values, format="ISO8601", utc="tz=" in arrow_type)
    if arrow_type.startswith("date"):
        return pd.to_datetime(values, format="ISO8601").dt.date
    if arrow_type in ("binary", "large_binary"):
        return values.map(lambda v: None if v is None else base64.b64decode(v))
    return values


def late_rows_frame(report: OperatorLateRows) -> pd.DataFrame:
    rows = pd.DataFrame([entry["row"] for entry in report.sample], columns=list(report.schema))
    for column, arrow_type in report.schema.items():
        rows[column] = _typed(rows[column], arrow_type)
    ms = pd.Series([entry["event_time"] for entry in report.sample], dtype="int64")
    watermark = pd.Series([entry["watermark"] for entry in report.sample], dtype="int64")
    added = {"event_time": pd.to_datetime(ms, unit="ms", utc=True).astype("datetime64[ms, UTC]"),
             "watermark": pd.to_datetime(watermark, unit="ms", utc=True).astype("datetime64[ms, UTC]"),
             "late_by": pd.to_timedelta(watermark - ms, unit="ms").astype("timedelta64[ms]"),
             "input": [entry.get("input", "") for entry in report.sample],
             "subtask": [entry["subtask"] for entry in report.sample]}
    if not any(added["input"]):  # one input (a window): nothing to say
        del added["input"]
    # a column of the row of one of these names keeps its name, the added one is prefixed with "late_"
    for name, values in added.items():
        rows[f"late_{name}" if name in rows.columns else name] = list(values)
    rows.attrs.update(operator=report.name, uid=report.uid, count=report.count, dropped=report.dropped,
                      side_output=report.side_output)
    return rows
