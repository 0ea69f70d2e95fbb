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
"""
from __future__ import annotations

import base64
from typing import Callable, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.state.key_groups import key_groups_of

from cluster.operators.base import OperatorSnapshot
from cluster.operators.keyed import KeyedOperator
from cluster.operators.base import to_table
from cluster.operators.windowing.timers import EVENT_TIME, TimerService
from cluster.operators.windowing.watermarks import NO_WATERMARK, rowtime_ms
from cluster.operators.windowing.windows import SessionWindows, SlidingWindows, TumblingWindows, assigner_of

LEFT, RIGHT = 0, 1
SIDES = ("left", "right")
RIGHT_SUFFIX = "_right"


def row_tuples(table: pa.Table) -> list[tuple]:
    """The rows as tuples of python values (immutable, picklable): a processing-time temporal
    join's latest right row per key."""
    return list(zip(*(column.to_pylist() for column in table.columns)))


def table_of(schema: pa.Schema, rows: Sequence[tuple]) -> pa.Table:
    columns = list(zip(*rows)) if rows else [()] * len(schema)
    return pa.Table.from_arrays([pa.array(list(values), type=field.type) for values, field in zip(columns, schema)],
                                schema=schema)


def _schema_to_text(schema: Optional[pa.Schema]) -> Optional[str]:
    # the checkpoint metadata is JSON
    return None if schema is None else base64.b64encode(schema.serialize().to_pybytes()).decode()


def _schema_of_text(text: Optional[str]) -> Optional[pa.Schema]:
    return None if text is None else pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


class SideBatch(NamedTuple):
    table: pa.Table
    ts: Optional[np.ndarray]  # the rowtime of each row (epoch ms), None in processing time
    ids: np.ndarray           # each row's key, as an index into keys
    keys: list                # the distinct keys (python natives), in order of first appearance
    key_groups: list          # their key groups


class Chunks:
    """One side's rows waiting in keyed state, in chunks: per key group, the rows of a batch there
    (their times, epoch ms, and an Arrow table) under a chunk number, and an index of the group's
    chunks, each with the time from which it wants another look (the watermark it waits for)."""

    _INDEX_KEY = 0  # the index is the only key of its state in each key group

    def __init__(self, backend, name: str):
        self.backend = backend
        self.state, self.index_state = f"{name}-chunks", f"{name}-index"

    MERGE_AT = 8  # a key group's chunks are merged into one when a new one would make this many

    def add(self, groups: Sequence[int], numbers: Sequence[int], chunks: Sequence[tuple],
            times: Sequence[Optional[int]]) -> None:
        """A new chunk for each key group (each group once). Small batches make small chunks, and a
        join reads every chunk of the key groups it looks at: so a group's chunks are merged when
        there are MERGE_AT of them, which keeps their count, and the cost per chunk, bounded."""
        index_keys = [self._INDEX_KEY] * len(groups)
        indexes = [index or () for index in self.backend.get_many(self.index_state, groups, index_keys)]
        full = [i for i, index in enumerate(indexes) if len(index) + 1 >= self.MERGE_AT]
        new_chunks, new_times = list(chunks), list(times)
        if full:
            old = self.read([groups[i] for i in full], [[n for n, _ in indexes[i]] for i in full])
            for i in full:
                parts = [chunk for g, chunk in old if g == groups[i]] + [new_chunks[i]]
                new_chunks[i] = (np.concatenate([ts for ts, _ in parts]),
                                 pa.concat_tables([rows for _, rows in parts], promote_options="default"))
                known = [t for _, t in indexes[i] if t is not None] + ([t] if (t := new_times[i]) is not None else [])
                new_times[i] = min(known) if known else None
                self.backend.put_many(self.state, [groups[i]] * len(indexes[i]), [n for n, _ in indexes[i]],
                                      [None] * len(indexes[i]))
                indexes[i] = ()
        self.backend.put_many(self.state, groups, numbers, new_chunks)
        self.backend.put_many(self.index_state, groups, index_keys,
                              [index + ((n, t),) for index, n, t in zip(indexes, numbers, new_times)])

    def index(self, group: int) -> dict[int, Optional[int]]:
        """Chunk number -> its time (None: it wants no look), in the order the chunks came."""
        return dict(self.backend.get(self.index_state, group, self._INDEX_KEY) or ())

    def read(self, groups: list[int], numbers: Optional[list[list[int]]] = None) -> list[tuple[int, tuple]]:
        """(key group, chunk (ts, rows)) of the chunks of these key groups (all, or those ``numbers``),
        in the order they came."""
        if numbers is None:
            indexes = self.backend.get_many(self.index_state, groups, [self._INDEX_KEY] * len(groups))
            numbers = [[n for n, _ in index or ()] for index in indexes]
        at = [(g, n) for g, ns in zip(groups, numbers) for n in ns]
        if not at:
            return []
        return list(zip([g for g, _ in at], self.backend.get_many(self.state, [g for g, _ in at], [n for _, n in at])))

    def rewrite(self, group: int, index: Mapping[int, Optional[int]], changed: Mapping[int, Optional[tuple]]) -> None:
        """The group's new ``index`` after putting the ``changed`` chunks (None: gone)."""
        for number, chunk in changed.items():
            self.backend.put(self.state, group, number, chunk)
        self.backend.put(self.index_state, group, self._INDEX_KEY, tuple(index.items()) or None)


def by_key_group(key_groups: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(key group, the positions holding it) for every key group in ``key_groups``."""
    order = np.argsort(key_groups, kind="stable")
    groups, firsts = np.unique(key_groups[order], return_index=True)
    return list(zip(groups.tolist(), np.split(order, firsts[1:])))


def concat(chunks: list[tuple[int, tuple]]) -> tuple[np.ndarray, np.ndarray, pa.Table]:
    """(key group, ts) of every row of these chunks (as Chunks.read gives them), and the rows."""
    rows = pa.concat_tables([rows for _, (_, rows) in chunks], promote_options="default")
    return (np.repeat([g for g, _ in chunks], [len(ts) for _, (ts, _) in chunks]),
            np.concatenate([ts for _, (ts, _) in chunks]),
            rows.combine_chunks() if len(chunks) > 1 else rows)  # a take from many chunks is slow


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
        self.schemas: list[Optional[pa.Schema]] = [None, None]
        self.timers = TimerService(self.backend)
        self.watermark = NO_WATERMARK
        self.late_records = 0
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

    def _drop_late(self, table: pa.Table, ts: np.ndarray, late: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        if not late.any():
            return table, ts
        self.late_records += int(late.sum())
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

    def _emit(self, left: pa.Table, right: Optional[pa.Table],
              extra: Sequence[tuple[str, pa.Array]] = ()) -> list[pa.Table]:
        """The joined rows of ``left`` and ``right``, aligned row by row (right None or a null row:
        no match), then the ``extra`` columns, through the udf."""
        if left.num_rows == 0:
            return []
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
        handle = {"watermark": self.watermark, "schemas": [_schema_to_text(s) for s in self.schemas],
                  "next_chunk": self.next_chunk}
        return OperatorSnapshot(handle, keyed=self.backend.snapshot())

    def restore_state(self, handles: list[dict]) -> None:
        super().restore_state(handles)
        self.timers.restore()
        # the minimum: whatever any subtask had not yet seen may still come to this one
        self.watermark = min((h.get("watermark", NO_WATERMARK) for h in handles), default=NO_WATERMARK)
        for side in (LEFT, RIGHT):
            texts = [h["schemas"][side] for h in handles if h.get("schemas") and h["schemas"][side]]
            self.schemas[side] = _schema_of_text(texts[0]) if texts else None
        # chunk numbers are unique within a key group: new ones come after every restored one
        self.next_chunk = max((h.get("next_chunk", 0) for h in handles), default=0)

    def metrics(self) -> dict:
        return {"numLateRecordsDropped": self.late_records, "newestEventTimestamp": self.newest}


class IntervalJoin(JoinOperator, kind="interval-join"):
    """params: lower, upper (ms), lower_inclusive, upper_inclusive (default True).

    State: each side's waiting rows in Chunks, a chunk's time its earliest expiry. A batch meets the
    other side's chunks of its key groups in one vectorised equi-join, so the work per batch is a
    few calls per key group, none per key or row; a chunk is cut down, or dropped, when the
    watermark passes its time."""

    def open(self) -> None:
        super().open()
        self._need_rowtimes("an interval join")
        where = self.spec.where()
        bounds: dict[str, int] = {}
        for name in ("lower", "upper"):
            value = self.params.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{where}: the interval join's {name} bound must be a number of milliseconds, "
                                 f"got {value!r}")
            bounds[name] = int(value)
        if bounds["lower"] > bounds["upper"]:
            raise ValueError(f"{where}: the interval join's lower bound ({bounds['lower']} ms) is above its upper "
                             f"bound ({bounds['upper']} ms)")
        # the closed range of r.ts - l.ts that joins
        self.lower = bounds["lower"] + (0 if self.params.get("lower_inclusive", True) else 1)
        self.upper = bounds["upper"] - (0 if self.params.get("upper_inclusive", True) else 1)
        self.waiting = (Chunks(self.backend, "left"), Chunks(self.backend, "right"))

    def _expiry(self, side: int, ts: np.ndarray) -> np.ndarray:
        """The first watermark from which a row of ``side`` at ``ts`` can meet no row to come (those
        have ts >= the watermark)."""
        return ts + self.upper + 1 if side == LEFT else ts - self.lower + 1

    def process_side(self, side: int, table: pa.Table) -> list[pa.Table]:
        ts = self._event_times(side, table)
        table, ts = self._drop_late(table, ts, ts < self.watermark)
        if table.num_rows == 0:
            return []
        table = table.replace_schema_metadata(None)
        parts = self._by_key_group(side, table)
        out = self._match(side, table, ts, [group for group, _ in parts])
        self._keep(side, table, ts, parts)
        return out

    def _match(self, side: int, table: pa.Table, ts: np.ndarray, key_groups: list[int]) -> list[pa.Table]:
        other = 1 - side
        chunks = self.waiting[other].read(key_groups)
        if not chunks:
            return []
        _, their_ts, theirs = concat(chunks)
        met = self._key_frame(side, table, ts, "__mine").drop(columns="__ts").merge(
            self._key_frame(other, theirs, their_ts, "__theirs").drop(columns="__ts"), on=self._key_names)
        at_mine, at_theirs = met["__mine"].to_numpy(), met["__theirs"].to_numpy()
        gap = their_ts[at_theirs] - ts[at_mine] if side == LEFT else ts[at_mine] - their_ts[at_theirs]
        joins = (gap >= self.lower) & (gap <= self.upper)
        if not joins.any():
            return []
        this_rows, other_rows = table.take(at_mine[joins]), theirs.take(at_theirs[joins])
        return self._emit(*((this_rows, other_rows) if side == LEFT else (other_rows, this_rows)))

    def _keep(self, side: int, table: pa.Table, ts: np.ndarray, parts: list) -> None:
        expiry = self._expiry(side, ts)
        groups, chunks, times = [], [], []
        for group, rows in parts:
            rows = rows[expiry[rows] > self.watermark]  # the others can meet no row to come
            if len(rows):
                groups.append(group)
                chunks.append((ts[rows], table.take(rows)))
                times.append(int(expiry[rows].min()))
        if groups:
            self.waiting[side].add(groups, self._chunk_numbers(len(groups)), chunks, times)
            self.timers.register_many(EVENT_TIME, groups, [side] * len(groups), times, [None] * len(groups))

    def process_watermark(self, watermark: int) -> tuple[list[pa.Table], Optional[int]]:
        self.watermark = max(self.watermark, watermark)
        due = self.timers.pop_due(EVENT_TIME, watermark)
        for side in (LEFT, RIGHT):
            for group in dict.fromkeys(t.key_group for t in due if t.key == side):
                self._expire(side, group, watermark)
        return [], watermark

    def _expire(self, side: int, group: int, watermark: int) -> None:
        waiting = self.waiting[side]
        index = waiting.index(group)
        stale = [number for number, time in index.items() if time is not None and time <= watermark]
        changed: dict[int, Optional[tuple]] = {}
        for number, (_, (ts, rows)) in zip(stale, waiting.read([group], [stale])):
            expiry = self._expiry(side, ts)
            useful = expiry > watermark
            if useful.any():
                changed[number] = (ts[useful], rows.filter(pa.array(useful)))
                index[number] = int(expiry[useful].min())
            else:
                changed[number] = None
                del index[number]
        waiting.rewrite(group, index, changed)
        times = [time for time in index.values() if time is not None]
        if times:
            self.timers.register(EVENT_TIME, group, side, min(times))


class WindowJoin(JoinOperator, kind="window-join"):
    """params: assigner {"type": "tumbling"|"sliding", "size", "slide", "offset"} (ms). State: each
    side's rows in Chunks, once per window they are in (a chunk's times are its rows' window
    starts, its time the earliest window end - 1), until the window fires; a key group's timer is
    its earliest window end - 1."""

    def open(self) -> None:
        super().open()
        self._need_rowtimes("a window join")
        where = self.spec.where()
        if self.params.get("time", "event") != "event":
            raise ValueError(f"{where}: a window join is in event time, not {self.params.get('time')!r}")
        assigner = assigner_of(self.params.get("assigner"), where)
        if isinstance(assigner, SessionWindows):
            raise ValueError(f"{where}: a window join takes tumbling or sliding windows, not session windows "
                             "(they merge)")
        self.assigner: Union[TumblingWindows, SlidingWindows] = assigner
        self.windows = (Chunks(self.backend, "left-window"), Chunks(self.backend, "right-window"))

    def _fire_time(self, starts: np.ndarray) -> np.ndarray:
        return starts + self.assigner.size - 1

    def process_side(self, side: int, table: pa.Table) -> list[pa.Table]:
        ts = self._event_times(side, table)
        if table.num_rows == 0:
            return []
        rows_of, starts = self.assigner.assign(ts)
        # Flink's WindowOperator: a window is late once its max timestamp is at or below the watermark
        live = self._fire_time(starts) > self.watermark
        alive = np.zeros(table.num_rows, dtype=bool)
        alive[rows_of[live]] = True
        self.late_records += int(table.num_rows - alive.sum())
        if not live.any():
            return []
        rows_of, starts = rows_of[live], starts[live]
        table = table.replace_schema_metadata(None)
        parts = by_key_group(self._key_groups(side, table)[rows_of])  # (key group, its rows' windows)
        times = [int(self._fire_time(starts[at]).min()) for _, at in parts]
        groups = [group for group, _ in parts]
        self.windows[side].add(groups, self._chunk_numbers(len(groups)),
                               [(starts[at], table.take(rows_of[at])) for _, at in parts], times)
        self.timers.register_many(EVENT_TIME, groups, [0] * len(groups), times, [None] * len(groups))
        return []

    def process_watermark(self, watermark: int) -> tuple[list[pa.Table], Optional[int]]:
        """The cross product of both sides' rows of each key and window that fires, of the key groups
        whose timer is due, all at once; the rows of windows still open stay."""
        self.watermark = max(self.watermark, watermark)
        groups = list(dict.fromkeys(t.key_group for t in self.timers.pop_due(EVENT_TIME, watermark)))
        if not groups:
            return [], watermark
        fired: list[Optional[tuple[np.ndarray, pa.Table]]] = []
        times: list[list[Optional[int]]] = []
        for side in (LEFT, RIGHT):
            chunks = self.windows[side].read(groups)
            if not chunks:
                fired.append(None)
                times.append(self._replace(self.windows[side], groups, None, None))
                continue
            row_groups, starts, rows = concat(chunks)
            due = self._fire_time(starts) <= watermark
            fired.append((starts[due], rows.filter(pa.array(due))) if due.any() else None)
            rest = (row_groups[~due], starts[~due], rows.filter(pa.array(~due))) if not due.all() else None
            times.append(self._replace(self.windows[side], groups, rest,
                                       lambda starts: int(self._fire_time(starts).min())))
        wake = [(g, min(t for t in ts if t is not None)) for g, ts in zip(groups, zip(*times))
                if any(t is not None for t in ts)]
        self.timers.register_many(EVENT_TIME, [g for g, _ in wake], [0] * len(wake), [t for _, t in wake],
                                  [None] * len(wake))
        left_fired, right_fired = fired
        if left_fired is None or right_fired is None:
            return [], watermark  # an inner join: windows with one side only join nothing
        (l_starts, lefts), (r_starts, rights) = left_fired, right_fired
        met = self._key_frame(LEFT, lefts, l_starts, "__left").merge(
            self._key_frame(RIGHT, rights, r_starts, "__right"), on=self._key_names + ["__ts"])
        if met.empty:
            return [], watermark
        at_left = met["__left"].to_numpy()
        starts = l_starts[at_left]
        window = [("window_start", pa.array(starts).cast(pa.timestamp("ms"))),
                  ("window_end", pa.array(starts + self.assigner.size).cast(pa.timestamp("ms")))]
        return self._emit(lefts.take(at_left), rights.take(met["__right"].to_numpy()), window), watermark


class TemporalJoin(JoinOperator, kind="temporal-join"):
    """params: how "inner"|"left". With left_rowtime and right_rowtime (event time), state in Chunks
    per key group: the right side's versions, the left rows waiting for the watermark; a key
    group's timer is the earliest time a waiting left row can go, or an old version be dropped.
    Without left_rowtime (processing time): the latest right row per key."""

    LATEST = "latest"

    def open(self) -> None:
        super().open()
        self.how = self.params.get("how", "inner")
        if self.how not in ("inner", "left"):
            raise ValueError(f"{self.spec.where()}: a temporal join is \"inner\" or \"left\", not {self.how!r}")
        self.event_time = self.rowtimes[LEFT] is not None
        if self.event_time:
            self._need_rowtimes("a temporal join with a left rowtime")
        self.pending, self.versions = Chunks(self.backend, "left-pending"), Chunks(self.backend, "right-versions")

    def process_side(self, side: int, table: pa.Table) -> list[pa.Table]:
        if not self.event_time:
            ts = self._read(side, table)
            if table.num_rows == 0:
                return []
            batch = self._by_key(side, table, ts)
            return self._join_latest(batch) if side == LEFT else self._update_latest(batch)
        ts = self._event_times(side, table)
        if side == LEFT:
            table, ts = self._drop_late(table, ts, ts < self.watermark)
        if table.num_rows == 0:
            return []
        table = table.replace_schema_metadata(None)
        parts = self._by_key_group(side, table)
        groups = [group for group, _ in parts]
        # a left row goes at its time; a version makes older ones of its key droppable from its time
        times = [int(ts[rows].min()) for _, rows in parts]
        (self.pending if side == LEFT else self.versions).add(
            groups, self._chunk_numbers(len(groups)), [(ts[rows], table.take(rows)) for _, rows in parts], times)
        self.timers.register_many(EVENT_TIME, groups, [0] * len(groups), times, [None] * len(groups))
        return []

    def process_watermark(self, watermark: int) -> tuple[list[pa.Table], Optional[int]]:
        """Joins the left rows up to the watermark, of the key groups whose timer is due, with the
        versions valid at their times; keeps the later left rows, and of the versions each key's
        last one at or before the watermark and the later ones: all key groups at once."""
        self.watermark = max(self.watermark, watermark)
        if not self.event_time:
            return [], watermark
        groups = list(dict.fromkeys(t.key_group for t in self.timers.pop_due(EVENT_TIME, watermark)))
        if not groups:
            return [], watermark
        out: list[pa.Table] = []
        rest: Optional[tuple] = None
        kept: Optional[tuple] = None
        v_rows: Optional[pa.Table] = None
        v_ts = np.empty(0, np.int64)
        pending, versions = self.pending.read(groups), self.versions.read(groups)
        if versions:
            v_groups, v_ts, v_rows = concat(versions)
            # versions by time, stably: of two of one time the later one wins
            frame = self._key_frame(RIGHT, v_rows, v_ts, "__at").sort_values("__ts", kind="stable")
            old = frame["__ts"].to_numpy() <= watermark
            superseded = np.zeros(len(frame), dtype=bool)
            superseded[old] = frame[old].duplicated(self._key_names, keep="last").to_numpy()
            keep = np.sort(frame["__at"].to_numpy()[~superseded])
            kept = (v_groups[keep], v_ts[keep], v_rows.take(keep))
        if pending:
            l_groups, l_ts, l_rows = concat(pending)
            due = l_ts <= watermark
            if due.any():
                out = self._join_versions(l_rows.filter(pa.array(due)), l_ts[due], v_rows, v_ts)
            if not due.all():
                rest = (l_groups[~due], l_ts[~due], l_rows.filter(pa.array(~due)))
        left_times = self._replace(self.pending, groups, rest, lambda ts: int(ts.min()))
        version_times = self._replace(self.versions, groups, kept,
                                      lambda ts: int(ts[ts > watermark].min()) if (ts > watermark).any() else None)
        wake = [(g, min(t for t in times if t is not None)) for g, times in
                zip(groups, zip(left_times, version_times)) if any(t is not None for t in times)]
        self.timers.register_many(EVENT_TIME, [g for g, _ in wake], [0] * len(wake), [t for _, t in wake],
                                  [None] * len(wake))
        return out, watermark

    def _join_versions(self, lefts: pa.Table, l_ts: np.ndarray, versions: Optional[pa.Table],
                       v_ts: np.ndarray) -> list[pa.Table]:
        if versions is None:
            return [] if self.how == "inner" else self._emit(lefts, None)
        names = self._key_names
        met = pd.merge_asof(self._key_frame(LEFT, lefts, l_ts, "__left").sort_values("__ts", kind="stable"),
                            self._key_frame(RIGHT, versions, v_ts, "__right").sort_values("__ts", kind="stable"),
                            on="__ts", by=names, direction="backward", allow_exact_matches=True)
        matched = met["__right"].notna().to_numpy()
        at_left = met["__left"].to_numpy()
        at_right = met["__right"].fillna(-1).to_numpy().astype(np.int64)
        if self.how == "inner":
            at_left, index = at_left[matched], pa.array(at_right[matched])
        else:
            index = pa.array(at_right, mask=~matched)
        return self._emit(lefts.take(at_left), versions.take(index))

    def _update_latest(self, batch: SideBatch) -> list[pa.Table]:
        # of several rows of a key in one batch, the last one is the latest
        last = [int(rows[-1]) for _, rows in by_key_group(batch.ids)]
        rows = row_tuples(batch.table.take(last))
        kids = [int(batch.ids[i]) for i in last]
        self.backend.put_many(self.LATEST, [batch.key_groups[k] for k in kids], [batch.keys[k] for k in kids], rows)
        return []

    def _join_latest(self, batch: SideBatch) -> list[pa.Table]:
        latest = self.backend.get_many(self.LATEST, batch.key_groups, batch.keys)
        found = [row for row in latest if row is not None]
        if not found and self.how == "inner":
            return []
        position = np.full(len(latest), -1, dtype=np.int64)
        position[np.flatnonzero([row is not None for row in latest])] = np.arange(len(found))
        at = position[batch.ids]
        matched = at >= 0
        left = batch.table
        if self.how == "inner":
            left, at = left.filter(pa.array(matched)), at[matched]
            index = pa.array(at)
        else:
            index = pa.array(at, mask=~matched)
        right = table_of(self.schemas[RIGHT], found).take(index) if self.schemas[RIGHT] is not None else None
        return self._emit(left, right)
