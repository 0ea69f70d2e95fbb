"""The JobMaster's decisions, as a pure state machine (Flink's SchedulerNG): events in,
instructions out, no sockets, no disk, no threads.

``DefaultScheduler.handle(event)`` applies one event (scheduler_events: a slot offer, a task's
state, a lost TaskManager, a fired timer, a checkpoint acknowledgement, the result of a disk
operation) and returns what the networked JobMaster must do about it (instructions: deploy,
cancel a task, start a timer, trigger barriers, write ``_metadata``, answer a savepoint
request). The checkpoint half is JobCheckpointing (checkpointing.py), which this class feeds
the job's facts with each call. The clock is an argument, so tests move time by hand; timers are
named and are the shell's to run.

Every method is for the JobManager's loop thread only; the shell checks that, this class does
not know about threads.
"""
from __future__ import annotations

from typing import Callable, Optional

from cluster.common import failures
from cluster.checkpoint.savepoint_fit import savepoint_fit
from cluster.graph.execution_graph import Execution, ExecutionGraph
from cluster.protocol.states import ExecutionState, JobState
from cluster.graph.job_graph import JobGraph
from cluster.protocol.metrics import restored_counters

from cluster.jobmanager.jobmaster.checkpointing import JobCheckpointing, JobFacts
from cluster.jobmanager.jobmaster.instructions import (CHECKPOINT_TIMER, FINAL_CHECKPOINT_TIMER, RESTART_TIMER,
                                                       SLOT_REQUEST_TIMER, CancelSlotRequest, CancelTask,
                                                       CancelTimer, DeployTasks, Instruction, JobTerminated,
                                                       ReleaseSlots, RequestSlots, StartTimer)
from cluster.jobmanager.jobmaster.restart_strategy import RestartStrategy
from cluster.jobmanager.jobmaster.scheduler_events import (CancelRequested, CheckpointAcknowledged,
                                                           CheckpointDeclined, CheckpointRequested, DeploymentFailed,
                                                           Event, InitializationFailed, MetadataWritten,
                                                           RestorePointFound, SavepointRequested, SchedulerError,
                                                           SlotsAllocated, SlotsOffered, SourceExhausted, StartScheduling,
                                                           TaskManagerLost, TaskMetricsReported, TaskStateReported,
                                                           TimerFired)
from cluster.jobmanager.resourcemanager.slot_manager import SlotAllocation
from cluster.conf.options import JobManagerOptions, StateRecoveryOptions


class DefaultScheduler:
    """One job's scheduling: slots, deployment, task states, failover and restart, cancel; the
    checkpoint decisions are its JobCheckpointing's, fed the job's facts (``facts()``)."""

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
        self.checkpointing = JobCheckpointing(job_graph, conf, clock, collect)
        self._out: list[Instruction] = []
        c = self.checkpointing
        self._handlers: dict[type, Callable] = {
            StartScheduling: lambda e: self._request_slots() if not self.graph.is_globally_terminal else None,
            InitializationFailed: self._initialization_failed,
            SlotsAllocated: self._slots_allocated,
            SlotsOffered: self._slots_offered,
            TaskStateReported: self._task_state_reported,
            TaskMetricsReported: self._task_metrics_reported,
            TaskManagerLost: self._task_manager_lost,
            DeploymentFailed: lambda e: self._task_failed(self.graph.executions[e.execution_id], e.reason),
            TimerFired: self._timer_fired,
            CancelRequested: lambda e: self._cancel(),
            SavepointRequested: lambda e: self._checkpointing(c.trigger_savepoint, e.request_id,
                                                              e.target_directory, e.stop),
            CheckpointRequested: lambda e: self._checkpointing(c.trigger_checkpoint, e.request_id),
            CheckpointAcknowledged: lambda e: self._checkpointing(c.acknowledge, e),
            CheckpointDeclined: lambda e: self._checkpointing(c.decline, e),
            SourceExhausted: lambda e: self._checkpointing(c.source_exhausted, e.execution_id),
            MetadataWritten: lambda e: self._checkpointing(c.metadata_written, e),
            RestorePointFound: self._restore_point_found,
        }

    @property
    def state(self) -> JobState:
        return self.graph.state

    def emit(self, instruction: Instruction) -> None:
        self._out.append(instruction)

    def facts(self) -> JobFacts:
        """What the checkpointing reads of the job, as of now."""
        return JobFacts(self.state, self.graph.executions)

    def _checkpointing(self, call: Callable[..., list[Instruction]], *args) -> None:
        """A JobCheckpointing call, fed the job's facts; its instructions go out in order."""
        self._out += call(self.facts(), *args)

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
        if fit.misfits and not self.conf.get(StateRecoveryOptions.SAVEPOINT_IGNORE_UNCLAIMED_STATE):
            raise SchedulerError(fit.refusal())
        self.checkpointing.restored(fit.claimed_body(body), directory, is_savepoint)

    # ------------------------------------------------------------------ slots and deployment
    def _request_slots(self) -> None:
        self.reason = f"waiting for {self.graph.required_slots} free slot(s)"
        self.emit(StartTimer(SLOT_REQUEST_TIMER, self.conf.get(JobManagerOptions.SLOT_REQUEST_TIMEOUT)))
        self.emit(RequestSlots(self.graph.required_slots))

    def _initialization_failed(self, event: InitializationFailed) -> None:
        if not self.graph.is_globally_terminal:  # (cancelled while it was checked)
            self._fail_globally(failures.add_note(event.reason,
                                                  "The job was not restarted: no restart can fix its failure."))

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
        self._out += self.checkpointing.on_running()

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
            self.graph.failed_task, self.graph.failed_on = execution.name, execution.task_manager_id
            self.graph.transition(JobState.FAILING, self.now())
            self.emit(CancelTimer(SLOT_REQUEST_TIMER))
            self._checkpointing(self.checkpointing.on_stopped, "the job is failing")
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
        self._checkpointing(self.checkpointing.on_stopped, "the job ended")
        state = self.state
        if state == JobState.RUNNING and self.graph.all_finished():
            self._terminate(JobState.FINISHED)
        elif state == JobState.CANCELLING:
            self._terminate(JobState.CANCELED)
        elif state == JobState.FAILING:
            self._allocations = []
            self.emit(ReleaseSlots())
            cannot_fix = failures.unrecoverable(self.graph.failure or "")
            delay = None if cannot_fix else self.restart_strategy.next_delay_ms(self.now())
            if delay is None:
                why = "no restart can fix its failure" if cannot_fix else self.restart_strategy.describe()
                self.graph.failure = failures.add_note(self.graph.failure or "", f"The job was not restarted: {why}.")
                self._terminate(JobState.FAILED)
                return
            self.graph.transition(JobState.RESTARTING, self.now())
            self.reason = f"restarting in {delay} ms (restart {self.restart_strategy.restarts})"
            self.emit(StartTimer(RESTART_TIMER, delay))

    def _restart(self) -> None:
        if self.state == JobState.RESTARTING:
            self.reason = "restarting: looking for the newest completed checkpoint"
            self._out += self.checkpointing.find_restore_point()

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
                self._checkpointing(self.checkpointing.tick)
        elif event.name == FINAL_CHECKPOINT_TIMER:
            self._checkpointing(self.checkpointing.trigger_final)

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
        self._checkpointing(self.checkpointing.on_stopped, "the job was cancelled")
        self._cancel_running_tasks()
        if self.graph.all_terminal():
            self._all_terminal()

    def _fail_globally(self, reason: str) -> None:
        self.graph.failure = reason
        self.graph.failed_task = self.graph.failed_on = None
        for execution in self.graph.non_terminal():
            self.graph.update_execution(execution.execution_id, ExecutionState.CANCELED)
        self._terminate(JobState.FAILED)

    def _terminate(self, state: JobState) -> None:
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
