"""The bottleneck of a job, named (GET /jobs/<id>/bottleneck, the dashboard's header): the vertex
that limits the job by Flink's rule of thumb (busy, and not back-pressured itself:
cluster.protocol.metrics.busiest_free), its busy share, whether it is chronic (the bottleneck in
most reports of the last minutes) or transient, and what usually helps: more parallelism for a
vertex busy on its own work; the system a sink writes to; a skewed key when one subtask is busy
and its siblings are not, naming the key group that the upstream tasks sent the most rows to.

BottleneckHistory keeps what each metrics report showed; ``report`` is pure (graph, metrics,
history, time in).

Thread use: the JobManager's loop thread (the JobMaster's metrics reports and the REST views).
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Optional

from cluster.graph.event_time import duration_text
from cluster.graph.job_graph import JobGraph, ShipStrategy
from cluster.graph.operator_kinds import KINDS, Role
from cluster.protocol.metrics import BOTTLENECK_BUSY, KEY_GROUP_ROWS_OUT, busiest_free
from cluster.state.key_groups import key_group_range

Metrics = dict[tuple[str, int], dict]  # (vertex id, subtask) -> that subtask's latest metrics
HISTORY_MS = 180_000   # the minutes a bottleneck is judged over
CHRONIC_SPAN_MS = 60_000  # it is chronic once the reports cover at least this long ...
CHRONIC_SHARE = 0.8    # ... and name it in at least this share of them
SKEW_RATIO = 0.5       # one subtask busy, every sibling at most half as busy: a skewed key


@dataclass(frozen=True)
class Load:
    vertex_id: str
    name: str
    busy: list[float]           # per subtask, shares of time
    backpressured: list[float]


def loads(graph: JobGraph, metrics: Metrics) -> list[Load]:
    out = []
    for vertex in graph.vertices:
        figures = [metrics.get((vertex.id, i), {}) for i in range(vertex.parallelism)]
        out.append(Load(vertex.id, vertex.name, [f.get("busyTimeMsPerSecond", 0.0) / 1000 for f in figures],
                        [f.get("backPressuredTimeMsPerSecond", 0.0) / 1000 for f in figures]))
    return out


def current(graph: JobGraph, metrics: Metrics) -> Optional[Load]:
    every = loads(graph, metrics)
    vertex = busiest_free([(load.vertex_id, max(load.busy), max(load.backpressured)) for load in every])
    return next((load for load in every if load.vertex_id == vertex), None)


class BottleneckHistory:
    def __init__(self) -> None:
        self.samples: deque[tuple[int, Optional[str]]] = deque()

    def observe(self, now_ms: int, vertex_id: Optional[str]) -> None:
        self.samples.append((now_ms, vertex_id))
        while self.samples and self.samples[0][0] < now_ms - HISTORY_MS:
            self.samples.popleft()

    def held(self, vertex_id: str, now_ms: int) -> tuple[float, int]:
        """The share of the last minutes' reports that named ``vertex_id``, and how long they span."""
        recent = [(t, v) for t, v in self.samples if t >= now_ms - HISTORY_MS]
        if not recent:
            return 0.0, 0
        return sum(v == vertex_id for _, v in recent) / len(recent), recent[-1][0] - recent[0][0]


def _skew(graph: JobGraph, metrics: Metrics, load: Load) -> Optional[dict]:
    if len(load.busy) < 2:
        return None
    hot = max(range(len(load.busy)), key=lambda i: load.busy[i])
    siblings = max(b for i, b in enumerate(load.busy) if i != hot)
    if load.busy[hot] < BOTTLENECK_BUSY or siblings > load.busy[hot] * SKEW_RATIO:
        return None
    vertex = graph.vertex(load.vertex_id)
    sent: Counter[int] = Counter()
    total = 0
    for index, edge in graph.inputs_of(vertex.id):
        if edge.ship_strategy != ShipStrategy.HASH:
            continue
        for (source, _), figures in metrics.items():
            if source == edge.source and str(index) in figures.get(KEY_GROUP_ROWS_OUT, {}):
                rows, top = figures[KEY_GROUP_ROWS_OUT][str(index)]
                total += rows
                sent.update(dict(top))
    mine = key_group_range(vertex.max_parallelism, len(load.busy), hot)
    groups = {group: n for group, n in sent.items() if group in mine}
    skew = {"subtask": hot, "busy": round(load.busy[hot], 3), "siblings-busy": round(siblings, 3),
            "key-group": None, "key-group-share": None}
    if groups and total:
        group = max(groups, key=lambda g: (groups[g], -g))
        skew.update({"key-group": group, "key-group-share": round(groups[group] / total, 3)})
    return skew


def report(graph: JobGraph, metrics: Metrics, history: BottleneckHistory, now_ms: int) -> dict:
    """GET /jobs/<id>/bottleneck: the vertex, its shares, chronic or transient, skew, and what helps."""
    load = current(graph, metrics)
    if load is None:
        return {"vertex-id": None, "name": None, "text": "Nothing holds the job back: no vertex is busy at least "
                f"{BOTTLENECK_BUSY:.0%} of the time without being back-pressured."}
    share, span = history.held(load.vertex_id, now_ms)
    chronic = span >= CHRONIC_SPAN_MS and share >= CHRONIC_SHARE
    busy = max(load.busy)
    skew = _skew(graph, metrics, load)
    vertex = graph.vertex(load.vertex_id)
    sink = KINDS[vertex.operators[-1].kind].role is Role.SINK
    when = (f"{'chronic' if chronic else 'transient so far'}: the bottleneck in {share:.0%} of the reports of "
            f"the last {duration_text(span)}")
    text = f"'{load.name}' limits the job, busy {busy:.0%} of the time and not back-pressured ({when}). "
    if skew is not None:
        where = "" if skew["key-group"] is None else (
            f"; key group {skew['key-group']} carries {skew['key-group-share']:.0%} of the rows sent to it")
        text += (f"A skewed key: subtask {skew['subtask']} is busy {skew['busy']:.0%} while its siblings are at "
                 f"most {skew['siblings-busy']:.0%}{where}. More parallelism does not spread one key: aggregate "
                 "before the key_by, or salt the hot key.")
    elif sink:
        text += ("It ends in a sink: the system it writes to, or how it writes, is the limit; more parallelism "
                 "helps if that system takes parallel writes.")
    else:
        text += "More parallelism for it helps (or a cheaper function in it)."
    return {"vertex-id": load.vertex_id, "name": load.name, "busy": round(busy, 3),
            "backpressured": round(max(load.backpressured), 3), "chronic": chronic, "share": round(share, 3),
            "over-ms": span, "skew": skew, "sink": sink, "text": text}
