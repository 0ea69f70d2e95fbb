"""The window join of two keyed streams (Flink's window join, a coGroup on windows).

The cross product of both sides' rows of a key and window, emitted when the watermark reaches
the window's end - 1, with window_start and window_end; a row all of whose windows have fired is
late. What the joins share is cluster.operators.joins. Thread use: the task thread only.
"""
from __future__ import annotations

from typing import Optional, Union

import numpy as np
import pyarrow as pa

from cluster.graph.windows import SessionWindows, SlidingWindows, TumblingWindows, assigner_of
from cluster.operators.join_state import Chunks, by_key_group, concat
from cluster.operators.joins import LEFT, RIGHT, SIDES, JoinOperator
from cluster.operators.timers import EVENT_TIME


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
        if not alive.all():
            late = ~alive
            self.late.record(table.filter(pa.array(late)), ts[late], self.watermark, False, SIDES[side])
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
