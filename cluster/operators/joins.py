"""Joins of two keyed streams, as Flink's: the interval join, the window join and the temporal
(versioned table) join.

Both inputs arrive hash-partitioned by their key columns (params["key"] on the left,
params["right_key"] on the right), so rows with equal key values meet in one subtask and one key
group. Rows that wait for the other side live in the keyed state backend in Chunks: per key group
and batch, an Arrow table of the rows there, so that a batch or a watermark is joined with one
vectorised merge over all its key groups rather than key by key. Event-time timers per key group
say when the watermark makes a chunk's rows useless (or fires its windows). State, timers, the
watermark and the sides' schemas are checkpointed; a restore at another parallelism takes its key
groups' share.

* interval-join (Flink's IntervalJoinOperator): a left row l and a right row r of one key join when
  ``l.ts + lower <= r.ts <= l.ts + upper``, emitted as soon as both are there. A row with
  ``ts < watermark`` is late: dropped and counted.
* window-join (Flink's window join, a coGroup on windows): the cross product of both sides' rows of
  a key and window, emitted when the watermark reaches the window's end - 1, with window_start and
  window_end. A row all of whose windows have fired is late.
* temporal-join (Flink's temporal table join): in event time the right side is a versioned table
  and a left row joins the version valid at its rowtime, once the watermark says no older version
  can still come; in processing time (no left rowtime) a left row joins its key's latest right row.

Joined rows: the left's columns, then the right's, without its key columns named as the left's key
column they join, other colliding names suffixed "_right"; an optional udf fn(DataFrame) -> DataFrame
transforms them. Thread use: the task thread only.

This module holds what the three share (JoinOperator: keys, schemas, joined rows, checkpoints);
each join is a module of its own (interval_join, window_join, temporal_join), and the rows that
wait in keyed state are join_state's Chunks.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np
import pyarrow as pa

from cluster.graph.event_time import NO_WATERMARK
from cluster.graph.schema import schema_of_text, schema_to_text
from cluster.common.frames import to_table
from cluster.operators.base import OperatorSnapshot
from cluster.operators.join_state import Chunks, by_key_group, concat
from cluster.operators.keyed import KeyedOperator
from cluster.operators.late_rows import LateRows
from cluster.operators.timers import TimerService
from cluster.operators.windowing.watermarks import rowtime_ms
from cluster.protocol.metrics import LATE_ROWS, NEWEST_EVENT_TIMESTAMP, NUM_LATE_RECORDS_DROPPED
from cluster.state.key_groups import key_groups_of

LEFT, RIGHT = 0, 1
SIDES = ("left", "right")
RIGHT_SUFFIX = "_right"


class Met(NamedTuple):
    """The pairs of a batch's rows and the other side's waiting rows with equal keys."""
    mine: np.ndarray       # each pair's row of the batch (a position in it)
    at_theirs: np.ndarray  # each pair's waiting row (a position in theirs)
    their_ts: np.ndarray   # every waiting row's time
    theirs: pa.Table       # every waiting row of the batch's key groups


class SideBatch(NamedTuple):
    table: pa.Table
    ts: Optional[np.ndarray]  # the rowtime of each row (epoch ms), None in processing time
    ids: np.ndarray           # each row's key, as an index into keys
    keys: list                # the distinct keys (python natives), in order of first appearance
    key_groups: list          # their key groups


class JoinOperator(KeyedOperator):
    """What the three joins share. params: key, right_key (default: key), left_rowtime,
    right_rowtime. udf: fn(joined DataFrame) -> DataFrame."""

    def open(self) -> None:
        super().open()
        where = self.spec.where()
        self.right_key = list(self.params.get("right_key") or self.key)
        if not self.key or len(self.key) != len(self.right_key):
            raise ValueError(f"{where}: the left key {self.key} and the right key {self.right_key} must "
                             "name as many columns, at least one")
        self.keys = (self.key, self.right_key)
        self.rowtimes = (self.params.get("left_rowtime"), self.params.get("right_rowtime"))
        # each side's columns: given when the plan knows them (an outer join pads a side it never saw)
        given = self.params.get("side_schemas") or [None, None]
        self.schemas: list[Optional[pa.Schema]] = [schema_of_text(t) for t in given]
        self.timers = TimerService(self.backend)
        self.watermark = NO_WATERMARK
        self.late = LateRows(self.spec.uid, self.spec.name, None)  # joins drop late rows (no side output)
        self.newest = NO_WATERMARK
        self.next_chunk = 0  # the number of the next chunk (Chunks) this subtask writes

    def _need_rowtimes(self, what: str) -> None:
        missing = [f"{side}_rowtime" for side, column in zip(SIDES, self.rowtimes) if not column]
        if missing:
            raise ValueError(f"{self.spec.where()}: {what} is in event time and needs the rowtime column of "
                             f"both inputs: {' and '.join(missing)} not given")

    # ------------------------------------------------------------------ input
    def process(self, table: pa.Table) -> list[pa.Table]:
        raise TypeError(f"{self.spec.where()} joins two inputs: its batches come through process_side")

    def _read(self, side: int, table: pa.Table) -> Optional[np.ndarray]:
        """Learns the side's schema; the rows' event times (None in processing time)."""
        self.schemas[side] = table.schema.remove_metadata()
        column = self.rowtimes[side]
        if column is None:
            return None
        ts = rowtime_ms(table, column, f"{self.spec.where()}, its {SIDES[side]} input")
        if len(ts):
            self.newest = max(self.newest, int(ts.max()))
        return ts

    def _event_times(self, side: int, table: pa.Table) -> np.ndarray:
        """_read, for a side whose rowtime column open() made sure of."""
        ts = self._read(side, table)
        assert ts is not None, "open() checks that both rowtimes are given"
        return ts

    def _drop_late(self, side: int, table: pa.Table, ts: np.ndarray,
                   late: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        if not late.any():
            return table, ts
        self.late.record(table.filter(pa.array(late)), ts[late], self.watermark, False, SIDES[side])
        keep = ~late
        return table.filter(pa.array(keep)), ts[keep]

    def _by_key(self, side: int, table: pa.Table, ts: Optional[np.ndarray]) -> SideBatch:
        batch = self.group(table, keys_only=True, key=self.keys[side], input_name=f"its {SIDES[side]} input")
        return SideBatch(table, ts, batch.grouped.ngroup().to_numpy(), batch.keys, batch.key_groups)

    def _key_groups(self, side: int, table: pa.Table) -> np.ndarray:
        """The key group of each row, as the exchange routed it."""
        key = self.keys[side]
        missing = [k for k in key if k not in table.column_names]
        if missing:
            raise KeyError(f"{self.spec.where()}: key column(s) {missing} not in its {SIDES[side]} input "
                           f"(columns: {table.column_names})")
        return key_groups_of(table, key, self.ctx.max_parallelism)

    def _by_key_group(self, side: int, table: pa.Table) -> list[tuple[int, np.ndarray]]:
        """(key group, its rows) of a batch."""
        return by_key_group(self._key_groups(side, table))

    def _key_frame(self, side: int, table: pa.Table, ts: np.ndarray, position: str):
        """A side's key columns under names both sides share, its times and each row's position."""
        frame = table.select(self.keys[side]).rename_columns(self._key_names).to_pandas()
        frame["__ts"] = ts
        frame[position] = np.arange(len(frame))
        return frame

    def _meet(self, side: int, table: pa.Table, ts: Optional[np.ndarray],
              chunks: list[tuple[int, tuple]]) -> Optional[Met]:
        """The batch ``table`` of ``side`` (its times ``ts``, or none) against the other side's rows
        waiting in ``chunks`` (as Chunks.read gives them): one vectorised equi-join; None if none wait."""
        if not chunks:
            return None
        _, their_ts, theirs = concat(chunks)
        mine = self._key_frame(side, table, np.zeros(table.num_rows, np.int64) if ts is None else ts, "__mine")
        # a null key equals nothing, as in SQL (pandas' merge would pair two nulls)
        met = mine.drop(columns="__ts").dropna(subset=self._key_names).merge(
            self._key_frame(1 - side, theirs, their_ts, "__theirs").drop(columns="__ts")
            .dropna(subset=self._key_names), on=self._key_names)
        return Met(met["__mine"].to_numpy(), met["__theirs"].to_numpy(), their_ts, theirs)

    def _cut(self, waiting: Chunks, group: int, until: int, expiry: Callable[[np.ndarray], np.ndarray],
             domain: str, side: int) -> list[pa.Table]:
        """Drops the rows of ``group`` in ``waiting`` whose ``expiry(ts)`` is at or before ``until``,
        from the chunks whose time says they have such rows; a cut chunk's time becomes its rows'
        first expiry, and the group's timer (of ``domain``, keyed by ``side``) the first of those.
        Returns the rows dropped."""
        index = waiting.index(group)
        stale = [number for number, time in index.items() if time is not None and time <= until]
        changed: dict[int, Optional[tuple]] = {}
        dropped = []
        for number, (_, (ts, rows)) in zip(stale, waiting.read([group], [stale])):
            expires = expiry(ts)
            useful = expires > until
            dropped.append(rows.filter(pa.array(~useful)))
            if useful.any():
                changed[number] = (ts[useful], rows.filter(pa.array(useful)))
                index[number] = int(expires[useful].min())
            else:
                changed[number] = None
                del index[number]
        waiting.rewrite(group, index, changed)
        times = [time for time in index.values() if time is not None]
        if times:
            self.timers.register(domain, group, side, min(times))
        return dropped

    @property
    def _key_names(self) -> list[str]:
        return [f"__key{i}" for i in range(len(self.key))]

    def _chunk_numbers(self, n: int) -> list[int]:
        first, self.next_chunk = self.next_chunk, self.next_chunk + n
        return list(range(first, first + n))

    def _replace(self, chunks: Chunks, groups: list[int], rows: Optional[tuple],
                 time_of: Optional[Callable[[np.ndarray], Optional[int]]]) -> list[Optional[int]]:
        """Each key group's chunks become one of ``rows`` (key groups, ts, table), or none; the
        time of each group's new chunk."""
        parts: dict[int, np.ndarray] = {}
        if rows is not None:
            row_groups, ts, table = rows
            parts = dict(by_key_group(row_groups))
        times: list[Optional[int]] = []
        for group in groups:
            changed: dict[int, Optional[tuple]] = dict.fromkeys(chunks.index(group))
            index: dict[int, Optional[int]] = {}
            at = parts.get(group)
            if at is not None:
                assert time_of is not None  # given with rows
                number = self._chunk_numbers(1)[0]
                changed[number] = (ts[at], table.take(at))
                index[number] = time_of(ts[at])
            chunks.rewrite(group, index, changed)
            times.append(index[number] if at is not None else None)
        return times

    # ------------------------------------------------------------------ output
    def _right_columns(self) -> list[tuple[int, str]]:
        """(position in the right schema, name in the joined rows) of the right columns kept."""
        left, right = self.schemas
        assert left is not None and right is not None  # both sides have sent rows to join
        same_key = {r for l, r in zip(self.key, self.right_key) if l == r}
        kept = []
        for i, name in enumerate(right.names):
            if name in same_key:
                continue
            if name in left.names:
                renamed = name + RIGHT_SUFFIX
                if renamed in left.names or renamed in right.names:
                    raise ValueError(f"{self.spec.where()}: the right input's column {name!r} collides with the "
                                     f"left's, and so does {renamed!r}: rename one of them")
                name = renamed
            kept.append((i, name))
        return kept

    def _emit(self, left: Optional[pa.Table], right: Optional[pa.Table],
              extra: Sequence[tuple[str, pa.Array]] = ()) -> list[pa.Table]:
        """The joined rows of ``left`` and ``right``, aligned row by row (one of them None: no
        match, its columns null), then the ``extra`` columns, through the udf."""
        rows = left if left is not None else right
        if rows is None or rows.num_rows == 0:
            return []
        if left is None:
            left_schema = self.schemas[LEFT]
            if left_schema is None:
                raise ValueError(f"{self.spec.where()}: a right row without a match, and the left input's columns are "
                                 "not known (no left row came, and the plan gave no side_schemas)")
            left = pa.Table.from_arrays([pa.nulls(rows.num_rows, f.type) for f in left_schema], schema=left_schema)
        names, columns = list(left.column_names), list(left.columns)
        right_schema = self.schemas[RIGHT]
        if right_schema is not None:  # else no right row was ever seen: nothing to say of its columns
            for i, name in self._right_columns():
                names.append(name)
                columns.append(right.column(i) if right is not None else
                               pa.nulls(left.num_rows, right_schema.field(i).type))
        for name, column in extra:
            names.append(name)
            columns.append(column)
        joined = pa.Table.from_arrays(columns, names=names)
        if self.udf is None:
            return [joined]
        result = self.call_user(joined.to_pandas())
        if result is None:
            return []
        result = to_table(result, f"{self.spec.where()}: the join function")
        return [result] if result.num_rows else []

    # ------------------------------------------------------------------ checkpoints
    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        handle = {"watermark": self.watermark, "schemas": [schema_to_text(s) for s in self.schemas],
                  "next_chunk": self.next_chunk}
        return OperatorSnapshot(handle, keyed=self.backend.snapshot())

    def restore_state(self, handles: list[dict]) -> None:
        super().restore_state(handles)
        self.timers.restore()
        # the minimum: whatever any subtask had not yet seen may still come to this one
        self.watermark = min((h.get("watermark", NO_WATERMARK) for h in handles), default=NO_WATERMARK)
        for side in (LEFT, RIGHT):
            texts = [h["schemas"][side] for h in handles if h.get("schemas") and h["schemas"][side]]
            self.schemas[side] = schema_of_text(texts[0]) if texts else self.schemas[side]
        # chunk numbers are unique within a key group: new ones come after every restored one
        self.next_chunk = max((h.get("next_chunk", 0) for h in handles), default=0)

    def metrics(self) -> dict:
        return {NUM_LATE_RECORDS_DROPPED: self.late.dropped, NEWEST_EVENT_TIMESTAMP: self.newest,
                LATE_ROWS: self.late.report()}
