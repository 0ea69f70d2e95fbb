"""The views that answer rather than gauge (streamlab's own, beside Flink's): the bottleneck named,
the late rows seen, the end-to-end latency; GET /jobs/<id> carries them too, and so the dashboard.
Each takes the job's JobMaster. Loop thread only, as every view."""
from __future__ import annotations

from cluster.common.clock import now_ms
from cluster.graph.event_time import MAX_WATERMARK, NO_WATERMARK
from cluster.jobmanager.jobmaster.bottleneck import report as bottleneck_report
from cluster.protocol.latency import merged, percentiles
from cluster.protocol.metrics import CURRENT_INPUT_WATERMARK, LATENCY, late_rows


def latency_json(job) -> dict:
    """The job's end-to-end latency, ms: p50, p90 and p99 over its sinks' rows of the last 5-10 s
    (None before any), the rows they cover; and its event-time lag, how far the sinks' lowest
    watermark trails the wall clock (None without event time)."""
    sinks = [e.metrics for e in job.graph.executions.values() if LATENCY in e.metrics]
    buckets = merged([m[LATENCY] for m in sinks])
    p50, p90, p99 = percentiles(buckets) or (None, None, None)
    marks = [m.get(CURRENT_INPUT_WATERMARK, NO_WATERMARK) for m in sinks]
    lag = None
    if marks and NO_WATERMARK < min(marks) < MAX_WATERMARK:
        lag = max(0, now_ms() - min(marks))
    return {"p50": p50, "p90": p90, "p99": p99, "rows": sum(buckets.values()), "event-time-lag": lag}


def bottleneck_json(job) -> dict:
    """streamlab's own GET /jobs/<id>/bottleneck (cluster.jobmanager.jobmaster.bottleneck)."""
    return bottleneck_report(job.job_graph, job.task_metrics(), job.bottlenecks, now_ms())


def late_rows_json(job) -> list[dict]:
    """streamlab's own GET /jobs/<id>/late-rows: per window or join operator, the rows it found late
    over its subtasks (how many, how many dropped, its side output) and the newest of them, each
    with its event time and the watermark that made it late (cluster.operators.late_rows)."""
    return [{"uid": r.uid, "name": r.name, "count": r.count, "dropped": r.dropped, "side-output": r.side_output,
             "schema": r.schema, "sample": r.sample}
            for r in late_rows([{"subtask": e.subtask, "metrics": e.metrics} for e in job.graph.executions.values()])]
