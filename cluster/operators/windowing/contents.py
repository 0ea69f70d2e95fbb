"""Per-function window contents: what a window keeps and how it becomes its output row(s), one
class per window function kind with one interface (Flink's window state together with its
InternalWindowFunction).

* ReduceContents: the folded row (the user's reduce function over aligned rows);
* ProcessContents: the window's rows, handed to the user's process function when it fires;
* AggregateContents (aggregate, count): partial aggregates and a row count per (key, window), for
  session windows;
* BlockContents (aggregate, count of tumbling and sliding windows): one immutable block per
  (key group, window), key ``(BLOCK, start, end)``: a tuple of numpy arrays (the key columns, the
  partial columns and the row count), one element per key of the window in that key group, with
  one pair of timers per block (key BLOCK). Per-key entries and timers cost Python work per
  (key, window), which the pre-aggregated path (10k keys x 10 windows per batch) cannot afford;
  blocks merge and fire vectorised, and are still per key group, so a restore at another
  parallelism splits them as any keyed state.

Each: ``frame_of`` (the input columns it needs), ``add`` (rows into windows, keyed state WINDOW_STATE
under ``(key, start, end)``), ``merge`` (two session windows' contents as one), ``fire``/``clear``
(windows whose timers fired), ``result`` (output rows), ``snapshot``/``restore`` (what the
operator's handle carries beside the keyed state). The operator, as WindowScope, slots windows
into key groups and asks its trigger which of the windows just added to fire at once.

Thread use: the owning operator's task thread only.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.graph.windows import TimeWindow
from cluster.common.frames import frame_to_table, to_table
from cluster.operators.aggregates import PARTIALS, partial_columns, values_of
from cluster.operators.keyed import fold_rows
from cluster.operators.windowing.pre_aggregation import ROWS, window_partials

WINDOW_STATE = "window"
BLOCK = "__block__"  # the key, with the window, of a (key group, window)'s block in WINDOW_STATE
# how partial columns of one (key, window) combine, vectorised over many windows at once
MERGE_ARRAYS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "s": np.add, "c": np.add, "min": np.fmin, "max": np.fmax}  # fmin/fmax: a window of nulls so far is no minimum


class WindowScope(Protocol):
    """What contents need of their window operator (Flink's WindowOperator.Context)."""
    key: list[str]
    backend: Any
    sessions: bool

    def where(self) -> str: ...

    def call_user(self, *args) -> Any: ...

    def slots(self, windows: pd.DataFrame) -> tuple[list, list, list]: ...

    def key_groups_of(self, key_frame: pd.DataFrame) -> np.ndarray: ...

    def is_late(self, last_instants: np.ndarray) -> np.ndarray: ...

    def added(self, groups: Sequence, keys: Sequence, starts: np.ndarray, ends: np.ndarray,
              new: Optional[np.ndarray]) -> np.ndarray: ...


def _null(value) -> bool:
    return value is None or value != value  # NaN: pandas' aggregate of no values


def _merged(kind: str, column: np.ndarray, at: np.ndarray, before: list) -> np.ndarray:
    """``column`` with its values at ``at`` merged with the state's ``before`` (partial ``kind``)."""
    old = np.asarray(before)
    if column.dtype == object or old.dtype == object:  # min/max of strings, say: python's own, as KeyedAggregate
        merged = column.astype(object, copy=True)
        merged[at] = [b if _null(a) else a if _null(b) else PARTIALS[kind].merge(a, b)
                      for a, b in zip(merged[at].tolist(), before)]
        return merged
    merged = column.astype(np.result_type(column, old), copy=True)
    merged[at] = MERGE_ARRAYS[kind](merged[at], old)
    return merged


def run_starts(*columns: np.ndarray) -> np.ndarray:
    """Where a run of equal rows of sorted ``columns`` begins (0 included, for any rows)."""
    if not len(columns[0]):
        return np.zeros(0, dtype=np.int64)
    change = np.zeros(len(columns[0]), dtype=bool)
    change[0] = True
    for column in columns:
        change[1:] |= column[1:] != column[:-1]
    return np.flatnonzero(change)


def block_keys(starts, ends) -> list:
    """The state keys of the blocks of windows [starts[i], ends[i])."""
    return [(BLOCK, s, e) for s, e in zip(np.asarray(starts).tolist(), np.asarray(ends).tolist())]


def window_columns(starts, ends) -> dict:
    return {"window_start": pa.array(np.asarray(starts, dtype=np.int64)).cast(pa.timestamp("ms")),
            "window_end": pa.array(np.asarray(ends, dtype=np.int64)).cast(pa.timestamp("ms"))}


class WindowContents:
    """Per-(key, window) contents in WINDOW_STATE; the base of every kind."""

    blocks = False         # kept per (key group, window) instead (BlockContents)
    concat_fired = True    # the rows of windows fired by one watermark go out as one table

    def __init__(self, scope: WindowScope):
        self.scope = scope

    def frame_of(self, table: pa.Table) -> pd.DataFrame:
        raise NotImplementedError

    def add(self, pairs: pd.DataFrame, starts: np.ndarray, ends: np.ndarray) -> list[pa.Table]:
        """Adds rows to windows: row i of ``pairs`` to window [starts[i], ends[i]) of its key; the
        output rows of the windows that fire at once."""
        raise NotImplementedError

    def add_partials(self, frame: pd.DataFrame) -> list[pa.Table]:
        raise NotImplementedError(f"{type(self).__name__} takes rows, not pre-aggregated input")

    def merge(self, a, b):
        """The contents of two windows as one (Flink's mergeNamespaces)."""
        raise NotImplementedError

    def result(self, keys: list, starts: np.ndarray, ends: np.ndarray, values: list) -> list[pa.Table]:
        """The output rows of fired windows."""
        raise NotImplementedError

    def fire(self, groups: list, keys: list, starts: list, ends: list) -> list[pa.Table]:
        """The output rows of the windows whose timers fired."""
        values = self.scope.backend.get_many(WINDOW_STATE, groups, list(zip(keys, starts, ends)))
        if None in values:  # no rows (state moved by a merge, or a restore that had none)
            live = [i for i, v in enumerate(values) if v is not None]
            keys, starts, ends, values = ([column[i] for i in live] for column in (keys, starts, ends, values))
        if not values:
            return []
        return self.result(keys, np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), values)

    def clear(self, groups: list, keys: list, starts: list, ends: list) -> None:
        self.scope.backend.put_many(WINDOW_STATE, groups, list(zip(keys, starts, ends)), [None] * len(groups))

    def snapshot(self, handle: dict) -> None:
        pass

    def restore(self, handles: list[dict]) -> None:
        pass

    def _after_add(self, windows: pd.DataFrame, groups: list, keys: list, values: list,
                   new: Optional[np.ndarray]) -> list[pa.Table]:
        """The trigger's answer for the windows just added to (``new``: those that had no state, so
        no timers yet; None: all): the rows of those that fire at once (late rows within the
        allowed lateness: an updated row)."""
        starts = windows["window_start"].to_numpy(np.int64)
        ends = windows["window_end"].to_numpy(np.int64)
        fire = np.flatnonzero(self.scope.added(groups, keys, starts, ends, new))
        if not len(fire):
            return []
        return self.result([keys[i] for i in fire], starts[fire], ends[fire], [values[i] for i in fire])

    def _key_columns(self, keys: list) -> dict:
        key = self.scope.key
        if len(key) == 1:
            return {key[0]: keys}
        return {name: [k[i] for k in keys] for i, name in enumerate(key)}


class RowContents(WindowContents):
    """Contents built from whole rows (reduce, process): their columns are remembered, a reduced
    row has them, and go into the checkpoint."""

    def __init__(self, scope: WindowScope):
        super().__init__(scope)
        self.columns: Optional[list[str]] = None  # of the input rows

    def frame_of(self, table: pa.Table) -> pd.DataFrame:
        frame = table.to_pandas()
        self.columns = list(frame.columns)
        return frame

    def add(self, pairs: pd.DataFrame, starts: np.ndarray, ends: np.ndarray) -> list[pa.Table]:
        key = self.scope.key
        by = pairs[key].assign(window_start=starts, window_end=ends)
        grouped = by.groupby(key + ["window_start", "window_end"], sort=False, dropna=False)
        slots = grouped.ngroup().to_numpy()
        first = np.unique(slots, return_index=True)[1]
        windows = by.iloc[first].reset_index(drop=True)
        groups, keys, state_keys = self.scope.slots(windows)
        acc = self.scope.backend.get_many(WINDOW_STATE, groups, state_keys)
        new = None if self.scope.sessions else np.array([a is None for a in acc], dtype=bool)
        self._fold(pairs, slots, len(first), acc)
        self.scope.backend.put_many(WINDOW_STATE, groups, state_keys, acc)
        return self._after_add(windows, groups, keys, acc, new)

    def _fold(self, frame: pd.DataFrame, slots: np.ndarray, count: int, acc: list) -> None:
        """Row i of ``frame`` into ``acc[slots[i]]`` (None: an empty window), in row order."""
        raise NotImplementedError

    def snapshot(self, handle: dict) -> None:
        if self.columns is not None:
            handle["columns"] = self.columns

    def restore(self, handles: list[dict]) -> None:
        self.columns = next((h["columns"] for h in handles if h.get("columns")), self.columns)


class ReduceContents(RowContents):
    """udf: fn(acc_df, new_df) -> df, folding each window's rows into one (keyed.fold_rows)."""

    def _fold(self, frame: pd.DataFrame, slots: np.ndarray, count: int, acc: list) -> None:
        fold_rows(frame, slots, acc, self.scope.call_user, self.scope.where())

    def merge(self, a, b):
        acc = [a]
        fold_rows(pd.DataFrame([b], columns=self.columns), np.zeros(1, dtype=np.int64), acc,
                  self.scope.call_user, self.scope.where())
        return acc[0]

    def result(self, keys: list, starts: np.ndarray, ends: np.ndarray, values: list) -> list[pa.Table]:
        frame = pd.DataFrame(values, columns=self.columns)
        rest = {c: pa.array(frame[c]) for c in frame.columns if c not in self.scope.key}
        return [pa.table({**self._key_columns(keys), **window_columns(starts, ends), **rest})]


class ProcessContents(RowContents):
    """udf: fn(key, window, rows) -> DataFrame | None, called with each fired window's rows."""

    concat_fired = False  # each call's rows are a table of their own

    def _fold(self, frame: pd.DataFrame, slots: np.ndarray, count: int, acc: list) -> None:
        table = frame_to_table(frame)
        order = np.argsort(slots, kind="stable")
        bounds = np.searchsorted(slots[order], np.arange(count + 1))
        for slot in range(count):
            rows = table.take(pa.array(order[bounds[slot]:bounds[slot + 1]]))
            acc[slot] = rows if acc[slot] is None else pa.concat_tables([acc[slot], rows])

    def merge(self, a, b):
        return pa.concat_tables([a, b])

    def result(self, keys: list, starts: np.ndarray, ends: np.ndarray, values: list) -> list[pa.Table]:
        key, where = self.scope.key, self.scope.where()
        out = []
        for k, start, end, rows in zip(keys, starts.tolist(), ends.tolist(), values):
            result = self.scope.call_user(None if not key else k, TimeWindow(start, end), rows.to_pandas())
            if result is None:
                continue
            result = to_table(result, f"{where}: the process function")
            extra = {}
            for i, name in enumerate(key):
                if name not in result.column_names:
                    extra[name] = pa.array([k if len(key) == 1 else k[i]] * result.num_rows)
            for name, at in (("window_start", start), ("window_end", end)):
                if name not in result.column_names:
                    extra[name] = pa.array([at] * result.num_rows, pa.int64()).cast(pa.timestamp("ms"))
            if extra:
                result = pa.table({**extra, **{n: result.column(n) for n in result.column_names}})
            out.append(result)
        return [pa.concat_tables(out, promote_options="default")] if out else []


class AggregateContents(WindowContents):
    """aggregate (params["aggregations"], {out: [column, func]}) and count ({}: the row count as
    "count"): a tuple of the partial columns and the row count per (key, window)."""

    def __init__(self, scope: WindowScope, aggregations: dict, count: bool):
        super().__init__(scope)
        self.aggregations, self.count = aggregations, count
        self.partials = partial_columns(aggregations)
        self.state_columns = [n for n, _, _ in self.partials] + [ROWS]
        self.kinds = [kind for _, kind, _ in self.partials] + ["c"]

    def frame_of(self, table: pa.Table) -> pd.DataFrame:
        needed = list(dict.fromkeys(self.scope.key + [c for c, _ in self.aggregations.values()]))
        return table.select(needed).to_pandas()

    def add(self, pairs: pd.DataFrame, starts: np.ndarray, ends: np.ndarray) -> list[pa.Table]:
        partials = window_partials(pairs, self.scope.key, starts, ends, None, self.aggregations)
        groups, keys, state_keys = self.scope.slots(partials)
        columns = [partials[name].to_numpy() for name in self.state_columns]
        old = self.scope.backend.get_many(WINDOW_STATE, groups, state_keys)
        had = np.fromiter((o is not None for o in old), dtype=bool, count=len(old))
        if had.any():
            at = np.flatnonzero(had)
            olds = [old[i] for i in at]
            previous = [[o[j] for o in olds] for j in range(len(self.state_columns))]  # not zip(*): slow for many
            for j, kind in enumerate(self.kinds):
                columns[j] = _merged(kind, columns[j], at, previous[j])
        values = list(zip(*[c.tolist() for c in columns]))
        self.scope.backend.put_many(WINDOW_STATE, groups, state_keys, values)
        return self._after_add(partials, groups, keys, values, None)  # session windows: timers for all

    def merge(self, a, b):
        return tuple(MERGE_ARRAYS[k](np.asarray(x), np.asarray(y)).item() for k, x, y in zip(self.kinds, a, b))

    def result(self, keys: list, starts: np.ndarray, ends: np.ndarray, values: list) -> list[pa.Table]:
        by_name = {name: np.asarray([v[j] for v in values]) for j, name in enumerate(self.state_columns)}
        return self.result_columns({**self._key_columns(keys), **by_name}, starts, ends)

    def result_columns(self, columns: dict, starts: np.ndarray, ends: np.ndarray) -> list[pa.Table]:
        """The output rows of fired windows from the key and state columns."""
        window = window_columns(starts, ends)
        keys = {name: columns[name] for name in self.scope.key}
        if self.count:
            return [pa.table({**keys, **window, "count": np.asarray(columns[ROWS]).astype(np.int64)})]
        out = {}
        for name, (_, func) in self.aggregations.items():
            out[name] = values_of(name, func, columns)
        return [pa.table({**keys, **window, **out})]
