"""JobClient: the one way into a cluster, for scripts, the CLI and the notebook magic.

It submits JobGraphs and asks about jobs over the JobManager's control socket, and runs a
ResultReceiver: a socket of its own to which collect sinks stream Arrow batches straight from the
TaskManagers. A JobHandle follows one job: its status, its live results as pandas, its end.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import pandas as pd
import pyarrow as pa
import zmq

from cluster.graph.execution_graph import JobState
from cluster.graph.job_graph import JobGraph
from cluster.protocol import messages as m
from cluster.protocol.codec import Codec
from cluster.protocol.endpoint import RpcClient, bound_address, make_socket
from cluster.protocol.serde import ipc_to_table

from .local_cluster import ClusterInfo

log = logging.getLogger(__name__)
STATUS_POLL_S = 0.1


class JobExecutionError(RuntimeError):
    """The job failed; the message carries the cause with the user's traceback."""

    def __init__(self, job_id: str, name: str, failure: str):
        super().__init__(f"Job '{name}' ({job_id}) failed.\n{failure}")
        self.job_id, self.failure = job_id, failure


class JobCancelledError(RuntimeError):
    pass


class _SinkResults:
    """The rows one collect sink delivered, for the newest attempt of the job only."""

    def __init__(self, parallelism: int):
        self.parallelism = parallelism
        self.attempt = 0
        self.tables: list[pa.Table] = []
        self.ended: set[int] = set()
        self.rows = 0

    def add(self, attempt: int, table: Optional[pa.Table], subtask: int, end: bool) -> None:
        if attempt < self.attempt:
            return  # a straggler from before a restart
        if attempt > self.attempt:  # the job restarted: what the old attempt sent is void
            self.attempt, self.tables, self.ended, self.rows = attempt, [], set(), 0
        if end:
            self.ended.add(subtask)
        elif table is not None:
            self.tables.append(table)
            self.rows += table.num_rows

    @property
    def complete(self) -> bool:
        return len(self.ended) == self.parallelism


class ResultReceiver:
    """A ROUTER socket on 127.0.0.1 and a thread that files incoming batches by job and sink."""

    def __init__(self, codec: Codec, host: str = "127.0.0.1"):
        self.codec = codec
        self._sock = make_socket(zmq.Context.instance(), zmq.ROUTER)
        self._sock.bind(f"tcp://{host}:0")
        self.address = bound_address(self._sock)
        self._lock = threading.Condition()
        self._jobs: dict[str, dict[str, _SinkResults]] = {}
        self._running = True
        self._thread = threading.Thread(target=self._run, name="results", daemon=True)
        self._thread.start()

    def expect(self, job_id: str, sinks: dict[str, int]) -> None:
        with self._lock:
            self._jobs[job_id] = {uid: _SinkResults(p) for uid, p in sinks.items()}

    def _run(self) -> None:
        try:
            while self._running:
                if not self._sock.poll(100):
                    continue
                frames = self._sock.recv_multipart(copy=False)[1:]
                try:
                    msg, _, payload = self.codec.decode(frames)
                    if not isinstance(msg, (m.CollectBatch, m.CollectEnd)):
                        raise m.MalformedMessage(f"{msg.op} is not a result message")
                    table = ipc_to_table(payload[0].buffer) if isinstance(msg, m.CollectBatch) else None
                except Exception as exc:
                    log.warning("result socket: dropped a malformed message: %s", exc)
                    continue
                with self._lock:
                    sink = self._jobs.get(msg.job_id, {}).get(msg.sink)
                    if sink is not None:
                        sink.add(msg.attempt, table, msg.subtask, isinstance(msg, m.CollectEnd))
                        self._lock.notify_all()
        finally:
            self._sock.close(0)

    def frame(self, job_id: str, sink: str) -> pd.DataFrame:
        with self._lock:
            tables = list(self._jobs[job_id][sink].tables)
        if not tables:
            return pd.DataFrame()
        return pa.concat_tables(tables, promote_options="default").to_pandas()

    def rows(self, job_id: str, sink: str) -> int:
        with self._lock:
            return self._jobs[job_id][sink].rows

    def wait_complete(self, job_id: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._lock:
            while not all(s.complete for s in self._jobs[job_id].values()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
            return True

    def close(self) -> None:
        self._running = False
        self._thread.join(1)


@dataclass
class JobExecutionResult:
    job_id: str
    name: str
    state: str
    duration_ms: int
    results: dict[str, pd.DataFrame] = field(default_factory=dict)

    def to_pandas(self, sink: Optional[str] = None) -> pd.DataFrame:
        return _pick(self.results, sink)


def _pick(results: dict, sink: Optional[str]):
    if sink is not None:
        return results[sink]
    if len(results) != 1:
        raise ValueError(f"the job has {len(results)} collect sinks; name one of {sorted(results)}")
    return next(iter(results.values()))


class JobHandle:
    def __init__(self, client: "JobClient", job_id: str, name: str, sinks: dict[str, str]):
        self.client = client
        self.job_id = job_id
        self.name = name
        self._sinks = sinks  # collect sink name -> uid
        self.submitted_at = time.monotonic()

    def __repr__(self) -> str:
        return f"<JobHandle {self.name!r} {self.job_id}>"

    def job_status(self) -> m.JobStatus:
        return self.client.job_status(self.job_id)

    @property
    def status(self) -> str:
        return self.job_status().state

    def results_of(self, sink: Optional[str] = None) -> pd.DataFrame:
        uid = self._sinks[sink] if sink is not None else _pick(self._sinks, None)
        return self.client.results.frame(self.job_id, uid)

    @property
    def results(self) -> pd.DataFrame:
        """The rows collected so far (a fresh DataFrame each time)."""
        return self.results_of()

    def to_pandas(self, sink: Optional[str] = None) -> pd.DataFrame:
        return self.results_of(sink)

    def cancel(self) -> None:
        self.client.cancel(self.job_id)

    def wait(self, timeout: Optional[float] = None, on_status=None) -> JobExecutionResult:
        """Wait for the job's end. FINISHED returns the result; FAILED and CANCELED raise."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            status = self.job_status()
            if on_status and (status.state, status.reason) != last:
                on_status(status)
                last = (status.state, status.reason)
            if status.state in JobState.GLOBALLY_TERMINAL:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job '{self.name}' ({self.job_id}) still {status.state} after {timeout:g} s")
            time.sleep(STATUS_POLL_S)
        if status.state == JobState.FAILED:
            raise JobExecutionError(self.job_id, self.name, status.failure or "unknown cause")
        if status.state == JobState.CANCELED:
            raise JobCancelledError(f"job '{self.name}' ({self.job_id}) was cancelled")
        if self._sinks and not self.client.results.wait_complete(self.job_id, 30):
            raise RuntimeError(f"job '{self.name}' finished but not every collect sink's results arrived")
        duration = int((time.monotonic() - self.submitted_at) * 1000)
        return JobExecutionResult(self.job_id, self.name, status.state, duration,
                                  {n: self.results_of(n) for n in self._sinks})


class JobClient:
    def __init__(self, cluster: ClusterInfo, timeout: float = 10.0):
        self.cluster = cluster
        self.codec = Codec(cluster.secret)
        self.rpc = RpcClient(cluster.rpc_address, self.codec, timeout)
        self._results: Optional[ResultReceiver] = None

    @property
    def results(self) -> ResultReceiver:
        if self._results is None:
            self._results = ResultReceiver(self.codec)
        return self._results

    def submit(self, job_graph: JobGraph, detached: bool = False) -> JobHandle:
        sinks = {o.name: o.uid for v in job_graph.vertices for o in v.operators if o.kind == "collect-sink"}
        parallelism = {o.uid: v.parallelism for v in job_graph.vertices for o in v.operators}
        result_address = None
        if sinks and not detached:
            self.results.expect(job_graph.job_id, {uid: parallelism[uid] for uid in sinks.values()})
            result_address = self.results.address
        reply = self.rpc.request(m.SubmitJob(job_graph.to_dict(), result_address))
        return JobHandle(self, reply.job_id, job_graph.name, sinks)

    def job_status(self, job_id: str) -> m.JobStatus:
        return self.rpc.request(m.RequestJobStatus(job_id))

    def list_jobs(self) -> list[dict]:
        return self.rpc.request(m.ListJobs()).jobs

    def cancel(self, job_id: str) -> None:
        self.rpc.request(m.CancelJob(job_id))

    def cluster_overview(self) -> m.ClusterOverview:
        return self.rpc.request(m.RequestClusterOverview())

    def job_details(self, job_id: str) -> dict:
        """GET /jobs/<jobid> as a dict, plus "subtasks": state, TaskManager, slot and metrics of each."""
        return self.rpc.request(m.RequestJobDetails(job_id)).details

    def shutdown_cluster(self) -> None:
        self.rpc.request(m.ShutdownCluster())

    def close(self) -> None:
        if self._results is not None:
            self._results.close()
        self.rpc.close()
