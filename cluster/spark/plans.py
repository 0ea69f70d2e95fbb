"""Analysed plans of ``.sql`` chains, re-used for every batch after the first, by every job.

Per batch, a ``.sql`` chain made its view ``input`` (a command that Spark analyses and runs),
parsed and analysed every step, and analysed the fused job's partition tag once more: at 1.3M
rows/s some 15-25 ms of the driver's time per Spark job (medians: view 6, SQL 5, tag 7 ms), paid
by every round whatever its rows. Once Spark is busy a round's length is that fixed cost over the
share of Spark left free, so it set the latency at high rates. Yet only a plan's input changes
from batch to batch: here the first batch's analysed plan is kept, and each later batch's input
relation takes the place of its input leaf, with that leaf's attribute ids (which every expression
above refers to); the plan is marked analysed and goes straight to optimisation.

A plan depends on nothing but its SQL and its input's schema when it reads nothing but its input
and constants, so the TaskManager keeps one per SQL, schema and fusion (``PlanCache``) for every
job's chains: kept per chain and thread, each job analysed its plan three times over (its first
batch on each worker thread, its first fused round), 150-250 ms of a 5M-row job's 1.1-1.3 s, and a
re-run notebook cell analysed again what it had analysed a minute before.

Re-used only when the plan reads its input through one leaf among the tree's children: a
subquery expression holds a plan of its own inside an expression, and a self-join reads the input
twice; those plans are analysed per batch as before. So are plans that read a table or a view
(each batch reads what they hold at its time, as a Spark Structured Streaming micro-batch does)
and plans that are not deterministic: analysis fixes the seed of ``rand()``, ``uuid()`` and their
kind (Spark's ResolveRandomSeed), and a re-used plan would draw the same numbers for every batch.
``.spark`` functions never are re-used (they may build a different plan each time).

Every reach into Catalyst (the plan's walk, the input leaf's copy) is catalyst.py's.

Thread use: any thread may call a ``PlanCache`` and a ``PlanTemplate`` (each under its own lock).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import pyarrow as pa

from cluster.spark import catalyst
from cluster.spark.helpers import HELPER_PACKAGE, read_stream_file

INPUT_VIEW = "input"  # the view each SQL step reads (SparkChain._plan)
PLANS_KEPT = 64  # a TaskManager's plans, the least recently used released first


@dataclass(frozen=True)
class CachedPlan:
    """A chain's analysed plan, or None when it cannot be re-used (each batch is analysed), and
    each step's output columns, which a chain that does not analyse checks its consumers against."""
    template: Optional["PlanTemplate"]
    columns: tuple[tuple[str, ...], ...]


class PlanCache:
    """A TaskManager's analysed plans, by key: the chain's SQL steps, its input's Arrow schema
    (without metadata) and whether fused. Any thread."""

    def __init__(self, capacity: int = PLANS_KEPT):
        self.capacity = capacity
        self._lock = threading.Lock()
        self._plans: OrderedDict[tuple, CachedPlan] = OrderedDict()

    def get(self, key: tuple) -> Optional[CachedPlan]:
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
            return plan

    def put(self, key: tuple, plan: CachedPlan) -> CachedPlan:
        """Keep ``plan``, unless another thread kept one for the key first: the plan kept."""
        with self._lock:
            kept = self._plans.get(key)
            if kept is None:
                self._plans[key] = kept = plan
                evicted = [self._plans.popitem(last=False)[1] for _ in range(len(self._plans) - self.capacity)]
            else:
                evicted = [plan]
        for old in evicted:  # a thread binding one now finishes first (the template's lock)
            if old.template is not None:
                old.template.release()
        return kept

    def __len__(self) -> int:
        with self._lock:
            return len(self._plans)


class PlanTemplate:
    """An analysed plan over one input relation, and how to put another relation in its place."""

    def __init__(self, session, path: list[tuple[Any, list[Any], int]], copy_args: Any, rdd_arg: int,
                 kept: list[Any]):
        self._detach_one = catalyst.detacher(session)
        self._lock = threading.Lock()  # a bind sets the batch's rdd in the one copy_args array
        self._released = False
        self._users = 0  # calls using the root now (root())
        # from the root down: each ancestor of the input leaf, its children, and the leaf's side
        self._path = path
        # the leaf's constructor arguments, its attribute ids among them; its rdd set per batch
        self._copy_args, self._rdd_arg = copy_args, rdd_arg
        self._kept = kept  # every Java object the template holds, released with it
        self._copier = catalyst.PlanCopier(session)
        # a chain of one-child nodes (projections, filters) down to the input: a small batch may
        # run in the driver (local.py); set False once Spark's optimiser left a job to run
        self.local = bool(path) and all(len(children) == 1 for _, children, _ in path)

    @classmethod
    def of(cls, session, jdf, refs: catalyst.Refs, tagged: bool = False) -> Optional["PlanTemplate"]:
        """The template of a Java DataFrame's analysed plan, or None when it cannot be re-used.
        ``tagged``: the plan is a projection of ours (fusion.py's partition tag, itself not
        deterministic) over the steps' plan, whose determinism decides. What it reaches of the
        batch's own plan goes with ``refs`` (the batch's)."""
        plan = steps = catalyst.analyzed_plan(jdf, refs)
        if tagged:
            steps = catalyst.only_child(plan, "Project", refs)
            if steps is None:
                return None
        found = catalyst.input_path(plan, steps, INPUT_VIEW, refs)
        if found is None:
            return None  # a table or view read, the input read twice, or inside an expression (a subquery)
        path, leaf = found
        args = catalyst.leaf_copy_args(session, leaf, refs)
        if args is None:
            return None
        copy_args, rdd_arg = args
        # The template's own plan reads an empty RDD: over the analysed batch's leaf it kept that
        # batch's Arrow bytes in the JVM for as long as the chain ran, a whole fused job's input
        # per thread and plan; with 1M-row batches of eight int64 columns (64 MB) and the batch
        # the view "input" kept (SparkChain._plan), a 1g heap ran out within a few jobs.
        nodes = catalyst.PlanCopier(session).over(catalyst.empty_rdd(session, refs), leaf, copy_args, rdd_arg,
                                                  path, refs, keep=True)
        own_path = []  # each new ancestor with its children: Java objects of the template's own
        for node, (_, _, side) in zip(nodes, path):
            own_path.append((node, catalyst.children(node, refs), side))
        catalyst.forget_datasets(session, nodes[0])
        kept = [copy_args, *(obj for node, kids, _ in own_path for obj in (node, *kids))]
        return cls(session, own_path, copy_args, rdd_arg, kept)

    def bind(self, session, jdf, refs: catalyst.Refs) -> Optional[Any]:
        """The plan over ``jdf``'s relation (an Arrow batch's, of the template's schema), as a
        Java DataFrame of ``session``; None when the template was released (evicted) meanwhile."""
        leaf, rdd = catalyst.plan_rdd(jdf, refs)
        with self._lock:
            if self._released:
                return None
            root = self._copier.over(rdd, leaf, self._copy_args, self._rdd_arg, self._path, refs)[0]
        return self._copier.analysed_frame(session, root, refs)

    @contextmanager
    def root(self) -> Iterator[Optional[Any]]:
        """The template's own plan root, from which the JVM helpers (jvm/*.java) build a batch's
        plan, for the length of a call; None when the template was released or reads its input
        bare (no node above it). A release meanwhile leaves its objects in the JVM until the last
        such call is done: the lock is not held through a call, which may be a whole Spark job."""
        with self._lock:
            root = None if self._released or not self._path else self._path[0][0]
            if root is not None:
                self._users += 1
        try:
            yield root
        finally:
            if root is not None:
                with self._lock:
                    self._users -= 1
                    last = self._released and self._users == 0
                if last:
                    self._detach()

    def release(self) -> None:
        with self._lock:
            self._released = True
            if self._users:
                return  # the last call using its root detaches
        self._detach()

    def _detach(self) -> None:
        with self._lock:
            kept, self._kept = self._kept, []
        for obj in kept:
            self._detach_one(obj)


class BatchJobs:
    """jvm/BatchJob.java as loaded in a session's JVM: a batch through a kept plan as one Spark
    job, in one py4j call where the Python way (ArrowBridge.parts_to_jvm, PlanTemplate.bind,
    ArrowBridge.from_jvm) made some thirty. Any thread."""

    def __init__(self, helper: Any):
        self._run = helper.run  # the method's lookup, a round trip of its own, made once

    @classmethod
    def load(cls, session) -> Optional["BatchJobs"]:
        helper = catalyst.load_helper(session, HELPER_PACKAGE, "BatchJob")
        return None if helper is None else cls(helper)

    def run(self, session, template: PlanTemplate, spark_schema: str, in_path: str,
            out_path: str) -> Optional[tuple[pa.Table, float]]:
        """The batch in the Arrow stream file ``in_path`` (``spark_schema``: its Spark schema as
        JSON) through ``template``'s plan: its output, partitions in order, and the seconds taken to
        bind the plan to it; None when the template was released meanwhile. A failure of the job
        raises as PySpark raises it."""
        with template.root() as root:
            if root is None:
                return None
            with catalyst.spark_errors():
                bind_ns = self._run(catalyst.java_session(session), root, spark_schema, in_path, out_path)
        return read_stream_file(out_path), bind_ns / 1e9
