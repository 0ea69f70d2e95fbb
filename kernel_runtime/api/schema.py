"""What each Spark step will receive, found before the job is submitted.

Spark analyses a plan against its input schema without running it. The client has no
SparkSession (starting one costs seconds), so it works out the input schema of each Spark step
from a few sample rows: the generator's function on 16 sequence numbers, pandas steps applied to
that sample. The schema travels in the step's params; the TaskManager analyses the fused Spark
chain against it at deployment, so a wrong column fails the job before its first batch, naming
the step. Where a sample cannot be made (an unknown source, a step that raised), the schema is
left unknown and Spark analyses at the first batch instead: sampling never fails a submission.
"""
from __future__ import annotations

from typing import Callable, Optional

import cloudpickle
import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.graph.chaining import StreamNode
from cluster.graph.job_graph import OperatorSpec
from cluster.graph.operator_kinds import KINDS, Output

SAMPLE_ROWS = 16


def _sequence(spec: OperatorSpec, fn: Optional[Callable], table: Optional[pa.Table]) -> pa.Table:
    seq = np.arange(SAMPLE_ROWS, dtype=np.int64)
    return pa.table({"seq": seq}) if fn is None else _table(fn(seq))


def _given(spec: OperatorSpec, value, what: str):
    if value is None:
        raise ValueError(f"{spec.where()}: no {what} to sample its output from")
    return value


def _function(spec: OperatorSpec, fn: Optional[Callable], table: Optional[pa.Table]) -> pa.Table:
    fn = _given(spec, fn, "function")
    table = _given(spec, table, "input sample")
    return _table(fn(table.to_pandas()))


def _key_count(spec: OperatorSpec, fn: Optional[Callable], table: Optional[pa.Table]) -> pa.Table:
    table = _given(spec, table, "input sample")
    return table.select(spec.params["key"]).append_column("count", pa.array([1] * table.num_rows, pa.int64()))


# How the sample of a kind's output is made from its input's, by its declared Output (a source
# has no input). Output.UNKNOWN has none: its sample is unknown.
SAMPLERS: dict[Output, Callable[[OperatorSpec, Optional[Callable], Optional[pa.Table]], Optional[pa.Table]]] = {
    Output.SEQUENCE: _sequence,
    Output.FUNCTION: _function,
    Output.INPUT: lambda spec, fn, table: table,
    Output.KEY_COUNT: _key_count,
}


def _sample_of(node: StreamNode, inputs: list[Optional[pa.Table]]) -> Optional[pa.Table]:
    spec = node.spec
    kind = KINDS[spec.kind]
    if kind.output is Output.UNKNOWN:  # before unpickling: a Spark step's function would import pyspark
        return None
    table = None
    if not kind.is_source:
        if not inputs or any(t is None for t in inputs):
            return None
        table = inputs[0] if len(inputs) == 1 else pa.concat_tables(inputs, promote_options="default")
    fn = cloudpickle.loads(spec.udf) if spec.udf is not None else None
    return SAMPLERS[kind.output](spec, fn, table)


def _table(result) -> pa.Table:
    if isinstance(result, dict):
        result = pd.DataFrame(result)
    if isinstance(result, pd.DataFrame):
        return pa.Table.from_pandas(result, preserve_index=False)
    if isinstance(result, pa.Table):
        return result
    raise TypeError(type(result).__name__)


def annotate_spark_input_schemas(nodes: list[StreamNode]) -> None:
    if not any(KINDS[n.spec.kind].spark for n in nodes):
        return
    samples: dict[str, Optional[pa.Table]] = {}
    for node in nodes:  # creation order is a topological order
        inputs = [samples.get(e.source) if e.side_output is None else None for e in node.inputs]
        known = [t for t in inputs if t is not None]
        if KINDS[node.spec.kind].spark and inputs and len(known) == len(inputs):
            schema = known[0].schema if len(known) == 1 else pa.unify_schemas([t.schema for t in known])
            node.spec.params["input_schema"] = schema.serialize().to_pybytes()
        try:
            samples[node.uid] = _sample_of(node, inputs)
        except Exception:
            samples[node.uid] = None  # the job itself will report this step's error properly
