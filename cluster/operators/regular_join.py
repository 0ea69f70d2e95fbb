"""The regular join (Flink SQL's streaming join without a time bound) of two keyed streams.

Every row of either side is kept in keyed state, since a row of the other side with its key may
come at any time, and each new row is joined at once with the other side's rows of its key: an
inner join of two append-only streams is append-only, each pair emitted once, when its later row
arrives. State grows with the inputs unless a state TTL is given (Flink's
``table.exec.state.ttl``): a row is then forgotten that long after it arrived (processing time),
and a later row of its key no longer meets it. What the joins share is cluster.operators.joins.
Thread use: the task thread only.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa

from cluster.common import clock
from cluster.operators.join_state import Chunks
from cluster.operators.joins import LEFT, RIGHT, JoinOperator
from cluster.operators.timers import PROCESSING_TIME


class RegularJoin(JoinOperator, kind="regular-join"):
    """params: state_ttl_ms (0 or absent: rows are kept for ever).

    State: each side's rows in Chunks, a chunk's times the rows' arrival (epoch ms, wall clock),
    its time the first arrival + TTL when there is a TTL. A batch meets the other side's chunks of
    its key groups in one vectorised equi-join, as the interval join's does."""

    def open(self) -> None:
        super().open()
        ttl = self.params.get("state_ttl_ms") or 0
        if isinstance(ttl, bool) or not isinstance(ttl, (int, np.integer)) or ttl < 0:
            raise ValueError(f"{self.spec.where()}: the join's state_ttl_ms must be a number of milliseconds "
                             f"(0: keep every row), got {ttl!r}")
        self.ttl = int(ttl)
        self.uses_processing_time = self.ttl > 0
        self.rows = (Chunks(self.backend, "left-rows"), Chunks(self.backend, "right-rows"))

    def process_side(self, side: int, table: pa.Table) -> list[pa.Table]:
        self._read(side, table)  # learns the schema and the newest event time, if the side has one
        if table.num_rows == 0:
            return []
        table = table.replace_schema_metadata(None)
        parts = self._by_key_group(side, table)
        out = self._match(side, table, [group for group, _ in parts])
        self._keep(side, table, parts)
        return out

    def _match(self, side: int, table: pa.Table, key_groups: list[int]) -> list[pa.Table]:
        met = self._meet(side, table, None, self.rows[1 - side].read(key_groups))
        if met is None:
            return []
        this_rows, other_rows = table.take(met.mine), met.theirs.take(met.at_theirs)
        return self._emit(*((this_rows, other_rows) if side == LEFT else (other_rows, this_rows)))

    def _keep(self, side: int, table: pa.Table, parts: list) -> None:
        now = clock.now_ms()
        arrived = np.full(table.num_rows, now, dtype=np.int64)
        expiry = now + self.ttl if self.ttl else None
        groups = [group for group, _ in parts]
        self.rows[side].add(groups, self._chunk_numbers(len(groups)),
                            [(arrived[rows], table.take(rows)) for _, rows in parts], [expiry] * len(groups))
        if expiry is not None:
            self.timers.register_many(PROCESSING_TIME, groups, [side] * len(groups), [expiry] * len(groups),
                                      [None] * len(groups))

    def process_watermark(self, watermark: int) -> tuple[list[pa.Table], Optional[int]]:
        # no row is late to a join without a time bound: the watermark only passes on
        self.watermark = max(self.watermark, watermark)
        return [], watermark

    def on_processing_time(self, now_ms: int) -> list[pa.Table]:
        due = self.timers.pop_due(PROCESSING_TIME, now_ms)
        for side in (LEFT, RIGHT):
            for group in dict.fromkeys(t.key_group for t in due if t.key == side):
                self._forget(side, group, now_ms)
        return []

    def _forget(self, side: int, group: int, now_ms: int) -> None:
        """The rows of ``side`` in key group ``group`` that arrived a TTL or more before ``now_ms``."""
        self._cut(self.rows[side], group, now_ms, lambda ts: ts + self.ttl, PROCESSING_TIME, side)
