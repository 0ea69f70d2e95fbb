"""Checkpoints between the JobMaster's CheckpointCoordinator and the tasks: trigger at the
sources, acknowledge or decline from every task, notify complete or aborted, and a source's end
of input (which, with checkpointing, waits for a final checkpoint). The barriers themselves travel
in-band on the data plane (cluster.protocol.data_plane_messages).
"""
from __future__ import annotations

from dataclasses import dataclass

from cluster.protocol.message_base import Message


@dataclass(frozen=True)
class TriggerCheckpoint(Message, op="trigger-checkpoint"):
    """To a source task: inject barrier n into the stream."""
    job_id: str
    execution_id: str
    checkpoint_id: int
    timestamp: int
    kind: str       # checkpoint | savepoint | final (all sources ended) | stop (stop-with-savepoint)
    directory: str  # where this checkpoint's files go


@dataclass(frozen=True)
class AcknowledgeCheckpoint(Message, op="acknowledge-checkpoint"):
    job_id: str
    execution_id: str
    checkpoint_id: int
    state: dict  # operator uid -> state handle (file names relative to the checkpoint directory)


@dataclass(frozen=True)
class DeclineCheckpoint(Message, op="decline-checkpoint"):
    job_id: str
    execution_id: str
    checkpoint_id: int
    reason: str


@dataclass(frozen=True)
class NotifyCheckpointComplete(Message, op="notify-checkpoint-complete"):
    job_id: str
    checkpoint_id: int


@dataclass(frozen=True)
class NotifyCheckpointAborted(Message, op="notify-checkpoint-aborted"):
    job_id: str
    checkpoint_id: int


@dataclass(frozen=True)
class EndOfInput(Message, op="end-of-input"):
    """A source task read all of its input; with checkpointing it waits for a final checkpoint."""
    job_id: str
    execution_id: str
