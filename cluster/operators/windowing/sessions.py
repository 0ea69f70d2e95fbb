"""Session windows' merging: Flink's MergingWindowSet, per key, over whole batches.

Each key's session windows are in keyed state SESSION_STATE (a sorted tuple of (start, end)).
Rows are placed one by one in arrival order (a row's window [ts, ts + gap) merges with every
window it overlaps or touches); the windows merged away move their contents into the covering
one (the contents' ``merge``) and lose their timers (the trigger's ``timer_times``). A row whose
covering window is already late is skipped (anything it could merge with is gone).

Thread use: the owning operator's task thread only.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from cluster.graph.windows import SessionWindows, TimeWindow, merge_windows
from cluster.operators.timers import EVENT_TIME, TimerService
from cluster.operators.windowing.contents import WINDOW_STATE, WindowContents, WindowScope
from cluster.operators.windowing.triggers import Trigger

SESSION_STATE = "window-sessions"


class MergingWindowSet:
    def __init__(self, assigner: SessionWindows, scope: WindowScope, contents: WindowContents,
                 trigger: Trigger, timers: TimerService):
        self.gap = assigner.gap
        self.scope, self.contents, self.trigger, self.timers = scope, contents, trigger, timers

    def place(self, frame: pd.DataFrame, ts: np.ndarray, watermark: int):
        """(row index, window start, window end) of every row placed, and which rows were
        skipped (their window is late)."""
        key, backend = self.scope.key, self.scope.backend
        if key:
            codes = frame.groupby(key, sort=False, dropna=False).ngroup().to_numpy()
        else:
            codes = np.zeros(len(frame), dtype=np.int64)
        first = np.unique(codes, return_index=True)[1]
        groups, keys, _ = self.scope.slots(frame.iloc[first][key].assign(window_start=0, window_end=0))
        old_sets = backend.get_many(SESSION_STATE, groups, keys)
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(len(first) + 1))
        starts = np.zeros(len(ts), dtype=np.int64)
        ends = np.zeros(len(ts), dtype=np.int64)
        skipped = np.zeros(len(ts), dtype=bool)
        # as before the trigger was split out: a processing-time session window is never late
        # (a tumbling or sliding one is once a watermark passes it: the trigger's is_late alone)
        event_time = self.trigger.domain == EVENT_TIME
        new_sets, moves = [], []  # moves: (key group, key, window merged away, the window it went into)
        for g in range(len(first)):
            windows = [TimeWindow(*w) for w in old_sets[g] or ()]
            existing = set(windows)
            into: dict[TimeWindow, TimeWindow] = {}
            placed = []
            for i in order[bounds[g]:bounds[g + 1]].tolist():
                window = TimeWindow(int(ts[i]), int(ts[i]) + self.gap)
                cover, members = next((c, m) for c, m in merge_windows(windows + [window]) if window in m)
                if event_time and self.trigger.is_late(cover.max_timestamp, watermark):
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
        backend.put_many(SESSION_STATE, groups, keys, new_sets)
        if moves:
            self._move_windows(moves)
        rows = np.flatnonzero(~skipped)
        return rows, starts[rows], ends[rows], skipped

    def _move_windows(self, moves: list) -> None:
        """Merges the contents of session windows merged away into their covering windows."""
        backend = self.scope.backend
        olds = backend.get_many(WINDOW_STATE, [g for g, _, _, _ in moves], [(k, *w) for _, k, w, _ in moves])
        targets: dict[tuple, Any] = {}
        for (group, key, window, target), old in zip(moves, olds):
            for timestamp in self.trigger.timer_times(window.max_timestamp):
                self.timers.delete(self.trigger.domain, group, key, timestamp, tuple(window))
            backend.put(WINDOW_STATE, group, (key, *window), None)
            if old is None:
                continue
            at = (group, key, target)
            if at not in targets:
                targets[at] = backend.get(WINDOW_STATE, group, (key, *target))
            targets[at] = old if targets[at] is None else self.contents.merge(targets[at], old)
        for (group, key, target), value in targets.items():
            backend.put(WINDOW_STATE, group, (key, *target), value)

    def forget(self, groups: list, keys: list, starts: list, ends: list) -> None:
        """Drops purged windows from their keys' sets."""
        by_key: dict[tuple, set] = {}
        for group, key, start, end in zip(groups, keys, starts, ends):
            by_key.setdefault((group, key), set()).add(TimeWindow(start, end))
        groups = [g for g, _ in by_key]
        keys = [k for _, k in by_key]
        sets = self.scope.backend.get_many(SESSION_STATE, groups, keys)
        kept = [tuple(w for w in (s or ()) if TimeWindow(*w) not in gone) or None
                for s, gone in zip(sets, by_key.values())]
        self.scope.backend.put_many(SESSION_STATE, groups, keys, kept)
