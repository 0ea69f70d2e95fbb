"""The regular join (Flink SQL's streaming join without a time bound) of two keyed streams.

Every row of either side is kept in keyed state, since a row of the other side with its key may
come at any time, and each new row is joined at once with the other side's rows of its key: an
inner join of two append-only streams is append-only, each pair emitted once, when its later row
arrives. State grows with the inputs unless a state TTL is given (Flink's
``table.exec.state.ttl``): a row is then forgotten that long after it arrived (processing time),
and a later row of its key no longer meets it. What the joins share is cluster.operators.joins.

A side may be an upsert stream (a running aggregate's rows, Flink's input with a unique key): its
row for an upsert key replaces the one kept before, and is joined anew with the other side's rows,
which its old version met. The upsert key lies within the side's join key, so every version of a
row comes to one key group and meets the same rows, and an update's pairs replace the old ones by
the result's key: each updating side's upsert key, and for an append side a row id the join gives
each row it keeps (``row_ids``). The id is the row's content hashed with how many rows of that
content came before it, so that a replay after a restore gives a row its id again (a result view
then converges on the pairs, as it does for every upsert key). Thread use: the task thread only.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.common import clock
from cluster.operators.join_state import Chunks, by_key_group, concat
from cluster.operators.joins import LEFT, RIGHT, SIDES, JoinOperator
from cluster.operators.timers import PROCESSING_TIME


class RegularJoin(JoinOperator, kind="regular-join"):
    """params: state_ttl_ms (0 or absent: rows are kept for ever); upsert_keys (per side, the
    columns an upsert stream's rows are keyed by, within its join key, or None: an append side);
    row_ids (per side, the column that numbers its rows, or None).

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
        self.upsert_keys: list[Optional[list[str]]] = list(self.params.get("upsert_keys") or (None, None))
        self.row_ids: list[Optional[str]] = list(self.params.get("row_ids") or (None, None))
        for side, upsert in enumerate(self.upsert_keys):
            if upsert is not None and (not upsert or not set(upsert) <= set(self.keys[side])):
                raise ValueError(f"{self.spec.where()}: the {('left', 'right')[side]} input's upsert key {upsert} must "
                                 f"lie within its join key {self.keys[side]}: each version of a row must meet the "
                                 "rows its old version met")

    def process_side(self, side: int, table: pa.Table) -> list[pa.Table]:
        groups = self._key_groups(side, table) if table.num_rows else np.empty(0, np.int64)  # of each row
        if self.row_ids[side] is not None:
            table = self._numbered(side, table, groups)
        self._read(side, table)  # learns the schema and the newest event time, if the side has one
        if table.num_rows == 0:
            return []
        table = table.replace_schema_metadata(None)
        if self.upsert_keys[side] is not None:
            table, groups = self._latest(side, table, groups)
        parts = by_key_group(groups)
        out = self._match(side, table, [group for group, _ in parts])
        if self.upsert_keys[side] is None:
            self._keep(side, table, parts)
        else:
            self._upsert(side, table, groups, [group for group, _ in parts])
        return out

    def _numbered(self, side: int, table: pa.Table, groups: np.ndarray) -> pa.Table:
        """The rows (of key groups ``groups``) with an id: the hash of a row's content and of the
        number of rows of that content its key group had before it (kept in keyed state, so a
        restore keeps counting)."""
        if table.num_rows == 0:
            return table.append_column(self.row_ids[side], pa.array([], pa.int64()))
        content = pd.util.hash_pandas_object(table.to_pandas(), index=False).to_numpy().view(np.int64)
        frame = pd.DataFrame({"group": groups, "content": content})
        frame["before"] = frame.groupby(["group", "content"], sort=False).cumcount()
        seen = frame.drop_duplicates(["group", "content"], keep="last")
        seen_groups, seen_contents = seen["group"].tolist(), seen["content"].tolist()
        state = f"{SIDES[side]}-row-counts"
        had = dict(zip(zip(seen_groups, seen_contents),
                       [c or 0 for c in self.backend.get_many(state, seen_groups, seen_contents)]))
        frame["before"] += [had[key] for key in zip(frame["group"].tolist(), frame["content"].tolist())]
        self.backend.put_many(state, seen_groups, seen_contents, (frame.loc[seen.index, "before"] + 1).tolist())
        occurrence = pd.util.hash_pandas_object(frame[["content", "before"]], index=False).to_numpy().view(np.int64)
        return table.append_column(self.row_ids[side], pa.array(occurrence, pa.int64()))

    def _latest(self, side: int, table: pa.Table, groups: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """A batch's last row per upsert key, and its key group: the versions before it are replaced at once."""
        keys = table.select(self.upsert_keys[side]).to_pandas()
        last = ~keys.duplicated(keep="last").to_numpy()
        return (table, groups) if last.all() else (table.filter(pa.array(last)), groups[last])

    def _upsert(self, side: int, table: pa.Table, row_groups: np.ndarray, groups: list[int]) -> None:
        """The batch's rows (of key groups ``row_groups``) replace the kept rows of their upsert keys
        in ``groups``: one chunk per key group."""
        arrived = np.full(table.num_rows, clock.now_ms(), dtype=np.int64)
        ts, rows = arrived, table
        kept = self.rows[side].read(groups)
        if kept:
            old_groups, old_ts, old = concat(kept)
            key = self.upsert_keys[side]
            assert key is not None
            replaced = old.select(key).to_pandas().merge(
                table.select(key).to_pandas().drop_duplicates().assign(__new=True), how="left", on=key)["__new"]
            stays = replaced.isna().to_numpy()
            row_groups = np.concatenate([old_groups[stays], row_groups])
            ts = np.concatenate([old_ts[stays], arrived])
            rows = pa.concat_tables([old.filter(pa.array(stays)), table], promote_options="default")
        times = self._replace(self.rows[side], groups, (row_groups, ts, rows),
                              (lambda t: int(t.min()) + self.ttl) if self.ttl else (lambda t: None))
        self._forget_at(side, groups, times)

    def _forget_at(self, side: int, groups: list[int], times: list[Optional[int]]) -> None:
        """A processing-time timer per key group at which the TTL forgets its rows (None: none)."""
        due = [(group, time) for group, time in zip(groups, times) if time is not None]
        if due:
            self.timers.register_many(PROCESSING_TIME, [g for g, _ in due], [side] * len(due), [t for _, t in due],
                                      [None] * len(due))

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
        self._forget_at(side, groups, [expiry] * len(groups))

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
