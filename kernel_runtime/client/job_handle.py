"""JobHandle: one submitted job as the client follows it, and the plumbing of its results.

A handle tells the job's status, its live results as pandas, its metrics and keyed state, its
end; it waits by following the job's events (kernel_runtime.client.events), never by asking in
a loop. The ResultReceiver is the socket of the client's own to which collect sinks stream Arrow
batches straight from the TaskManagers, kept per job and sink exactly once across restarts.

A handle asks the client that submitted its job (JobService: the JobClient, named by what it
does, so the two modules do not import each other). What a notebook adds to a handle, the live
dashboard and the rich display, kernel_runtime.notebook registers when imported (HandleDisplay).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional, Protocol

import pandas as pd
import pyarrow as pa
import zmq

from cluster.common.failures import Failure
from cluster.protocol.states import JobState
from cluster.graph.job_graph import JobGraph
from cluster.protocol import messages as m
from cluster.protocol.codec import Codec
from cluster.protocol.endpoint import R
from cluster.protocol.sockets import bind_socket, make_socket
from cluster.protocol.serde import ipc_to_table

from kernel_runtime.client.cluster_info import ClusterInfo
from kernel_runtime.client.events import JobView, JobWatch
from kernel_runtime.client.results import ResultBuffer

log = logging.getLogger(__name__)
ROWS_CHECK_S = 0.1  # wait_for_rows looks at the rows received (here, in this process) this often
HOOKS_EVERY_S = 1.0  # a wait without news still runs its hooks this often



class JobExecutionError(RuntimeError):
    """The job failed. The message is the root cause in one line (cluster.common.failures): the user's
    exception, the operator and the place; ``failure`` is the whole account, ``traceback`` the
    user's traceback. Python prints them below the message (a note); a notebook shows them
    without the client's own frames (``_render_traceback_``)."""

    def __init__(self, job_id: str, name: str, failure: str):
        cause = Failure.parse(failure)
        super().__init__(cause.headline)
        self.job_id, self.name, self.failure, self.traceback = job_id, name, failure, cause.traceback
        self.add_note("\n".join((f"Job '{name}' ({job_id}) failed.", *cause.notes)))
        if cause.traceback:
            self.add_note(f"\nThe user code's traceback, on the TaskManager:\n{cause.traceback}")

    def _render_traceback_(self) -> list[str]:
        red, reset = "\x1b[0;31m", "\x1b[0m"
        return [f"{red}{type(self).__name__}{reset}: {self}", *getattr(self, "__notes__", [])]


class JobCancelledError(RuntimeError):
    """The job was cancelled; ``results`` holds the rows its collect sinks delivered until then."""

    def __init__(self, message: str, results: Optional[dict[str, pd.DataFrame]] = None):
        super().__init__(message)
        self.results = results or {}


class _SinkResults:
    """The rows one collect sink delivered, exactly once across restarts.

    Each batch carries its epoch (the last checkpoint barrier before it) and the checkpoint its
    attempt restored from. When a newer attempt's first batch arrives, the rows of epochs from
    the restored checkpoint on are dropped, because the new attempt replays them; with no
    checkpoint to restore (0), everything the old attempts sent is void. A barrier is answered
    with an acknowledgement for the JobManager: the rows before it came first on the same
    ordered channel, so the client holds them all."""

    def __init__(self, parallelism: int, buffer: ResultBuffer):
        self.parallelism = parallelism
        self.attempt = 0  # the attempt whose rows the buffer holds
        self.latest_attempt = 0  # the newest attempt heard of
        self.buffer = buffer
        self.ended: dict[int, set[int]] = {}  # attempt -> subtasks that ended
        self.error: Optional[str] = None
        self.first_row_at: Optional[float] = None  # time.perf_counter() of the first row kept

    def receive(self, msg: m.CollectBatch | m.CollectBarrier | m.CollectEnd,
                table: Optional[pa.Table] = None) -> Optional[m.AcknowledgeCollect]:
        self.latest_attempt = max(self.latest_attempt, msg.attempt)
        if isinstance(msg, m.CollectEnd):
            self.ended.setdefault(msg.attempt, set()).add(msg.subtask)
        elif isinstance(msg, m.CollectBarrier):
            return m.AcknowledgeCollect(msg.job_id, msg.attempt, msg.sink, msg.subtask, msg.checkpoint_id)
        elif table is not None and msg.attempt >= self.attempt:  # else a straggler from before a restart
            if msg.attempt > self.attempt:
                self.attempt, self.error = msg.attempt, None
                self.buffer = self.buffer.restored(msg.restored_from)
            self.buffer.add(table, msg.epoch)
            if self.first_row_at is None and table.num_rows:
                self.first_row_at = time.perf_counter()
        return None

    @property
    def complete(self) -> bool:
        return len(self.ended.get(self.latest_attempt, ())) == self.parallelism


@dataclass(frozen=True)
class ResultSummary:
    """Where one collect sink stands: rows received and kept, the mode, a few rows to show."""

    received: int
    kept: int
    mode: str
    preview: pd.DataFrame
    error: Optional[str] = None
    first_row_at: Optional[float] = None  # time.perf_counter() when the first row arrived


class ResultReceiver:
    """A ROUTER socket on 127.0.0.1 and a thread that files incoming batches by job and sink."""

    def __init__(self, codec: Codec, acknowledge: Callable[[m.AcknowledgeCollect], None], host: str = "127.0.0.1"):
        self.codec = codec
        self.acknowledge = acknowledge  # called on the receiver thread: must not block
        self._sock = make_socket(zmq.Context.instance(), zmq.ROUTER)
        self.address = bind_socket(self._sock, f"tcp://{host}:0", codec)
        self._lock = threading.Condition()
        self._jobs: dict[str, dict[str, _SinkResults]] = {}
        self._running = True
        self._thread = threading.Thread(target=self._run, name="results", daemon=True)
        self._thread.start()

    def expect(self, job_id: str, sinks: dict[str, tuple[int, ResultBuffer]]) -> None:
        """Be ready for a job's collect sinks: uid -> (parallelism, the buffer that keeps its rows)."""
        with self._lock:
            self._jobs[job_id] = {uid: _SinkResults(p, buffer) for uid, (p, buffer) in sinks.items()}

    def _run(self) -> None:
        try:
            while self._running:
                if not self._sock.poll(100):
                    continue
                frames = self._sock.recv_multipart(copy=False)[1:]
                try:
                    msg, _, payload = self.codec.decode(frames)
                    if not isinstance(msg, (m.CollectBatch, m.CollectBarrier, m.CollectEnd)):
                        raise m.MalformedMessage(f"{msg.op} is not a result message")
                    table = ipc_to_table(payload[0].buffer) if isinstance(msg, m.CollectBatch) else None
                except Exception as exc:
                    log.warning("result socket: dropped a malformed message: %s", exc)
                    continue
                ack = None
                with self._lock:
                    sink = self._jobs.get(msg.job_id, {}).get(msg.sink)
                    if sink is not None:
                        try:
                            ack = sink.receive(msg, table)
                        except Exception as exc:  # e.g. rows without the update mode's key
                            sink.error = f"{type(exc).__name__}: {exc}"
                            log.warning("result socket: job %s sink %s: %s", msg.job_id, msg.sink, sink.error)
                        self._lock.notify_all()
                if ack is not None:
                    self.acknowledge(ack)
        finally:
            self._sock.close(0)

    def _sink(self, job_id: str, sink: str) -> _SinkResults:
        results = self._jobs[job_id][sink]
        if results.error:
            raise RuntimeError(f"the rows of collect sink {sink} could not be kept: {results.error}")
        return results

    def frame(self, job_id: str, sink: str) -> pd.DataFrame:
        with self._lock:
            return self._sink(job_id, sink).buffer.frame()

    def summary(self, job_id: str, sink: str, n: int) -> "ResultSummary":
        with self._lock:
            results = self._jobs[job_id][sink]
            buffer = results.buffer
            preview = buffer.preview(n) if not results.error else pd.DataFrame()
            return ResultSummary(buffer.total, len(buffer), buffer.describe(), preview, results.error,
                                 results.first_row_at)

    def rows(self, job_id: str, sink: str) -> int:
        """Rows received from the current attempt, kept or not."""
        with self._lock:
            return self._jobs[job_id][sink].buffer.total

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
    state: JobState
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


class JobService(Protocol):
    """What a handle asks of the client that submitted its job (JobClient); any thread may call it."""

    cluster: ClusterInfo

    @property
    def results(self) -> ResultReceiver: ...

    def request(self, msg: m.Message, *, expect: type[R], timeout: Optional[float] = None, again: bool = True) -> R: ...

    def job_status(self, job_id: str) -> m.JobStatus: ...

    def job_details(self, job_id: str) -> dict: ...

    def follow(self, job_id: str, listener: Optional[Callable[[JobView], None]] = None) -> JobWatch: ...

    def cancel(self, job_id: str) -> None: ...

    def trigger_savepoint(self, job_id: str, target_directory: Optional[str] = None, stop: bool = False,
                          timeout: float = 600.0) -> str: ...


class HandleDisplay(Protocol):
    """What a notebook adds to a handle (kernel_runtime.notebook registers it as JobHandle.display):
    the job's live dashboard, and the entries of its rich display beside the text one."""

    def dashboard(self, handle: JobHandle, **options) -> Any: ...

    def mimebundle(self, handle: JobHandle, include, exclude) -> dict: ...


class JobHandle:
    """One submitted job: its status, its collected rows (live, as pandas), its metrics, its end.

    In a notebook its rich display is the live dashboard with the result table (``display``)."""

    # what a notebook adds to every handle; kernel_runtime.notebook sets it when imported, before
    # any handle is shown (without it a handle is text, and has no dashboard)
    display: ClassVar[Optional[HandleDisplay]] = None

    def __init__(self, client: JobService, job_id: str, name: str, sinks: dict[str, str],
                 job_graph: Optional[JobGraph] = None, detached: bool = False):
        self.client = client
        self.job_id = job_id
        self.name = name
        self.job_graph = job_graph
        self.detached = detached
        self._sinks = sinks  # collect sink name -> uid
        self.submitted_at = time.monotonic()
        self.upgraded_from: Optional[str] = None  # the savepoint a %%stream upgrade started it from
        self._dashboard = None
        # called (on the waiting thread) at every change wait() hears of: the dashboard applies
        # its pending update there, since a cell blocked in wait() holds the kernel's loop
        self.wait_hooks: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"<JobHandle {self.name!r} {self.job_id}>"

    def job_status(self) -> m.JobStatus:
        return self.client.job_status(self.job_id)

    @property
    def status(self) -> str:
        return self.job_status().state

    @property
    def sinks(self) -> list[str]:
        return list(self._sinks)

    def _uid(self, sink: Optional[str]) -> str:
        if self.detached:
            raise RuntimeError(f"job '{self.name}' ({self.job_id}) was submitted detached: "
                               "its collected rows are not sent to this client")
        if sink is not None and sink not in self._sinks:
            raise KeyError(f"job '{self.name}' has no collect sink {sink!r}; it has {sorted(self._sinks)}")
        return self._sinks[sink] if sink is not None else _pick(self._sinks, None)

    def results_of(self, sink: Optional[str] = None) -> pd.DataFrame:
        return self.client.results.frame(self.job_id, self._uid(sink))

    @property
    def results(self) -> pd.DataFrame:
        """The rows kept so far, as the result mode keeps them (a fresh DataFrame each time)."""
        return self.results_of()

    def to_pandas(self, sink: Optional[str] = None) -> pd.DataFrame:
        return self.results_of(sink)

    def summary(self, sink: Optional[str] = None, rows: int = 10) -> ResultSummary:
        """Rows received and kept, the result mode, and at most ``rows`` rows to look at: the
        newest (append), the first keys (update), the one row (single)."""
        return self.client.results.summary(self.job_id, self._uid(sink), rows)

    def row_count(self, sink: Optional[str] = None) -> int:
        """Rows received so far (of the current attempt), including those no longer kept."""
        return self.client.results.rows(self.job_id, self._uid(sink))

    def cancel(self) -> None:
        self.client.cancel(self.job_id)

    def savepoint(self, target_directory: Optional[str] = None, timeout: float = 600.0) -> str:
        """A savepoint of the running job; returns its location (start a job from it with the
        configuration key execution.savepoint.path)."""
        return self.client.trigger_savepoint(self.job_id, target_directory, timeout=timeout)

    def stop(self, savepoint: bool = True, target_directory: Optional[str] = None, timeout: float = 600.0):
        """Stop with a savepoint (the job ends FINISHED; returns the location), or just cancel."""
        if not savepoint:
            self.cancel()
            return None
        return self.client.trigger_savepoint(self.job_id, target_directory, stop=True, timeout=timeout)

    def state(self, operator: str, key=None, fresh: bool = False, timeout: float = 120.0) -> pd.DataFrame:
        """The keyed state of ``operator`` (its name, e.g. "count", or its uid) as pandas: one row
        per key, the key columns first, then one column per state (a process function's value
        state as its value, list state as a list, map state as a dict; aggregates by the names
        given). Read at the newest completed checkpoint, or at one taken now with ``fresh=True``;
        the job runs on. ``key``: that key's row only (a tuple for several key columns), an empty
        frame if it has none. The state columns are those some key holds (a process function
        creates its states as it goes); a key without one of them has None there.

        ``attrs``: ``checkpoint_id``, ``operator``, ``uid`` and ``sources``, each source
        operator's subtask positions at the checkpoint (what input the state covers)."""
        from cluster.checkpoint.inspection import decode_entries, encode_key, state_frame
        answer = self.client.request(
            m.RequestKeyedState(self.job_id, operator, None if key is None else encode_key(key), fresh),
            expect=m.KeyedState, timeout=timeout)
        frame = state_frame(decode_entries(answer.entries), answer.operator)
        frame.attrs.update(checkpoint_id=answer.checkpoint_id, operator=answer.operator["name"],
                           uid=answer.operator["uid"], sources=answer.sources)
        return frame

    def metrics(self) -> pd.DataFrame:
        """One row per subtask: vertex, subtask, attempt, status, TaskManager, slot and its metrics."""
        rows = []
        for subtask in self.client.job_details(self.job_id)["subtasks"]:
            row = {k: v for k, v in subtask.items() if k != "metrics"}
            row.update((k, v) for k, v in subtask["metrics"].items() if k not in row and k != "job_id")
            rows.append(row)
        return pd.DataFrame(rows)

    def dashboard(self, **options):
        """The live dashboard widget of this job, fed by its events (one per handle; ``options``
        count on the first call: ``poll_interval``, seconds between its last refreshes once the
        job ended, and ``rows`` of the result table)."""
        if self._dashboard is None:
            if JobHandle.display is None:
                raise RuntimeError("a job's dashboard comes with the notebook: import kernel_runtime.notebook")
            self._dashboard = JobHandle.display.dashboard(self, **options)
        return self._dashboard

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        shown = JobHandle.display
        return (shown.mimebundle(self, include, exclude) if shown is not None else {}) | {"text/plain": self._summary()}

    def _summary(self) -> str:
        try:
            state = self.status
        except Exception as exc:  # the cluster is gone; say so rather than fail the display
            state = f"status unknown ({exc})"
        lines = [f"Job '{self.name}' ({self.job_id}): {state}"]
        if not self.detached:
            for sink in self._sinks:
                summary = self.summary(sink, rows=0)
                lines.append(f"  {sink}: {summary.received:,} rows received, {summary.kept:,} kept ({summary.mode})")
        return "\n".join(lines)

    def _status(self, view: JobView) -> Optional[m.JobStatus]:
        """The job's status as the events tell it; when the JobManager could not be asked, ask
        once more, which raises its error (gone: TimeoutError; the job unknown: RpcError)."""
        return self.job_status() if view.error else view.status

    def wait_for_rows(self, n: int = 1, timeout: Optional[float] = None, sink: Optional[str] = None) -> int:
        """Block until at least n rows arrived (e.g. before a first look at a live job's results);
        returns the rows received. Raises if the job ends, or the timeout passes, first."""
        uid = self._uid(sink)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.client.follow(self.job_id) as watch:
            while (received := self.client.results.rows(self.job_id, uid)) < n:
                for hook in self.wait_hooks:
                    hook()
                status = self._status(watch.view)
                if status is not None and status.state in JobState.GLOBALLY_TERMINAL \
                        and self.client.results.rows(self.job_id, uid) < n:
                    raise RuntimeError(f"job '{self.name}' ({self.job_id}) is {status.state} after {received} of {n} rows")
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job '{self.name}' ({self.job_id}): {received} of {n} rows after {timeout:g} s")
                time.sleep(ROWS_CHECK_S)
        return received

    def wait(self, timeout: Optional[float] = None, on_status=None) -> JobExecutionResult:
        """Wait for the job's end. FINISHED returns the result; FAILED and CANCELED raise."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        with self.client.follow(self.job_id) as watch:
            view = watch.view
            while True:
                status = self._status(view)
                if on_status and status is not None and (status.state, status.reason) != last:
                    on_status(status)
                    last = (status.state, status.reason)
                for hook in self.wait_hooks:
                    hook()
                if status is not None and status.state in JobState.GLOBALLY_TERMINAL:
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    state = status.state if status is not None else "not heard of"
                    raise TimeoutError(f"job '{self.name}' ({self.job_id}) still {state} after {timeout:g} s")
                if watch.closed:
                    raise RuntimeError(f"the job events of {self.client.cluster.events_address} stopped; see the log")
                view = watch.wait_for_change(view.version, HOOKS_EVERY_S if remaining is None
                                             else min(HOOKS_EVERY_S, remaining))
        if status.state == JobState.FAILED:
            raise JobExecutionError(self.job_id, self.name, status.failure or "unknown cause")
        if status.state == JobState.CANCELED:
            results = {} if self.detached else {n: self.results_of(n) for n in self._sinks}
            raise JobCancelledError(f"job '{self.name}' ({self.job_id}) was cancelled", results)
        if self._sinks and not self.detached and not self.client.results.wait_complete(self.job_id, 30):
            raise RuntimeError(f"job '{self.name}' finished but not every collect sink's results arrived")
        duration = int((time.monotonic() - self.submitted_at) * 1000)
        results = {} if self.detached else {n: self.results_of(n) for n in self._sinks}
        return JobExecutionResult(self.job_id, self.name, JobState(status.state), duration, results)
