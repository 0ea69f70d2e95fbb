"""The ResultReceiver: the socket of a client's own to which collect sinks stream Arrow batches
straight from the TaskManagers, filed per job and sink, exactly once across restarts (each sink's
rows in a ResultBuffer, results.py); what a handle and the notebook's result table read of them.

Thread use: the receiver's thread files batches; any thread reads, under the receiver's lock.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

import pandas as pd
import pyarrow as pa
import zmq

from cluster.protocol import messages as m
from cluster.protocol.codec import Codec
from cluster.protocol.serde import ipc_to_table
from cluster.protocol.sockets import bind_socket, make_socket

from kernel_runtime.client.results import ResultBuffer

log = logging.getLogger(__name__)


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
    kind: str = ""  # append, update or single (results.MODES)
    key: tuple[str, ...] = ()  # an update table's key columns
    limit: Optional[int] = None  # the most rows (append) or keys (update) kept
    attempt: int = 0  # the job's attempt whose rows these are (a restart replaces the rows)


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
                                 results.first_row_at, buffer.mode, tuple(getattr(buffer, "key", ())),
                                 buffer.max_rows, results.attempt)

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
