"""The window operator: ``key_by(...).window(assigner)`` with Flink's WindowOperator semantics.

Per key and window [start, end) the operator keeps the window's contents in the keyed backend
(state ``window``, key ``(key, start, end)``): the folded row for ``reduce``, the rows for
``process``, partial aggregates and a row count for ``aggregate``/``count`` of session windows.
A timer per (key, window) at its max timestamp (``end - 1``) fires it (Flink's EventTimeTrigger /
ProcessingTimeTrigger), one at ``end - 1 + allowed_lateness`` clears it.

Tumbling and sliding ``aggregate``/``count`` windows keep one entry per (key group, window)
instead, key ``(BLOCK, start, end)`` under that key group: an immutable block, a tuple of numpy
arrays (the key columns, then the partial columns and the row count), one element per key of the
window in that key group, with one pair of timers per block (key ``BLOCK``, namespace the window).
Per-key entries and timers cost Python work per (key, window), which the pre-aggregated path
(10k keys x 10 windows per batch) cannot afford; blocks merge and fire vectorised. They are
still per key group, so a restore at another parallelism splits them as any keyed state. A window is late once
``end - 1 + allowed_lateness <= watermark``: rows for it are skipped, and a row all of whose
windows are late goes to the late side output (or counts in numLateRecordsDropped). A row for a
window that fired but is not late fires it again at once: an updated row for that window.

Batches are handled whole, not row by row: the watermark does not move within a batch, so every
decision Flink makes per row is the same for the batch's rows; a window that several rows of one
batch fire again gives one updated row. Session windows are merged per key in arrival order
(state ``window-sessions`` holds each key's windows; merged windows' contents move into the
covering one, their timers go).

Pre-aggregation: upstream of the exchange, ``window_partials`` (pandas, the "window-partial"
kind) or ``spark_window_partials`` (a Spark step) assign windows and aggregate per key and window;
the operator merges these partial rows into state (params["pre_aggregated"]).

Thread use: the task thread only.
"""
from __future__ import annotations

import time
from operator import itemgetter
from typing import Any, Callable, Optional

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.state.key_groups import key_groups_of_frame

from cluster.operators.base import Operator, OperatorSnapshot, frame_to_table
from cluster.operators.keyed import (MERGE, MERGE_IN_BATCH, PARTIALS, KeyedOperator, fold_rows, partial_columns, quoted)
from cluster.operators.base import to_table
from cluster.operators.windowing.timers import EVENT_TIME, PROCESSING_TIME, TimerService
from cluster.operators.windowing.watermarks import NO_WATERMARK, rowtime_ms
from cluster.operators.windowing.windows import (SessionWindows, SlidingWindows, TimeWindow, TumblingWindows, assigner_of, merge_windows)

WINDOW_STATE = "window"
BLOCK = "__block__"  # the key, with the window, of a (key group, window)'s block in WINDOW_STATE
SESSION_STATE = "window-sessions"
ROWS, LATEST = "__rows__", "__latest__"
# how partial columns of one (key, window) combine, vectorised over many windows at once
MERGE_ARRAYS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "s": np.add, "c": np.add, "min": np.fmin, "max": np.fmax}  # fmin/fmax: a window of nulls so far is no minimum


def _null(value) -> bool:
    return value is None or value != value  # NaN: pandas' aggregate of no values


def _merged(kind: str, column: np.ndarray, at: np.ndarray, before: list) -> np.ndarray:
    """``column`` with its values at ``at`` merged with the state's ``before`` (partial ``kind``)."""
    old = np.asarray(before)
    if column.dtype == object or old.dtype == object:  # min/max of strings, say: python's own, as KeyedAggregate
        merged = column.astype(object, copy=True)
        merged[at] = [b if _null(a) else a if _null(b) else MERGE[kind](a, b)
                      for a, b in zip(merged[at].tolist(), before)]
        return merged
    merged = column.astype(np.result_type(column, old), copy=True)
    merged[at] = MERGE_ARRAYS[kind](merged[at], old)
    return merged


def assign(assigner, timestamps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row index, window start, whether it is the row's latest window) per window of a row."""
    rows, starts = assigner.assign(timestamps)
    if isinstance(assigner, SlidingWindows):
        latest = starts == (np.asarray(timestamps, dtype=np.int64)[rows]
                            - np.mod(timestamps[rows] - assigner.offset, assigner.slide))
    else:
        latest = np.ones(len(rows), dtype=bool)
    return rows, starts, latest


def window_partials(frame: pd.DataFrame, key: list[str], starts: np.ndarray, ends: np.ndarray,
                    latest: Optional[np.ndarray], aggregations: dict) -> pd.DataFrame:
    """One row per key and window: the key, window_start, window_end, the partial columns of
    ``aggregations`` (keyed.partial_columns), __rows__ and, given ``latest``, __latest__. ``frame``
    holds one row per (row, window) pair."""
    frame = frame.assign(window_start=starts, window_end=ends)
    columns = {}
    if latest is not None:
        frame[LATEST] = latest.astype(np.int64)
        columns[LATEST] = (LATEST, "sum")
    for name, kind, column in partial_columns(aggregations):
        columns[name] = (column, MERGE_IN_BATCH[kind] if kind != "c" else "count")
    grouped = frame.groupby(key + ["window_start", "window_end"], sort=False, dropna=False)
    out = grouped.agg(**columns) if columns else pd.DataFrame(index=grouped.size().index)
    out[ROWS] = grouped.size()
    order = [n for n, _, _ in partial_columns(aggregations)] + [ROWS] + ([LATEST] if latest is not None else [])
    return out[order].reset_index()


class WindowPartial(Operator, kind="window-partial"):
    """Partial aggregates per key and window of each batch, before the exchange (no state).
    params: key, rowtime, assigner, aggregations ({} for count)."""

    def open(self) -> None:
        assigner = assigner_of(self.params["assigner"], self.spec.where())
        if isinstance(assigner, SessionWindows):
            raise ValueError(f"{self.spec.where()}: session windows cannot be pre-aggregated (they merge)")
        self.assigner = assigner

    def process(self, table: pa.Table) -> list[pa.Table]:
        if table.num_rows == 0:
            return []
        key, aggregations = list(self.params["key"]), self.params["aggregations"]
        ts = rowtime_ms(table, self.params["rowtime"], self.spec.where())
        rows, starts, latest = assign(self.assigner, ts)
        needed = list(dict.fromkeys(key + [column for column, _ in aggregations.values()]))
        frame = table.select(needed).to_pandas()
        if not isinstance(self.assigner, TumblingWindows):  # a row in several windows: one row per window
            frame = frame.take(rows)
        partials = window_partials(frame, key, starts, starts + self.assigner.size, latest, aggregations)
        return [frame_to_table(partials)]


def spark_window_partials(spec: dict) -> Callable:
    """The same partial rows as a step of a Spark plan: a function DataFrame -> DataFrame that
    runs one SQL query (a few py4j calls per batch, where building the plan of column expressions
    took dozens: some 0.5 s a batch with the task's other threads holding the GIL)."""
    assigner = assigner_of(spec["assigner"], "the window pre-aggregation")
    if isinstance(assigner, SessionWindows):
        raise ValueError("the window pre-aggregation: session windows cannot be pre-aggregated (they merge)")
    key, rowtime, aggregations = list(spec["key"]), spec["rowtime"], spec["aggregations"]
    view = "__window_input"
    queries: dict[str, str] = {}  # by the rowtime column's Spark type

    def step(df):
        from pyspark.sql import types as T
        schema = df.schema  # one round trip to the JVM
        if rowtime not in schema.names:
            raise ValueError(f"the timestamp column {rowtime!r} is not in its input (columns: {schema.names})")
        kind = schema[rowtime].dataType
        if isinstance(kind, (T.TimestampType, T.TimestampNTZType, T.DateType)):
            ts = f"unix_millis(CAST({quoted(rowtime)} AS TIMESTAMP))"
        elif isinstance(kind, (T.LongType, T.IntegerType, T.ShortType, T.ByteType)):
            ts = f"CAST({quoted(rowtime)} AS BIGINT)"
        else:
            raise ValueError(f"the timestamp column {rowtime!r} is {kind.simpleString()}, not a time: give a "
                             "timestamp column or integer epoch milliseconds")
        query = queries.get(ts)
        if query is None:
            query = queries[ts] = window_partials_sql(view, key, ts, assigner, aggregations)
        df.createOrReplaceTempView(view)
        return df.sparkSession.sql(query)

    return step


def window_partials_sql(view: str, key: list[str], ts: str, assigner, aggregations: dict) -> str:
    """The partial rows of every batch row's windows, as Spark SQL over ``view`` whose event time
    in epoch ms is the expression ``ts``: key, window_start, window_end, the partial columns,
    __rows__ and __latest__."""
    size = assigner.size
    slide = getattr(assigner, "slide", size)
    count = -(-size // slide)
    keys = "".join(f"{quoted(k)}, " for k in key)
    last = f"(__ts__ - pmod(__ts__ - {assigner.offset}, {slide}))"  # the start of a row's latest window
    functions = {"s": "sum", "c": "count", "min": "min", "max": "max"}
    partials = partial_columns(aggregations)
    rows = f"SELECT *, {ts} AS __ts__ FROM {view}"
    if count == 1:
        spread = f"SELECT *, {last} AS window_start FROM ({rows})"
        aggs = [f"{functions[k]}({quoted(c)}) AS {quoted(n)}" for n, k, c in partials]
        aggs += [f"count(1) AS {ROWS}", f"count(1) AS {LATEST}"]
    elif size % slide == 0:
        # a row's windows then depend on its pane (its latest window's start) alone: aggregate per
        # key and pane first and spread the panes over their windows, count times fewer rows
        # through the explode than spreading the rows
        pane_aggs = ", ".join([f"{functions[k]}({quoted(c)}) AS {quoted(n)}" for n, k, c in partials]
                              + [f"count(1) AS {ROWS}"])
        panes = f"SELECT {keys}{last} AS __pane__, {pane_aggs} FROM ({rows}) GROUP BY {keys}{last}"
        spread = (f"SELECT *, __pane__ - __k__ * {slide} AS window_start FROM ({panes}) "
                  f"LATERAL VIEW explode(sequence(0, {count - 1})) AS __k__")
        merge = {"s": "sum", "c": "sum", "min": "min", "max": "max"}
        aggs = [f"{merge[k]}({quoted(n)}) AS {quoted(n)}" for n, k, _ in partials]
        aggs += [f"CAST(sum({ROWS}) AS BIGINT) AS {ROWS}",
                 f"CAST(sum(CASE WHEN __k__ = 0 THEN {ROWS} ELSE 0 END) AS BIGINT) AS {LATEST}"]
    else:
        spread = (f"SELECT * FROM (SELECT *, {last} - __k__ * {slide} AS window_start FROM ({rows}) "
                  f"LATERAL VIEW explode(sequence(0, {count - 1})) AS __k__) WHERE window_start > __ts__ - {size}")
        aggs = [f"{functions[k]}({quoted(c)}) AS {quoted(n)}" for n, k, c in partials]
        aggs += [f"count(1) AS {ROWS}", f"CAST(sum(CASE WHEN __k__ = 0 THEN 1 ELSE 0 END) AS BIGINT) AS {LATEST}"]
    return (f"SELECT {keys}window_start, window_start + {size} AS window_end, {', '.join(aggs)} "
            f"FROM ({spread}) GROUP BY {keys}window_start")


def _timer_columns(entries: list) -> tuple[list, list, list, list]:
    """Key groups, keys, window starts and ends of window timers (key group, key, window), as lists
    (not zip(*...), which is slow for many)."""
    windows = list(map(_third, entries))
    return (list(map(_first, entries)), list(map(_second, entries)), list(map(_first, windows)),
            list(map(_second, windows)))


_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)


def _run_starts(*columns: np.ndarray) -> np.ndarray:
    """Where a run of equal rows of sorted ``columns`` begins (0 included, for any rows)."""
    if not len(columns[0]):
        return np.zeros(0, dtype=np.int64)
    change = np.zeros(len(columns[0]), dtype=bool)
    change[0] = True
    for column in columns:
        change[1:] |= column[1:] != column[:-1]
    return np.flatnonzero(change)


def _block_keys(starts, ends) -> list:
    """The state keys of the blocks of windows [starts[i], ends[i])."""
    return [(BLOCK, s, e) for s, e in zip(np.asarray(starts).tolist(), np.asarray(ends).tolist())]


def _window_columns(starts, ends) -> dict:
    return {"window_start": pa.array(np.asarray(starts, dtype=np.int64)).cast(pa.timestamp("ms")),
            "window_end": pa.array(np.asarray(ends, dtype=np.int64)).cast(pa.timestamp("ms"))}


def _windows(starts: np.ndarray, ends: np.ndarray) -> list:
    """Timer namespaces: the windows as (start, end) of python ints."""
    return list(zip(starts.tolist(), ends.tolist()))


class WindowOperator(KeyedOperator, kind="window"):
    """params: key, assigner, time, rowtime, function, aggregations, allowed_lateness, late_tag,
    pre_aggregated (see the module doc and the design). udf: reduce fn(acc_df, new_df) -> df or
    process fn(key, window, rows) -> DataFrame | None."""

    def clock(self) -> int:
        """The wall clock, epoch ms: processing time."""
        return int(time.time() * 1000)

    def open(self) -> None:
        super().open()
        where = self.spec.where()
        params = self.params
        self.assigner = assigner_of(params["assigner"], where)
        self.sessions = isinstance(self.assigner, SessionWindows)
        self.domain = EVENT_TIME if params.get("time", "event") == "event" else PROCESSING_TIME
        if params.get("time", "event") not in ("event", "processing"):
            raise ValueError(f"{where}: time must be 'event' or 'processing', not {params['time']!r}")
        self.uses_processing_time = self.domain == PROCESSING_TIME
        self.rowtime: Optional[str] = params.get("rowtime") if self.domain == EVENT_TIME else None
        if self.domain == EVENT_TIME and not self.rowtime:
            raise ValueError(f"{where}: an event-time window needs the rowtime column of its input")
        self.function = params.get("function", "aggregate")
        if self.function not in ("aggregate", "count", "reduce", "process"):
            raise ValueError(f"{where}: unknown window function {self.function!r}")
        if self.function in ("reduce", "process") and self.udf is None:
            raise ValueError(f"{where}: a {self.function} window needs its function")
        self.aggregations = (params.get("aggregations") or {}) if self.function == "aggregate" else {}
        self.partials = partial_columns(self.aggregations)
        # lateness only exists in event time (Flink: processing-time windows are never late)
        self.lateness = int(params.get("allowed_lateness") or 0) if self.domain == EVENT_TIME else 0
        if self.lateness < 0:
            raise ValueError(f"{where}: allowed_lateness must be >= 0 ms, got {self.lateness}")
        self.late_tag = params.get("late_tag")
        self.pre_aggregated = bool(params.get("pre_aggregated"))
        if self.pre_aggregated and (self.sessions or self.function not in ("aggregate", "count")):
            raise ValueError(f"{where}: only tumbling and sliding aggregate/count windows take pre-aggregated input")
        if self.pre_aggregated and self.late_tag is not None:
            raise ValueError(f"{where}: a window with a late side output needs its rows, not pre-aggregated input")
        self.timers = TimerService(self.backend)
        self.watermark = NO_WATERMARK
        self.late_dropped = 0
        self.newest = NO_WATERMARK
        self.state_columns = [n for n, _, _ in self.partials] + [ROWS]
        self.blocks = self.function in ("aggregate", "count") and not self.sessions
        self.columns: Optional[list[str]] = None  # of the input rows, which a reduced row has

    # ------------------------------------------------------------------ input
    def process(self, table: pa.Table) -> list[pa.Table]:
        if table.num_rows == 0:
            return []
        if self.pre_aggregated:
            return self._process_partials(table)
        where = self.spec.where()
        if self.rowtime is not None:  # event time (open checked it is given)
            ts = rowtime_ms(table, self.rowtime, where)
        else:
            ts = np.full(table.num_rows, self.clock(), dtype=np.int64)
        self.newest = max(self.newest, int(ts.max()))
        missing = [k for k in self.key if k not in table.column_names]
        if missing:
            raise KeyError(f"{where}: key column(s) {missing} not in the input (columns: {table.column_names})")
        if self.function in ("aggregate", "count"):
            needed = list(dict.fromkeys(self.key + [c for c, _ in self.aggregations.values()]))
            frame = table.select(needed).to_pandas()
        else:
            frame = table.to_pandas()
            self.columns = list(frame.columns)
        if isinstance(self.assigner, SessionWindows):
            rows, starts, ends, skipped = self._merge_sessions(frame, ts)
        else:
            rows, starts, _ = assign(self.assigner, ts)
            ends = starts + self.assigner.size
            keep = ends - 1 + self.lateness > self.watermark
            rows, starts, ends = rows[keep], starts[keep], ends[keep]
            skipped = np.bincount(rows, minlength=len(ts)) == 0
        if skipped.any():
            self._late(table, np.flatnonzero(skipped))
        if len(rows) == 0:
            return []
        everyone = len(rows) == len(frame) and bool((rows == np.arange(len(rows))).all())
        pairs = frame if everyone else frame.take(rows)
        return self._add(pairs.reset_index(drop=True), starts, ends)

    def _late(self, table: pa.Table, rows: np.ndarray) -> None:
        if self.late_tag is not None:
            self.side_output(self.late_tag, table.take(pa.array(rows)))
        else:
            self.late_dropped += len(rows)

    def _process_partials(self, table: pa.Table) -> list[pa.Table]:
        where = self.spec.where()
        missing = [c for c in self.key + ["window_start", "window_end"] + self.state_columns + [LATEST]
                   if c not in table.column_names]
        if missing:
            raise KeyError(f"{where}: pre-aggregated input lacks {missing} (columns: {table.column_names})")
        frame = table.to_pandas()
        starts = frame["window_start"].to_numpy(np.int64)
        ends = frame["window_end"].to_numpy(np.int64)
        self.newest = max(self.newest, int(ends.max()) - 1)  # the rows' own times were aggregated away
        keep = ends - 1 + self.lateness > self.watermark
        if not keep.all():
            self.late_dropped += int(frame[LATEST].to_numpy()[~keep].sum())
            frame = frame[keep]
        if frame.empty:
            return []
        if self.blocks:  # its one groupby also combines the rows of several producers
            return self._merge_blocks(frame)
        # one partial row per producer and window: combine them before touching state
        grouped = frame.groupby(self.key + ["window_start", "window_end"], sort=False, dropna=False)
        merged = grouped.agg(**{n: (n, MERGE_IN_BATCH[kind]) for n, kind, _ in self.partials},
                             **{ROWS: (ROWS, "sum")}).reset_index()
        return self._merge_aggregates(merged)

    # ------------------------------------------------------------------ window contents
    def _add(self, pairs: pd.DataFrame, starts: np.ndarray, ends: np.ndarray) -> list[pa.Table]:
        """Adds rows to windows: row i of ``pairs`` to window [starts[i], ends[i]) of its key."""
        if self.function in ("aggregate", "count"):
            partials = window_partials(pairs, self.key, starts, ends, None, self.aggregations)
            return self._merge_blocks(partials) if self.blocks else self._merge_aggregates(partials)
        frame = pairs
        by = frame[self.key].assign(window_start=starts, window_end=ends)
        grouped = by.groupby(self.key + ["window_start", "window_end"], sort=False, dropna=False)
        slots = grouped.ngroup().to_numpy()
        first = np.unique(slots, return_index=True)[1]
        windows = by.iloc[first].reset_index(drop=True)
        groups, keys, state_keys = self._slots(windows)
        acc = self.backend.get_many(WINDOW_STATE, groups, state_keys)
        new = None if self.sessions else np.array([a is None for a in acc], dtype=bool)
        if self.function == "reduce":
            fold_rows(frame, slots, acc, self.call_user, self.spec.where())
        else:
            table = frame_to_table(frame)
            order = np.argsort(slots, kind="stable")
            bounds = np.searchsorted(slots[order], np.arange(len(first) + 1))
            for slot in range(len(first)):
                rows = table.take(pa.array(order[bounds[slot]:bounds[slot + 1]]))
                acc[slot] = rows if acc[slot] is None else pa.concat_tables([acc[slot], rows])
        self.backend.put_many(WINDOW_STATE, groups, state_keys, acc)
        return self._after_add(windows, groups, keys, acc, new)

    def _merge_blocks(self, partials: pd.DataFrame) -> list[pa.Table]:
        """Merges partial rows (key, window_start, window_end, state columns; several rows of one
        key and window allowed) into the blocks of their (key group, window)s: the old blocks and
        the new rows aggregated in one groupby, split back into blocks."""
        n = len(partials)
        starts = partials["window_start"].to_numpy(np.int64)
        ends = partials["window_end"].to_numpy(np.int64)
        groups = key_groups_of_frame(partials[self.key], self.ctx.max_parallelism) if self.key else \
            np.full(n, self.key_groups.start, dtype=np.int64)  # window_all: one key, parallelism 1
        order = np.lexsort((ends, starts, groups))
        firsts = order[_run_starts(groups[order], starts[order], ends[order])]
        touched_groups, touched_starts, touched_ends = groups[firsts], starts[firsts], ends[firsts]
        old = self.backend.get_many(WINDOW_STATE, touched_groups.tolist(), _block_keys(touched_starts, touched_ends))
        had = np.fromiter((o is not None for o in old), dtype=bool, count=len(old))
        names = self.key + self.state_columns
        columns = {name: [partials[name].to_numpy()] for name in names}
        where = {"__group__": [groups], "window_start": [starts], "window_end": [ends],
                 "__new__": [np.ones(n, dtype=np.int8)]}
        for i in np.flatnonzero(had).tolist():
            block = old[i]
            size = len(block[0])
            for name, values in zip(names, block):
                columns[name].append(values)
            for name, value in (("__group__", touched_groups[i]), ("window_start", touched_starts[i]),
                                ("window_end", touched_ends[i])):
                where[name].append(np.full(size, value, dtype=np.int64))
            where["__new__"].append(np.zeros(size, dtype=np.int8))
        frame = pd.DataFrame({name: np.concatenate(parts) for name, parts in {**where, **columns}.items()})
        kinds = [kind for _, kind, _ in self.partials] + ["c"]
        # sorted by key group and window: each block is one run of rows
        merged = frame.groupby(["__group__", "window_start", "window_end"] + self.key, sort=True, dropna=False).agg(
            **{name: (name, MERGE_IN_BATCH[kind]) for name, kind in zip(self.state_columns, kinds)},
            __new__=("__new__", "max")).reset_index()
        m_groups = merged["__group__"].to_numpy(np.int64)
        m_starts = merged["window_start"].to_numpy(np.int64)
        m_ends = merged["window_end"].to_numpy(np.int64)
        arrays = [merged[name].to_numpy() for name in names]
        bounds = np.append(_run_starts(m_groups, m_starts, m_ends), len(merged)).tolist()
        blocks = [tuple(a[lo:hi].copy() for a in arrays) for lo, hi in zip(bounds[:-1], bounds[1:])]
        # the same (key group, window)s in the same order as the touched ones
        self.backend.put_many(WINDOW_STATE, touched_groups.tolist(), _block_keys(touched_starts, touched_ends), blocks)
        now = self.watermark if self.domain == EVENT_TIME else self.clock()
        due = touched_ends - 1 <= now if self.domain == EVENT_TIME else np.zeros(len(firsts), dtype=bool)
        registrations = [(~had & ~due, touched_ends - 1)]
        if self.lateness:
            registrations.append((~had, touched_ends - 1 + self.lateness))
        for at, when in registrations:
            rows = np.flatnonzero(at)
            if len(rows):
                self.timers.register_many(self.domain, touched_groups[rows].tolist(), [BLOCK] * len(rows),
                                          when[rows].tolist(), _windows(touched_starts[rows], touched_ends[rows]))
        if not due.any():
            return []
        # late rows within the lateness: the updated rows of the keys this batch touched
        emit = (m_ends - 1 <= now) & (merged["__new__"].to_numpy() == 1)
        return self._emit_columns({name: a[emit] for name, a in zip(names, arrays)}, m_starts[emit], m_ends[emit])

    def _merge_aggregates(self, partials: pd.DataFrame) -> list[pa.Table]:
        groups, keys, state_keys = self._slots(partials)
        columns = [partials[name].to_numpy() for name in self.state_columns]
        old = self.backend.get_many(WINDOW_STATE, groups, state_keys)
        had = np.fromiter((o is not None for o in old), dtype=bool, count=len(old))
        if had.any():
            at = np.flatnonzero(had)
            olds = [old[i] for i in at]
            previous = [[o[j] for o in olds] for j in range(len(self.state_columns))]  # not zip(*): slow for many
            kinds = [kind for _, kind, _ in self.partials] + ["c"]
            for j, kind in enumerate(kinds):
                columns[j] = _merged(kind, columns[j], at, previous[j])
        values = list(zip(*[c.tolist() for c in columns]))
        self.backend.put_many(WINDOW_STATE, groups, state_keys, values)
        return self._after_add(partials, groups, keys, values, None)  # session windows: timers for all

    def _slots(self, windows: pd.DataFrame) -> tuple[list, list, list]:
        """(key groups, keys, state keys) of the windows of a frame with the key columns,
        window_start and window_end (one row per window)."""
        starts = windows["window_start"].tolist()
        ends = windows["window_end"].tolist()
        if not self.key:  # window_all: one key, in the first key group (its parallelism is 1)
            keys = [()] * len(windows)
            groups = [self.key_groups.start] * len(windows)
        else:
            key_frame = windows[self.key]
            groups = key_groups_of_frame(key_frame, self.ctx.max_parallelism).tolist()
            # python natives, as KeyedOperator.group makes them (Series.tolist converts numpy scalars)
            keys = key_frame[self.key[0]].tolist() if len(self.key) == 1 else \
                list(zip(*[key_frame[k].tolist() for k in self.key]))
        return groups, keys, list(zip(keys, starts, ends))

    def _after_add(self, windows: pd.DataFrame, groups: list, keys: list, values: list,
                   new: Optional[np.ndarray]) -> list[pa.Table]:
        """Timers for the windows just added to (``new``: those that had no state, so no timers
        yet; None: all); those whose time has passed fire at once (late rows within the allowed
        lateness: an updated row)."""
        starts = windows["window_start"].to_numpy(np.int64)
        ends = windows["window_end"].to_numpy(np.int64)
        max_ts = ends - 1
        now = self.watermark if self.domain == EVENT_TIME else self.clock()
        due = max_ts <= now if self.domain == EVENT_TIME else np.zeros(len(ends), dtype=bool)
        timed = np.ones(len(ends), dtype=bool) if new is None else new
        # the firing timer (unless due now) and, with lateness, the clearing one
        registrations = [(timed & ~due, max_ts)] + ([(timed, max_ts + self.lateness)] if self.lateness else [])
        for at, when in registrations:
            if not at.any():
                continue
            if at.all():
                self.timers.register_many(self.domain, groups, keys, when.tolist(),
                                          list(zip(starts.tolist(), ends.tolist())))
            else:
                rows = np.flatnonzero(at)
                self.timers.register_many(self.domain, [groups[i] for i in rows], [keys[i] for i in rows],
                                          when[rows].tolist(), list(zip(starts[rows].tolist(), ends[rows].tolist())))
        fire = np.flatnonzero(due)
        if not len(fire):
            return []
        return self._emit([keys[i] for i in fire], starts[fire], ends[fire], [values[i] for i in fire])

    # ------------------------------------------------------------------ sessions
    def _merge_sessions(self, frame: pd.DataFrame, ts: np.ndarray):
        """Flink's MergingWindowSet per key, row by row in arrival order: (row index, window start,
        window end) of every row placed, and which rows were skipped (their window is late). The
        windows merged away move their contents into the covering window and lose their timers."""
        assert isinstance(self.assigner, SessionWindows)  # only session windows merge
        gap = self.assigner.gap
        if self.key:
            grouped = frame.groupby(self.key, sort=False, dropna=False)
            codes = grouped.ngroup().to_numpy()
        else:
            codes = np.zeros(len(frame), dtype=np.int64)
        first = np.unique(codes, return_index=True)[1]
        groups, keys, _ = self._slots(frame.iloc[first][self.key].assign(window_start=0, window_end=0))
        old_sets = self.backend.get_many(SESSION_STATE, groups, keys)
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(len(first) + 1))
        starts = np.zeros(len(ts), dtype=np.int64)
        ends = np.zeros(len(ts), dtype=np.int64)
        skipped = np.zeros(len(ts), dtype=bool)
        new_sets, moves = [], []  # moves: (key group, key, window merged away, the window it went into)
        for g in range(len(first)):
            windows = [TimeWindow(*w) for w in old_sets[g] or ()]
            existing = set(windows)
            into: dict[TimeWindow, TimeWindow] = {}
            placed = []
            for i in order[bounds[g]:bounds[g + 1]].tolist():
                window = TimeWindow(int(ts[i]), int(ts[i]) + gap)
                cover, members = next((c, m) for c, m in merge_windows(windows + [window]) if window in m)
                if cover.max_timestamp + self.lateness <= self.watermark and self.domain == EVENT_TIME:
                    skipped[i] = True  # late on its own (anything it could merge with is gone)
                    continue
                for member in members:
                    if member != cover and member in windows:
                        into[member] = cover
                windows = [w for w in windows if w not in members] + [cover]
                placed.append((i, cover))
            for window, target in list(into.items()):
                while target in into:
                    target = into[target]
                into[window] = target
            for i, window in placed:
                window = into.get(window, window)
                starts[i], ends[i] = window
            moves += [(groups[g], keys[g], w, into[w]) for w in existing if w in into]
            new_sets.append(tuple(sorted(windows)) or None)
        self.backend.put_many(SESSION_STATE, groups, keys, new_sets)
        if moves:
            self._move_windows(moves)
        rows = np.flatnonzero(~skipped)
        return rows, starts[rows], ends[rows], skipped

    def _move_windows(self, moves: list) -> None:
        """Merges the contents of session windows merged away into their covering windows."""
        olds = self.backend.get_many(WINDOW_STATE, [g for g, _, _, _ in moves], [(k, *w) for _, k, w, _ in moves])
        targets: dict[tuple, Any] = {}
        for (group, key, window, target), old in zip(moves, olds):
            for timestamp in {window.max_timestamp, window.max_timestamp + self.lateness}:
                self.timers.delete(self.domain, group, key, timestamp, tuple(window))
            self.backend.put(WINDOW_STATE, group, (key, *window), None)
            if old is None:
                continue
            at = (group, key, target)
            if at not in targets:
                targets[at] = self.backend.get(WINDOW_STATE, group, (key, *target))
            targets[at] = old if targets[at] is None else self._combine(targets[at], old)
        for (group, key, target), value in targets.items():
            self.backend.put(WINDOW_STATE, group, (key, *target), value)

    def _combine(self, a, b):
        """The contents of two windows as one (Flink's mergeNamespaces)."""
        if self.function in ("aggregate", "count"):
            kinds = [kind for _, kind, _ in self.partials] + ["c"]
            return tuple(MERGE_ARRAYS[k](np.asarray(x), np.asarray(y)).item() for k, x, y in zip(kinds, a, b))
        if self.function == "process":
            return pa.concat_tables([a, b])
        acc = [a]
        fold_rows(pd.DataFrame([b], columns=self.columns), np.zeros(1, dtype=np.int64), acc,
                  self.call_user, self.spec.where())
        return acc[0]

    # ------------------------------------------------------------------ time
    def process_watermark(self, watermark: int) -> tuple[list[pa.Table], Optional[int]]:
        if watermark <= self.watermark:
            return [], watermark
        self.watermark = watermark
        return (self._on_timers(EVENT_TIME, watermark) if self.domain == EVENT_TIME else []), watermark

    def on_processing_time(self, now_ms: int) -> list[pa.Table]:
        return self._on_timers(PROCESSING_TIME, now_ms) if self.domain == PROCESSING_TIME else []

    def _on_timers(self, domain: str, until: int) -> list[pa.Table]:
        out = []
        for timestamp, entries in self.timers.pop_due_by_time(domain, until):
            # a window's timer at its max timestamp fires it, the one at max + lateness clears it
            if self.lateness:
                fire = [e for e in entries if timestamp == e[2][1] - 1]
                clear = [e for e in entries if timestamp == e[2][1] - 1 + self.lateness]
            else:
                fire = clear = entries
            if self.blocks:
                out += self._fire_blocks(fire, clear)
                continue
            fired = _timer_columns(fire)
            if fire:
                groups, keys, starts, ends = fired
                values = self.backend.get_many(WINDOW_STATE, groups, list(zip(keys, starts, ends)))
                if None in values:  # no rows (state moved by a merge, or a restore that had none)
                    live = [i for i, v in enumerate(values) if v is not None]
                    keys, starts, ends, values = ([column[i] for i in live] for column in (keys, starts, ends, values))
                if values:
                    out += self._emit(keys, np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), values)
            if clear:
                groups, keys, starts, ends = fired if clear is fire else _timer_columns(clear)
                self.backend.put_many(WINDOW_STATE, groups, list(zip(keys, starts, ends)), [None] * len(clear))
                if self.sessions:
                    self._forget_sessions(groups, keys, starts, ends)
        return [pa.concat_tables(out)] if len(out) > 1 and self.function != "process" else out

    def _fire_blocks(self, fire: list, clear: list) -> list[pa.Table]:
        """Emits the blocks of the (key group, BLOCK, window) timers ``fire``, deletes those of ``clear``."""
        out = []
        if fire:
            groups, _, starts, ends = _timer_columns(fire)
            blocks = self.backend.get_many(WINDOW_STATE, groups, _block_keys(starts, ends))
            live = [i for i, b in enumerate(blocks) if b is not None]  # none: a restore that had no rows
            if live:
                sizes = [len(blocks[i][0]) for i in live]
                names = self.key + self.state_columns
                columns = {name: np.concatenate([blocks[i][j] for i in live]) for j, name in enumerate(names)}
                out = self._emit_columns(columns, np.repeat(np.asarray(starts, dtype=np.int64)[live], sizes),
                                         np.repeat(np.asarray(ends, dtype=np.int64)[live], sizes))
        if clear:
            groups, _, starts, ends = _timer_columns(clear)
            self.backend.put_many(WINDOW_STATE, groups, _block_keys(starts, ends), [None] * len(clear))
        return out

    def _forget_sessions(self, groups: list, keys: list, starts: list, ends: list) -> None:
        by_key: dict[tuple, set] = {}
        for group, key, start, end in zip(groups, keys, starts, ends):
            by_key.setdefault((group, key), set()).add(TimeWindow(start, end))
        groups = [g for g, _ in by_key]
        keys = [k for _, k in by_key]
        sets = self.backend.get_many(SESSION_STATE, groups, keys)
        kept = [tuple(w for w in (s or ()) if TimeWindow(*w) not in gone) or None
                for s, gone in zip(sets, by_key.values())]
        self.backend.put_many(SESSION_STATE, groups, keys, kept)

    # ------------------------------------------------------------------ output
    def _key_columns(self, keys: list) -> dict:
        if len(self.key) == 1:
            return {self.key[0]: keys}
        return {name: [key[i] for key in keys] for i, name in enumerate(self.key)}

    def _emit(self, keys: list, starts: np.ndarray, ends: np.ndarray, values: list) -> list[pa.Table]:
        """The output rows of fired windows."""
        if self.function == "process":
            return self._emit_process(keys, starts, ends, values)
        if self.function == "reduce":
            frame = pd.DataFrame(values, columns=self.columns)
            rest = {c: pa.array(frame[c]) for c in frame.columns if c not in self.key}
            return [pa.table({**self._key_columns(keys), **_window_columns(starts, ends), **rest})]
        by_name = {name: np.asarray([v[j] for v in values]) for j, name in enumerate(self.state_columns)}
        return self._emit_columns({**self._key_columns(keys), **by_name}, starts, ends)

    def _emit_columns(self, columns: dict, starts: np.ndarray, ends: np.ndarray) -> list[pa.Table]:
        """The output rows of fired aggregate/count windows from the key and state columns."""
        window = _window_columns(starts, ends)
        keys = {name: columns[name] for name in self.key}
        if self.function == "count":
            return [pa.table({**keys, **window, "count": np.asarray(columns[ROWS]).astype(np.int64)})]
        out = {}
        for name, (column, func) in self.aggregations.items():
            if func == "mean":
                out[name] = np.asarray(columns[f"__{name}__s"]).astype(float) / np.asarray(columns[f"__{name}__c"])
            else:
                out[name] = columns[f"__{name}__{PARTIALS[func][0]}"]
        return [pa.table({**keys, **window, **out})]

    def _emit_process(self, keys, starts, ends, tables) -> list[pa.Table]:
        out = []
        for key, start, end, rows in zip(keys, starts.tolist(), ends.tolist(), tables):
            result = self.call_user(None if not self.key else key, TimeWindow(start, end), rows.to_pandas())
            if result is None:
                continue
            result = to_table(result, f"{self.spec.where()}: the process function")
            extra = {}
            for i, name in enumerate(self.key):
                if name not in result.column_names:
                    extra[name] = pa.array([key if len(self.key) == 1 else key[i]] * result.num_rows)
            for name, at in (("window_start", start), ("window_end", end)):
                if name not in result.column_names:
                    extra[name] = pa.array([at] * result.num_rows, pa.int64()).cast(pa.timestamp("ms"))
            if extra:
                result = pa.table({**extra, **{n: result.column(n) for n in result.column_names}})
            out.append(result)
        return [pa.concat_tables(out, promote_options="default")] if out else []

    # ------------------------------------------------------------------ checkpoints and metrics
    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        handle: dict[str, Any] = {"watermark": self.watermark}
        if self.columns is not None:
            handle["columns"] = self.columns
        return OperatorSnapshot(handle, keyed=self.backend.snapshot())

    def restore_state(self, handles: list[dict]) -> None:
        super().restore_state(handles)
        # the smallest: a subtask that had seen less would otherwise skip rows as late
        self.watermark = min((h.get("watermark", NO_WATERMARK) for h in handles), default=NO_WATERMARK)
        self.timers.restore()
        self.columns = next((h["columns"] for h in handles if h.get("columns")), self.columns)
        # per-key window state where blocks are expected (or the reverse) would never fire: say so
        for domain in (EVENT_TIME, PROCESSING_TIME):
            odd = next((t for t in self.timers.timers(domain) if (t.key == BLOCK) != self.blocks), None)
            if odd is not None:
                layout = "per (key group, window) blocks" if self.blocks else "per (key, window) entries"
                raise ValueError(f"{self.spec.where()}: the restored window state is not kept as {layout}, as this "
                                 f"{self.params['assigner'].get('type')} {self.function} window keeps it (a timer "
                                 f"of key {odd.key!r}): it was written by another window operator or another "
                                 "version of it")

    def metrics(self) -> dict:
        return {"numLateRecordsDropped": self.late_dropped, "newestEventTimestamp": self.newest}
