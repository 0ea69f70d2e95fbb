"""One Spark job for the subtasks of a Spark chain that share a TaskManager's JVM.

A Spark job costs 40-70 ms of the JVM's CPU however few its rows (../shared/notes/spark.md). The
subtasks of a chain fill one TaskManager first (``cluster.evenly-spread-out-slots: false``), so
at parallelism 2 both run their jobs back to back in one JVM on 2 cores: each job then waits for
CPU, and at low rates a row's latency is about 1.5 jobs of that slowed length. Here the Spark
stages of a chain's subtasks in this process form a group that runs one job at a time: whichever
stage's worker runs next takes what waits in every member stage and runs a single job over all of
it, each stage's batch in partitions of its own; every output row carries its partition
(``spark_partition_id()``), which says whose batch it came from.

That holds only for plans that keep each partition's rows in that partition: scans, filters,
projections. The first fused job's physical plan is checked; a plan with anything
else (an exchange for a GROUP BY or a join, a sort, a limit, a subquery) makes the chain run one
job per subtask batch from then on, as without fusion, the first job's batches included.

Thread use: ``run_round`` is called by the member stages' workers (several at once); one at a
time runs, under the group's lock. ``join`` and ``leave`` are called by the stages' task threads;
``join`` never waits for a round.
"""
from __future__ import annotations

import re
import threading
from typing import Any, Optional, Protocol

import numpy as np
import pyarrow as pa

from cluster.spark import catalyst
from cluster.spark.arrow import JvmRefs, by_pyspark
from cluster.spark.memory import BatchMemory

PARTITION_COLUMN = "__streamlab_partition__"
# physical operators that keep each input partition's rows in that partition, by the name the
# plan's tree string shows (WholeStageCodegen's "*(1) " prefix and the tree's lines stripped)
_NARROW = ("Project", "Filter", "Scan ExistingRDD", "InputAdapter", "WholeStageCodegen", "ColumnarToRow")
_PREFIX = re.compile(r"^[\s|+\-]*(?:\*\(\d+\)\s*)?")


class FusedStage(Protocol):
    """What a round needs of a member's Spark stage (stage.SparkStage)."""

    def take_batch(self, max_bytes: int) -> Optional[tuple[int, pa.Table]]: ...

    def run_batch(self, sequence: int, table: pa.Table) -> None: ...

    def finish_batch(self, sequence: int, out: list[pa.Table], rows: int) -> None: ...

    def fail_batch(self, exc: BaseException) -> None: ...


class FusedChain(Protocol):
    """What a round needs of a member's Spark chain (chain.SparkChain)."""

    memory: BatchMemory

    def runs_locally(self, schema: pa.Schema, rows: int) -> bool: ...

    def process_parts(self, tables: list[pa.Table], fusion: "FusionGroup") -> tuple[Optional[pa.Table], list]: ...


class FusionGroup:
    """The Spark stages of one chain (a job's attempt, a vertex) in this process."""

    _registry: dict[tuple, "FusionGroup"] = {}
    _registry_lock = threading.Lock()

    def __init__(self, key: tuple):
        self.key = key
        self.lock = threading.Lock()  # held while a round runs: one job of the group at a time
        # Guards ``members`` only: a stage joins while a round runs. Under the round's lock, a
        # subtask that opened while another's first job ran waited for that job (300-450 ms of a
        # 5M-row job that took 1.1-1.2 s) before its source read a row.
        self._members_lock = threading.Lock()
        self.members: list[tuple[FusedStage, FusedChain]] = []
        self.narrow: Optional[bool] = None  # None: no fused job ran yet

    @classmethod
    def join(cls, key: tuple, stage: FusedStage, chain: FusedChain) -> "FusionGroup":
        with cls._registry_lock:
            group = cls._registry.get(key)
            if group is None:
                group = cls._registry[key] = FusionGroup(key)
            with group._members_lock:
                group.members.append((stage, chain))
            return group

    def leave(self, stage: FusedStage) -> None:
        """After a round that may hold the stage's batch (lock order: round, registry, members)."""
        with self.lock, self._registry_lock, self._members_lock:
            self.members = [m for m in self.members if m[0] is not stage]
            if not self.members and self._registry.get(self.key) is self:
                del self._registry[self.key]

    def run_round(self, stage: FusedStage) -> None:
        """What waits in every member stage, through Spark: one job when the plan allows, else one
        job per stage's batch; each output (or the failure) handed to its stage."""
        with self.lock:
            # the calling stage first: its chain (session, job group) runs the fused job
            with self._members_lock:
                members = sorted(self.members, key=lambda m: m[0] is not stage)
            # one job's input is at most the TaskManager's budget for batches in the JVM (memory.py):
            # the stages left out have their input taken by their own workers' next rounds
            allowance = members[0][1].memory.capacity
            taken = []
            for member, chain in members:
                if allowance <= 0:
                    break
                if (batch := member.take_batch(allowance)) is not None:
                    taken.append((member, chain, *batch))
                    allowance -= batch[1].nbytes
            if not taken:
                return  # another worker's round took this stage's input
            schema = taken[0][3].schema
            # small batches run in the driver without a Spark job (local.py), each its own
            small = taken[0][1].runs_locally(schema, sum(t[3].num_rows for t in taken))
            if len(taken) > 1 and self.narrow is not False and all(t[3].schema.equals(schema) for t in taken) \
                    and not by_pyspark(schema) and not small:
                try:
                    outputs = self._fused(taken[0][1], [t[3] for t in taken])
                except BaseException as exc:
                    for member, _, sequence, table in taken:
                        member.fail_batch(exc)
                    return
                if outputs is not None:
                    for (member, _, sequence, table), out in zip(taken, outputs):
                        member.finish_batch(sequence, out, table.num_rows)
                    return
            for member, chain, sequence, table in taken:  # each in a job of its own
                member.run_batch(sequence, table)

    def _fused(self, leader: FusedChain, tables: list[pa.Table]) -> Optional[list[list[pa.Table]]]:
        out, ranges = leader.process_parts(tables, self)
        return None if out is None else split_by_partition(out, ranges)

    def check_plan(self, jdf: Any, refs: JvmRefs) -> bool:
        """Whether the physical plan keeps each partition's rows apart (decided once)."""
        if self.narrow is None:
            self.narrow = is_narrow(catalyst.executed_plan_tree(jdf, refs))
        return self.narrow


def is_narrow(tree: str) -> bool:
    """Whether every operator of a physical plan's tree string keeps partitions apart."""
    for line in tree.splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith(":"):
            return False  # a subquery of an expression
        node = _PREFIX.sub("", line, count=1)
        if not any(node == name or node[len(name):len(name) + 1] in (" ", "[", "(") and node.startswith(name)
                   for name in _NARROW):
            return False
    return True


def split_by_partition(table: pa.Table, ranges: list[tuple[int, int]]) -> list[list[pa.Table]]:
    """The fused job's output (rows in partition order, tagged) cut back into each batch's rows."""
    partition = table.column(PARTITION_COLUMN).to_numpy()
    rows = table.drop_columns([PARTITION_COLUMN])
    bounds = np.searchsorted(partition, [edge for r in ranges for edge in r], side="left")
    outputs = []
    for i in range(len(ranges)):
        start, stop = int(bounds[2 * i]), int(bounds[2 * i + 1])
        outputs.append([rows.slice(start, stop - start)] if stop > start else [])
    return outputs
