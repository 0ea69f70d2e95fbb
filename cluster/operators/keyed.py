"""Keyed operators: their state lives in a keyed state backend, partitioned by key group.

Each subtask owns the key groups of its range (cluster.state.key_groups); a batch arrives
hash-partitioned, so every key in it belongs here. Each operator emits, per batch, the new value
of every key the batch touched: an upsert stream whose latest row per key is the current value.

* count: a running count per key;
* aggregate: named aggregations (cluster.operators.aggregates). Partial aggregates are computed
  per batch before the exchange (in the upstream Spark plan when there is one, else in pandas)
  and merged into keyed state here, so the shuffle carries one row per key and batch;
* reduce: a user function folding a key's rows into one (vectorised over keys);
* process: a user function per key and batch with Flink's value, list and map state.
"""
from __future__ import annotations

import tempfile
from functools import reduce
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import cloudpickle
import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.common import clock
from cluster.graph.event_time import NO_WATERMARK
from cluster.graph.operator_kinds import ROW_KIND_COLUMN
from cluster.graph.schema import quoted
from cluster.state.loader import create_backend
from cluster.state.key_groups import key_group_range, key_groups_of_frame

from cluster.common.frames import frame_to_table, to_table
from cluster.operators.aggregates import MERGE_IN_BATCH, PARTIALS, partial_columns, values_of
from cluster.operators.base import Operator, OperatorSnapshot, UserFunctionError
from cluster.operators.timers import EVENT_TIME, PROCESSING_TIME, TimerService

def partial_aggregate_frame(frame: pd.DataFrame, key: list[str], aggregations: dict) -> pd.DataFrame:
    """One row per key with the partial aggregates of this batch (pandas)."""
    out = {name: PARTIALS[kind].rows(frame, column, key) for name, kind, column in partial_columns(aggregations)}
    return pd.DataFrame(out).reset_index()


def spark_partial_aggregate(key: list[str], aggregations: dict) -> str:
    """The same partials as one more SQL step of a Spark plan, over the view ``input``."""
    keys = ", ".join(map(quoted, key))
    partials = ", ".join(f"{PARTIALS[kind].spark.format(c=quoted(column))} AS {quoted(name)}"
                         for name, kind, column in partial_columns(aggregations))
    return f"SELECT {keys}, {partials} FROM input GROUP BY {keys}"


def merge_in_batch(frame: pd.DataFrame, key: list[str], partials: list[tuple[str, str, str]]) -> pd.DataFrame:
    """One row per key of partial rows (several per key: one per producer of the batch), merged."""
    grouped = frame.groupby(key, sort=False, dropna=False)
    merged = {}
    for name, kind, _ in partials:
        if kind in MERGE_IN_BATCH:
            merged[name] = getattr(grouped[name], MERGE_IN_BATCH[kind])()
        else:
            merged[name] = grouped[name].agg(lambda values, merge=PARTIALS[kind].merge: reduce(merge, values.tolist()))
    return pd.DataFrame(merged).reset_index()


def state_key_values(column: pd.Series) -> list:
    """A key column's values as keyed state stores them: plain Python values, a time as its int64
    nanoseconds (a Timestamp is no state key: the backends write keys as plain data)."""
    if pd.api.types.is_datetime64_any_dtype(column) or pd.api.types.is_timedelta64_dtype(column):
        missing = column.isna().to_numpy()
        return [None if gone else int(ns) for ns, gone in zip(column.dt.as_unit("ns").array.asi8, missing)]
    return column.astype(object).tolist()


class KeyedBatch(NamedTuple):
    frame: pd.DataFrame      # the batch (or only its key columns)
    key_frame: pd.DataFrame  # one row per distinct key, in order of first appearance
    keys: list               # those keys as python natives (tuples for several columns)
    key_groups: list         # their key groups
    grouped: Any             # the pandas groupby over the keys, in the same order


class KeyedOperator(Operator):
    """Base of operators with keyed state: a backend over this subtask's key groups."""

    def open(self) -> None:
        self.key = list(self.params["key"])
        config = self.ctx.config
        work = Path(config.tmp_dir or tempfile.gettempdir()) / "streamlab-state" / \
            f"{self.ctx.execution_id or 'task'}-{self.spec.uid[:8]}"
        self.key_groups = key_group_range(self.ctx.max_parallelism, self.ctx.parallelism, self.ctx.subtask)
        self.backend = create_backend(config.state_backend, self.key_groups,
                                      self.ctx.max_parallelism, work)

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        return OperatorSnapshot({}, keyed=self.backend.snapshot())

    def restore_state(self, handles: list[dict]) -> None:
        self.backend.restore([Path(h["directory"]) / h["keyed_file"] for h in handles if h.get("keyed_file")])

    def close(self) -> None:
        self.backend.close()

    def group(self, table: pa.Table, keys_only: bool = False, key: Optional[list[str]] = None,
              input_name: str = "the input") -> KeyedBatch:
        """The batch by key; ``keys_only`` converts just the key columns to pandas. ``key``: other
        key columns than params["key"] (a join's right input, ``input_name``)."""
        key = self.key if key is None else key
        missing = [k for k in key if k not in table.column_names]
        if missing:
            raise KeyError(f"{self.spec.where()}: key column(s) {missing} not in {input_name} "
                           f"(columns: {table.column_names})")
        frame = (table.select(key) if keys_only else table).to_pandas()
        # the key groups of the rows, exactly as the exchange routed them
        groups_of_rows = key_groups_of_frame(frame[key], self.ctx.max_parallelism)
        first = ~frame.duplicated(key).to_numpy()
        key_frame = frame.loc[first, key].reset_index(drop=True)
        columns = [state_key_values(key_frame[k]) for k in key]
        keys = columns[0] if len(key) == 1 else list(zip(*columns))
        return KeyedBatch(frame, key_frame, keys, groups_of_rows[first].tolist(),
                          frame.groupby(key, sort=False, dropna=False))


class KeyedCount(KeyedOperator, kind="keyed-count"):
    """params: key."""

    def process(self, table: pa.Table) -> list[pa.Table]:
        if table.num_rows == 0:
            return []
        batch = self.group(table, keys_only=True)
        sizes = batch.grouped.size().to_numpy()
        old = self.backend.get_many("count", batch.key_groups, batch.keys)
        counts = [(o or 0) + int(n) for o, n in zip(old, sizes)]
        self.backend.put_many("count", batch.key_groups, batch.keys, counts)
        out = batch.key_frame
        out["count"] = np.asarray(counts, dtype=np.int64)
        return [frame_to_table(out)]


class LocalAggregate(Operator, kind="local-aggregate"):
    """Partial aggregates per key of each batch, before the exchange (no state). params: key,
    aggregations."""

    def process(self, table: pa.Table) -> list[pa.Table]:
        if table.num_rows == 0:
            return []
        frame = partial_aggregate_frame(table.to_pandas(), list(self.params["key"]), self.params["aggregations"])
        return [frame_to_table(frame)]


class KeyedAggregate(KeyedOperator, kind="keyed-aggregate"):
    """params: key, aggregations {out: [column, func]}, pre_aggregated (the input already holds
    partial columns), changelog (the rows say their kind in ROW_KIND_COLUMN, and a key's update
    comes after its old row marked '-U', which an aggregation over these rows takes back: Flink's
    retraction)."""

    def open(self) -> None:
        super().open()
        self.aggregations = self.params["aggregations"]
        self.partials = partial_columns(self.aggregations)

    def process(self, table: pa.Table) -> list[pa.Table]:
        if table.num_rows == 0:
            return []
        frame = table.to_pandas()
        if not self.params.get("pre_aggregated"):
            frame = partial_aggregate_frame(frame, self.key, self.aggregations)
        frame = merge_in_batch(frame, self.key, self.partials)
        frame, _, keys, groups, _ = self.group(frame_to_table(frame))
        new_values = frame[[n for n, _, _ in self.partials]].astype(object).values.tolist()
        merges = [PARTIALS[kind].merge for _, kind, _ in self.partials]
        merged = []
        olds = self.backend.get_many("partials", groups, keys)
        for old, new in zip(olds, new_values):
            merged.append(tuple(self._stored(new)) if old is None else
                          tuple(merge(a, b) for merge, a, b in zip(merges, old, new)))
        self.backend.put_many("partials", groups, keys, merged)
        out = self._rows(frame[self.key].copy(), merged)
        if not self.params.get("changelog"):
            return [frame_to_table(out)]
        before = [i for i, o in enumerate(olds) if o is not None]
        out[ROW_KIND_COLUMN] = ["+U" if o is not None else "+I" for o in olds]
        if not before:
            return [frame_to_table(out)]
        retracted = self._rows(frame[self.key].iloc[before].reset_index(drop=True), [olds[i] for i in before])
        retracted[ROW_KIND_COLUMN] = "-U"
        return [frame_to_table(pd.concat([retracted, out], ignore_index=True))]  # a key's -U before its +U

    def _rows(self, out: pd.DataFrame, partials: list) -> pd.DataFrame:
        """The keys' rows: each aggregation's value from the keys' partials."""
        columns = {name: [m[i] for m in partials] for i, (name, _, _) in enumerate(self.partials)}
        for name, (_, func) in self.aggregations.items():
            out[name] = values_of(name, func, columns)
        return out

    def _stored(self, partials: list) -> list:
        """A key's first partials as the state keeps them: sets and lists as tuples (Spark sends arrays)."""
        return [PARTIALS[kind].merge((), value) if kind in ("set", "list") else value
                for (_, kind, _), value in zip(self.partials, partials)]


def fold_rows(frame: pd.DataFrame, slots: np.ndarray, acc: list, reduce: Callable, where: str) -> None:
    """Folds the rows of ``frame`` into ``acc`` in row order, as a reduce function over aligned rows:
    row i goes into ``acc[slots[i]]`` (a row tuple, None before its first row). The function is
    called once per rank of rows within their slot, for every slot at once, with the accumulated
    rows and the new ones as DataFrames of the frame's columns."""
    columns = list(frame.columns)
    slots = np.asarray(slots)
    rank = pd.Series(slots).groupby(slots, sort=False).cumcount().to_numpy()
    for r in range(int(rank.max()) + 1 if len(rank) else 0):
        at = np.flatnonzero(rank == r)
        rows = frame.iloc[at].reset_index(drop=True)
        values = rows.astype(object).values.tolist()  # column-wise: ints stay ints (a row-wise iloc upcasts)
        row_slots = slots[at].tolist()
        have = [j for j, slot in enumerate(row_slots) if acc[slot] is not None]
        for j, slot in enumerate(row_slots):
            if acc[slot] is None:
                acc[slot] = tuple(values[j])
        if have:
            previous = pd.DataFrame([acc[row_slots[j]] for j in have], columns=columns)
            combined = reduce(previous, rows.iloc[have].reset_index(drop=True))
            combined = to_table(combined, f"{where}: the reduce function").to_pandas()
            if list(combined.columns) != columns or len(combined) != len(have):
                raise UserFunctionError(f"{where}: the reduce function must return one row per "
                                        f"input row with the columns {columns}, got {list(combined.columns)} "
                                        f"and {len(combined)} rows for {len(have)}")
            for j, row in zip(have, combined.astype(object).values.tolist()):
                acc[row_slots[j]] = tuple(row)


class KeyedReduce(KeyedOperator, kind="keyed-reduce"):
    """udf: fn(accumulated: DataFrame, new: DataFrame) -> DataFrame, over aligned rows (one per
    key, the same columns, the key columns included); folds each key's rows in arrival order."""

    def process(self, table: pa.Table) -> list[pa.Table]:
        if table.num_rows == 0:
            return []
        frame, _, keys, groups, grouped = self.group(table)
        acc = self.backend.get_many("reduced", groups, keys)
        fold_rows(frame, grouped.ngroup().to_numpy(), acc, self.call_user, self.spec.where())
        self.backend.put_many("reduced", groups, keys, acc)
        return [frame_to_table(pd.DataFrame(acc, columns=list(frame.columns)))]


class ValueState:
    def __init__(self, access: "KeyedStateAccess", name: str):
        self._access, self._name = access, f"v:{name}"

    def value(self):
        return self._access._get(self._name)

    def update(self, value) -> None:
        self._access._put(self._name, value)

    def clear(self) -> None:
        self._access._put(self._name, None)


class ListState:
    """Stored as a tuple: values are immutable in the backend, so every change stores a new one."""

    def __init__(self, access: "KeyedStateAccess", name: str):
        self._access, self._name = access, f"l:{name}"

    def get(self) -> list:
        return list(self._access._get(self._name) or ())

    def add(self, value) -> None:
        self._access._put(self._name, tuple(self.get()) + (value,))

    def add_all(self, values) -> None:
        self._access._put(self._name, tuple(self.get()) + tuple(values))

    def update(self, values) -> None:
        self._access._put(self._name, tuple(values) or None)

    def clear(self) -> None:
        self._access._put(self._name, None)


class MapState:
    """Stored as a dict that is copied on every change (values are immutable in the backend)."""

    def __init__(self, access: "KeyedStateAccess", name: str):
        self._access, self._name = access, f"m:{name}"

    def _map(self) -> dict:
        return self._access._get(self._name) or {}

    def get(self, key, default=None):
        return self._map().get(key, default)

    def put(self, key, value) -> None:
        self._access._put(self._name, {**self._map(), key: value})

    def remove(self, key) -> None:
        changed = dict(self._map())
        changed.pop(key, None)
        self._access._put(self._name, changed or None)

    def contains(self, key) -> bool:
        return key in self._map()

    def keys(self) -> list:
        return list(self._map())

    def items(self) -> list:
        return list(self._map().items())

    def is_empty(self) -> bool:
        return not self._map()

    def clear(self) -> None:
        self._access._put(self._name, None)


class TimerAccess:
    """Flink's TimerService as a process function sees it: timers of the current key."""

    def __init__(self, access: "KeyedStateAccess", timers: TimerService):
        self._access, self._timers = access, timers
        self.watermark = NO_WATERMARK  # the operator's current event time

    def current_watermark(self) -> int:
        return self.watermark

    def current_processing_time(self) -> int:
        return clock.now_ms()

    def register_event_time_timer(self, timestamp: int) -> None:
        self._timers.register(EVENT_TIME, self._access._group, self._access.key, int(timestamp))

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._timers.register(PROCESSING_TIME, self._access._group, self._access.key, int(timestamp))

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._timers.delete(EVENT_TIME, self._access._group, self._access.key, int(timestamp))

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._timers.delete(PROCESSING_TIME, self._access._group, self._access.key, int(timestamp))


class KeyedStateAccess:
    """What a process function gets: the state of the current key, by name, as Flink's handles,
    and its timers (``timer_service()``)."""

    def __init__(self, backend, timers: Optional[TimerService] = None):
        self._backend = backend
        self.key: Any = None
        self._group = 0
        self._timer_access = TimerAccess(self, timers or TimerService(backend))

    def timer_service(self) -> TimerAccess:
        return self._timer_access

    def _at(self, key, key_group: int) -> "KeyedStateAccess":
        self.key, self._group = key, key_group
        return self

    def _get(self, name: str):
        return self._backend.get(name, self._group, self.key)

    def _put(self, name: str, value) -> None:
        self._backend.put(name, self._group, self.key, value)

    def value_state(self, name: str) -> ValueState:
        return ValueState(self, name)

    def list_state(self, name: str) -> ListState:
        return ListState(self, name)

    def map_state(self, name: str) -> MapState:
        return MapState(self, name)


class KeyedProcess(KeyedOperator, kind="keyed-process"):
    """udf: fn(key, rows: DataFrame, state: KeyedStateAccess) -> DataFrame or None, per key and
    batch; params["on_timer"] (pickled): on_timer(key, timestamp, state) -> DataFrame or None, for
    each timer the function registered (``state.timer_service()``), event-time ones once the
    watermark reaches them, processing-time ones once the clock does."""

    uses_processing_time = True

    def open(self) -> None:
        super().open()
        self.timers = TimerService(self.backend)
        self.access = KeyedStateAccess(self.backend, self.timers)
        pickled = self.params.get("on_timer")
        self.on_timer: Optional[Callable] = cloudpickle.loads(pickled) if pickled else None

    def process_watermark(self, watermark: int) -> tuple[list[pa.Table], Optional[int]]:
        self.access.timer_service().watermark = watermark
        return self._fire(self.timers.pop_due(EVENT_TIME, watermark)), watermark

    def on_processing_time(self, now_ms: int) -> list[pa.Table]:
        next_time = self.timers.next_time(PROCESSING_TIME)
        if next_time is None or next_time > now_ms:
            return []
        return self._fire(self.timers.pop_due(PROCESSING_TIME, now_ms))

    def _fire(self, due: list) -> list[pa.Table]:
        if not due:
            return []
        if self.on_timer is None:
            raise UserFunctionError(f"{self.spec.where()}: a timer fired and the process function has no "
                                    "on_timer to call: process(fn, on_timer=...)", self.spec.name, self.spec.call_site)
        out = []
        for timer in due:
            result = self.call(self.on_timer, timer.key, timer.timestamp, self.access._at(timer.key, timer.key_group))
            if result is not None:
                out.append(to_table(result, f"{self.spec.where()}: the on_timer function"))
        return [pa.concat_tables(out, promote_options="default")] if out else []

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        snapshot = super().snapshot_state(checkpoint_id)
        snapshot.handle["watermark"] = self.access.timer_service().watermark
        return snapshot

    def restore_state(self, handles: list[dict]) -> None:
        super().restore_state(handles)
        self.timers.restore()
        self.access.timer_service().watermark = min((h.get("watermark", NO_WATERMARK) for h in handles),
                                                    default=NO_WATERMARK)

    def process(self, table: pa.Table) -> list[pa.Table]:
        if table.num_rows == 0:
            return []
        frame, _, keys, groups, grouped = self.group(table)
        out = []
        for key, group, (_, rows) in zip(keys, groups, grouped):
            result = self.call_user(key, rows.reset_index(drop=True), self.access._at(key, group))
            if result is not None:
                out.append(to_table(result, f"{self.spec.where()}: the process function"))
        if not out:
            return []
        return [pa.concat_tables(out, promote_options="default")]
