"""JSON views of the JobManager's state, with Flink's REST field names.

Shared by the REST API (handlers.py), the Dispatcher's control messages (the CLI's status, the
notebook dashboard) and the event publisher, so there is one definition of each answer. Called
on the loop thread. They read the Dispatcher through JobManagerState: the Dispatcher imports
these views, so REST does not import the Dispatcher back.
An id that names nothing raises NotFound (the REST API's 404), never a bare KeyError: a KeyError
out of a view is a bug and answered as one.
"""
from __future__ import annotations

import time
from typing import Callable, Mapping, Optional, Protocol

from cluster.common.clock import now_ms
from cluster.protocol.states import ExecutionState, JobState
from cluster.protocol.endpoint import RpcEndpoint
from cluster.jobmanager.rest.diagnosis import bottleneck_json, latency_json
from cluster.jobmanager.rest.window_waits import window_waits
from cluster.protocol.metrics import CURRENT_INPUT_WATERMARK, EVENT_TIME_METRICS, backpressure_level, split_watermarks

from cluster.jobmanager.jobmaster.job_master import JobMaster
from cluster.jobmanager.resourcemanager.resource_manager import ResourceManager
from cluster.conf.options import CheckpointingOptions, StateBackendOptions

VERSION = "streamlab-0.1.0"


class NotFound(LookupError):
    """An id in a request names no job, vertex, checkpoint or savepoint operation."""


class JobManagerState(Protocol):
    """What the views and the REST handlers read of the Dispatcher (loop thread only)."""

    @property
    def jobs(self) -> Mapping[str, JobMaster]: ...

    @property
    def rm(self) -> ResourceManager: ...

    @property
    def endpoint(self) -> RpcEndpoint: ...


def job_master(d: JobManagerState, job_id: str):
    job = d.jobs.get(job_id)
    if job is None:
        raise NotFound(f"Job {job_id} not found")
    return job


def job_vertex(job, vertex_id: str):
    try:
        return job.job_graph.vertex(vertex_id)
    except KeyError:
        raise NotFound(f"No vertex with ID '{vertex_id}' exists in job {job.job_id}") from None


def overview_json(d: JobManagerState) -> dict:
    sm = d.rm.slot_manager
    states = [j.state for j in d.jobs.values()]
    return {
        "taskmanagers": len(sm.task_managers),
        "slots-total": sm.total_slots,
        "slots-available": sm.free_slots,
        "jobs-running": sum(s not in JobState.GLOBALLY_TERMINAL for s in states),
        "jobs-finished": states.count(JobState.FINISHED),
        "jobs-cancelled": states.count(JobState.CANCELED),
        "jobs-failed": states.count(JobState.FAILED),
        "flink-version": VERSION,
        "flink-commit": "",
    }


def taskmanagers_json(d: JobManagerState) -> dict:
    sm = d.rm.slot_manager
    wall_minus_mono = time.time() - time.monotonic()
    result = []
    for tm_id, reg in sm.task_managers.items():
        slots = sm.slot_report(tm_id)
        hardware = {"cpuCores": reg.hardware.get("cpuCores", 0),
                    "physicalMemory": reg.hardware.get("physicalMemory", 0),
                    "freeMemory": reg.hardware.get("freeMemory", 0), "managedMemory": 0}
        result.append({
            "id": tm_id,
            "path": reg.data_address,
            "dataPort": int(reg.data_address.rsplit(":", 1)[-1]),
            "jmxPort": -1,
            "timeSinceLastHeartbeat": int((reg.last_heartbeat + wall_minus_mono) * 1000),
            "slotsNumber": reg.number_of_slots,
            "freeSlots": sum(1 for s in slots if s is None),
            "assignedTasks": len(reg.tasks),
            "hardware": hardware,
            # streamlab's own: which job holds each slot (the slot view of the dashboard)
            "slots": [None if s is None else {"job_id": s.job_id, "allocation_id": s.allocation_id}
                      for s in slots],
            "pid": reg.pid,
            # streamlab's own: its SparkSession's phase ("" none started, queued, starting, ready, failed)
            "spark": reg.spark,
        })
    return {"taskmanagers": result}


def _job_times(job) -> tuple[int, int, int]:
    """(start, end or -1, duration) of the job as a whole: from its first attempt on."""
    start = job.graph.start_ms
    end = max((job.graph.timestamps[s] for s in JobState.GLOBALLY_TERMINAL), default=0) \
        if job.graph.is_globally_terminal else -1
    duration = (end if end > 0 else now_ms()) - start
    return start, end, duration


def jobs_overview_json(d: JobManagerState) -> dict:
    jobs = []
    for job in d.jobs.values():
        start, end, duration = _job_times(job)
        counts = job.graph.status_counts()
        jobs.append({
            "jid": job.job_id, "name": job.job_graph.name, "jobType": "STREAMING",
            "schedulerType": "Default", "start-time": start, "end-time": end, "duration": duration,
            "state": job.state, "last-modification": max(job.graph.timestamps.values()),
            "tasks": {k.lower(): v for k, v in counts.items()} | {
                "total": len(job.graph.executions), "reconciling": 0,
                "canceling": counts[ExecutionState.CANCELING]},
            "pending-operators": 0,
        })
    return {"jobs": jobs}


def _vertex_metrics(executions) -> dict:
    total = {"read-bytes": 0, "write-bytes": 0, "read-records": 0, "write-records": 0,
             "accumulated-backpressured-time": 0, "accumulated-idle-time": 0, "accumulated-busy-time": 0}
    source_keys = {"read-bytes": "bytes-in", "write-bytes": "bytes-out", "read-records": "records-in",
                   "write-records": "records-out", "accumulated-backpressured-time": "backpressured-ms",
                   "accumulated-idle-time": "idle-ms", "accumulated-busy-time": "busy-ms"}
    for e in executions:
        for key, src in source_keys.items():
            total[key] += e.metrics.get(src, 0)
    for key in ("read-bytes", "write-bytes", "read-records", "write-records"):
        total[f"{key}-complete"] = True
    return total


def _highest(executions, per_second: str) -> float:
    """The highest share of time (0..1) of a ...TimeMsPerSecond metric over the vertex's subtasks."""
    return max((e.metrics.get(per_second, 0.0) / 1000 for e in executions), default=0.0)


def plan_json(job) -> dict:
    g = job.job_graph
    nodes = []
    for v in reversed(g.topological_order()):  # Flink lists the sinks first
        node = {"id": v.id, "operator": "", "parallelism": v.parallelism, "operator_strategy": "",
                "description": "<br/>".join(f"{o.name} [{o.kind}] ({o.call_site})" for o in v.operators),
                "optimizer_properties": {}}
        inputs = [{"num": n, "id": e.source, "ship_strategy": e.ship_strategy, "exchange": "pipelined_bounded"}
                  for n, (_, e) in enumerate(g.inputs_of(v.id))]
        if inputs:
            node["inputs"] = inputs
        nodes.append(node)
    return {"jid": job.job_id, "name": g.name, "type": "STREAMING", "nodes": nodes}


def job_json(d: JobManagerState, job_id: str) -> dict:
    job = job_master(d, job_id)
    start, end, duration = _job_times(job)
    vertices = []
    for v in job.job_graph.vertices:
        executions = job.graph.executions_of(v.id)
        counts = job.graph.status_counts(v.id)
        backpressured = _highest(executions, "backPressuredTimeMsPerSecond")
        vertices.append({
            "id": v.id, "slotSharingGroupId": "default", "name": v.name, "maxParallelism": v.max_parallelism,
            "parallelism": v.parallelism, "status": job.graph.vertex_state(v.id),
            "start-time": job.graph.timestamps[JobState.RUNNING] or -1, "end-time": end, "duration": duration,
            "tasks": counts | {"RECONCILING": 0}, "metrics": _vertex_metrics(executions),
            # streamlab's own: the worst subtask's level, as GET .../backpressure grades it, and the
            # highest busy and back-pressured shares of its subtasks, which Flink's job graph colours
            # a vertex by, so a view of the whole job (the lab's Streams panel) needs no request per vertex
            "backpressure-level": backpressure_level(backpressured),
            "busy-ratio": _highest(executions, "busyTimeMsPerSecond"), "backpressured-ratio": backpressured,
            # and the rows its sink delivered (records-sent, Flink's numRecordsSend), which
            # write-records (rows to other tasks) does not count
            "records-sent": sum(e.metrics.get("records-sent", 0) for e in executions),
        })
    return {
        "jid": job.job_id, "name": job.job_graph.name, "isStoppable": False, "state": job.state,
        "job-type": "STREAMING", "schedulerType": "Default", "start-time": start, "end-time": end,
        "duration": duration, "maxParallelism": -1, "now": now_ms(),
        "timestamps": dict(job.graph.timestamps) | {"INITIALIZING": start, "SUSPENDED": 0, "RECONCILING": 0},
        "vertices": vertices, "status-counts": job.graph.status_counts() | {"RECONCILING": 0},
        "plan": plan_json(job), "pending-operators": 0,
        # streamlab's own: the attempt running now (1 for the first, as JobStatus counts), why a
        # job waits, and the failure cause with the user's traceback
        "attempt": job.graph.attempt, "status-reason": job.status_reason, "failure-cause": job.graph.current_failure,
        # and the failure it last failed or restarted by, while a later attempt runs too
        "last-failure": _last_failure(job),
        # the dashboard's checkpoint view
        "checkpoints": checkpoints_json(d, job_id),
        # why a window has not fired yet: what holds its watermark back (window_waits.py)
        "window-waits": window_waits(job.job_graph, job.task_metrics()),
        # the vertex that limits the job, and what helps (GET /jobs/<id>/bottleneck)
        "bottleneck": bottleneck_json(job),
        # end to end, ingestion to sink, over the last seconds (cluster.protocol.latency)
        "latency": latency_json(job),
    }


def _last_failure(job) -> Optional[dict]:
    graph = job.graph
    if not graph.failure:
        return None
    return {"cause": graph.failure, "timestamp": graph.timestamps[JobState.FAILING] or None,
            "task": graph.failed_task, "taskmanager": graph.failed_on}


def backpressure_json(d: JobManagerState, job_id: str, vertex_id: str) -> dict:
    job = job_master(d, job_id)
    job_vertex(job, vertex_id)
    subtasks = []
    for e in job.graph.executions_of(vertex_id):
        ratio = round(e.metrics.get("backPressuredTimeMsPerSecond", 0.0) / 1000, 3)
        idle = round(e.metrics.get("idleTimeMsPerSecond", 0.0) / 1000, 3)
        busy = round(e.metrics.get("busyTimeMsPerSecond", 0.0) / 1000, 3)
        level = backpressure_level(ratio)
        subtasks.append({"subtask": e.subtask, "backpressureLevel": level, "backpressure-level": level,
                         "ratio": ratio, "idleRatio": idle, "busyRatio": busy})
    worst = max((s["ratio"] for s in subtasks), default=0.0)
    level = backpressure_level(worst)
    return {"status": "ok", "backpressureLevel": level, "backpressure-level": level, "end-timestamp": now_ms(),
            "subtasks": subtasks}


def watermarks_json(d: JobManagerState, job_id: str, vertex_id: str) -> list[dict]:
    """GET /jobs/<id>/vertices/<vid>/watermarks, as Flink's JobVertexWatermarksHandler: each
    subtask's input watermark, ``{"id": "<subtask>.currentInputWatermark", "value": "<ms>"}``, the
    value a string as Flink's metric store keeps it (NO_WATERMARK is "-9223372036854775808"), a
    subtask that has reported none yet left out. A source subtask that reads several splits at once
    (Kafka partitions) adds each split's, ``<subtask>.split.<split>.currentWatermark``, and
    ``...idle`` ("true"/"false"), as its metrics name them. A bare list: Flink's
    MetricCollectionResponseBody serialises as its list of metrics."""
    job = job_master(d, job_id)
    job_vertex(job, vertex_id)
    out = []
    for e in sorted(job.graph.executions_of(vertex_id), key=lambda e: e.subtask):
        if CURRENT_INPUT_WATERMARK in e.metrics:
            out.append({"id": f"{e.subtask}.{CURRENT_INPUT_WATERMARK}", "value": str(e.metrics[CURRENT_INPUT_WATERMARK])})
        for split, (watermark, idle) in sorted(split_watermarks(e.metrics).items()):
            out += [{"id": f"{e.subtask}.split.{split}.currentWatermark", "value": str(watermark)},
                    {"id": f"{e.subtask}.split.{split}.idle", "value": str(idle).lower()}]
    return out


# A task's metrics under Flink's names (MetricNames), as its metric store lists them for a vertex
FLINK_TASK_METRICS = {"numRecordsIn": "records-in", "numRecordsOut": "records-out", "numRecordsSend": "records-sent",
                      "numBytesIn": "bytes-in", "numBytesOut": "bytes-out", "busyTimeMsPerSecond": "busyTimeMsPerSecond",
                      "backPressuredTimeMsPerSecond": "backPressuredTimeMsPerSecond",
                      "idleTimeMsPerSecond": "idleTimeMsPerSecond"} | {name: name for name in EVENT_TIME_METRICS}


def vertex_metrics_json(d: JobManagerState, job_id: str, vertex_id: str, get: Optional[list[str]]) -> list[dict]:
    """GET /jobs/<id>/vertices/<vid>/metrics[?get=a,b], as Flink's JobVertexMetricsHandler: the
    vertex's metrics, "<subtask>.<name>"; without ``get`` the names there are (ids only), with it
    the values (strings) of those asked for that exist. streamlab's operator metrics are the task's
    (Flink scopes them "<subtask>.<operator>.<name>")."""
    job = job_master(d, job_id)
    job_vertex(job, vertex_id)
    store = {f"{e.subtask}.{flink}": e.metrics[ours]
             for e in sorted(job.graph.executions_of(vertex_id), key=lambda e: e.subtask)
             for flink, ours in FLINK_TASK_METRICS.items() if ours in e.metrics}
    if get is None:
        return [{"id": name} for name in store]
    return [{"id": name, "value": str(store[name])} for name in dict.fromkeys(get) if name in store]


def vertex_json(d: JobManagerState, job_id: str, vertex_id: str) -> dict:
    job = job_master(d, job_id)
    v = job_vertex(job, vertex_id)
    start, end, duration = _job_times(job)
    subtasks = []
    for e in job.graph.executions_of(vertex_id):
        reg = d.rm.slot_manager.task_managers.get(e.task_manager_id)
        subtasks.append({
            "subtask": e.subtask, "status": e.state, "attempt": e.attempt - 1,
            "endpoint": reg.data_address.replace("tcp://", "") if reg else "-", "start-time": start,
            "end-time": end, "duration": duration, "metrics": _vertex_metrics([e]),
            "taskmanager-id": e.task_manager_id or "(unassigned)",
            "status-duration": e.status_durations(now_ms()), "start_time": start})
    metric_names = ("write-records", "read-records", "write-bytes", "read-bytes", "accumulated-backpressured-time",
                    "accumulated-idle-time", "accumulated-busy-time")
    aggregated = {"metrics": {name: _stats([s["metrics"][name] for s in subtasks]) for name in metric_names},
                  "status-duration": {state: _stats([s["status-duration"].get(state, 0) for s in subtasks])
                                      for state in ExecutionState.ALL}}
    return {"id": v.id, "name": v.name, "parallelism": v.parallelism, "maxParallelism": v.max_parallelism,
            "now": now_ms(), "subtasks": subtasks, "aggregated": aggregated}


def _distribution(values: list) -> tuple[list, Callable[[float], int]]:
    """Sorted values (never empty) and their q-quantile, nearest rank."""
    values = sorted(values) or [0]
    return values, lambda q: values[min(len(values) - 1, int(q * len(values)))]


def _stats(values: list) -> dict:
    """A vertex's aggregated metric, as Flink's vertex details show it."""
    values, pick = _distribution(values)
    return {"min": values[0], "max": values[-1], "sum": sum(values), "avg": sum(values) // len(values),
            "median": pick(0.5), "p25": pick(0.25), "p75": pick(0.75), "p95": pick(0.95)}


def subtasks_json(d: JobManagerState, job_id: str) -> list[dict]:
    """streamlab's own: every subtask with its state, TaskManager, slot and latest metrics."""
    job = job_master(d, job_id)
    slots = {a.allocation_id: a.slot_index for a in d.rm.slot_manager.allocations_of(job_id)}
    return [{"vertex_id": e.vertex.id, "vertex": e.vertex.name, "subtask": e.subtask, "attempt": e.attempt,
             "status": e.state, "taskmanager_id": e.task_manager_id, "slot": slots.get(e.allocation_id),
             "metrics": dict(e.metrics)}
            for e in sorted(job.graph.executions.values(), key=lambda e: (e.vertex.id, e.subtask))]


def exceptions_json(job, d: JobManagerState) -> dict:
    """Flink's exception history: the job's failure, with the task that failed, its TaskManager and
    that TaskManager's address while it is registered."""
    entries = []
    graph = job.graph
    if graph.failure:
        registered = d.rm.slot_manager.task_managers.get(graph.failed_on) if graph.failed_on else None
        entries.append({"exceptionName": graph.failure.splitlines()[0][:200],
                        "stacktrace": graph.failure,
                        "timestamp": graph.timestamps[JobState.FAILING] or now_ms(),
                        "failureLabels": {}, "taskName": graph.failed_task,
                        "endpoint": registered.data_address.removeprefix("tcp://") if registered else None,
                        "taskManagerId": graph.failed_on})
    return {"exceptionHistory": {"entries": entries, "truncated": False}}


def config_json() -> dict:
    return {"refresh-interval": 3000, "timezone-name": time.tzname[0], "timezone-offset": -time.timezone * 1000,
            "flink-version": VERSION, "flink-revision": "",
            "features": {"web-submit": False, "web-cancel": True, "web-rescale": False, "web-history": False}}




# ---------------------------------------------------------------------- checkpoints
def _checkpoint_entry(record) -> dict:
    duration = (record.end_ms if record.end_ms > 0 else now_ms()) - record.trigger_ms
    entry = {"className": {"COMPLETED": "completed", "FAILED": "failed"}.get(record.status, "in_progress"),
             "id": record.checkpoint_id, "status": record.status, "is_savepoint": record.kind in ("savepoint", "stop"),
             "savepointFormat": "CANONICAL" if record.kind in ("savepoint", "stop") else None,
             "trigger_timestamp": record.trigger_ms, "latest_ack_timestamp": record.latest_ack_ms,
             "checkpointed_size": record.size, "state_size": record.size, "end_to_end_duration": duration,
             "alignment_buffered": 0, "processed_data": 0, "persisted_data": 0,
             "num_subtasks": record.participants, "num_acknowledged_subtasks": record.acknowledged,
             "checkpoint_type": {"savepoint": "SAVEPOINT", "stop": "SAVEPOINT"}.get(record.kind, "CHECKPOINT"),
             "tasks": {vid: {"id": record.checkpoint_id, "status": record.status,
                             "latest_ack_timestamp": t["latest_ack"], "checkpointed_size": t["size"],
                             "state_size": t["size"], "end_to_end_duration": t["latest_ack"] - record.trigger_ms,
                             "alignment_buffered": 0, "processed_data": 0, "persisted_data": 0,
                             "num_subtasks": t["num_subtasks"],
                             "num_acknowledged_subtasks": t["num_acknowledged_subtasks"]}
                       for vid, t in record.tasks.items()},
             "external_path": f"file:{record.directory}", "discarded": False}
    if record.status == "FAILED":  # Flink's FailedCheckpointStatistics; the others have no failure fields
        entry |= {"failure_message": record.failure or "", "failure_timestamp": record.end_ms}
    return entry


def _summary(values: list) -> dict:
    """A checkpoint statistic's summary, as Flink's checkpoint overview shows it (floats)."""
    values, pick = _distribution(values)
    return {"min": values[0], "max": values[-1], "avg": sum(values) // len(values),
            **{name: float(pick(q)) for name, q in (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99),
                                                    ("p999", 0.999))}}


def checkpoints_json(d: JobManagerState, job_id: str) -> dict:
    c = job_master(d, job_id).checkpointing.coordinator
    records = sorted(c.records.values(), key=lambda r: r.checkpoint_id, reverse=True)
    completed = [r for r in records if r.status == "COMPLETED"]
    latest = lambda pred: next((_checkpoint_entry(r) for r in records if pred(r)), None)
    restored = None
    if c.restored:
        rid, when, path, is_savepoint = c.restored
        restored = {"id": rid, "restore_timestamp": when, "is_savepoint": is_savepoint, "external_path": f"file:{path}"}
    sizes = [r.size for r in completed]
    return {
        "counts": {"restored": 1 if c.restored else 0, "total": c.counts["completed"] + c.counts["failed"] + len(c.pending),
                   "in_progress": len(c.pending), "completed": c.counts["completed"], "failed": c.counts["failed"]},
        "summary": {"checkpointed_size": _summary(sizes), "state_size": _summary(sizes),
                    "end_to_end_duration": _summary([r.end_ms - r.trigger_ms for r in completed]),
                    "alignment_buffered": _summary([]), "processed_data": _summary([]),
                    "persisted_data": _summary([])},
        "latest": {"completed": latest(lambda r: r.status == "COMPLETED" and r.kind not in ("savepoint", "stop")),
                   "savepoint": latest(lambda r: r.status == "COMPLETED" and r.kind in ("savepoint", "stop")),
                   "failed": latest(lambda r: r.status == "FAILED"), "restored": restored},
        "history": [_checkpoint_entry(r) for r in records],
    }


def checkpoint_details_json(d: JobManagerState, job_id: str, checkpoint_id: int) -> dict:
    record = job_master(d, job_id).checkpointing.coordinator.records.get(checkpoint_id)
    if record is None:
        raise NotFound(f"Could not find checkpointing statistics for checkpoint {checkpoint_id} of job {job_id}")
    return _checkpoint_entry(record)


def checkpoint_config_json(d: JobManagerState, job_id: str) -> dict:
    conf = job_master(d, job_id).conf
    return {"mode": conf.get(CheckpointingOptions.MODE).lower(), "interval": conf.get(CheckpointingOptions.INTERVAL),
            "timeout": conf.get(CheckpointingOptions.TIMEOUT), "min_pause": conf.get(CheckpointingOptions.MIN_PAUSE),
            "max_concurrent": conf.get(CheckpointingOptions.MAX_CONCURRENT_CHECKPOINTS),
            "externalization": {"enabled": True, "delete_on_cancellation": False},
            "state_backend": {"rocksdb": "EmbeddedRocksDBStateBackend"}.get(conf.get(StateBackendOptions.STATE_BACKEND),
                                                                            "HashMapStateBackend"),
            "checkpoint_storage": "FileSystemCheckpointStorage", "unaligned_checkpoints": False,
            "tolerable_failed_checkpoints": 0, "aligned_checkpoint_timeout": 0,
            "checkpoints_after_tasks_finish": True, "state_changelog_enabled": False,
            "changelog_periodic_materialization_interval": 600000, "changelog_storage": "memory"}


def savepoint_status_json(d: JobManagerState, job_id: str, trigger_id: str) -> dict:
    request = job_master(d, job_id).checkpointing.savepoint_requests.get(trigger_id)
    if request is None:
        raise NotFound(f"No savepoint operation with trigger id {trigger_id} for job {job_id}")
    if request["status"] == "IN_PROGRESS":
        return {"status": {"id": "IN_PROGRESS"}, "operation": None}
    if "location" in request:
        return {"status": {"id": "COMPLETED"}, "operation": {"location": f"file:{request['location']}"}}
    return {"status": {"id": "COMPLETED"}, "operation": {"failure-cause": {"class": "CheckpointException",
                                                                          "stack-trace": request["failure"]}}}
