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

from typing import Optional

import cloudpickle
import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.graph.chaining import StreamNode

SAMPLE_ROWS = 16


def _sample_of(node: StreamNode, inputs: list[Optional[pa.Table]]) -> Optional[pa.Table]:
    kind, spec = node.spec.kind, node.spec
    fn = cloudpickle.loads(spec.udf) if spec.udf is not None else None
    if kind == "generator-source":
        seq = np.arange(SAMPLE_ROWS, dtype=np.int64)
        return pa.table({"seq": seq}) if fn is None else _table(fn(seq))
    if not inputs or any(t is None for t in inputs):
        return None
    table = inputs[0] if len(inputs) == 1 else pa.concat_tables(inputs, promote_options="default")
    if kind == "map-batches":
        return _table(fn(table.to_pandas()))
    if kind == "filter":
        return table
    if kind == "keyed-count":
        return table.select(spec.params["key"]).append_column("count", pa.array([1] * table.num_rows, pa.int64()))
    return None  # Spark steps (no Spark here), sinks, connectors


def _table(result) -> pa.Table:
    if isinstance(result, dict):
        result = pd.DataFrame(result)
    if isinstance(result, pd.DataFrame):
        return pa.Table.from_pandas(result, preserve_index=False)
    if isinstance(result, pa.Table):
        return result
    raise TypeError(type(result).__name__)


def annotate_spark_input_schemas(nodes: list[StreamNode]) -> None:
    if not any(n.spec.kind == "spark" for n in nodes):
        return
    samples: dict[str, Optional[pa.Table]] = {}
    for node in nodes:  # creation order is a topological order
        inputs = [samples.get(e.source) if e.side_output is None else None for e in node.inputs]
        if node.spec.kind == "spark" and inputs and all(t is not None for t in inputs):
            schema = inputs[0].schema if len(inputs) == 1 else pa.unify_schemas([t.schema for t in inputs])
            node.spec.params["input_schema"] = schema.serialize().to_pybytes()
        try:
            samples[node.uid] = _sample_of(node, inputs)
        except Exception:
            samples[node.uid] = None  # the job itself will report this step's error properly
