"""Sinks: collect (Arrow batches to the client) and print (the TaskManager's stdout, as Flink's)."""
from __future__ import annotations

import logging
import sys

import pyarrow as pa

from cluster.protocol.messages import CollectBatch, CollectEnd

from .base import Operator
from cluster.protocol.serde import table_to_ipc

log = logging.getLogger(__name__)


class CollectSink(Operator):
    def open(self) -> None:
        self.address = self.ctx.result_address
        if self.address is None:
            log.info("%s: no client to collect to (detached job): rows are discarded", self.spec.where())

    def process(self, table: pa.Table) -> list[pa.Table]:
        if self.address is not None and table.num_rows:
            self.ctx.sender.send(self.address, CollectBatch(
                self.ctx.job_id, self.ctx.attempt, self.spec.uid, self.ctx.subtask), [table_to_ipc(table)])
        return []

    def finish(self) -> list[pa.Table]:
        if self.address is not None:
            self.ctx.sender.send(self.address, CollectEnd(
                self.ctx.job_id, self.ctx.attempt, self.spec.uid, self.ctx.subtask))
        return []


class PrintSink(Operator):
    def process(self, table: pa.Table) -> list[pa.Table]:
        if table.num_rows:
            prefix = f"{self.ctx.subtask + 1}> " if self.ctx.parallelism > 1 else ""
            text = table.to_pandas().to_string(index=False, header=False)
            sys.stdout.write("".join(prefix + line + "\n" for line in text.splitlines()))
            sys.stdout.flush()
        return []
