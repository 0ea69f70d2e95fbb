"""Timers per key, in event time and processing time: Flink's InternalTimerService.

A timer is (timestamp, key, namespace): the window operator's namespace is its window (start,
end), a process function's is None. Registering the same timer twice keeps one. Event-time timers
fire when the watermark reaches their timestamp, processing-time ones when the wall clock does,
in timestamp order.

Timers live in the operator's keyed state backend (one state per domain, keyed by
(key, timestamp, namespace) under the key's key group, which is also the value), so they are checkpointed, restored and
rescaled with the rest of its state, by either backend. An index in memory (times in a heap, the
timers of each time in a set) answers "what is due" without scanning the backend; ``restore``
rebuilds it from the backend after the backend restored.

It sits beside the core operators, not in windowing/: as Flink's InternalTimerService it is the
keyed operators' facility (a process function's timers, the joins' state expiry) that the window
operator uses too, so keyed operators need not import windowing.

Thread use: the owning operator's task thread only.
"""
from __future__ import annotations

import heapq
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence

EVENT_TIME, PROCESSING_TIME = "event", "processing"
DOMAINS = (EVENT_TIME, PROCESSING_TIME)


class Timer(NamedTuple):
    timestamp: int
    key_group: int
    key: Any
    namespace: Any


class _Index:
    """Timers by time: a heap of times (a time may be in it more than once, or stale) and the
    pending timers of each time."""

    def __init__(self) -> None:
        self.times: list[int] = []
        self.at: dict[int, set[tuple[int, Any, Any]]] = {}

    def add(self, timestamp: int, entry: tuple[int, Any, Any]) -> None:
        pending = self.at.get(timestamp)
        if pending is None:
            pending = self.at[timestamp] = set()
            heapq.heappush(self.times, timestamp)
        pending.add(entry)

    def add_many(self, timestamp: int, entries: set) -> None:
        pending = self.at.get(timestamp)
        if pending is None:
            self.at[timestamp] = set(entries)
            heapq.heappush(self.times, timestamp)
        else:
            pending.update(entries)

    def remove(self, timestamp: int, entry: tuple[int, Any, Any]) -> bool:
        pending = self.at.get(timestamp)
        if pending is None or entry not in pending:
            return False
        pending.discard(entry)
        if not pending:
            del self.at[timestamp]  # its time stays in the heap until popped: skipped then
        return True

    def pop_until(self, until: int) -> list[tuple[int, list[tuple[int, Any, Any]]]]:
        due = []
        while self.times and self.times[0] <= until:
            timestamp = heapq.heappop(self.times)
            entries = self.at.pop(timestamp, None)
            if entries:
                due.append((timestamp, _in_order(entries)))
        return due

    def next_time(self) -> Optional[int]:
        while self.times and self.times[0] not in self.at:
            heapq.heappop(self.times)
        return self.times[0] if self.times else None

    def __len__(self) -> int:
        return sum(len(p) for p in self.at.values())


def _in_order(entries: set) -> list:
    """Timers of one time in a fixed order (key group, key, namespace); by their repr where keys of
    several types do not compare."""
    try:
        return sorted(entries)
    except TypeError:
        return sorted(entries, key=repr)


class TimerService:
    def __init__(self, backend, name: str = "timers"):
        self.backend = backend
        self._states = {domain: f"_{name}/{domain}" for domain in DOMAINS}
        self._index = {domain: _Index() for domain in DOMAINS}

    def register(self, domain: str, key_group: int, key, timestamp: int, namespace=None) -> None:
        self.register_many(domain, [key_group], [key], [timestamp], [namespace])

    def register_many(self, domain: str, key_groups: Sequence[int], keys: Sequence,
                      timestamps: Sequence[int], namespaces: Sequence) -> None:
        index = self._index[domain]
        timestamps = [int(t) for t in timestamps]
        if len({len(key_groups), len(keys), len(timestamps), len(namespaces)}) != 1:
            raise ValueError("register_many: key groups, keys, timestamps and namespaces differ in length")
        by_time: dict[int, list] = {}
        if len(set(timestamps)) == 1:  # the usual: the keys of one window
            by_time[timestamps[0]] = list(zip(key_groups, keys, namespaces))
        else:
            for key_group, key, timestamp, namespace in zip(key_groups, keys, timestamps, namespaces):
                by_time.setdefault(timestamp, []).append((key_group, key, namespace))
        for timestamp, entries in by_time.items():
            # many timers share a time (a window's keys): the new ones by set difference, in C
            pending = index.at.get(timestamp)
            new = set(entries) - pending if pending is not None else set(entries)
            if not new:
                continue
            index.add_many(timestamp, new)
            added = list(new)
            groups = [group for group, _, _ in added]
            self.backend.put_many(self._states[domain], groups,
                                  [(key, timestamp, namespace) for _, key, namespace in added], groups)  # the value: its key group

    def delete(self, domain: str, key_group: int, key, timestamp: int, namespace=None) -> None:
        if self._index[domain].remove(int(timestamp), (key_group, key, namespace)):
            self.backend.put(self._states[domain], key_group, (key, int(timestamp), namespace), None)

    def pop_due(self, domain: str, until: int) -> list[Timer]:
        """The timers with timestamp <= ``until``, in timestamp order, removed."""
        return [Timer(timestamp, *entry) for timestamp, entries in self.pop_due_by_time(domain, until)
                for entry in entries]

    def pop_due_by_time(self, domain: str, until: int) -> list[tuple[int, list[tuple[int, Any, Any]]]]:
        """The same, as (timestamp, [(key group, key, namespace), ...]) per time: no Timer per
        timer, for an operator firing many at once (a window's keys)."""
        due = self._index[domain].pop_until(until)
        for timestamp, entries in due:
            self.backend.put_many(self._states[domain], [group for group, _, _ in entries],
                                  [(key, timestamp, namespace) for _, key, namespace in entries], [None] * len(entries))
        return due

    def next_time(self, domain: str) -> Optional[int]:
        return self._index[domain].next_time()

    def earliest(self, domain: str, wanted: Callable[[int, Any], bool]) -> Optional[tuple[int, Any]]:
        """(time, namespace) of the earliest pending timer for which ``wanted(time, namespace)``.
        Any thread: it reads copies (the heap's list and each time's set, each copied in one step
        under the GIL), so it may miss what the task thread adds meanwhile; stale times are skipped."""
        index = self._index[domain]
        for timestamp in sorted(set(index.times)):
            for _, _, namespace in set(index.at.get(timestamp, ())):
                if wanted(timestamp, namespace):
                    return timestamp, namespace
        return None

    def pending(self, domain: str) -> int:
        return len(self._index[domain])

    def restore(self) -> None:
        """Rebuild the index from the backend, after it restored."""
        for domain in DOMAINS:
            index = self._index[domain] = _Index()
            for (key, timestamp, namespace), key_group in self.backend.items(self._states[domain]):
                index.add(timestamp, (key_group, key, namespace))

    def timers(self, domain: str) -> Iterable[Timer]:
        """Every pending timer of the domain, in no particular order (for tests and views)."""
        for timestamp, pending in self._index[domain].at.items():
            for key_group, key, namespace in pending:
                yield Timer(timestamp, key_group, key, namespace)
