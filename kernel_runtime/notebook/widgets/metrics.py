"""What the dashboard derives from the JobManager's answers: rates, time shares, Flink's grades.

Plain classes without widgets or sockets: fed ``job_details()`` dicts with a timestamp, they
answer per vertex. Time shares are Flink's ``busyTimeMsPerSecond``,
``backPressuredTimeMsPerSecond`` and ``idleTimeMsPerSecond`` when the TaskManagers report them,
else derived from the cumulative ``busy-ms``, ``backpressured-ms`` and ``idle-ms``. A vertex
shows the three shares of one of its subtasks, so they add up as each subtask's do.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple, Optional

from cluster.graph.operator_kinds import source_ends
from cluster.graph.event_time import MAX_WATERMARK, NO_WATERMARK
from cluster.protocol.metrics import (CURRENT_OUTPUT_WATERMARK, NEWEST_EVENT_TIMESTAMP, NUM_LATE_RECORDS_DROPPED,
                                      backpressure_level as rest_backpressure_level, busiest_free)

PER_SECOND = {"busy": "busyTimeMsPerSecond", "backpressured": "backPressuredTimeMsPerSecond",
              "idle": "idleTimeMsPerSecond"}
CUMULATIVE = {"busy": "busy-ms", "backpressured": "backpressured-ms", "idle": "idle-ms"}


def backpressure_level(ratio: float) -> str:
    """The grade as the dashboard shows it, Flink's web UI's OK / LOW / HIGH (REST says ok/low/high)."""
    return rest_backpressure_level(ratio).upper()


class RateMeter:
    """The rate of a growing counter, over a sliding window of samples (smooths the steps of
    metrics that arrive once per heartbeat while the dashboard polls more often)."""

    def __init__(self, window_s: float = 2.0):
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, t: float, value: float) -> float:
        if self._samples and value < self._samples[-1][1]:
            self._samples.clear()  # the counter restarted (a new attempt)
        self._samples.append((t, value))
        while len(self._samples) > 2 and t - self._samples[1][0] >= self.window_s:
            self._samples.popleft()
        t0, v0 = self._samples[0]
        return (value - v0) / (t - t0) if t > t0 else 0.0


@dataclass(frozen=True)
class VertexStats:
    vertex_id: str
    name: str
    parallelism: int
    status: str
    records_in: int
    records_out: int
    in_rate: float  # records per second
    out_rate: float
    # shares of time, 0..1, adding up to 1: those of the vertex's most back-pressured subtask (the
    # one Flink grades the vertex by), the busiest if none is; of its running subtasks, or once
    # none runs, the last figures its subtasks reported
    busy: float
    backpressured: float
    idle: float
    # the highest busy share of its subtasks: with the back-pressured share above (the highest too),
    # what Flink's job graph colours a vertex by ("Busy (max)", "Backpressured (max)")
    busy_max: float = 0.0
    # of records_out: the rows its sinks delivered (Flink's numRecordsSend); the rest went to
    # other tasks. A sink's vertex sends nothing on, so without it it would show 0 out
    records_sent: int = 0

    @property
    def level(self) -> str:
        """OK, LOW or HIGH, as Flink's web UI shows it."""
        return backpressure_level(self.backpressured)

    @property
    def load_color(self) -> str:
        return load_color(self.busy_max, self.backpressured)


class JobMetrics:
    """Follows one job's subtask metrics from one job_details() answer to the next."""

    def __init__(self, window_s: float = 2.0):
        self.window_s = window_s
        self._meters: dict[tuple, RateMeter] = {}

    def _rate(self, key: tuple, t: float, value: float) -> float:
        meter = self._meters.get(key)
        if meter is None:
            meter = self._meters[key] = RateMeter(self.window_s)
        return meter.add(t, value)

    def _shares(self, t: float, subtask: dict) -> Optional[dict[str, float]]:
        """The subtask's busy, back-pressured and idle shares (adding up to 1); None before it
        reported any."""
        metrics = subtask.get("metrics") or {}
        if all(k in metrics for k in PER_SECOND.values()):
            return shares({name: metrics[k] for name, k in PER_SECOND.items()})
        if not any(k in metrics for k in CUMULATIVE.values()):
            return None
        key = (subtask["vertex_id"], subtask["subtask"], subtask.get("attempt", 0))
        return shares({name: self._rate(key + (k,), t, metrics.get(k, 0)) for name, k in CUMULATIVE.items()})

    def observe(self, t: float, details: dict) -> list[VertexStats]:
        by_vertex: dict[str, list[dict]] = {}
        for subtask in details.get("subtasks", []):
            by_vertex.setdefault(subtask["vertex_id"], []).append(subtask)
        stats = []
        for vertex in details.get("vertices", []):
            subtasks = by_vertex.get(vertex["id"], [])
            records_in = sum((s.get("metrics") or {}).get("records-in", 0) for s in subtasks)
            records_sent = sum((s.get("metrics") or {}).get("records-sent", 0) for s in subtasks)
            records_out = records_sent + sum((s.get("metrics") or {}).get("records-out", 0) for s in subtasks)
            running = [s for s in subtasks if s.get("status") == "RUNNING"]
            # an ended job keeps the figures its subtasks last reported, not zeros
            measured = [sh for s in running or subtasks if (sh := self._shares(t, s)) is not None]
            shown = max(measured, key=lambda sh: (sh["backpressured"], sh["busy"]), default=NO_SHARES)
            busy_max = max((sh["busy"] for sh in measured), default=0.0)
            stats.append(VertexStats(
                vertex_id=vertex["id"], name=vertex["name"], parallelism=vertex["parallelism"],
                status=vertex.get("status", ""), records_in=records_in, records_out=records_out,
                in_rate=self._rate((vertex["id"], "in"), t, records_in),
                out_rate=self._rate((vertex["id"], "out"), t, records_out), busy_max=busy_max,
                records_sent=records_sent, **shown))
        return stats


def load_colors(busy: float, backpressured: float) -> tuple[str, str]:
    """A vertex's fill as Flink's job graph colours it, and the text that reads on it (white on the
    dark ones): the bottleneck, busy, red; an operator that waits for it, back-pressured, dark grey
    to black; an idle one blue; shades between. Shares 0..1."""
    if backpressured > busy:
        return f"hsl(0, 0%, {round(85 - 65 * backpressured)}%)", "white" if backpressured > 0.5 else "black"
    return f"hsl({round(210 * (1 - busy))}, 75%, {round(82 - 30 * busy)}%)", "white" if busy > 0.7 else "black"


def load_color(busy: float, backpressured: float) -> str:
    return load_colors(busy, backpressured)[0]


def bottleneck(stats: list[VertexStats]) -> Optional[str]:
    """The vertex that holds the job back, if one does (cluster.protocol.metrics.busiest_free)."""
    return busiest_free([(s.vertex_id, s.busy_max, s.backpressured) for s in stats])


NO_SHARES = {"busy": 0.0, "backpressured": 0.0, "idle": 0.0}


def shares(amounts: dict[str, float]) -> dict[str, float]:
    """Busy, back-pressured and idle amounts of time (any unit, e.g. ms per second) as shares
    that add up to 1: a TaskManager's per-second figures add up to 1000 but for rounding, rates
    of the cumulative counters only about so."""
    amounts = {name: max(0.0, float(amounts.get(name, 0.0))) for name in NO_SHARES}
    total = sum(amounts.values())
    return {name: value / total for name, value in amounts.items()} if total > 0 else dict(NO_SHARES)


class SourceProgress(NamedTuple):
    rows: int  # the rows the sources took in, for the job as a whole
    total: Optional[int]  # the rows they will take in all, if known
    bounded: bool  # every source ends (a count, files without watching, a bounded stream)


def source_progress(job_graph, stats: list[VertexStats]) -> Optional[SourceProgress]:
    """The rows the sources took in, and how many they will take in all when that is known
    (generators with a count); None without a job graph.

    A source task counts the rows it takes from its source as records in, whatever the chain
    after it does with them; a restored attempt counts on from its checkpoint's figures."""
    if job_graph is None:
        return None
    sources = {v.id: v.operators[0] for v in job_graph.vertices if v.is_source}
    done = sum(s.records_in for s in stats if s.vertex_id in sources)
    bounded = all(source_ends(op.kind, op.params) for op in sources.values())
    counts: list[Optional[int]] = [op.params.get("count") if op.kind == "generator-source" else None
                                   for op in sources.values()]
    total = None if any(c is None for c in counts) else sum(c for c in counts if c is not None)
    return SourceProgress(done, total, bounded)


@dataclass(frozen=True)
class VertexEventTime:
    vertex_id: str
    name: str
    # the vertex's low watermark, as Flink's web UI shows it: the minimum over its subtasks'
    # currentOutputWatermark (NO_WATERMARK while one has none yet, MAX_WATERMARK at the end of input)
    watermark: int
    # how far the watermark trails the newest event time of the job, ms; None when either is unknown
    # or the vertex's input has ended
    lag_ms: Optional[int]
    late_dropped: int  # numLateRecordsDropped, over its subtasks


@dataclass(frozen=True)
class JobEventTime:
    newest: Optional[int]  # the newest event time seen in the job (epoch ms), None before any
    vertices: list[VertexEventTime]


def event_time(details: dict) -> Optional[JobEventTime]:
    """Watermarks, lag and late records per vertex, from job_details() (or the events' summary of
    it); None for a job without event time: no watermark of any task has moved and no operator saw
    an event time (the end of input alone, MAX_WATERMARK, is no sign of event time: every bounded
    job's sources send it)."""
    by_vertex: dict[str, list[dict]] = {}
    for subtask in details.get("subtasks", []):
        by_vertex.setdefault(subtask["vertex_id"], []).append(subtask.get("metrics") or {})
    every = [metrics for subtasks in by_vertex.values() for metrics in subtasks]
    newest = max((t for ms in every if (t := ms.get(NEWEST_EVENT_TIMESTAMP, NO_WATERMARK)) > NO_WATERMARK),
                 default=None)
    if newest is None and not any(NO_WATERMARK < ms.get(CURRENT_OUTPUT_WATERMARK, NO_WATERMARK) < MAX_WATERMARK
                                  for ms in every):
        return None
    vertices = []
    for vertex in details.get("vertices", []):
        subtasks = by_vertex.get(vertex["id"], [])
        # a subtask that has not reported yet has no watermark yet either
        watermark = min((ms.get(CURRENT_OUTPUT_WATERMARK, NO_WATERMARK) for ms in subtasks), default=NO_WATERMARK)
        lag = None
        if newest is not None and NO_WATERMARK < watermark < MAX_WATERMARK:
            # never below 0: the newest event time and the watermark come in heartbeats of
            # different TaskManagers, a newer watermark may meet an older newest event time
            lag = max(0, newest - watermark)
        vertices.append(VertexEventTime(vertex["id"], vertex["name"], watermark, lag,
                                        sum(ms.get(NUM_LATE_RECORDS_DROPPED, 0) for ms in subtasks)))
    return JobEventTime(newest, vertices)
