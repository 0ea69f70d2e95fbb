"""The CheckpointCoordinator: which checkpoints are pending, who still owes an acknowledgement,
when one completes, expires or is declined, and what the history looks like.

A pure state machine (the JobMaster supplies the clock and does the I/O), so Flink's rules are
tested directly: at most ``max-concurrent-checkpoints`` pending, ``min-pause`` between the end
of one and the start of the next, ``timeout`` aborts, a decline aborts, and only the last
``state.checkpoints.num-retained`` completed checkpoints are kept. Savepoints and the final
checkpoint of a finished input are triggered on demand, outside the periodic rules.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Optional



class CheckpointKind(enum.StrEnum):
    """Why a checkpoint was taken; equal to the plain strings on the wire and in _metadata."""
    CHECKPOINT = "checkpoint"  # periodic
    SAVEPOINT = "savepoint"
    STOP = "stop"              # stop-with-savepoint: the sources end after it
    FINAL = "final"            # the last checkpoint of a bounded job whose input has ended


PERIODIC_KINDS = (CheckpointKind.CHECKPOINT,)
SAVEPOINT_KINDS = (CheckpointKind.SAVEPOINT, CheckpointKind.STOP)


@dataclass
class PendingCheckpoint:
    checkpoint_id: int
    kind: str
    trigger_ms: int
    directory: str
    waiting: set[str]                      # participants that have not acknowledged yet
    acks: dict[str, dict] = field(default_factory=dict)
    ack_times: dict[str, int] = field(default_factory=dict)
    on_done: list[Callable[[Optional["CompletedCheckpoint"], Optional[str]], None]] = field(default_factory=list)

    @property
    def is_savepoint(self) -> bool:
        return self.kind in SAVEPOINT_KINDS

    @property
    def fully_acknowledged(self) -> bool:
        return not self.waiting


@dataclass
class CompletedCheckpoint:
    checkpoint_id: int
    kind: str
    trigger_ms: int
    end_ms: int
    directory: str
    size: int
    participants: int

    @property
    def is_savepoint(self) -> bool:
        return self.kind in SAVEPOINT_KINDS


@dataclass
class CheckpointRecord:
    """One row of the history that GET /jobs/<id>/checkpoints shows."""
    checkpoint_id: int
    kind: str
    status: str  # IN_PROGRESS, COMPLETED, FAILED
    trigger_ms: int
    participants: int
    acknowledged: int = 0
    latest_ack_ms: int = -1
    end_ms: int = -1
    size: int = 0
    failure: Optional[str] = None
    directory: str = ""
    tasks: dict = field(default_factory=dict)  # per vertex: acknowledged subtasks, size, latest ack


class CheckpointCoordinator:
    def __init__(self, interval_ms: int, timeout_ms: int, min_pause_ms: int, max_concurrent: int,
                 retained: int, history_size: int = 10):
        self.interval_ms = interval_ms
        self.timeout_ms = timeout_ms
        self.min_pause_ms = min_pause_ms
        self.max_concurrent = max_concurrent
        self.retained = retained
        self.history_size = history_size
        self.pending: dict[int, PendingCheckpoint] = {}
        self.completed: list[CompletedCheckpoint] = []  # retained checkpoints, oldest first
        self.savepoints: list[CompletedCheckpoint] = []
        self.records: dict[int, CheckpointRecord] = {}
        self.counts = {"completed": 0, "failed": 0}
        self.restored: Optional[tuple[int, int, str, bool]] = None  # (id, when, path, is_savepoint)
        self._next_id = 1
        self._last_completion_ms: Optional[int] = None

    @property
    def periodic(self) -> bool:
        return self.interval_ms > 0

    def start_ids_after(self, checkpoint_id: int) -> None:
        """After a restore, new checkpoints continue the numbering."""
        self._next_id = max(self._next_id, checkpoint_id + 1)

    # ------------------------------------------------------------------ triggering
    def why_not_trigger(self, now_ms: int) -> Optional[str]:
        periodic = [p for p in self.pending.values() if p.kind in PERIODIC_KINDS]
        if len(periodic) >= self.max_concurrent:
            return f"{len(periodic)} checkpoint(s) pending (max-concurrent-checkpoints {self.max_concurrent})"
        if self._last_completion_ms is not None and now_ms - self._last_completion_ms < self.min_pause_ms:
            return f"min-pause {self.min_pause_ms} ms since the last checkpoint"
        return None

    def trigger(self, now_ms: int, participants: list[str], directory_for: Callable[[int], str],
                kind: str = CheckpointKind.CHECKPOINT) -> PendingCheckpoint:
        checkpoint_id = self._next_id
        self._next_id += 1
        pending = PendingCheckpoint(checkpoint_id, kind, now_ms, directory_for(checkpoint_id), set(participants))
        self.pending[checkpoint_id] = pending
        self.records[checkpoint_id] = CheckpointRecord(checkpoint_id, kind, "IN_PROGRESS", now_ms, len(participants),
                                                       directory=pending.directory)
        self._trim_history()
        return pending

    # ------------------------------------------------------------------ acknowledgements
    def acknowledge(self, checkpoint_id: int, participant: str, state: dict, now_ms: int) -> Optional[PendingCheckpoint]:
        """Record an ack; returns the pending checkpoint once every participant acknowledged."""
        pending = self.pending.get(checkpoint_id)
        if pending is None or participant not in pending.waiting:
            return None  # late, duplicate or for an aborted checkpoint
        pending.waiting.discard(participant)
        pending.acks[participant] = state
        pending.ack_times[participant] = now_ms
        record = self.records[checkpoint_id]
        record.acknowledged += 1
        record.latest_ack_ms = now_ms
        return pending if pending.fully_acknowledged else None

    def complete(self, pending: PendingCheckpoint, now_ms: int, size: int) -> tuple[CompletedCheckpoint, list[CompletedCheckpoint]]:
        """The metadata is written: the checkpoint exists. Returns it and the ones no longer retained."""
        del self.pending[pending.checkpoint_id]
        done = CompletedCheckpoint(pending.checkpoint_id, pending.kind, pending.trigger_ms, now_ms,
                                   pending.directory, size, len(pending.acks))
        record = self.records[pending.checkpoint_id]
        record.status, record.end_ms, record.size = "COMPLETED", now_ms, size
        self.counts["completed"] += 1
        dropped: list[CompletedCheckpoint] = []
        if done.is_savepoint:
            self.savepoints.append(done)
        else:
            self._last_completion_ms = now_ms
            self.completed.append(done)
            while len(self.completed) > self.retained:
                dropped.append(self.completed.pop(0))
        # a completed checkpoint subsumes older pending ones (as in Flink)
        for older in [p for p in self.pending.values()
                      if p.checkpoint_id < done.checkpoint_id and not p.is_savepoint]:
            self.abort(older.checkpoint_id, f"subsumed by checkpoint {done.checkpoint_id}", now_ms)
        for callback in pending.on_done:
            callback(done, None)
        return done, dropped

    def decline(self, checkpoint_id: int, participant: str, reason: str, now_ms: int) -> Optional[PendingCheckpoint]:
        if checkpoint_id not in self.pending:
            return None
        return self.abort(checkpoint_id, f"declined by {participant}: {reason}", now_ms)

    def expire(self, now_ms: int) -> list[PendingCheckpoint]:
        late = [p for p in self.pending.values() if now_ms - p.trigger_ms > self.timeout_ms]
        return [self._abort(p, f"expired before completing (timeout {self.timeout_ms} ms, "
                               f"{len(p.waiting)} participant(s) had not acknowledged)", now_ms)
                for p in late if p.checkpoint_id in self.pending]  # a callback may have aborted it

    def abort(self, checkpoint_id: int, reason: str, now_ms: int) -> Optional[PendingCheckpoint]:
        pending = self.pending.get(checkpoint_id)
        if pending is None:
            return None
        return self._abort(pending, reason, now_ms)

    def _abort(self, pending: PendingCheckpoint, reason: str, now_ms: int) -> PendingCheckpoint:
        checkpoint_id = pending.checkpoint_id
        del self.pending[checkpoint_id]
        record = self.records[checkpoint_id]
        record.status, record.end_ms, record.failure = "FAILED", now_ms, reason
        self.counts["failed"] += 1
        for callback in pending.on_done:
            callback(None, reason)
        return pending

    def abort_all(self, reason: str, now_ms: int) -> list[PendingCheckpoint]:
        return [self._abort(p, reason, now_ms) for p in list(self.pending.values())
                if p.checkpoint_id in self.pending]  # a callback may have aborted it

    def latest(self) -> Optional[CompletedCheckpoint]:
        return self.completed[-1] if self.completed else None

    def _trim_history(self) -> None:
        finished = sorted(cid for cid, r in self.records.items() if r.status != "IN_PROGRESS")
        for cid in finished[:max(0, len(self.records) - self.history_size)]:
            del self.records[cid]
