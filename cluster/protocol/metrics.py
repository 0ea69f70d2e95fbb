"""What the task metrics in heartbeats mean to their readers (the REST API, the dashboard)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


# Flink's rule of thumb for the vertex that limits a job: busy, and not back-pressured itself (what
# waits for it upstream is back-pressured, and is not the problem); here, busy at least half the time
BOTTLENECK_BUSY = 0.5


def busiest_free(vertices: list[tuple[str, float, float]]) -> Optional[str]:
    """The bottleneck among (vertex id, highest busy share, highest back-pressured share of its
    subtasks): the busiest vertex graded "ok" for back pressure, if busy at least BOTTLENECK_BUSY.
    The dashboard and GET /jobs/<id>/bottleneck both name the vertex this gives."""
    free = [(busy, vertex) for vertex, busy, backpressured in vertices
            if backpressure_level(backpressured) == "ok" and busy >= BOTTLENECK_BUSY]
    return max(free, key=lambda f: f[0])[1] if free else None


def backpressure_level(ratio: float) -> str:
    """Flink's grading of the share of time a subtask was back-pressured, with the names of its
    REST API: "ok" up to 10 %, "low" up to 50 %, "high" above."""
    return "ok" if ratio <= 0.10 else "low" if ratio <= 0.5 else "high"


# A task's counters, as its metrics name them. They are part of its checkpoint (acknowledged
# under CHECKPOINTED_COUNTERS beside the operators' state handles, kept in ``_metadata`` apart
# from them) so that a restored attempt counts on from what the checkpoint covered: the job's
# figures are then those of one run without failures, exactly once, as its output is.
# records-sent: the rows its sinks were given to deliver (Flink's sink metric numRecordsSend), which
# records-out (what went to other tasks) does not count: a sink's vertex would show 0 out
COUNTERS = ("records-in", "records-out", "bytes-in", "bytes-out", "records-sent")
CHECKPOINTED_COUNTERS = "@task-counters"  # never an operator uid (those are hex digests)


def restored_counters(entries: list[dict], subtask: int, parallelism: int) -> dict[str, int]:
    """A subtask's counters from its vertex's ``entries`` at a checkpoint (each with the
    ``subtask`` and ``parallelism`` that took it): its own at the same parallelism; after a
    rescale, the sum of those of old subtask i with i % parallelism == subtask, so that the
    vertex's totals stay what they were."""
    restored = dict.fromkeys(COUNTERS, 0)
    for entry in entries:
        if entry["subtask"] % parallelism == subtask:
            for name in COUNTERS:
                restored[name] += int(entry.get(name, 0))
    return restored


# Event time, with Flink's metric names (MetricNames.IO_CURRENT_INPUT_WATERMARK, ...): every
# task reports its input and output watermark (int epoch ms, NO_WATERMARK before the first);
# window, join and timestamp operators add the records they dropped as late and the largest
# event time they saw.
CURRENT_INPUT_WATERMARK = "currentInputWatermark"
CURRENT_OUTPUT_WATERMARK = "currentOutputWatermark"
NUM_LATE_RECORDS_DROPPED = "numLateRecordsDropped"
NEWEST_EVENT_TIMESTAMP = "newestEventTimestamp"
EVENT_TIME_METRICS = (CURRENT_INPUT_WATERMARK, CURRENT_OUTPUT_WATERMARK, NUM_LATE_RECORDS_DROPPED,
                      NEWEST_EVENT_TIMESTAMP)
# streamlab's own, for what holds a window back (cluster.jobmanager.rest.window_waits): a task's input
# channels' watermarks, {"<edge>/<producer subtask>": [watermark, idle]}; whether its output is
# idle; a window operator's oldest window not yet fired, [start, end] (epoch ms)
INPUT_WATERMARKS = "inputWatermarks"
OUTPUT_IDLE = "outputIdle"
OLDEST_OPEN_WINDOW = "oldestOpenWindow"


def split_watermarks(metrics: dict) -> dict[str, tuple[int, bool]]:
    """A source subtask's splits read at once (Kafka partitions): each one's watermark and idleness,
    from its metrics ``split.<split>.currentWatermark`` and ``split.<split>.idle`` (the
    timestamps operator's, Flink's per-split watermark names)."""
    out = {}
    for name, value in metrics.items():
        if name.startswith("split.") and name.endswith(".currentWatermark"):
            split = name[len("split."):-len(".currentWatermark")]
            out[split] = (int(value), bool(metrics.get(f"split.{split}.idle", False)))
    return out


# streamlab's own: a sink task's end-to-end latency, rows per bucket over the last interval
# (cluster.protocol.latency), {"<bucket>": rows}
LATENCY = "latencyBuckets"
EVENT_TIME_LAG = "eventTimeLagBuckets"  # the same of its rows' event-time lag, where they carry event time
# streamlab's own, for a hot key (cluster.jobmanager.jobmaster.bottleneck): per hash edge a task writes to,
# the rows it sent and the key groups it sent the most, {"<edge>": [rows, [[key group, rows], ...]]}
KEY_GROUP_ROWS_OUT = "keyGroupRowsOut"
# streamlab's own: per operator uid that finds rows late, how many and the newest few of them
# (cluster.operators.late_rows.LateRows.report), for the dashboard and JobHandle.late_rows
LATE_ROWS = "late-rows"


@dataclass(frozen=True)
class OperatorLateRows:
    """An operator's late rows over its subtasks: the ``late-rows`` reports added up."""
    uid: str
    name: str
    count: int                  # every late row
    dropped: int                # those not sent to a side output
    side_output: Optional[str]  # its late side output's tag, None when late rows are dropped
    schema: dict                # column -> Arrow type (text) of the sampled rows
    sample: list                # the newest reported entries, oldest first, each with its "subtask"


def late_rows(subtasks: list[dict]) -> list[OperatorLateRows]:
    """Per operator that finds rows late (windows, joins), from job details' ``subtasks`` (each
    with ``subtask`` and ``metrics``), in the order the operators first appear."""
    reports: dict[str, list[tuple[int, dict]]] = {}
    for subtask in subtasks:
        for uid, report in ((subtask.get("metrics") or {}).get(LATE_ROWS) or {}).items():
            reports.setdefault(uid, []).append((subtask.get("subtask", 0), report))
    out = []
    for uid, entries in reports.items():
        first = entries[0][1]
        sample = sorted(({**row, "subtask": subtask} for subtask, report in entries for row in report["sample"]),
                        key=lambda row: (row["at"], row["subtask"]))
        out.append(OperatorLateRows(uid, first["name"], sum(r["count"] for _, r in entries),
                                    sum(r["dropped"] for _, r in entries), first["side_output"],
                                    next((r["schema"] for _, r in entries if r["schema"]), {}), sample))
    return out
