"""A job's and a task's states, Flink's names: the ExecutionGraph's state machine moves them, and
messages carry them (decoded from the wire as these enums, message_base).
"""
from __future__ import annotations

import enum
from typing import ClassVar


class _State(enum.StrEnum):
    """A state shows as its name, as Flink's do (``'FINISHED'``, not ``<JobState.FINISHED: ...>``):
    users meet them in notebooks (``handle.status``) as they always have, as plain strings."""

    def __repr__(self) -> str:
        return repr(self.value)


class JobState(_State):
    """A StrEnum so that members equal their names as plain strings (wire format, JSON)."""
    CREATED = "CREATED"
    RUNNING = "RUNNING"
    FAILING = "FAILING"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELED = "CANCELED"
    FINISHED = "FINISHED"
    RESTARTING = "RESTARTING"

    # Not members: set after the class body (an assignment inside it would make a member).
    ALL: ClassVar[tuple[JobState, ...]]
    GLOBALLY_TERMINAL: ClassVar[tuple[JobState, ...]]
    FAILURE: ClassVar[tuple[JobState, ...]]


# Tuples rather than sets: views list the states in this order (REST "timestamps", "status-counts").
JobState.ALL = tuple(JobState)
JobState.GLOBALLY_TERMINAL = (JobState.FAILED, JobState.CANCELED, JobState.FINISHED)
# the states a job's failure is the news of; afterwards (a recovered job running) it is history
JobState.FAILURE = (JobState.FAILING, JobState.RESTARTING, JobState.FAILED)


class ExecutionState(_State):
    CREATED = "CREATED"
    SCHEDULED = "SCHEDULED"
    DEPLOYING = "DEPLOYING"
    INITIALIZING = "INITIALIZING"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    CANCELING = "CANCELING"
    CANCELED = "CANCELED"
    FAILED = "FAILED"

    ALL: ClassVar[tuple[ExecutionState, ...]]
    TERMINAL: ClassVar[tuple[ExecutionState, ...]]


ExecutionState.ALL = tuple(ExecutionState)
ExecutionState.TERMINAL = (ExecutionState.FINISHED, ExecutionState.CANCELED, ExecutionState.FAILED)
