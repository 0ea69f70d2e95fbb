"""Barrier alignment at a task with several input channels (Chandy-Lamport, as Flink does it).

EXACTLY_ONCE: a channel that delivered barrier n is blocked (its data belongs after the
snapshot) until barrier n came on every channel still open; then the task snapshots, forwards
the barrier and unblocks. AT_LEAST_ONCE: nothing is blocked; the snapshot is taken when the last
barrier arrives. A newer barrier while aligning aborts the older checkpoint (it can no longer
complete here). A channel that ended counts as aligned.

Pure bookkeeping: the task asks what to do and does it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from cluster.protocol.messages import CheckpointBarrier, TriggerCheckpoint


@dataclass(frozen=True)
class Barrier:
    checkpoint_id: int
    timestamp: int
    kind: str
    directory: str

    @classmethod
    def of(cls, msg: Union[TriggerCheckpoint, CheckpointBarrier]) -> "Barrier":
        """The barrier a trigger (at a source) or a barrier message (between tasks) carries."""
        return cls(msg.checkpoint_id, msg.timestamp, msg.kind, msg.directory)

    def on_channel(self, channel: str) -> CheckpointBarrier:
        """The message that carries this barrier down ``channel`` to another TaskManager."""
        return CheckpointBarrier(channel, self.checkpoint_id, self.timestamp, self.kind, self.directory)


@dataclass(frozen=True)
class AlignmentResult:
    snapshot: Optional[Barrier] = None   # every open channel delivered it: snapshot and forward
    aborted: Optional[int] = None        # this older checkpoint can no longer complete here


class BarrierAligner:
    def __init__(self, channels: list[str], exactly_once: bool):
        self.open = set(channels)
        self.exactly_once = exactly_once
        self.current: Optional[Barrier] = None
        self.received: set[str] = set()
        self.last_completed = 0

    @property
    def blocked(self) -> frozenset:
        return frozenset(self.received) if self.exactly_once and self.current else frozenset()

    def on_barrier(self, channel: str, barrier: Barrier) -> AlignmentResult:
        aborted = None
        if barrier.checkpoint_id <= self.last_completed or (
                self.current and barrier.checkpoint_id < self.current.checkpoint_id):
            return AlignmentResult()  # from a checkpoint given up already
        if self.current and barrier.checkpoint_id > self.current.checkpoint_id:
            aborted = self.current.checkpoint_id
            self.current, self.received = None, set()
        if self.current is None:
            self.current = barrier
        self.received.add(channel)
        return AlignmentResult(self._complete_if_aligned(), aborted)

    def on_end_of_partition(self, channel: str) -> AlignmentResult:
        self.open.discard(channel)
        self.received.discard(channel)
        return AlignmentResult(self._complete_if_aligned())

    def _complete_if_aligned(self) -> Optional[Barrier]:
        if self.current is None or not self.open <= self.received:
            return None
        done, self.current, self.received = self.current, None, set()
        self.last_completed = done.checkpoint_id
        return done
