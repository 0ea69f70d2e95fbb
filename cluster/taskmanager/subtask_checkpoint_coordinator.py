"""SubtaskCheckpointCoordinator: a task's part of a checkpoint, and its restore from one.

When a barrier is aligned on every input (or a source's checkpoint is triggered), the synchronous
part runs on the task thread: everything before the barrier goes through the Spark stage and out,
the counters and every operator's state are taken at this cut, and the barrier goes on in-band on
every output channel. The state files are then written on the TaskManager's snapshot executor
while processing goes on, and the checkpoint is acknowledged with their handles, or declined.

A final or stop checkpoint (ENDING_KINDS) ends a source task: it reads no more once it took that
checkpoint, and ends when the checkpoint completes; an abort lets it go on reading.

A restored attempt starts from a checkpoint's counters (before its first report) and each
operator's state (after the operators opened).

Thread use: the task thread, except ``_write_snapshots``, which runs on the snapshot executor.
"""
from __future__ import annotations

import logging
from concurrent.futures import Executor
from pathlib import Path
from typing import Callable, Optional

from cluster.checkpoint.barriers import Barrier
from cluster.checkpoint.coordinator import CheckpointKind
from cluster.graph.deployment import TaskDeploymentDescriptor
from cluster.operators.base import SourceOperator
from cluster.protocol.metrics import CHECKPOINTED_COUNTERS, restored_counters
from cluster.taskmanager.operator_chain import OperatorChain
from cluster.taskmanager.task_metrics import TaskMetrics

log = logging.getLogger(__name__)
ENDING_KINDS = (CheckpointKind.FINAL, CheckpointKind.STOP)  # checkpoints after which the sources end


class SubtaskCheckpointCoordinator:
    def __init__(self, tdd: TaskDeploymentDescriptor, task_name: str, metrics: TaskMetrics,
                 snapshot_executor: Executor, acknowledge: Callable[[int, dict], None],
                 decline: Callable[[int, str], None]):
        """``acknowledge`` and ``decline`` report to the JobManager (the task's CheckpointResponder);
        any thread may call them."""
        self.tdd, self.name, self.metrics = tdd, task_name, metrics
        self.snapshot_executor = snapshot_executor
        self._acknowledge, self._decline = acknowledge, decline
        self._ending_after: Optional[int] = None  # the final/stop checkpoint after which a source ends
        self.end_confirmed = False                # that checkpoint completed: the source ends now

    @property
    def ending(self) -> bool:
        """A source took a final or stop checkpoint: it reads no more while that one is pending
        (the task thread)."""
        return self._ending_after is not None

    # ------------------------------------------------------------------ the task thread
    def checkpoint(self, barrier: Barrier, chain: OperatorChain) -> None:
        """The synchronous part, on the task thread: flush, snapshot, forward the barrier. The
        state files are written on the snapshot executor while processing goes on."""
        cid = barrier.checkpoint_id
        chain.flush_stage()
        chain.flush_outputs()
        # every row before the barrier is counted now, none after it: the counters of this cut
        counters = self.metrics.counters()
        try:
            snapshots = {}
            for op in chain.operators:
                snapshot = op.snapshot_state(cid)
                if snapshot is not None:
                    snapshots[op.spec.uid] = snapshot
        except Exception as exc:
            log.exception("%s: snapshot of checkpoint %d failed", self.name, cid)
            self.decline(cid, f"snapshot failed in {self.name}: {type(exc).__name__}: {exc}")
            return
        if barrier.kind in ENDING_KINDS and isinstance(chain.operators[0], SourceOperator):
            self._ending_after = cid
        chain.emit_barrier(barrier)
        self.snapshot_executor.submit(self._write_snapshots, barrier, snapshots, counters)

    def decline(self, checkpoint_id: int, reason: str) -> None:
        """This task takes no part in the checkpoint (its snapshot failed, or a newer barrier came
        before it aligned): the checkpoint fails."""
        self._decline(checkpoint_id, reason)

    def notify_complete(self, checkpoint_id: int, chain: OperatorChain) -> None:
        for op in chain.operators:
            op.notify_checkpoint_complete(checkpoint_id)
        if self._ending_after is not None and checkpoint_id >= self._ending_after:
            self.end_confirmed = True

    def notify_aborted(self, checkpoint_id: int) -> None:
        if checkpoint_id == self._ending_after:
            self._ending_after = None  # a stop that did not happen: go on reading

    def restore_counters(self) -> None:
        """Count on from the restored checkpoint's figures: before the task's first report, so a
        restored attempt never reads less."""
        counted = (self.tdd.restore or {}).get("counters", {}).get(self.tdd.vertex["id"])
        if counted:
            self.metrics.restore_counters(restored_counters(counted, self.tdd.subtask, self.tdd.vertex["parallelism"]))

    def restore(self, chain: OperatorChain) -> None:
        """Each operator's state from the restored checkpoint (once the operators opened)."""
        restore = self.tdd.restore
        if not restore:
            return
        for op in chain.operators:
            handles = restore["operators"].get(op.spec.uid)
            if handles is not None:
                op.restore_state([dict(h, directory=restore["directory"]) for h in handles])

    # ------------------------------------------------------------------ the snapshot executor
    def _write_snapshots(self, barrier: Barrier, snapshots: dict, counters: dict[str, int]) -> None:
        try:
            directory = Path(barrier.directory)
            directory.mkdir(parents=True, exist_ok=True)
            state: dict = {CHECKPOINTED_COUNTERS: counters}
            for uid, snapshot in snapshots.items():
                handle = dict(snapshot.handle)
                if snapshot.keyed is not None:
                    name = f"{uid}-{self.tdd.subtask}.state"
                    handle.update(snapshot.keyed.write(directory / name), keyed_file=name)
                state[uid] = handle
            self._acknowledge(barrier.checkpoint_id, state)
        except Exception as exc:
            log.exception("%s: writing checkpoint %d failed", self.name, barrier.checkpoint_id)
            self.decline(barrier.checkpoint_id, f"{type(exc).__name__}: {exc}")
