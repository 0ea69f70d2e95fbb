"""The JobMaster's decisions, as a pure state machine (Flink's SchedulerNG with its
CheckpointCoordinator): events in, instructions out, no sockets, no disk, no threads.

``DefaultScheduler.handle(event)`` applies one event (a slot offer, a task's state, a lost
TaskManager, a fired timer, a checkpoint acknowledgement, the result of a disk operation) and
returns what the networked JobMaster must do about it (deploy, cancel a task, start a timer,
trigger barriers, write ``_metadata``, answer a savepoint request). The clock is an argument,
so tests move time by hand; timers are named and are the shell's to run.

Every method is for the JobManager's loop thread only; the shell checks that, this class does
not know about threads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from cluster.common import failures
from cluster.checkpoint.coordinator import (CheckpointCoordinator, CheckpointKind, CompletedCheckpoint,
                                            PendingCheckpoint)
from cluster.checkpoint.storage import CheckpointStorage
from cluster.graph.execution_graph import Execution, ExecutionGraph, ExecutionState, JobState
from cluster.graph.job_graph import JobGraph, OperatorSpec
from cluster.checkpoint.savepoint_fit import restore_plan, savepoint_fit
from cluster.protocol.metrics import CHECKPOINTED_COUNTERS, restored_counters

from cluster.jobmanager.jobmaster.restart_strategy import RestartStrategy
from cluster.jobmanager.resourcemanager.slot_manager import SlotAllocation

FINAL_RETRY_MS = 200

# timer names
SLOT_REQUEST_TIMER = "slot-request"
RESTART_TIMER = "restart"
CHECKPOINT_TIMER = "checkpoint"
FINAL_CHECKPOINT_TIMER = "final-checkpoint"


class SchedulerError(Exception):
    """A request the job cannot serve in its current state (answered to the caller, not a bug)."""


# --------------------------------------------------------------------------- events
class Event:
    """Something that happened to the job; the only input of DefaultScheduler.handle."""


@dataclass(frozen=True)
class StartScheduling(Event):
    pass


@dataclass(frozen=True)
class SlotsAllocated(Event):
    allocations: tuple[SlotAllocation, ...]


@dataclass(frozen=True)
class SlotsOffered(Event):
    allocation_ids: tuple[str, ...]


@dataclass(frozen=True)
class TaskStateReported(Event):
    execution_id: str
    state: str
    error: Optional[str] = None
    metrics: Optional[dict] = None


@dataclass(frozen=True)
class TaskMetricsReported(Event):
    tasks: tuple[dict, ...]


@dataclass(frozen=True)
class TaskManagerLost(Event):
    task_manager_id: str
    reason: str


@dataclass(frozen=True)
class DeploymentFailed(Event):
    """The shell could not hand a task to its TaskManager (gone since the allocation)."""
    execution_id: str
    reason: str


@dataclass(frozen=True)
class TimerFired(Event):
    name: str


@dataclass(frozen=True)
class CancelRequested(Event):
    pass


@dataclass(frozen=True)
class SavepointRequested(Event):
    request_id: str
    target_directory: Optional[str]
    stop: bool


@dataclass(frozen=True)
class CheckpointRequested(Event):
    """A checkpoint now, outside the periodic rules (Flink's manual checkpoint trigger);
    ``on_done(completed or None, failure or None)`` is called when it completes or fails."""
    on_done: Callable[[Optional[CompletedCheckpoint], Optional[str]], None]


@dataclass(frozen=True)
class CheckpointAcknowledged(Event):
    checkpoint_id: int
    participant: str  # an execution id, or collect/<sink uid>/<subtask> for a client's acknowledgement
    state: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointDeclined(Event):
    checkpoint_id: int
    participant: str
    reason: str


@dataclass(frozen=True)
class SourceExhausted(Event):
    execution_id: str


@dataclass(frozen=True)
class MetadataWritten(Event):
    checkpoint_id: int
    error: Optional[str] = None


@dataclass(frozen=True)
class RestorePointFound(Event):
    """The answer to FindRestorePoint: the newest sound checkpoint's metadata, or None."""
    body: Optional[dict]
    directory: Optional[str]


# --------------------------------------------------------------------------- instructions
class Instruction:
    """Something the networked JobMaster must do; the only output of DefaultScheduler.handle."""


@dataclass(frozen=True)
class RequestSlots(Instruction):
    count: int


@dataclass(frozen=True)
class CancelSlotRequest(Instruction):
    pass


@dataclass(frozen=True)
class ReleaseSlots(Instruction):
    pass


@dataclass(frozen=True)
class DeployTasks(Instruction):
    """Submit every execution of the attempt to the TaskManager of its slot."""
    attempt: int
    placements: tuple[tuple[Execution, SlotAllocation], ...]
    restore: Optional[dict]


@dataclass(frozen=True)
class CancelTask(Instruction):
    task_manager_id: str
    execution_id: str


@dataclass(frozen=True)
class StartTimer(Instruction):
    name: str
    delay_ms: int


@dataclass(frozen=True)
class CancelTimer(Instruction):
    name: str


@dataclass(frozen=True)
class TriggerCheckpoint(Instruction):
    """Inject barrier n at each source task."""
    checkpoint_id: int
    timestamp: int
    kind: str
    directory: str
    sources: tuple[tuple[str, str], ...]  # (task manager id, execution id)


@dataclass(frozen=True)
class WriteMetadata(Instruction):
    """Write ``_metadata`` (storage executor); answered by MetadataWritten."""
    checkpoint_id: int
    directory: str
    body: dict


@dataclass(frozen=True)
class NotifyCheckpointComplete(Instruction):
    checkpoint_id: int
    task_managers: tuple[str, ...]


@dataclass(frozen=True)
class NotifyCheckpointAborted(Instruction):
    checkpoint_id: int
    task_managers: tuple[str, ...]


@dataclass(frozen=True)
class DisposeCheckpoint(Instruction):
    directory: str


@dataclass(frozen=True)
class FindRestorePoint(Instruction):
    """Read the candidates' metadata, newest first, plus any completed checkpoint on disk in
    ``job_dir`` (storage executor); answered by RestorePointFound."""
    candidates: tuple[tuple[int, str], ...]
    job_dir: str


@dataclass(frozen=True)
class SavepointFinished(Instruction):
    request_id: str
    location: Optional[str]
    failure: Optional[str]


@dataclass(frozen=True)
class JobTerminated(Instruction):
    state: str


# --------------------------------------------------------------------------- checkpoints
class JobCheckpointing:
    """The checkpoint half of the scheduler: barriers, acknowledgements, ``_metadata``, restore.

    A checkpoint covers the tasks and, for collect sinks, the client that holds their rows;
    it exists once ``_metadata`` is written (by the shell, off the loop); then the sinks commit.
    """

    def __init__(self, scheduler: "DefaultScheduler", conf, collect_participants: list[str]):
        self.s = scheduler
        self.interval_ms = conf["execution.checkpointing.interval"]
        self.coordinator = CheckpointCoordinator(
            self.interval_ms, conf["execution.checkpointing.timeout"], conf["execution.checkpointing.min-pause"],
            conf["execution.checkpointing.max-concurrent-checkpoints"], conf["state.checkpoints.num-retained"])
        self.storage = CheckpointStorage(conf["execution.checkpointing.dir"], conf["state.savepoints.dir"],
                                         scheduler.job_id)
        self.collect_participants = collect_participants
        self.restore: Optional[dict] = None  # what the next deployment starts from
        self.savepoint_requests: dict[str, dict] = {}  # request id -> Flink's async operation status
        self._exhausted: set[str] = set()
        self._writing: set[int] = set()  # fully acknowledged, _metadata being written

    @property
    def emit(self) -> Callable[[Instruction], None]:
        return self.s.emit

    # ------------------------------------------------------------------ lifecycle
    def on_running(self) -> None:
        self._exhausted.clear()
        if self.interval_ms > 0:
            self.emit(StartTimer(CHECKPOINT_TIMER, self.interval_ms))

    def on_stopped(self, reason: str) -> None:
        self.emit(CancelTimer(CHECKPOINT_TIMER))
        for pending in self.coordinator.abort_all(reason, self.s.now()):
            self._aborted(pending)

    def tick(self) -> None:
        self.emit(StartTimer(CHECKPOINT_TIMER, self.interval_ms))
        for expired in self.coordinator.expire(self.s.now()):
            self._aborted(expired)
        if self.all_running() and self.coordinator.why_not_trigger(self.s.now()) is None:
            self.trigger(CheckpointKind.CHECKPOINT)

    def all_running(self) -> bool:
        return self.s.state == JobState.RUNNING and all(
            e.state == ExecutionState.RUNNING for e in self.s.graph.executions.values())

    # ------------------------------------------------------------------ triggering
    def trigger(self, kind: str, directory: Optional[str] = None) -> PendingCheckpoint:
        now = self.s.now()
        pending = self.coordinator.trigger(
            now, [*self.s.graph.executions, *self.collect_participants],
            lambda n: str(directory or self.storage.checkpoint_dir(n)), kind)
        sources = tuple((e.task_manager_id, e.execution_id) for e in self.s.graph.executions.values()
                        if e.vertex.is_source and e.task_manager_id is not None)
        self.emit(TriggerCheckpoint(pending.checkpoint_id, pending.trigger_ms, kind, pending.directory, sources))
        return pending

    def trigger_savepoint(self, request_id: str, target: Optional[str], stop: bool) -> None:
        if not self.all_running():
            raise SchedulerError(f"job {self.s.job_id} is {self.s.state}: a savepoint needs every task RUNNING")
        pending = self.trigger(CheckpointKind.STOP if stop else CheckpointKind.SAVEPOINT, str(self.storage.new_savepoint_dir(target)))
        self.savepoint_requests[request_id] = {"status": "IN_PROGRESS"}

        def done(completed: Optional[CompletedCheckpoint], reason: Optional[str]) -> None:
            self.savepoint_requests[request_id] = (
                {"status": "COMPLETED", "location": completed.directory} if completed
                else {"status": "COMPLETED", "failure": reason})
            self.emit(SavepointFinished(request_id, completed.directory if completed else None,
                                        None if completed else f"the savepoint of job {self.s.job_id} failed: {reason}"))
        pending.on_done.append(done)

    def trigger_checkpoint(self, on_done: Callable[[Optional[CompletedCheckpoint], Optional[str]], None]) -> None:
        if not self.all_running():
            raise SchedulerError(f"job {self.s.job_id} is {self.s.state}: a checkpoint needs every task RUNNING")
        self.trigger(CheckpointKind.CHECKPOINT).on_done.append(on_done)

    def source_exhausted(self, execution_id: str) -> None:
        self._exhausted.add(execution_id)
        sources = {e.execution_id for e in self.s.graph.executions.values() if e.vertex.is_source}
        if sources <= self._exhausted:
            self.trigger_final()

    def trigger_final(self) -> None:
        if self.s.state != JobState.RUNNING:
            return
        if any(p.kind == CheckpointKind.FINAL for p in self.coordinator.pending.values()):
            return
        pending = self.trigger(CheckpointKind.FINAL)

        def retry(completed, reason) -> None:
            if completed is None and self.s.state == JobState.RUNNING:
                self.emit(StartTimer(FINAL_CHECKPOINT_TIMER, FINAL_RETRY_MS))
        pending.on_done.append(retry)

    # ------------------------------------------------------------------ acknowledgements
    def acknowledge(self, event: CheckpointAcknowledged) -> None:
        participant = event.participant
        if not participant.startswith("collect/") and participant not in self.s.graph.executions:
            return  # a report of an earlier attempt
        pending = self.coordinator.acknowledge(event.checkpoint_id, participant, event.state, self.s.now())
        if pending is not None:
            self._write_metadata(pending)

    def decline(self, event: CheckpointDeclined) -> None:
        pending = self.coordinator.decline(event.checkpoint_id, event.participant, event.reason, self.s.now())
        if pending is not None:
            self._aborted(pending)

    def _write_metadata(self, pending: PendingCheckpoint) -> None:
        operators: dict[str, dict] = {}
        specs = {o.uid: o for v in self.s.job_graph.vertices for o in v.operators}
        counters: dict[str, list[dict]] = {}  # vertex id -> each subtask's counters at the barrier
        tasks: dict[str, dict] = {}
        for participant, state in pending.acks.items():
            execution = self.s.graph.executions.get(participant)
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
                                                   "max_parallelism": execution.vertex.max_parallelism,
                                                   "subtasks": []})
                entry["subtasks"].append(dict(handle, subtask=execution.subtask,
                                              parallelism=execution.vertex.parallelism))
        self.coordinator.records[pending.checkpoint_id].tasks = tasks
        body = {"job_id": self.s.job_id, "job_name": self.s.job_graph.name, "checkpoint_id": pending.checkpoint_id,
                "kind": pending.kind, "timestamp": pending.trigger_ms, "operators": operators, "counters": counters}
        self._writing.add(pending.checkpoint_id)
        self.emit(WriteMetadata(pending.checkpoint_id, pending.directory, body))

    def metadata_written(self, event: MetadataWritten) -> None:
        self._writing.discard(event.checkpoint_id)
        pending = self.coordinator.pending.get(event.checkpoint_id)
        if pending is None:
            # aborted while its _metadata was being written (expired, cancelled, failover): a
            # checkpoint the sinks never committed must not be found on recovery
            if event.error is None:
                self.emit(DisposeCheckpoint(self._directory_of(event.checkpoint_id)))
            return
        if event.error is not None:
            self.coordinator.abort(event.checkpoint_id, f"writing _metadata failed: {event.error}", self.s.now())
            self._aborted(pending)
            return
        size = sum(int(h.get("bytes", 0)) for state in pending.acks.values() for h in state.values())
        completed, dropped = self.coordinator.complete(pending, self.s.now(), size)
        for old in dropped:
            self.emit(DisposeCheckpoint(old.directory))
        self.emit(NotifyCheckpointComplete(completed.checkpoint_id, self._task_managers()))

    def _directory_of(self, checkpoint_id: int) -> str:
        record = self.coordinator.records.get(checkpoint_id)
        return record.directory if record else str(self.storage.checkpoint_dir(checkpoint_id))

    def _aborted(self, pending: PendingCheckpoint) -> None:
        self.emit(NotifyCheckpointAborted(pending.checkpoint_id, self._task_managers()))

    def _task_managers(self) -> tuple[str, ...]:
        return tuple(sorted({e.task_manager_id for e in self.s.graph.executions.values() if e.task_manager_id}))

    # ------------------------------------------------------------------ restore
    def find_restore_point(self) -> None:
        candidates = tuple((c.checkpoint_id, c.directory) for c in reversed(self.coordinator.completed))
        self.emit(FindRestorePoint(candidates, str(self.storage.job_dir)))

    def restored(self, body: dict, directory: str, is_savepoint: bool) -> dict:
        self.coordinator.start_ids_after(body["checkpoint_id"])
        self.coordinator.restored = (body["checkpoint_id"], self.s.now(), str(directory), is_savepoint)
        self.restore = restore_plan(body, directory, is_savepoint)
        return self.restore


# --------------------------------------------------------------------------- the scheduler
class DefaultScheduler:
    def __init__(self, job_graph: JobGraph, conf, clock: Callable[[], int], result_address: Optional[str] = None,
                 slot_availability: Callable[[], tuple[int, int]] = lambda: (0, 0)):
        self.job_graph = job_graph
        self.job_id = job_graph.job_id
        self.conf = conf
        self.now = clock
        self.slot_availability = slot_availability  # (free, total) in the cluster now: for messages
        self.graph = ExecutionGraph(job_graph, clock(), clock=clock)
        self.restart_strategy = RestartStrategy.from_config(conf)
        self.reason: Optional[str] = None
        self._allocations: list[SlotAllocation] = []
        self._offered: set[str] = set()
        collect = []
        if result_address is not None:
            for v in job_graph.vertices:
                for op in v.operators:
                    if op.kind == "collect-sink":
                        collect += [f"collect/{op.uid}/{s}" for s in range(v.parallelism)]
        self.checkpointing = JobCheckpointing(self, conf, collect)
        self._out: list[Instruction] = []
        self._handlers: dict[type, Callable] = {
            StartScheduling: lambda e: self._request_slots(),
            SlotsAllocated: self._slots_allocated,
            SlotsOffered: self._slots_offered,
            TaskStateReported: self._task_state_reported,
            TaskMetricsReported: self._task_metrics_reported,
            TaskManagerLost: self._task_manager_lost,
            DeploymentFailed: lambda e: self._task_failed(self.graph.executions[e.execution_id], e.reason),
            TimerFired: self._timer_fired,
            CancelRequested: lambda e: self._cancel(),
            SavepointRequested: lambda e: self.checkpointing.trigger_savepoint(e.request_id, e.target_directory,
                                                                               e.stop),
            CheckpointRequested: lambda e: self.checkpointing.trigger_checkpoint(e.on_done),
            CheckpointAcknowledged: self.checkpointing.acknowledge,
            CheckpointDeclined: self.checkpointing.decline,
            SourceExhausted: lambda e: self.checkpointing.source_exhausted(e.execution_id),
            MetadataWritten: self.checkpointing.metadata_written,
            RestorePointFound: self._restore_point_found,
        }

    @property
    def state(self) -> str:
        return self.graph.state

    def emit(self, instruction: Instruction) -> None:
        self._out.append(instruction)

    def handle(self, event: Event) -> list[Instruction]:
        """Apply one event; returns the instructions it produced, in order. Raises SchedulerError
        for a request the job cannot serve now (nothing changed then)."""
        self._out = []
        self._handlers[type(event)](event)
        out, self._out = self._out, []
        return out

    # ------------------------------------------------------------------ savepoint to start from
    def restore_from_savepoint(self, body: dict, directory: str, is_savepoint: bool = True) -> None:
        """Start from a savepoint (read by the shell); refuses one with state that does not fit
        this job (see savepoint_fit) unless execution.savepoint.ignore-unclaimed-state, which
        starts without that state. A new HA leader recovering a job starts from its latest
        checkpoint this way too (``is_savepoint`` False: the job's counters go on)."""
        fit = savepoint_fit(body, self.job_graph)
        if fit.misfits and not self.conf["execution.savepoint.ignore-unclaimed-state"]:
            raise SchedulerError(fit.refusal())
        self.checkpointing.restored(fit.claimed_body(body), directory, is_savepoint)

    # ------------------------------------------------------------------ slots and deployment
    def _request_slots(self) -> None:
        self.reason = f"waiting for {self.graph.required_slots} free slot(s)"
        self.emit(StartTimer(SLOT_REQUEST_TIMER, self.conf["slot.request.timeout"]))
        self.emit(RequestSlots(self.graph.required_slots))

    def _slot_request_timed_out(self) -> None:
        if self._allocations or self.state != JobState.CREATED:
            return
        self.emit(CancelSlotRequest())
        free, total = self.slot_availability()
        self._fail_globally(
            f"NoResourceAvailableException: Could not acquire the minimum required resources: the job "
            f"needs {self.graph.required_slots} slot(s) but only {free} of {total} were free within "
            f"slot.request.timeout ({self.conf['slot.request.timeout']} ms)")

    def _slots_allocated(self, event: SlotsAllocated) -> None:
        self.emit(CancelTimer(SLOT_REQUEST_TIMER))
        if self.graph.is_globally_terminal:  # ended meanwhile: give the slots back
            self.emit(ReleaseSlots())
            return
        if self.state != JobState.CREATED or self._allocations:
            return  # a grant we did not wait for; releasing would take the slots the job holds
        self._allocations = list(event.allocations)
        self._offered = set()
        for execution in self.graph.executions.values():
            self.graph.set_state(execution, ExecutionState.SCHEDULED)
        self.reason = "deploying: waiting for TaskManagers to offer the allocated slots"

    def _slots_offered(self, event: SlotsOffered) -> None:
        expected = {a.allocation_id for a in self._allocations}
        self._offered.update(a for a in event.allocation_ids if a in expected)
        if self.state == JobState.CREATED and expected and self._offered == expected:
            self._deploy()

    def _deploy(self) -> None:
        self.graph.transition(JobState.RUNNING, self.now())
        self.reason = None
        placements = []
        for execution in self.graph.executions.values():
            alloc = self._allocations[execution.subtask]
            execution.task_manager_id = alloc.task_manager_id
            execution.allocation_id = alloc.allocation_id
            self.graph.set_state(execution, ExecutionState.DEPLOYING)
            placements.append((execution, alloc))
        self.emit(DeployTasks(self.graph.attempt, tuple(placements), self.checkpointing.restore))
        self.checkpointing.on_running()

    @property
    def allocations(self) -> list[SlotAllocation]:
        return list(self._allocations)

    # ------------------------------------------------------------------ task reports
    def _task_state_reported(self, event: TaskStateReported) -> None:
        execution = self.graph.update_execution(event.execution_id, event.state, event.error)
        if execution is None:
            return  # stale (an earlier attempt), unknown, or a transition the table forbids
        if event.metrics:
            execution.metrics = dict(event.metrics)
        if execution.state == ExecutionState.FAILED:
            self._task_failed(execution, event.error or "unknown error")
        elif self.graph.all_terminal():
            self._all_terminal()

    def _task_metrics_reported(self, event: TaskMetricsReported) -> None:
        for task in event.tasks:
            execution_id = task.get("execution_id")
            execution = self.graph.executions.get(execution_id) if isinstance(execution_id, str) else None
            if execution is not None and not execution.is_terminal:
                execution.metrics = task

    def _task_manager_lost(self, event: TaskManagerLost) -> None:
        if self.graph.is_globally_terminal:
            return
        tm_id, reason = event.task_manager_id, event.reason
        if self.state == JobState.CREATED and any(a.task_manager_id == tm_id for a in self._allocations):
            # lost between allocation and deployment: give back what we hold and ask again
            self._allocations, self._offered = [], set()
            for execution in self.graph.executions.values():
                self.graph.set_state(execution, ExecutionState.CREATED)
            self.emit(ReleaseSlots())
            self._request_slots()
            return
        lost = [e for e in self.graph.non_terminal() if e.task_manager_id == tm_id]
        for execution in lost:
            self.graph.update_execution(execution.execution_id, ExecutionState.FAILED, reason)
        if lost:
            self._task_failed(lost[0], reason)

    def _task_failed(self, execution: Execution, error: str) -> None:
        if execution.state != ExecutionState.FAILED:
            self.graph.update_execution(execution.execution_id, ExecutionState.FAILED, error)
        if self.state in (JobState.RUNNING, JobState.CREATED):
            self.graph.failure = failures.task_failed(error, execution.name, execution.task_manager_id)
            self.graph.transition(JobState.FAILING, self.now())
            self.emit(CancelTimer(SLOT_REQUEST_TIMER))
            self.checkpointing.on_stopped("the job is failing")
            self._cancel_running_tasks()
        if self.graph.all_terminal():
            self._all_terminal()

    def _cancel_running_tasks(self) -> None:
        for execution in self.graph.non_terminal():
            if execution.state in (ExecutionState.CREATED, ExecutionState.SCHEDULED) or \
                    execution.task_manager_id is None:
                self.graph.update_execution(execution.execution_id, ExecutionState.CANCELED)
            elif execution.state != ExecutionState.CANCELING:
                self.graph.update_execution(execution.execution_id, ExecutionState.CANCELING)
                self.emit(CancelTask(execution.task_manager_id, execution.execution_id))

    def _all_terminal(self) -> None:
        self.checkpointing.on_stopped("the job ended")
        state = self.state
        if state == JobState.RUNNING and self.graph.all_finished():
            self._terminate(JobState.FINISHED)
        elif state == JobState.CANCELLING:
            self._terminate(JobState.CANCELED)
        elif state == JobState.FAILING:
            self._allocations = []
            self.emit(ReleaseSlots())
            delay = self.restart_strategy.next_delay_ms()
            if delay is None:
                self.graph.failure = failures.add_note(
                    self.graph.failure or "", f"The job was not restarted: {self.restart_strategy.describe()}.")
                self._terminate(JobState.FAILED)
                return
            self.graph.transition(JobState.RESTARTING, self.now())
            self.reason = f"restarting in {delay} ms (restart {self.restart_strategy.restarts})"
            self.emit(StartTimer(RESTART_TIMER, delay))

    def _restart(self) -> None:
        if self.state == JobState.RESTARTING:
            self.reason = "restarting: looking for the newest completed checkpoint"
            self.checkpointing.find_restore_point()

    def _restore_point_found(self, event: RestorePointFound) -> None:
        if self.state != JobState.RESTARTING:
            return  # cancelled while the checkpoints were read
        if event.body is not None:
            self.checkpointing.restored(event.body, str(event.directory), is_savepoint=False)
        # else: no checkpoint yet, start again from where the job first started
        self.graph.reset_executions()
        counters = self.checkpointing.restore["counters"] if self.checkpointing.restore else {}
        for execution in self.graph.executions.values():
            # what the restored checkpoint covered, shown until the new attempt reports
            entries = counters.get(execution.vertex.id)
            if entries:
                execution.metrics = restored_counters(entries, execution.subtask, execution.vertex.parallelism)
        self.graph.transition(JobState.CREATED, self.now())
        self._request_slots()

    # ------------------------------------------------------------------ timers
    def _timer_fired(self, event: TimerFired) -> None:
        if event.name == SLOT_REQUEST_TIMER:
            self._slot_request_timed_out()
        elif event.name == RESTART_TIMER:
            self._restart()
        elif event.name == CHECKPOINT_TIMER:
            if self.state == JobState.RUNNING:
                self.checkpointing.tick()
        elif event.name == FINAL_CHECKPOINT_TIMER:
            self.checkpointing.trigger_final()

    # ------------------------------------------------------------------ cancel
    def _cancel(self) -> None:
        if self.graph.is_globally_terminal or self.state == JobState.CANCELLING:
            return
        self.emit(CancelTimer(SLOT_REQUEST_TIMER))
        self.emit(CancelTimer(RESTART_TIMER))
        self.emit(CancelSlotRequest())
        if self.state == JobState.RESTARTING:
            self._terminate(JobState.CANCELED)
            return
        self.graph.transition(JobState.CANCELLING, self.now())
        self.checkpointing.on_stopped("the job was cancelled")
        self._cancel_running_tasks()
        if self.graph.all_terminal():
            self._all_terminal()

    def _fail_globally(self, reason: str) -> None:
        self.graph.failure = reason
        for execution in self.graph.non_terminal():
            self.graph.update_execution(execution.execution_id, ExecutionState.CANCELED)
        self._terminate(JobState.FAILED)

    def _terminate(self, state: str) -> None:
        self.graph.transition(state, self.now())
        self.reason = None
        self._allocations = []
        self.emit(CancelTimer(CHECKPOINT_TIMER))
        self.emit(ReleaseSlots())
        self.emit(JobTerminated(state))

    # ------------------------------------------------------------------ views
    @property
    def status_reason(self) -> Optional[str]:
        """Why the job waits: its own reason, or what a starting task waits for (e.g. Spark)."""
        if self.reason and self.state == JobState.CREATED and not self._allocations:
            free, total = self.slot_availability()
            return f"{self.reason}; the cluster has {free} free of {total}"
        if self.reason:
            return self.reason
        for e in self.graph.non_terminal():
            if e.metrics.get("detail"):
                return f"{e.metrics['detail']} (TaskManager {e.task_manager_id})"
        return None
