"""JobHandle: one submitted job as the client follows it.

A handle tells the job's status, its live results as pandas (received by the client's
ResultReceiver, result_receiver.py), its metrics, late rows and keyed state, its end; it waits by
following the job's events (kernel_runtime.client.events), never by asking in a loop.

A handle asks the client that submitted its job (JobService: the JobClient, named by what it
does, so the two modules do not import each other). What a notebook adds to a handle, the live
dashboard and the rich display, kernel_runtime.notebook registers when imported (HandleDisplay).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional, Protocol

import pandas as pd

from cluster.common.failures import Failure
from cluster.protocol.states import JobState
from cluster.graph.job_graph import JobGraph
from cluster.protocol import messages as m
from cluster.protocol.endpoint import R
from cluster.protocol.metrics import LATE_ROWS

from kernel_runtime.client.cluster_info import ClusterInfo
from kernel_runtime.client.events import JobView, JobWatch
from kernel_runtime.client.result_receiver import ResultReceiver, ResultSummary

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

    def late_rows(self, operator: str) -> pd.DataFrame:
        """The newest rows ``operator`` (a window or join: its name or uid) found late, as pandas:
        the rows' own columns, then their ``event_time``, the ``watermark`` that made them late,
        ``late_by`` (the one minus the other), the join ``input`` they came on and the ``subtask``,
        oldest first; at most 20 per subtask. ``attrs``: ``count`` (every late row so far),
        ``dropped`` (those not sent to a side output), ``side_output`` (its tag, or None),
        ``operator`` and ``uid``. Empty while the operator has found none."""
        from cluster.protocol.metrics import OperatorLateRows, late_rows
        from kernel_runtime.client.late_rows import late_rows_frame
        reports = late_rows(self.client.job_details(self.job_id)["subtasks"])
        report = next((r for r in reports if operator in (r.name, r.uid)), None)
        if report is None:
            known = [] if self.job_graph is None else [
                op for v in self.job_graph.vertices for op in v.operators if operator in (op.name, op.uid)]
            if not known:
                raise KeyError(f"job '{self.name}' ({self.job_id}) has no window or join operator named "
                               f"{operator!r} reporting late rows; those that do: {[r.name for r in reports]}")
            report = OperatorLateRows(known[0].uid, known[0].name, 0, 0, None, {}, [])  # not open yet
        return late_rows_frame(report)

    def bottleneck(self) -> dict:
        """The vertex that limits the job now, by Flink's rule of thumb (busy, not back-pressured),
        its busy share, whether it is ``chronic`` (over the last minutes) or transient, a skewed key
        (``skew``: the busy subtask and the key group the upstream tasks sent the most rows), and a
        ``text`` saying what helps; GET /jobs/<id>/bottleneck. ``vertex-id`` None: nothing limits it."""
        return self.client.job_details(self.job_id)["bottleneck"]

    def window_waits(self, timeout: float = 0.0) -> list[dict]:
        """Why the job's event-time windows have not fired: per window operator with a window still
        open, its oldest one (``window``: start and end, epoch ms), its ``watermark`` and what holds
        that back (``held_by``: the source subtask, or its split, followed upstream from the
        smallest input), with a ``text`` sentence; GET /jobs/<id>'s ``window-waits``. ``timeout``:
        wait up to so many seconds for one to show (a job just started has read nothing yet)."""
        deadline = time.monotonic() + timeout
        with self.client.follow(self.job_id) as watch:
            view = watch.view
            while not view.summary.get("window-waits") and not view.ended and not watch.closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                view = watch.wait_for_change(view.version, remaining)
        return view.summary.get("window-waits") or self.client.job_details(self.job_id).get("window-waits") or []

    def metrics(self) -> pd.DataFrame:
        """One row per subtask: vertex, subtask, attempt, status, TaskManager, slot and its metrics."""
        rows = []
        for subtask in self.client.job_details(self.job_id)["subtasks"]:
            row = {k: v for k, v in subtask.items() if k != "metrics"}
            row.update((k, v) for k, v in subtask["metrics"].items() if k not in row and k not in ("job_id", LATE_ROWS))
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
        """Wait for the job's end. FINISHED returns the result; FAILED and CANCELED raise. Outside a
        notebook (whose header shows them), each restart is a line on stderr, its cause first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        restarts = None if _in_a_notebook() else RestartLines(self.name, self.job_id)
        with self.client.follow(self.job_id, None if restarts is None else restarts.see) as watch:
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


class RestartLines:
    """A script's account of its job's restarts: one line on stderr for each, the cause first, as
    a notebook's header tells it (a job restarting for ever in silence looked like a hung script)."""

    def __init__(self, name: str, job_id: str):
        self.name, self.job_id = name, job_id
        self.told: set[int] = set()  # the attempts whose failure was told

    def see(self, view: JobView) -> None:
        """The events thread, after changes of the job (JobView.restarts keeps every restart)."""
        for attempt, failure in view.restarts:
            if attempt not in self.told:
                self.told.add(attempt)
                print(f"{Failure.parse(failure).headline} (job '{self.name}' {self.job_id} restarts after "
                      f"attempt {attempt})", file=sys.stderr, flush=True)


def _in_a_notebook() -> bool:
    """Whether this process is an IPython kernel or shell (its display shows a job's restarts)."""
    ipython = sys.modules.get("IPython")
    return ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None
