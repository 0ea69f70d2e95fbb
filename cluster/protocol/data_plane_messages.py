"""The data plane: between TaskManagers as Flink's NettyMessage (buffers, credit, end of
partition, and the in-band events: checkpoint barriers, watermarks, watermark status), and from
a collect sink to the client's result socket. The rows themselves (Arrow IPC) travel in the
frames after the message.
"""
from __future__ import annotations

from dataclasses import dataclass

from cluster.protocol.message_base import Message


@dataclass(frozen=True)
class BufferResponse(Message, op="buffer-response"):
    channel: str
    sequence: int
    # the wall clock (epoch ms) when the oldest of its rows was read by its source, 0 if unknown
    # (cluster.protocol.latency)
    ingested_ms: int = 0


@dataclass(frozen=True)
class AddCredit(Message, op="add-credit"):
    channel: str
    credit: int


@dataclass(frozen=True)
class EndOfPartition(Message, op="end-of-partition"):
    channel: str


@dataclass(frozen=True)
class CheckpointBarrier(Message, op="checkpoint-barrier"):
    channel: str
    checkpoint_id: int
    timestamp: int
    kind: str
    directory: str


@dataclass(frozen=True)
class Watermark(Message, op="watermark"):
    """In-band event time, after every row before it (cluster.operators.windowing.watermarks)."""
    channel: str
    timestamp: int


@dataclass(frozen=True)
class WatermarkStatus(Message, op="watermark-status"):
    """The producer became idle (its watermark holds nobody back) or active again."""
    channel: str
    idle: bool


# --------------------------------------------------------------------------- collect sink -> client
@dataclass(frozen=True)
class CollectBatch(Message, op="collect-batch"):
    job_id: str
    attempt: int
    sink: str
    subtask: int
    # the last checkpoint barrier the sink passed before these rows (0: none), and the checkpoint
    # this attempt restored from: on a restart the client drops earlier attempts' rows of epochs
    # >= the restored checkpoint, because they will be replayed
    epoch: int
    restored_from: int


@dataclass(frozen=True)
class CollectBarrier(Message, op="collect-barrier"):
    """Every row before checkpoint barrier n was sent: the client acknowledges it to the JobManager."""
    job_id: str
    attempt: int
    sink: str
    subtask: int
    checkpoint_id: int


@dataclass(frozen=True)
class CollectEnd(Message, op="collect-end"):
    job_id: str
    attempt: int
    sink: str
    subtask: int
