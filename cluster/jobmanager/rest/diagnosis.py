"""The views that answer rather than gauge (streamlab's own, beside Flink's): the bottleneck named,
the late rows seen, the end-to-end latency; GET /jobs/<id> carries them too, and so the dashboard.
Each takes the job's JobMaster. Loop thread only, as every view."""
from __future__ import annotations

from cluster.common.clock import now_ms
from cluster.jobmanager.jobmaster.bottleneck import report as bottleneck_report
from cluster.protocol.latency import merged, percentiles
from cluster.protocol.metrics import EVENT_TIME_LAG, LATENCY, late_rows


def latency_json(job) -> dict:
    """The job's end-to-end latency, ms: p50, p90 and p99 over its sinks' rows of the last 5-10 s
    (None before any) and the rows they cover; and, where its sinks' rows carry event time, their
    event-time lag (the wall clock minus a row's event time) the same way, else None."""
    sinks = [e.metrics for e in job.graph.executions.values() if LATENCY in e.metrics]
    buckets = merged([m[LATENCY] for m in sinks])
    p50, p90, p99 = percentiles(buckets) or (None, None, None)
    lags = merged([m.get(EVENT_TIME_LAG) or {} for m in sinks])
    lag = percentiles(lags)
    return {"p50": p50, "p90": p90, "p99": p99, "rows": sum(buckets.values()),
            "event-time-lag": None if lag is None else dict(zip(("p50", "p90", "p99"), lag))}


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
