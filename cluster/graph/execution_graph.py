"""The ExecutionGraph: the JobGraph expanded to one ExecutionVertex per parallel subtask.

A pure state machine (no sockets, no clocks of its own): the JobMaster feeds it events and reads
back what follows. Job and task states are Flink's names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from cluster.graph.job_graph import JobGraph, JobVertex, new_id
from cluster.protocol.states import ExecutionState, JobState


# Keyed by str: states also arrive as plain strings from the wire.
_JOB_TRANSITIONS: dict[str, set[str]] = {
    JobState.CREATED: {JobState.RUNNING, JobState.FAILING, JobState.FAILED, JobState.CANCELLING,
                       JobState.CANCELED},
    JobState.RUNNING: {JobState.FINISHED, JobState.FAILING, JobState.CANCELLING, JobState.RESTARTING},
    JobState.FAILING: {JobState.FAILED, JobState.RESTARTING, JobState.CANCELLING},
    JobState.RESTARTING: {JobState.CREATED, JobState.CANCELLING, JobState.CANCELED, JobState.FAILED},
    JobState.CANCELLING: {JobState.CANCELED},
}


# What a task's reported state may follow (Flink's Execution): a report that does not fit is
# stale or late (a RUNNING that arrives after the JobMaster asked the task to cancel) and loses.
_TASK_TRANSITIONS: dict[str, set[str]] = {
    ExecutionState.CREATED: {ExecutionState.SCHEDULED, ExecutionState.CANCELED, ExecutionState.FAILED},
    ExecutionState.SCHEDULED: {ExecutionState.CREATED, ExecutionState.DEPLOYING, ExecutionState.CANCELED,
                               ExecutionState.FAILED},
    ExecutionState.DEPLOYING: {ExecutionState.INITIALIZING, ExecutionState.RUNNING, ExecutionState.FINISHED,
                               ExecutionState.CANCELING, ExecutionState.CANCELED, ExecutionState.FAILED},
    ExecutionState.INITIALIZING: {ExecutionState.RUNNING, ExecutionState.FINISHED, ExecutionState.CANCELING,
                                  ExecutionState.CANCELED, ExecutionState.FAILED},
    ExecutionState.RUNNING: {ExecutionState.FINISHED, ExecutionState.CANCELING, ExecutionState.CANCELED,
                             ExecutionState.FAILED},
    # a task that finishes while it is being cancelled counts as cancelled (Flink's completeCancelling)
    ExecutionState.CANCELING: {ExecutionState.CANCELED, ExecutionState.FAILED},
}


class IllegalStateTransition(RuntimeError):
    pass


@dataclass
class Execution:
    """One attempt to run one subtask."""

    execution_id: str
    vertex: JobVertex
    subtask: int
    attempt: int
    state: ExecutionState = ExecutionState.CREATED
    task_manager_id: Optional[str] = None
    allocation_id: Optional[str] = None
    error: Optional[str] = None
    metrics: dict = field(default_factory=dict)
    entered: dict = field(default_factory=dict)  # state -> when (ms) this execution entered it

    def status_durations(self, now_ms: int) -> dict[str, int]:
        """How long it spent in each state it went through, as Flink's status-duration."""
        order = sorted(self.entered.items(), key=lambda kv: kv[1])
        return {state: (order[i + 1][1] if i + 1 < len(order) else now_ms) - since
                for i, (state, since) in enumerate(order)}

    @property
    def is_terminal(self) -> bool:
        return self.state in ExecutionState.TERMINAL

    @property
    def name(self) -> str:
        return f"{self.vertex.name} ({self.subtask + 1}/{self.vertex.parallelism})"


class ExecutionGraph:
    def __init__(self, job_graph: JobGraph, now_ms: int, clock=lambda: 0):
        self.job_graph = job_graph
        self._clock = clock  # ms; only for the times shown, never for decisions
        self.state: JobState = JobState.CREATED
        self.attempt = 0
        self.timestamps: dict[str, int] = {s: 0 for s in JobState.ALL}
        self.timestamps[JobState.CREATED] = now_ms
        # when the job started: timestamps[CREATED] moves with every restart, the job's duration
        # (Flink's) counts from here across all its attempts
        self.start_ms = now_ms
        self.failure: Optional[str] = None
        # the task whose failure ``failure`` is, and its TaskManager (None: a failure of the whole
        # job): Flink's exception history names them
        self.failed_task: Optional[str] = None
        self.failed_on: Optional[str] = None
        self.executions: dict[str, Execution] = {}
        # called after every job state change with (graph, old state, new state, now_ms), on the
        # caller's thread: the JobManager's event publisher listens here
        self.listeners: list[Callable[["ExecutionGraph", JobState, JobState, int], None]] = []
        self.reset_executions()

    # ------------------------------------------------------------------ job state
    def transition(self, new_state: JobState, now_ms: int) -> None:
        if new_state not in _JOB_TRANSITIONS.get(self.state, ()):
            raise IllegalStateTransition(f"job {self.job_graph.job_id}: {self.state} -> {new_state}")
        old, self.state = self.state, new_state
        self.timestamps[new_state] = now_ms
        for listener in self.listeners:
            listener(self, old, new_state, now_ms)

    def failure_in(self, state: JobState) -> Optional[str]:
        """The failure a job in ``state`` is in: while it fails, restarts or has failed. A job that
        recovered and runs or finished is not failing (the cause stays in ``failure``, the
        exception history)."""
        return self.failure if state in JobState.FAILURE else None

    @property
    def current_failure(self) -> Optional[str]:
        return self.failure_in(self.state)

    @property
    def is_globally_terminal(self) -> bool:
        return self.state in JobState.GLOBALLY_TERMINAL

    def reset_executions(self) -> None:
        """Fresh executions for a (re)start; the attempt number tells stale reports apart."""
        self.attempt += 1
        self.executions = {}
        for vertex in self.job_graph.topological_order():
            for subtask in range(vertex.parallelism):
                eid = new_id()
                self.executions[eid] = Execution(eid, vertex, subtask, self.attempt,
                                                 entered={ExecutionState.CREATED: self._clock()})

    @property
    def required_slots(self) -> int:
        # Slot sharing: one slot holds one subtask of every vertex.
        return max(v.parallelism for v in self.job_graph.vertices)

    # ------------------------------------------------------------------ tasks
    def update_execution(self, execution_id: str, state: ExecutionState, error: Optional[str] = None) -> Optional[Execution]:
        """Apply a task's reported state; None for a report about an unknown or stale execution, or
        one that the transition table refuses (it then changes nothing)."""
        execution = self.executions.get(execution_id)
        if execution is None or state not in ExecutionState.ALL:
            return None
        if execution.state == ExecutionState.CANCELING and state == ExecutionState.FINISHED:
            state = ExecutionState.CANCELED
        if state not in _TASK_TRANSITIONS.get(execution.state, ()):
            return None
        self.set_state(execution, state)
        if error:
            execution.error = error
        return execution

    def set_state(self, execution: Execution, state: ExecutionState) -> None:
        execution.state = state
        execution.entered.setdefault(state, self._clock())

    def non_terminal(self) -> list[Execution]:
        return [e for e in self.executions.values() if not e.is_terminal]

    def all_finished(self) -> bool:
        return all(e.state == ExecutionState.FINISHED for e in self.executions.values())

    def all_terminal(self) -> bool:
        return all(e.is_terminal for e in self.executions.values())

    def executions_of(self, vertex_id: str) -> list[Execution]:
        return sorted((e for e in self.executions.values() if e.vertex.id == vertex_id),
                      key=lambda e: e.subtask)

    def status_counts(self, vertex_id: Optional[str] = None) -> dict[str, int]:
        counts: dict[str, int] = {s: 0 for s in ExecutionState.ALL}
        for e in self.executions.values():
            if vertex_id is None or e.vertex.id == vertex_id:
                counts[e.state] += 1
        return counts

    def vertex_state(self, vertex_id: str) -> str:
        counts = self.status_counts(vertex_id)
        for state in (ExecutionState.FAILED, ExecutionState.CANCELING, ExecutionState.CANCELED,
                      ExecutionState.RUNNING, ExecutionState.INITIALIZING, ExecutionState.DEPLOYING,
                      ExecutionState.SCHEDULED, ExecutionState.CREATED):
            if counts[state]:
                return state
        return ExecutionState.FINISHED
