"""Sinks: collect (Arrow batches to the client), print (the TaskManager's stdout, as Flink's) and
discard (Flink's DiscardingSink, for benchmarks and for jobs run for their side effects)."""
from __future__ import annotations

import logging
import sys

import pyarrow as pa

from cluster.protocol.messages import CollectBarrier, CollectBatch, CollectEnd

from cluster.operators.base import Operator
from cluster.protocol.serde import table_to_ipc

log = logging.getLogger(__name__)


class CollectSink(Operator, kind="collect-sink"):
    """Streams batches to the client. Exactly once across restarts: each batch carries its epoch
    (the last checkpoint barrier before it), and at every barrier a marker tells the client, which
    acknowledges it to the JobManager: a checkpoint completes only once the client holds every row
    before it. After a restore from checkpoint n the client drops earlier attempts' rows of
    epochs >= n, which are replayed."""

    def open(self) -> None:
        self.address = self.ctx.result_address
        self.epoch = self.ctx.restored_checkpoint
        if self.address is None:
            log.info("%s: no client to collect to (detached job): rows are discarded", self.spec.where())

    def process(self, table: pa.Table) -> list[pa.Table]:
        if self.address is not None and table.num_rows:
            self.ctx.sender.send(self.address, CollectBatch(
                self.ctx.job_id, self.ctx.attempt, self.spec.uid, self.ctx.subtask, self.epoch,
                self.ctx.restored_checkpoint), [table_to_ipc(table)])
        return []

    def snapshot_state(self, checkpoint_id: int):
        if self.address is not None:
            self.ctx.sender.send(self.address, CollectBarrier(
                self.ctx.job_id, self.ctx.attempt, self.spec.uid, self.ctx.subtask, checkpoint_id))
        self.epoch = checkpoint_id
        return None

    def finish(self) -> list[pa.Table]:
        if self.address is not None:
            self.ctx.sender.send(self.address, CollectEnd(
                self.ctx.job_id, self.ctx.attempt, self.spec.uid, self.ctx.subtask))
        return []


class PrintSink(Operator, kind="print-sink"):
    def process(self, table: pa.Table) -> list[pa.Table]:
        if table.num_rows:
            prefix = f"{self.ctx.subtask + 1}> " if self.ctx.parallelism > 1 else ""
            text = table.to_pandas().to_string(index=False, header=False)
            sys.stdout.write("".join(prefix + line + "\n" for line in text.splitlines()))
            sys.stdout.flush()
        return []


class DiscardingSink(Operator, kind="discarding-sink"):
    def process(self, table: pa.Table) -> list[pa.Table]:
        return []
