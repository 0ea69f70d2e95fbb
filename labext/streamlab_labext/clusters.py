"""The clusters a Jupyter server may show, and their state composed from each JobManager's REST API.

Allowed are exactly: the embedded cluster of each kernel this server runs (named by the kernel in
its registry file, kernel_runtime.notebook.lab_registry) and the standing clusters of the setting
``StreamlabLab.cluster_dirs``. A cluster is asked for by its id, never by a path: an id that names
none of those is refused.

Every call to a JobManager is asynchronous (tornado's AsyncHTTPClient on the server's own loop)
with a short timeout; a JobManager that is down or slow makes its cluster an entry with
``error``, not a failed answer. The address and token come from the cluster directory and stay
on the server.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from kernel_runtime.notebook.lab_registry import REGISTRY_FOLDER, cluster_id
from cluster.graph.operator_kinds import KINDS
from kernel_runtime.notebook.widgets.job_graph import operators
from kernel_runtime.notebook.widgets.metrics import load_colors
from kernel_runtime.client.cluster_info import ClusterInfo, ClusterNotRunning
from kernel_runtime.deploy.processes import alive

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 5.0
CACHE_S = 1.0  # many open panels cost a cluster one refresh a second
SAVEPOINT_TIMEOUT_S = 120.0
STATE_TIMEOUT_S = 125.0  # the JobManager answers within its own 120 s (a fresh checkpoint, then the read)
SAVEPOINT_POLL_S = 0.2
MAX_JOBS = 20  # the newest jobs of a cluster the list shows (each costs a request per refresh)
TERMINAL = frozenset({"FINISHED", "CANCELED", "FAILED"})


class ClusterRefused(LookupError):
    """An id that names no cluster this server may see (HTTP 403)."""


class JobManagerError(Exception):
    """A JobManager answered with an error (its HTTP status and Flink's ``errors`` text)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class KnownCluster:
    """An allowed cluster directory, and whose it is."""

    cluster_dir: Path
    name: str
    source: str  # "kernel" | "setting"
    kernel_id: Optional[str] = None
    notebook_path: Optional[str] = None

    @property
    def id(self) -> str:
        return cluster_id(self.cluster_dir)

    def entry(self, error: Optional[str] = None) -> dict:
        return {"id": self.id, "name": self.name, "source": self.source, "kernel_id": self.kernel_id,
                "notebook_path": self.notebook_path, "error": error, "slots_total": 0, "slots_used": 0,
                "taskmanagers": [], "jobs": []}


# ---------------------------------------------------------------------- which clusters
def kernel_registrations(runtime_dir: Path, running: set[str]) -> list[tuple[str, Path]]:
    """(kernel id, cluster directory) of every registry file whose kernel is running here."""
    found = []
    for path in sorted((Path(runtime_dir) / REGISTRY_FOLDER).glob("kernel-*.json")):
        try:
            body = json.loads(path.read_text())
            kernel_id, cluster_dir, pid = body["kernel_id"], body["cluster_dir"], body["pid"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("streamlab: ignoring the registry file %s: %s", path, exc)
            continue
        # the file's name is the kernel's: a file cannot speak for another kernel; a kernel process
        # killed outright (then restarted under its id) left its file behind
        if path.name == f"kernel-{kernel_id}.json" and kernel_id in running and alive(pid):
            found.append((kernel_id, Path(cluster_dir)))
    return found


async def known_clusters(setting_dirs: list[str], runtime_dir: Path, running: set[str],
                         notebook_of: Callable[[str], Awaitable[Optional[str]]]) -> dict[str, KnownCluster]:
    known: dict[str, KnownCluster] = {}
    for kernel_id, directory in kernel_registrations(runtime_dir, running):
        notebook = await notebook_of(kernel_id)
        cluster = KnownCluster(directory, Path(notebook).name if notebook else directory.name, "kernel",
                               kernel_id, notebook)
        known[cluster.id] = cluster
    for setting in setting_dirs:
        path = Path(setting).expanduser()
        cluster = KnownCluster(path, path.name, "setting")
        known.setdefault(cluster.id, cluster)  # a kernel attached to a standing cluster: the kernel's entry
    return known


# ---------------------------------------------------------------------- one JobManager
class JobManagerRest:
    """A JobManager's REST API, asked asynchronously with the cluster's token."""

    def __init__(self, info: ClusterInfo):
        self.base = info.rest_address.rstrip("/")
        self.headers = dict(info.rest_headers)

    @classmethod
    async def of(cls, cluster_dir: Path) -> "JobManagerRest":
        # ClusterInfo.load may ask ZooKeeper (an HA cluster): off the server's loop
        loop = asyncio.get_running_loop()
        return cls(await loop.run_in_executor(None, ClusterInfo.load, cluster_dir))

    async def call(self, path: str, method: str = "GET", body: Optional[dict] = None,
                   timeout: float = REQUEST_TIMEOUT_S) -> Any:
        headers = dict(self.headers)
        data: Optional[bytes] = None
        if method != "GET":
            # the JobManager takes a mutating request's body as JSON only (an empty one too)
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode() if body is not None else b""
        request = HTTPRequest(self.base + path, method=method, headers=headers, body=data,
                              connect_timeout=CONNECT_TIMEOUT_S, request_timeout=timeout)
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as exc:
            if exc.response is None:  # a timeout
                raise
            try:
                message = "; ".join(json.loads(exc.response.body)["errors"])
            except (ValueError, KeyError, TypeError):
                message = str(exc)
            raise JobManagerError(exc.code, message) from None
        return json.loads(response.body) if response.body else None


def _sum(vertices: list[dict], ids: set[str], metric: str) -> int:
    return int(sum(v["metrics"].get(metric, 0) for v in vertices if v["id"] in ids))


_LEVELS = ("ok", "low", "high")


def job_entry(overview: dict, details: Optional[dict]) -> dict:
    """A job of the list: the overview's figures, with records, back pressure and checkpoint from
    its details. Records in: what the sources took in; records out: what the sinks delivered."""
    entry = {"id": overview["jid"], "name": overview["name"], "state": overview["state"],
             "start_time": overview["start-time"], "duration_ms": overview["duration"],
             "records_in": 0, "records_out": 0, "backpressure": "ok", "last_checkpoint": None}
    if details is None:
        return entry
    vertices = details.get("vertices", [])
    nodes = details.get("plan", {}).get("nodes", [])
    sources = {n["id"] for n in nodes if not n.get("inputs")}
    levels = [v["backpressure-level"] for v in vertices]
    entry |= {"records_in": _sum(vertices, sources, "read-records"),
              "records_out": int(sum(v.get("records-sent", 0) for v in vertices)),
              "backpressure": max(levels, key=_LEVELS.index, default="ok")}
    history = details.get("checkpoints", {}).get("history", [])
    last = next((c for c in history if not c["is_savepoint"] and c["status"] != "IN_PROGRESS"), None)
    if last is not None:
        entry["last_checkpoint"] = {"id": last["id"], "status": last["status"],
                                    "end_time": last["latest_ack_timestamp"],
                                    "duration_ms": last["end_to_end_duration"], "size": last["state_size"]}
    return entry


async def cluster_entry(known: KnownCluster, ended: Optional[dict[str, dict]] = None) -> dict:
    """The cluster's entry of GET /clusters; its error when its JobManager cannot be asked.
    ``ended``: the details of this cluster's ended jobs, kept between refreshes (they no longer change)."""
    ended = {} if ended is None else ended
    try:
        rest = await JobManagerRest.of(known.cluster_dir)
        overview, taskmanagers = await asyncio.gather(rest.call("/jobs/overview"), rest.call("/taskmanagers"))
        jobs = sorted(overview["jobs"], key=lambda j: j["start-time"], reverse=True)[:MAX_JOBS]
        details = await asyncio.gather(*(_details(rest, j, ended) for j in jobs), return_exceptions=True)
    except ClusterNotRunning as exc:
        return known.entry(f"JobManager not reachable: {exc}")
    except (OSError, asyncio.TimeoutError, HTTPClientError, JobManagerError) as exc:
        return known.entry(f"JobManager not reachable: {type(exc).__name__}: {exc}")
    try:
        return _compose(known, overview, taskmanagers, jobs, details)
    except (KeyError, TypeError, ValueError) as exc:  # a JobManager of another version: its entry says so
        log.exception("streamlab: cannot read the answers of the JobManager of %s", known.cluster_dir)
        return known.entry(f"unexpected answer from the JobManager: {type(exc).__name__}: {exc}")


async def _details(rest: JobManagerRest, job: dict, ended: dict[str, dict]) -> dict:
    kept = ended.get(job["jid"])
    if kept is not None:
        return kept
    details = await rest.call(f"/jobs/{job['jid']}")
    if details["state"] in TERMINAL:
        ended[job["jid"]] = details
    return details


def _compose(known: KnownCluster, overview: dict, taskmanagers: dict, jobs: list[dict], details: list) -> dict:
    names = {j["jid"]: j["name"] for j in overview["jobs"]}
    tms = []
    for tm in sorted(taskmanagers["taskmanagers"], key=lambda t: t["id"]):
        slots = [{"index": i, "job_id": s["job_id"] if s else None, "job_name": names.get(s["job_id"]) if s else None}
                 for i, s in enumerate(tm.get("slots", []))]
        tms.append({"id": tm["id"], "slots_total": tm["slotsNumber"],
                    "slots_used": tm["slotsNumber"] - tm["freeSlots"], "slots": slots})
    entry = known.entry()
    entry |= {"slots_total": sum(t["slots_total"] for t in tms), "slots_used": sum(t["slots_used"] for t in tms),
              "taskmanagers": tms,
              # a job that ended between the two requests has no details: its overview figures
              "jobs": [job_entry(j, d if isinstance(d, dict) else None) for j, d in zip(jobs, details)]}
    return entry


def vertex_entry(vertex: dict) -> dict:
    """A vertex of the job view, with the colour Flink's job graph gives it while it runs: the busy
    bottleneck red, what waits for it dark, idle blue (metrics.load_colors, as the dashboard's graph)."""
    busy, backpressured = vertex.get("busy-ratio", 0.0), vertex.get("backpressured-ratio", 0.0)
    color, ink = load_colors(busy, backpressured) if vertex.get("status") == "RUNNING" else (None, None)
    return {"id": vertex["id"], "name": vertex["name"], "parallelism": vertex["parallelism"],
            "status": vertex.get("status", ""), "backpressure": vertex["backpressure-level"],
            "busy": busy, "backpressured": backpressured,
            "color": color, "ink": ink,
            "records_in": vertex["metrics"].get("read-records", 0),
            # to other tasks, and what its sink delivered
            "records_out": vertex["metrics"].get("write-records", 0) + vertex.get("records-sent", 0)}


def keyed_operators(nodes: list[dict]) -> list[str]:
    """The names of the plan's operators that keep keyed state (GET .../state?operator=<name>)."""
    return [name for node in nodes for name, kind in operators(node.get("description", ""))
            if (declared := KINDS.get(kind)) is not None and declared.keyed and declared.stateful]


async def job_detail(known: KnownCluster, job_id: str) -> dict:
    rest = await JobManagerRest.of(known.cluster_dir)
    jid = quote(job_id, safe="")
    details, exceptions, checkpointing, late = await asyncio.gather(
        rest.call(f"/jobs/{jid}"), rest.call(f"/jobs/{jid}/exceptions"), rest.call(f"/jobs/{jid}/checkpoints/config"),
        rest.call(f"/jobs/{jid}/late-rows"))
    overview = {"jid": details["jid"], "name": details["name"], "state": details["state"],
                "start-time": details["start-time"], "duration": details["duration"]}
    nodes = details.get("plan", {}).get("nodes", [])
    return {
        "job": job_entry(overview, details),
        "vertices": [vertex_entry(v) for v in details.get("vertices", [])],
        # the operators whose keyed state the view can show, to pick from; 0: checkpointing is off
        "keyed_operators": keyed_operators(nodes), "checkpoint_interval_ms": checkpointing["interval"],
        "edges": [{"source": i["id"], "target": n["id"], "ship_strategy": i["ship_strategy"]}
                  for n in nodes for i in n.get("inputs", [])],
        "checkpoints": [{"id": c["id"], "status": c["status"], "trigger_time": c["trigger_timestamp"],
                         "end_time": c["latest_ack_timestamp"], "duration_ms": c["end_to_end_duration"],
                         "size": c["state_size"], "is_savepoint": c["is_savepoint"]}
                        for c in details.get("checkpoints", {}).get("history", [])],
        "exceptions": [{"time": e["timestamp"], "exception": e["stacktrace"], "task": e.get("taskName")}
                       for e in exceptions["exceptionHistory"]["entries"]],
        "diagnosis": diagnosis(details, late),
    }


def diagnosis(details: dict, late: list[dict]) -> dict:
    """What the JobManager answers of the job (cluster/jobmanager/rest/diagnosis.py): the bottleneck
    in words, the end-to-end latency, why windows wait, the late rows per operator."""
    bottleneck = details.get("bottleneck") or {}
    return {"bottleneck": bottleneck.get("text") if bottleneck.get("vertex-id") else None,
            "latency": details.get("latency"),
            "window_waits": [w["text"] for w in details.get("window-waits") or []],
            "late_rows": [{"operator": r["name"], "count": r["count"], "dropped": r["dropped"]}
                          for r in late if r["count"]]}


STATE_ROWS = 200  # the panel shows a page of keys, not a whole state


async def keyed_state(known: KnownCluster, job_id: str, operator: str, key: Optional[str], fresh: bool,
                      limit: int = STATE_ROWS) -> dict:
    """An operator's keyed state from the JobManager (GET /jobs/<id>/state), its first ``limit``
    rows; ``rows_total`` says how many keys there are."""
    rest = await JobManagerRest.of(known.cluster_dir)
    query = {"operator": operator, "fresh": "true" if fresh else "false"} | ({"key": key} if key is not None else {})
    answer = await rest.call(f"/jobs/{quote(job_id, safe='')}/state?{urlencode(query)}", timeout=STATE_TIMEOUT_S)
    answer["rows_total"] = len(answer["rows"])
    answer["rows"] = answer["rows"][:limit]
    return answer


async def cancel(known: KnownCluster, job_id: str) -> None:
    rest = await JobManagerRest.of(known.cluster_dir)
    await rest.call(f"/jobs/{quote(job_id, safe='')}?mode=cancel", method="PATCH")


async def savepoint(known: KnownCluster, job_id: str, target: Optional[str], stop: bool) -> str:
    """Trigger a savepoint (``stop``: stop with it) and wait for its location, as Flink's
    asynchronous operations go: POST, then poll the trigger's status."""
    rest = await JobManagerRest.of(known.cluster_dir)
    jid = quote(job_id, safe="")
    if stop:
        trigger = await rest.call(f"/jobs/{jid}/stop", "POST", {"targetDirectory": target})
    else:
        trigger = await rest.call(f"/jobs/{jid}/savepoints", "POST", {"target-directory": target, "cancel-job": False})
    status_path = f"/jobs/{jid}/savepoints/{trigger['request-id']}"
    deadline = time.monotonic() + SAVEPOINT_TIMEOUT_S
    while True:
        answer = await rest.call(status_path)
        if answer["status"]["id"] == "COMPLETED":
            operation = answer["operation"]
            if "location" in operation:
                return str(operation["location"])
            cause = operation.get("failure-cause", {}).get("stack-trace", "unknown cause")
            raise JobManagerError(409, f"the savepoint of job {job_id} failed: {cause}")
        if time.monotonic() > deadline:
            raise JobManagerError(504, f"the savepoint of job {job_id} did not complete within "
                                       f"{SAVEPOINT_TIMEOUT_S:g} s (it may still complete)")
        await asyncio.sleep(SAVEPOINT_POLL_S)


# ---------------------------------------------------------------------- the cached list
class ClusterList:
    """GET /clusters, computed at most once per CACHE_S however many panels ask: requests that
    arrive while a refresh runs share it."""

    def __init__(self, find: Callable[[], Awaitable[dict[str, KnownCluster]]]):
        self._find = find
        self._at = float("-inf")
        self._value: Optional[dict] = None
        self._refresh: Optional[asyncio.Future] = None
        self._ended: dict[str, dict[str, dict]] = {}  # cluster id -> job id -> details of an ended job

    async def get(self) -> dict:
        if self._value is not None and time.monotonic() - self._at < CACHE_S:
            return self._value
        if self._refresh is None:
            self._refresh = asyncio.ensure_future(self._compute())
        refresh = self._refresh
        try:
            return await asyncio.shield(refresh)
        finally:
            if self._refresh is refresh and refresh.done():
                self._refresh = None

    async def _compute(self) -> dict:
        known = await self._find()
        self._ended = {cid: self._ended.get(cid, {}) for cid in known}  # forget the clusters gone
        entries = await asyncio.gather(*(cluster_entry(k, self._ended[cid]) for cid, k in known.items()))
        for cid, entry in zip(known, entries):  # keep only the ended jobs still listed
            listed = {j["id"] for j in entry["jobs"]}
            self._ended[cid] = {jid: d for jid, d in self._ended[cid].items() if jid in listed}
        self._value = {"clusters": list(entries), "refreshed": int(time.time() * 1000)}
        self._at = time.monotonic()
        return self._value
