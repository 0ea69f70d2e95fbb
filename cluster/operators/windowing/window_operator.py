"""The window operator: ``key_by(...).window(assigner)`` with Flink's WindowOperator semantics.

Per key and window [start, end) the operator keeps the window's contents in the keyed backend
(state ``window``): its parts are Flink's. The assigner (cluster.graph.windows) places rows in
windows; the contents (contents.py, blocks.py, slices.py: one class per window function kind and
state layout) keep what a window holds and make its output rows; the trigger (triggers.py:
EventTimeTrigger, ProcessingTimeTrigger) decides from the watermark and the timers per (key,
window) when a window fires and when it is purged, allowed lateness included; session windows merge per key
(sessions.py). A window is late once the trigger says so (``end - 1 + allowed_lateness <=
watermark``): rows for it are skipped, and a row all of whose windows are late goes to the late
side output (or counts in numLateRecordsDropped); either way the newest few are kept to be seen
(late_rows.py). A row for a window that fired but is not late fires it again at once: an updated
row for that window.

Batches are handled whole, not row by row: the watermark does not move within a batch, so every
decision Flink makes per row is the same for the batch's rows; a window that several rows of one
batch fire again gives one updated row.

Pre-aggregation: upstream of the exchange, ``window-partial`` (pre_aggregation.py, Arrow or
pandas, after a Spark step too) assigns windows and aggregates per key and window; the operator
merges these partial rows into state (params["pre_aggregated"]).

Processing time comes from ``clock`` (epoch ms), given to the operator: the wall clock unless the
task or a test gives another.

Thread use: the task thread only.
"""
from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.common.clock import now_ms
from cluster.graph.event_time import NO_WATERMARK
from cluster.graph.job_graph import OperatorSpec
from cluster.graph.windows import SessionWindows, SlidingWindows, assigner_of
from cluster.operators.base import OperatorContext, OperatorSnapshot
from cluster.operators.keyed import KeyedOperator
from cluster.operators.late_rows import LateRows
from cluster.operators.timers import EVENT_TIME, PROCESSING_TIME, TimerService
from cluster.operators.windowing.blocks import BlockContents
from cluster.operators.windowing.contents import (BLOCK, AggregateContents, ProcessContents, ReduceContents,
                                                  WindowContents)
from cluster.operators.windowing.pre_aggregation import LATEST, assign
from cluster.operators.windowing.sessions import MergingWindowSet
from cluster.operators.windowing.slices import SliceContents
from cluster.operators.windowing.triggers import EventTimeTrigger, ProcessingTimeTrigger, Trigger, TriggerResult
from cluster.operators.windowing.watermarks import rowtime_ms
from cluster.protocol.metrics import (LATE_ROWS, NEWEST_EVENT_TIMESTAMP, NUM_LATE_RECORDS_DROPPED,
                                     OLDEST_OPEN_WINDOW)
from cluster.state.key_groups import key_groups_of_frame

_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)


def _timer_columns(entries: list) -> tuple[list, list, list, list]:
    """Key groups, keys, window starts and ends of window timers (key group, key, window), as lists
    (not zip(*...), which is slow for many)."""
    windows = list(map(_third, entries))
    return (list(map(_first, entries)), list(map(_second, entries)), list(map(_first, windows)),
            list(map(_second, windows)))


class WindowOperator(KeyedOperator, kind="window"):
    """params: key, assigner, time, rowtime, function, aggregations, allowed_lateness, late_tag,
    pre_aggregated (see the module doc and the design). udf: reduce fn(acc_df, new_df) -> df or
    process fn(key, window, rows) -> DataFrame | None."""

    def __init__(self, spec: OperatorSpec, ctx: OperatorContext, clock: Callable[[], int] = now_ms):
        super().__init__(spec, ctx)
        self.clock = clock  # processing time, epoch ms

    def open(self) -> None:
        super().open()
        where = self.spec.where()
        params = self.params
        self.assigner = assigner_of(params["assigner"], where)
        self.sessions = isinstance(self.assigner, SessionWindows)
        if params.get("time", "event") not in ("event", "processing"):
            raise ValueError(f"{where}: time must be 'event' or 'processing', not {params['time']!r}")
        event_time = params.get("time", "event") == "event"
        self.rowtime: Optional[str] = params.get("rowtime") if event_time else None
        if event_time and not self.rowtime:
            raise ValueError(f"{where}: an event-time window needs the rowtime column of its input")
        self.function = params.get("function", "aggregate")
        self.contents = self._contents_of(self.function, where)
        # lateness only exists in event time (Flink: processing-time windows are never late)
        lateness = int(params.get("allowed_lateness") or 0) if event_time else 0
        if lateness < 0:
            raise ValueError(f"{where}: allowed_lateness must be >= 0 ms, got {lateness}")
        self.trigger: Trigger = EventTimeTrigger(lateness) if event_time else ProcessingTimeTrigger()
        self.uses_processing_time = not event_time
        self.late_tag = params.get("late_tag")
        self.pre_aggregated = bool(params.get("pre_aggregated"))
        if self.pre_aggregated and not self.contents.blocks:
            raise ValueError(f"{where}: only tumbling and sliding aggregate/count windows take pre-aggregated input")
        if self.pre_aggregated and self.late_tag is not None:
            raise ValueError(f"{where}: a window with a late side output needs its rows, not pre-aggregated input")
        self.timers = TimerService(self.backend)
        self.merging = MergingWindowSet(self.assigner, self, self.contents, self.trigger, self.timers) \
            if isinstance(self.assigner, SessionWindows) else None
        self.watermark = NO_WATERMARK
        self.late = LateRows(self.spec.uid, self.spec.name, self.late_tag)
        self.newest = NO_WATERMARK

    def _contents_of(self, function: str, where: str) -> WindowContents:
        if function not in ("aggregate", "count", "reduce", "process"):
            raise ValueError(f"{where}: unknown window function {function!r}")
        if function in ("reduce", "process") and self.udf is None:
            raise ValueError(f"{where}: a {function} window needs its function")
        if function == "reduce":
            return ReduceContents(self)
        if function == "process":
            return ProcessContents(self)
        aggregations = (self.params.get("aggregations") or {}) if function == "aggregate" else {}
        if self.params.get("slices"):  # the partials upstream are per slice (windowed.py decides)
            if not isinstance(self.assigner, SlidingWindows) or not self.params.get("pre_aggregated"):
                raise ValueError(f"{where}: only a pre-aggregated sliding window is kept per slice")
            return SliceContents(self, aggregations, function == "count", self.assigner, int(self.params["slices"]))
        return (AggregateContents if self.sessions else BlockContents)(self, aggregations, function == "count")

    # ------------------------------------------------------------------ the contents' scope
    def where(self) -> str:
        return self.spec.where()

    def slots(self, windows: pd.DataFrame) -> tuple[list, list, list]:
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

    def is_late(self, last_instants: np.ndarray) -> np.ndarray:
        """Whether windows of these last instants are late (past their clean-up)."""
        return self.trigger.is_late(last_instants, self.watermark)

    def key_groups_of(self, key_frame: pd.DataFrame) -> np.ndarray:
        if not self.key:  # window_all: one key, parallelism 1
            return np.full(len(key_frame), self.key_groups.start, dtype=np.int64)
        return key_groups_of_frame(key_frame, self.ctx.max_parallelism)

    def added(self, groups: Sequence, keys: Sequence, starts: np.ndarray, ends: np.ndarray,
              new: Optional[np.ndarray]) -> np.ndarray:
        """Rows went into these windows (``new``: those that had no contents before; None: any):
        registers the timers the trigger wants, and says which windows fire now."""
        results, registrations = self.trigger.on_element(ends - 1, new, self.watermark)
        for at, when in registrations:
            if not at.any():
                continue
            if at.all():
                self.timers.register_many(self.trigger.domain, groups, keys, when.tolist(),
                                          list(zip(starts.tolist(), ends.tolist())))
            else:
                rows = np.flatnonzero(at).tolist()
                self.timers.register_many(self.trigger.domain, [groups[i] for i in rows], [keys[i] for i in rows],
                                          when[rows].tolist(), list(zip(starts[rows].tolist(), ends[rows].tolist())))
        return (results & TriggerResult.FIRE) != 0

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
        frame = self.contents.frame_of(table)
        if self.merging is not None:
            rows, starts, ends, skipped = self.merging.place(frame, ts, self.watermark)
        else:
            assert not isinstance(self.assigner, SessionWindows)  # only session windows merge
            rows, starts, _ = assign(self.assigner, ts)
            ends = starts + self.assigner.size
            keep = ~self.is_late(ends - 1)
            rows, starts, ends = rows[keep], starts[keep], ends[keep]
            skipped = np.bincount(rows, minlength=len(ts)) == 0
        if skipped.any():
            self._late(table, ts, np.flatnonzero(skipped))
        if len(rows) == 0:
            return []
        everyone = len(rows) == len(frame) and bool((rows == np.arange(len(rows))).all())
        pairs = frame if everyone else frame.take(rows)
        return self.contents.add(pairs.reset_index(drop=True), starts, ends)

    def _late(self, table: pa.Table, ts: np.ndarray, rows: np.ndarray) -> None:
        late = table.take(pa.array(rows))
        if self.late_tag is not None:
            self.side_output(self.late_tag, late)
        self.late.record(late, ts[rows], self.watermark, self.late_tag is not None)

    def _process_partials(self, table: pa.Table) -> list[pa.Table]:
        assert isinstance(self.contents, BlockContents)  # open checked: only blocks take partials
        where = self.spec.where()
        missing = [c for c in self.key + ["window_start", "window_end"] + self.contents.state_columns + [LATEST]
                   if c not in table.column_names]
        if missing:
            raise KeyError(f"{where}: pre-aggregated input lacks {missing} (columns: {table.column_names})")
        frame = table.to_pandas()
        ends = frame["window_end"].to_numpy(np.int64)
        self.newest = max(self.newest, int(ends.max()) - 1)  # the rows' own times were aggregated away
        last = self.contents.last_instants(frame["window_start"].to_numpy(np.int64), ends)
        keep = ~self.is_late(last)
        if not keep.all():
            # the rows were aggregated away upstream: their partials stand for them, one per key and
            # window, at the window's last instant; a row counts once, in its latest window
            late = frame.loc[~keep, self.key + ["window_start", "window_end", LATEST]].rename(columns={LATEST: "rows"})
            late[["window_start", "window_end"]] = late[["window_start", "window_end"]].astype("datetime64[ms]")
            self.late.record(pa.Table.from_pandas(late, preserve_index=False), last[~keep], self.watermark,
                             False, rows=int(late["rows"].sum()))
            frame = frame[keep]
        if frame.empty:
            return []
        return self.contents.add_partials(frame)  # its one groupby also combines the rows of several producers

    # ------------------------------------------------------------------ time
    def process_watermark(self, watermark: int) -> tuple[list[pa.Table], Optional[int]]:
        if watermark <= self.watermark:
            return [], watermark
        self.watermark = watermark
        return (self._on_timers(watermark) if self.trigger.domain == EVENT_TIME else []), watermark

    def on_processing_time(self, now_ms: int) -> list[pa.Table]:
        return self._on_timers(now_ms) if self.trigger.domain == PROCESSING_TIME else []

    def _on_timers(self, until: int) -> list[pa.Table]:
        out = []
        for timestamp, entries in self.timers.pop_due_by_time(self.trigger.domain, until):
            fire, clear = self._split(timestamp, entries)
            fired = _timer_columns(fire)
            if fire:
                out += self.contents.fire(*fired)
            if clear:
                columns = fired if clear is fire else _timer_columns(clear)
                self.contents.clear(*columns)
                if self.merging is not None:
                    self.merging.forget(*columns)
        return [pa.concat_tables(out)] if len(out) > 1 and self.contents.concat_fired else out

    def _split(self, timestamp: int, entries: list) -> tuple[list, list]:
        """The timers of one time (key group, key, window) to fire and to purge, as the trigger
        says per window (one answer per window end: a time holds a few)."""
        said = {end: self.trigger.on_timer(timestamp, end - 1) for end in {e[2][1] for e in entries}}
        if len(said) == 1:
            result, = said.values()
            return (entries if result & TriggerResult.FIRE else []), (entries if result & TriggerResult.PURGE else [])
        return ([e for e in entries if said[e[2][1]] & TriggerResult.FIRE],
                [e for e in entries if said[e[2][1]] & TriggerResult.PURGE])

    # ------------------------------------------------------------------ checkpoints and metrics
    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        handle: dict[str, Any] = {"watermark": self.watermark}
        self.contents.snapshot(handle)
        return OperatorSnapshot(handle, keyed=self.backend.snapshot())

    def restore_state(self, handles: list[dict]) -> None:
        super().restore_state(handles)
        # the smallest: a subtask that had seen less would otherwise skip rows as late
        self.watermark = min((h.get("watermark", NO_WATERMARK) for h in handles), default=NO_WATERMARK)
        self.timers.restore()
        self.contents.restore(handles)
        # per-key window state where blocks are expected (or the reverse) would never fire: say so
        blocks = self.contents.blocks
        for domain in (EVENT_TIME, PROCESSING_TIME):
            odd = next((t for t in self.timers.timers(domain) if (t.key == BLOCK) != blocks), None)
            if odd is not None:
                layout = "per (key group, window) blocks" if blocks else "per (key, window) entries"
                raise ValueError(f"{self.spec.where()}: the restored window state is not kept as {layout}, as this "
                                 f"{self.params['assigner'].get('type')} {self.function} window keeps it (a timer "
                                 f"of key {odd.key!r}): it was written by another window operator or another "
                                 "version of it")

    def metrics(self) -> dict:
        """Any thread (the timers' ``earliest`` reads copies)."""
        figures = {NUM_LATE_RECORDS_DROPPED: self.late.dropped, NEWEST_EVENT_TIMESTAMP: self.newest,
                   LATE_ROWS: self.late.report()}
        if self.trigger.domain == EVENT_TIME:
            # a window's fire timer is at its last instant (its clean-up timer, with lateness, later)
            fires = self.timers.earliest(EVENT_TIME, lambda at, window: at == window[1] - 1)
            if fires is not None:
                figures[OLDEST_OPEN_WINDOW] = [int(fires[1][0]), int(fires[1][1])]
        return figures
