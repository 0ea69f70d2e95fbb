"""Timestamps and watermarks: Flink's TimestampsAndWatermarksOperator, the operator a
``WatermarkStrategy`` becomes (``from_source(..., watermark_strategy)``, ``from_generator(...,
watermark_strategy=...)`` or ``assign_timestamps_and_watermarks``).

Chained right after its source (same parallelism, forward), it makes the watermark of its source
subtask: the subtask reads its splits one after the other, so this is the watermark of the split
being read. Rows carry their event time in the rowtime column (params["column"]); with a timestamp
assigner the function's result is written to that column. Upstream watermarks are swallowed
(this operator makes its own), except the end of input. The largest timestamp seen is in its
checkpoint, so a restored job's watermark does not start from nothing again (restored at another
parallelism: the smallest of the old subtasks', which holds no row back).
"""
from __future__ import annotations

import json
import time
from typing import Optional

import pyarrow as pa

from cluster.graph.event_time import (MAX_WATERMARK, NO_WATERMARK, SPLIT_ROWS_METADATA, WINDOW_ENDS_PARAM,
                                      passes_window_end, timestamps_from)
from cluster.operators.base import Operator, OperatorSnapshot
from cluster.operators.windowing.watermarks import BoundedOutOfOrderness, SplitWatermarks, rowtime_ms


class TimestampsAndWatermarks(Operator, kind="timestamps-watermarks"):
    """params: column (the rowtime column), bound_ms (the out-of-orderness bound; None: no
    watermarks), idle_ms (None: never idle), assigner (the udf computes the column from the
    rows: fn(DataFrame) -> timestamps)."""

    generates_watermarks = True

    def open(self) -> None:
        self.column = self.params["column"]
        self.bound: Optional[int] = self.params.get("bound_ms")
        idle = self.params.get("idle_ms")
        self.generator = BoundedOutOfOrderness(self.bound or 0, None if idle is None else idle / 1000,
                                               clock=time.monotonic)
        # a source that reads several splits at once says which rows came from which (Kafka)
        self.splits = SplitWatermarks(self.bound or 0, None if idle is None else idle / 1000, clock=time.monotonic)
        self.by_split = False
        self.newest = NO_WATERMARK
        self.window_ends: list[list[int]] = self.params.get(WINDOW_ENDS_PARAM) or []
        self.emitted = NO_WATERMARK

    def process(self, table: pa.Table) -> list[pa.Table]:
        if table.num_rows == 0:
            return []
        if self.params.get("assigner"):
            stamps = timestamps_from(self.call_user(table.to_pandas()), table.num_rows, self.spec.where())
            if self.column in table.column_names:
                table = table.set_column(table.column_names.index(self.column), self.column, stamps)
            else:
                table = table.append_column(self.column, stamps)
        stamps = rowtime_ms(table, self.column, self.spec.where())
        newest = int(stamps.max())
        self.generator.on_batch(newest)
        self.newest = max(self.newest, newest)
        split_rows = (table.schema.metadata or {}).get(SPLIT_ROWS_METADATA)
        if split_rows is not None:
            self._on_splits(json.loads(split_rows), stamps)
            table = table.replace_schema_metadata(None)
        return [table]

    def _on_splits(self, split_rows: dict, stamps) -> None:
        self.by_split = True
        self.splits.assigned(split_rows["assigned"])
        start = 0
        for split, count in split_rows["rows"]:
            if count:
                self.splits.on_batch(split, int(stamps[start:start + count].max()))
            start += count

    def periodic_watermark(self) -> Optional[tuple[int, bool]]:
        if self.bound is None:
            return None  # no_watermarks(): timestamps only
        answer = self.splits.on_periodic_emit() if self.by_split else self.generator.on_periodic_emit()
        if answer is not None and not answer[1]:
            self.emitted = max(self.emitted, answer[0])
        return answer

    def window_end_passed(self) -> bool:
        """Whether the watermark now passes the end of one of the job's windows that the last one
        emitted did not (cluster.graph.event_time.WINDOW_ENDS_PARAM): then it goes out at once."""
        if self.bound is None or not self.window_ends:
            return False
        if self.by_split:
            answer = self.splits.on_periodic_emit()
            if answer is None or answer[1]:
                return False
            watermark = answer[0]
        else:
            watermark = self.generator.watermark
        return passes_window_end(self.window_ends, self.emitted, watermark)

    def process_watermark(self, watermark: int) -> tuple[list[pa.Table], Optional[int]]:
        return [], (MAX_WATERMARK if watermark == MAX_WATERMARK else None)

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        return OperatorSnapshot({"max_timestamp": self.generator.max_timestamp})

    def restore_state(self, handles: list[dict]) -> None:
        seen = [h["max_timestamp"] for h in handles if "max_timestamp" in h]
        if seen:
            self.generator.max_timestamp = max(self.generator.max_timestamp, min(seen))

    def metrics(self) -> dict:
        """Any thread. With per-split watermarks, each split's too, and whether it is idle (the
        dashboard's source view, and what holds a window back: cluster.jobmanager.rest.window_waits)."""
        figures: dict = {"newestEventTimestamp": self.newest}
        for split, (watermark, idle) in self.splits.states().items():
            figures[f"split.{split}.currentWatermark"] = watermark
            figures[f"split.{split}.idle"] = idle
        return figures
