"""The checkpoint half of the JobMaster's decisions (Flink's CheckpointCoordinator as the
scheduler drives it): barriers, acknowledgements, ``_metadata``, savepoint and checkpoint
requests, the final checkpoint of a finished input, and the checkpoint a restart restores.

A checkpoint covers the tasks and, for collect sinks, the client that holds their rows; it
exists once ``_metadata`` is written (by the shell, off the loop); then the sinks commit.

Pure as the scheduler is, and it holds no reference to it: every call is handed the job's facts
at that moment (``JobFacts``: the job's state and its executions) and returns the instructions
it produced, in order; the clock is injected. So what a decision reads is visible at the call,
and the machine is driven by hand in tests. Loop thread only (the shell checks; this class does
not know about threads).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Iterable, Mapping, Optional

from cluster.checkpoint.coordinator import (CheckpointCoordinator, CheckpointKind, CompletedCheckpoint,
                                            PendingCheckpoint)
from cluster.checkpoint.savepoint_fit import restore_plan, state_shape
from cluster.checkpoint.storage import CheckpointStorage
from cluster.graph.execution_graph import Execution
from cluster.protocol.states import ExecutionState, JobState
from cluster.graph.job_graph import JobGraph
from cluster.protocol.metrics import CHECKPOINTED_COUNTERS

from cluster.jobmanager.jobmaster.instructions import (CHECKPOINT_TIMER, FINAL_CHECKPOINT_TIMER, CancelTimer,
                                                       CheckpointFinished, DisposeCheckpoint, FindRestorePoint,
                                                       Instruction, NotifyCheckpointAborted,
                                                       NotifyCheckpointComplete, SavepointFinished, StartTimer,
                                                       TriggerCheckpoint, WriteMetadata)
from cluster.jobmanager.jobmaster.scheduler_events import (CheckpointAcknowledged, CheckpointDeclined,
                                                           MetadataWritten, SchedulerError, TooManySavepoints)
from cluster.conf.options import CheckpointingOptions

FINAL_RETRY_MS = 200
# Flink bounds the savepoint and checkpoint requests a job queues (CheckpointRequestDecider, 1000)
# and triggers them one at a time; here a requested savepoint starts at once, so the bound is on
# those in flight. Each holds barriers, acknowledgements and state handles until it completes:
# unbounded, a token holder's loop of triggers starved the periodic checkpoints and grew the
# JobManager for good.
MAX_PENDING_SAVEPOINTS = 10


@dataclass(frozen=True)
class JobFacts:
    """What the checkpointing reads of the job, handed in by the scheduler with every call."""
    state: str
    executions: Mapping[str, Execution]  # execution id -> the current attempt's execution

    @property
    def all_running(self) -> bool:
        return self.state == JobState.RUNNING and all(
            e.state == ExecutionState.RUNNING for e in self.executions.values())

    def task_managers(self) -> tuple[str, ...]:
        return tuple(sorted({e.task_manager_id for e in self.executions.values() if e.task_manager_id}))


class JobCheckpointing:
    """One job's checkpoints: its CheckpointCoordinator and storage, the savepoint requests'
    status (Flink's asynchronous operations), and the restore the next deployment starts from."""

    def __init__(self, job_graph: JobGraph, conf, clock: Callable[[], int], collect_participants: list[str]):
        self.job_graph = job_graph
        self.job_id = job_graph.job_id
        self.now = clock
        self.interval_ms = conf.get(CheckpointingOptions.INTERVAL)
        self.coordinator = CheckpointCoordinator(
            self.interval_ms, conf.get(CheckpointingOptions.TIMEOUT), conf.get(CheckpointingOptions.MIN_PAUSE),
            conf.get(CheckpointingOptions.MAX_CONCURRENT_CHECKPOINTS), conf.get(CheckpointingOptions.MAX_RETAINED_CHECKPOINTS))
        self.storage = CheckpointStorage(conf.get(CheckpointingOptions.CHECKPOINTS_DIRECTORY), conf.get(CheckpointingOptions.SAVEPOINT_DIRECTORY),
                                         self.job_id)
        self.collect_participants = collect_participants
        self.restore: Optional[dict] = None  # what the next deployment starts from
        self.savepoint_requests: dict[str, dict] = {}  # request id -> Flink's async operation status
        self._exhausted: set[str] = set()
        self._writing: set[int] = set()  # fully acknowledged, _metadata being written
        # who waits for a checkpoint: checkpoint id -> savepoint / checkpoint request id
        self._savepoint_of: dict[int, str] = {}
        self._requested_by: dict[int, str] = {}
        # checkpoints the coordinator just completed or aborted, in its order: answered by
        # _settle right after the coordinator call, with the facts of the call in progress
        self._settled: list[tuple[PendingCheckpoint, Optional[CompletedCheckpoint], Optional[str]]] = []

    # ------------------------------------------------------------------ lifecycle
    def on_running(self) -> list[Instruction]:
        self._exhausted.clear()
        return [StartTimer(CHECKPOINT_TIMER, self.interval_ms)] if self.interval_ms > 0 else []

    def on_stopped(self, job: JobFacts, reason: str) -> list[Instruction]:
        out: list[Instruction] = [CancelTimer(CHECKPOINT_TIMER)]
        self._settle(job, out, self.coordinator.abort_all(reason, self.now()))
        return out

    def tick(self, job: JobFacts) -> list[Instruction]:
        out: list[Instruction] = [StartTimer(CHECKPOINT_TIMER, self.interval_ms)]
        self._settle(job, out, self.coordinator.expire(self.now()))
        if job.all_running and self.coordinator.why_not_trigger(self.now()) is None:
            self.trigger(job, CheckpointKind.CHECKPOINT, out)
        return out

    # ------------------------------------------------------------------ triggering
    def trigger(self, job: JobFacts, kind: str, out: list[Instruction],
                directory: Optional[str] = None) -> PendingCheckpoint:
        """Start checkpoint ``kind`` now; its TriggerCheckpoint goes to ``out``."""
        pending = self.coordinator.trigger(
            self.now(), [*job.executions, *self.collect_participants],
            lambda n: str(directory or self.storage.checkpoint_dir(n)), kind)
        pending.on_done.append(partial(self._on_done, pending))
        sources = tuple((e.task_manager_id, e.execution_id) for e in job.executions.values()
                        if e.vertex.is_source and e.task_manager_id is not None)
        out.append(TriggerCheckpoint(pending.checkpoint_id, pending.trigger_ms, kind, pending.directory, sources))
        return pending

    def trigger_savepoint(self, job: JobFacts, request_id: str, target: Optional[str],
                          stop: bool) -> list[Instruction]:
        self._require_running(job, "a savepoint")
        pending_savepoints = sum(p.is_savepoint for p in self.coordinator.pending.values())
        if pending_savepoints >= MAX_PENDING_SAVEPOINTS:
            raise TooManySavepoints(
                f"job {self.job_id} already takes {pending_savepoints} savepoints (at most "
                f"{MAX_PENDING_SAVEPOINTS} at once): wait for one to complete and ask again")
        out: list[Instruction] = []
        pending = self.trigger(job, CheckpointKind.STOP if stop else CheckpointKind.SAVEPOINT, out,
                               str(self.storage.new_savepoint_dir(target)))
        self.savepoint_requests[request_id] = {"status": "IN_PROGRESS"}
        self._savepoint_of[pending.checkpoint_id] = request_id
        return out

    def trigger_checkpoint(self, job: JobFacts, request_id: str) -> list[Instruction]:
        self._require_running(job, "a checkpoint")
        out: list[Instruction] = []
        self._requested_by[self.trigger(job, CheckpointKind.CHECKPOINT, out).checkpoint_id] = request_id
        return out

    def _require_running(self, job: JobFacts, what: str) -> None:
        if not job.all_running:
            raise SchedulerError(f"job {self.job_id} is {job.state}: {what} needs every task RUNNING")

    def source_exhausted(self, job: JobFacts, execution_id: str) -> list[Instruction]:
        self._exhausted.add(execution_id)
        sources = {e.execution_id for e in job.executions.values() if e.vertex.is_source}
        return self.trigger_final(job) if sources <= self._exhausted else []

    def trigger_final(self, job: JobFacts) -> list[Instruction]:
        out: list[Instruction] = []
        if job.state == JobState.RUNNING and not any(
                p.kind == CheckpointKind.FINAL for p in self.coordinator.pending.values()):
            self.trigger(job, CheckpointKind.FINAL, out)
        return out

    # ------------------------------------------------------------------ outcomes
    def _on_done(self, pending: PendingCheckpoint, completed: Optional[CompletedCheckpoint],
                 reason: Optional[str]) -> None:
        """The coordinator's callback, inside its call: only noted, answered by _settle."""
        self._settled.append((pending, completed, reason))

    def _settle(self, job: JobFacts, out: list[Instruction], aborted: Iterable[PendingCheckpoint] = ()) -> None:
        """After a coordinator call: answer whoever waits for the checkpoints it ended, then tell
        the TaskManagers which of them were aborted."""
        settled, self._settled = self._settled, []
        for pending, completed, reason in settled:
            checkpoint_id = pending.checkpoint_id
            request_id = self._savepoint_of.pop(checkpoint_id, None)
            if request_id is not None:
                self.savepoint_requests[request_id] = (
                    {"status": "COMPLETED", "location": completed.directory} if completed
                    else {"status": "COMPLETED", "failure": reason})
                out.append(SavepointFinished(request_id, completed.directory if completed else None,
                                             None if completed else f"the savepoint of job {self.job_id} failed: {reason}"))
            request_id = self._requested_by.pop(checkpoint_id, None)
            if request_id is not None:
                out.append(CheckpointFinished(request_id, completed, reason))
            if pending.kind == CheckpointKind.FINAL and completed is None and job.state == JobState.RUNNING:
                out.append(StartTimer(FINAL_CHECKPOINT_TIMER, FINAL_RETRY_MS))
        out += [NotifyCheckpointAborted(p.checkpoint_id, job.task_managers()) for p in aborted]

    # ------------------------------------------------------------------ acknowledgements
    def acknowledge(self, job: JobFacts, event: CheckpointAcknowledged) -> list[Instruction]:
        participant = event.participant
        if not participant.startswith("collect/") and participant not in job.executions:
            return []  # a report of an earlier attempt
        pending = self.coordinator.acknowledge(event.checkpoint_id, participant, event.state, self.now())
        return [] if pending is None else [self._write_metadata(job, pending)]

    def decline(self, job: JobFacts, event: CheckpointDeclined) -> list[Instruction]:
        out: list[Instruction] = []
        pending = self.coordinator.decline(event.checkpoint_id, event.participant, event.reason, self.now())
        self._settle(job, out, [] if pending is None else [pending])
        return out

    def _write_metadata(self, job: JobFacts, pending: PendingCheckpoint) -> WriteMetadata:
        operators: dict[str, dict] = {}
        specs = {o.uid: o for v in self.job_graph.vertices for o in v.operators}
        counters: dict[str, list[dict]] = {}  # vertex id -> each subtask's counters at the barrier
        tasks: dict[str, dict] = {}
        for participant, state in pending.acks.items():
            execution = job.executions.get(participant)
            if execution is None:
                continue  # a client's collect acknowledgement carries no state
            stats = tasks.setdefault(execution.vertex.id, {"num_subtasks": execution.vertex.parallelism,
                                                           "num_acknowledged_subtasks": 0, "size": 0,
                                                           "latest_ack": 0})
            stats["num_acknowledged_subtasks"] += 1
            stats["size"] += sum(int(h.get("bytes", 0)) for h in state.values())
            stats["latest_ack"] = max(stats["latest_ack"], pending.ack_times[participant])
            state = dict(state)
            task_counters = state.pop(CHECKPOINTED_COUNTERS, None)
            if task_counters is not None:
                counters.setdefault(execution.vertex.id, []).append(
                    dict(task_counters, subtask=execution.subtask, parallelism=execution.vertex.parallelism))
            for uid, handle in state.items():
                spec = specs.get(uid)
                entry = operators.setdefault(uid, {"vertex": execution.vertex.name,
                                                   # what a restore checks its operator against
                                                   "name": spec.name if spec else None,
                                                   "kind": spec.kind if spec else None,
                                                   # a keyed operator's key columns (an upgrade's preview
                                                   # says when they changed)
                                                   "key": list(spec.params.get("key") or []) if spec else [],
                                                   # and what shapes its state (aggregates, window)
                                                   "shape": state_shape(spec) if spec else {},
                                                   "max_parallelism": execution.vertex.max_parallelism,
                                                   "subtasks": []})
                entry["subtasks"].append(dict(handle, subtask=execution.subtask,
                                              parallelism=execution.vertex.parallelism))
        self.coordinator.records[pending.checkpoint_id].tasks = tasks
        body = {"job_id": self.job_id, "job_name": self.job_graph.name, "checkpoint_id": pending.checkpoint_id,
                "kind": pending.kind, "timestamp": pending.trigger_ms, "operators": operators, "counters": counters}
        self._writing.add(pending.checkpoint_id)
        return WriteMetadata(pending.checkpoint_id, pending.directory, body)

    def metadata_written(self, job: JobFacts, event: MetadataWritten) -> list[Instruction]:
        self._writing.discard(event.checkpoint_id)
        out: list[Instruction] = []
        pending = self.coordinator.pending.get(event.checkpoint_id)
        if pending is None:
            # aborted while its _metadata was being written (expired, cancelled, failover): a
            # checkpoint the sinks never committed must not be found on recovery
            if event.error is None:
                out.append(DisposeCheckpoint(self._directory_of(event.checkpoint_id)))
            return out
        if event.error is not None:
            self.coordinator.abort(event.checkpoint_id, f"writing _metadata failed: {event.error}", self.now())
            self._settle(job, out, [pending])
            return out
        size = sum(int(h.get("bytes", 0)) for state in pending.acks.values() for h in state.values())
        completed, dropped = self.coordinator.complete(pending, self.now(), size)
        self._settle(job, out)
        out += [DisposeCheckpoint(old.directory) for old in dropped]
        out.append(NotifyCheckpointComplete(completed.checkpoint_id, job.task_managers()))
        return out

    def _directory_of(self, checkpoint_id: int) -> str:
        record = self.coordinator.records.get(checkpoint_id)
        return record.directory if record else str(self.storage.checkpoint_dir(checkpoint_id))

    # ------------------------------------------------------------------ restore
    def find_restore_point(self) -> list[Instruction]:
        candidates = tuple((c.checkpoint_id, c.directory) for c in reversed(self.coordinator.completed))
        return [FindRestorePoint(candidates, str(self.storage.job_dir))]

    def restored(self, body: dict, directory: str, is_savepoint: bool) -> dict:
        self.coordinator.start_ids_after(body["checkpoint_id"])
        self.coordinator.restored = (body["checkpoint_id"], self.now(), str(directory), is_savepoint)
        self.restore = restore_plan(body, directory, is_savepoint)
        return self.restore
