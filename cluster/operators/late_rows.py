"""LateRows: what an event-time operator (windows, window and interval joins) found late, so that a
user can see the rows and not only count them: how many, and the newest few with their event time
and the watermark that made them late, whether they went to a side output or were dropped.

The task reports it with its metrics (``late-rows``: per operator uid, see ``report``), the
JobManager keeps the newest report of every subtask, and the dashboard and
``JobHandle.late_rows`` read it from the job's details: nothing is sent per late row.

Thread use: ``record`` on the task thread; ``report`` from any thread (it reads a tuple that
``record`` replaces whole, and two ints).
"""
from __future__ import annotations

import base64
import datetime
import decimal
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from cluster.common.clock import now_ms

SAMPLE_ROWS = 20  # per operator and subtask: enough to see what is late, little to send in a heartbeat


def plain(value: Any) -> Any:
    """A row's value as msgpack and JSON carry it: times as ISO text (the report's schema says
    their type), decimals as text, bytes as base64."""
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


class LateRows:
    def __init__(self, uid: str, name: str, side_output: Optional[str], limit: int = SAMPLE_ROWS):
        self.uid, self.name, self.side_output, self.limit = uid, name, side_output, limit
        self.count = 0     # every late row, side output or not
        self.dropped = 0   # those without a side output (Flink's numLateRecordsDropped)
        self.schema: dict[str, str] = {}
        self.sample: tuple[dict, ...] = ()

    def record(self, table: pa.Table, event_times: np.ndarray, watermark: int, to_side_output: bool,
               input_name: str = "", rows: Optional[int] = None) -> None:
        """``table``'s rows were late at ``watermark`` (``event_times``: theirs, epoch ms, one per row);
        they went to the side output, or were dropped. ``rows``: the input rows they stand for when
        they are partial aggregates (default: one each)."""
        n = table.num_rows
        if n == 0:
            return
        stand_for = n if rows is None else rows
        self.count += stand_for
        if not to_side_output:
            self.dropped += stand_for
        first = max(0, n - self.limit)
        newest, times = table.slice(first), event_times[first:].tolist()
        self.schema = {f.name: str(f.type) for f in table.schema}
        at = now_ms()
        entries = tuple({"at": at, "event_time": t, "watermark": watermark, "input": input_name, "row": plain(row)}
                        for row, t in zip(newest.to_pylist(), times))
        self.sample = (self.sample + entries)[-self.limit:]

    def report(self) -> dict:
        return {self.uid: {"name": self.name, "count": self.count, "dropped": self.dropped,
                           "side_output": self.side_output, "schema": self.schema, "sample": list(self.sample)}}
