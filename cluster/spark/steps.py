"""The steps of a Spark chain and their analysis: what each fused ``.spark``/``.sql`` operator does to
the DataFrame, and the errors that name the step (or the chain) at fault.

Each step is SQL over the view ``input`` (a keyed aggregation's and a window's pre-aggregation
too) or a function DataFrame -> DataFrame. The steps are analysed one by one over the batch's
DataFrame, so that an error names its step, on the Arrow bridge's Java session or (``public``) by
PySpark's public ``sql``; chain.SparkChain decides which.

Thread use: ``plan`` may run on several threads at once (a chain's Spark stage, each thread with
a session of its own); ``outputs_checked`` is set once, by whichever thread analyses first.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Union

import cloudpickle

from cluster.graph.job_graph import OperatorSpec, missing_column
from cluster.operators.base import TaskCancelled, UserFunctionError
from cluster.spark import catalyst
from cluster.spark.arrow import JvmRefs
from cluster.spark.plans import INPUT_VIEW

Step = Union[str, Callable]


class ChainSteps:
    def __init__(self, specs: list[OperatorSpec]):
        self.pairs: list[tuple[OperatorSpec, Step]] = [(spec, step_of(spec)) for spec in specs]
        self.sql_only = all(isinstance(step, str) for _, step in self.pairs)
        self.key = tuple(step for _, step in self.pairs)  # a kept plan's, with its input's schema
        self.names = ", ".join(spec.name for spec in specs)
        self.call_site = specs[0].call_site
        self.outputs_checked = False  # the columns consumers key by, checked once per attempt

    def plan(self, session, jdf, refs: JvmRefs, columns: Optional[list] = None, public: bool = False) -> Any:
        """The steps' plan over ``jdf`` (a Java DataFrame), analysed step by step so that an error
        names its step; the columns consumers key by are checked on the first batch. ``columns``
        gets each step's output columns. A fast path's own reach that fails inside Spark's
        internals raises as it is (the chain falls back to ``public``)."""
        for spec, step in self.pairs:
            try:
                if isinstance(step, str):
                    catalyst.register_view(jdf, INPUT_VIEW)
                    # parsed and analysed here
                    jdf = refs.add(catalyst.public_sql(session, step) if public else catalyst.sql(session, step))
                else:
                    df = step(catalyst.frame(session, jdf))
                    if not catalyst.is_frame(df):
                        raise TypeError(f"the function must return a Spark DataFrame, got {type(df).__name__}")
                    # not released: the function may keep its DataFrame for later batches
                    jdf = catalyst.java_frame(df)
                if not self.outputs_checked or columns is not None:
                    output = catalyst.columns(jdf)
                    if not self.outputs_checked:
                        check_consumers(spec, output)
                    if columns is not None:
                        columns.append(tuple(output))
            except (TaskCancelled, UserFunctionError):
                raise
            except Exception as exc:
                if isinstance(step, str) and not public and catalyst.internal_failure(exc):
                    raise
                raise UserFunctionError(f"{spec.where()} failed in Spark: {type(exc).__name__}: "
                                        f"{catalyst.first_line(exc)}", spec.name, spec.call_site) from exc
        if any(isinstance(step, str) for _, step in self.pairs):
            # analysed: the view has done its work, and left in the session's catalog it kept the
            # batch (its Arrow bytes) in the JVM until the next batch's view or the session's end
            catalyst.drop_view(session, INPUT_VIEW, refs)
        self.outputs_checked = True
        return jdf

    def check_kept(self, columns: tuple[tuple[str, ...], ...]) -> None:
        """A kept plan's columns (an earlier job analysed it) against this chain's consumers."""
        if not self.outputs_checked:
            for (spec, _), output in zip(self.pairs, columns):
                check_consumers(spec, list(output))
            self.outputs_checked = True

    @contextmanager
    def running(self, public: bool = False) -> Iterator[None]:
        """Around the steps' Spark job: its failure as the user's error naming the chain, but a fast
        path failing inside Spark's internals as it is (the chain falls back to the public path)."""
        try:
            yield
        except Exception as exc:
            if not public and catalyst.internal_failure(exc):
                raise
            raise UserFunctionError(f"operator chain [{self.names}] ({self.call_site}) failed in Spark: "
                                    f"{type(exc).__name__}: {catalyst.first_line(exc)}", self.names,
                                    self.call_site) from exc


def check_consumers(spec: OperatorSpec, columns: list[str]) -> None:
    """The key columns the step's consumers need (given by the client, which could not know a
    Spark step's output) against the step's analysed output."""
    for column, what, consumer in spec.params.get("consumer_columns") or ():
        if column not in columns:
            raise UserFunctionError(missing_column(consumer, column, what, columns,
                                                   of=f" (the output of {spec.where()})"))


def step_of(spec: OperatorSpec) -> Step:
    if "sql" in spec.params:
        return spec.params["sql"]
    if "partial_aggregate" in spec.params:
        from cluster.operators.keyed import spark_partial_aggregate
        return spark_partial_aggregate(spec.params["key"], spec.params["partial_aggregate"])
    if spec.udf is None:
        raise TypeError(f"Spark step '{spec.name}' has neither SQL nor a function")
    return cloudpickle.loads(spec.udf)


class BatchTimings:
    """Where a Spark chain's batches spend their time, summed: Arrow in (the batch to the JVM),
    plan (views, SQL, analysis of every step), run (optimisation, execution, Arrow out). Any
    thread may add (several jobs run at once) and read."""

    def __init__(self):
        self._lock = threading.Lock()
        self.batches = self.rows = 0
        self.arrow_in = self.plan = self.run = 0.0

    def add(self, rows: int, arrow_in: float, plan: float, run: float) -> None:
        with self._lock:
            self.batches += 1
            self.rows += rows
            self.arrow_in += arrow_in
            self.plan += plan
            self.run += run

    def metrics(self) -> dict:
        with self._lock:
            return {"spark-batches": self.batches, "spark-rows": self.rows,
                    "spark-arrow-in-ms": round(self.arrow_in * 1000), "spark-plan-ms": round(self.plan * 1000),
                    "spark-run-ms": round(self.run * 1000)}
