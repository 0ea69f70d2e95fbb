"""Schemas known before the job runs: the type names a user may write, and the columns each
operator will receive, checked at submission where the client can know them.

Type names: a connector's ``schema`` may be a dict of column -> type name, a Spark DDL string
("city string, amount bigint"), a pyspark StructType or a pyarrow Schema. Spark's simple type
names (long, bigint, int, string, boolean, date, timestamp, ...) and Arrow's aliases (int64,
double, timestamp[ms], ...) are both accepted and normalised to Arrow alias names, which travel
in the operator's params and the TaskManager parses with ``pa.type_for_alias``.

Columns: the client has no SparkSession (starting one costs seconds and a JVM), so it works out
what each operator receives in pure Python: a source's declared schema, a generator's function
called on 16 sequence numbers, pandas steps applied to that sample; a step of unknown output
(Spark, a map over a schema without rows, keyed state) ends what is known. Where the input is
known, key_by columns and aggregation columns are checked here and a mistake raises
GraphValidationError naming the column, the operator and its line. A Spark step gets its input
schema in its params: the TaskManager analyses the fused Spark chain on an empty DataFrame of it
when the task opens, before any source of the job reads (a task opens its inputs only after its
consumers opened), and checks the key columns its consumers need against the analysed output.
Where nothing is known (a source without a schema), nothing is checked before the first batch.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterator, Optional, Union

import cloudpickle
import numpy as np
import pyarrow as pa

from cluster.graph.chaining import StreamNode
from cluster.graph.job_graph import GraphValidationError, OperatorSpec, ShipStrategy, missing_column
from cluster.graph.operator_kinds import KINDS, Output
from cluster.common.frames import to_table
from cluster.graph.schema import ACCEPTED, KAFKA_METADATA_TYPES, parse_schema, parse_type, split_top_level, type_name

SAMPLE_ROWS = 16

# dict of column -> type name, DDL string, pyarrow Schema, pyspark StructType (not imported here)
SchemaLike = Optional[Union[dict, str, pa.Schema, Any]]

def arrow_type_name(name) -> str:
    """The Arrow alias name of a Spark or Arrow type name (nested: Spark's form, as parse_type
    reads it back); ValueError if it is neither."""
    return type_name(parse_type(name))


_DDL_COLUMN = re.compile(r"^(`[^`]+`|[^\s:`]+)\s*(?::\s*|\s+)(.+)$")


def _ddl_columns(ddl: str) -> list[tuple[str, str]]:
    """Spark's DDL column list, "city string, amount bigint" (also "amount: bigint", `odd name`)."""
    columns = [part for part in split_top_level(ddl) if part]
    out = []
    for column in columns:
        match = _DDL_COLUMN.match(column)
        if match is None:
            raise ValueError(f"{column!r} is not 'name type'")
        name, type_name = match.groups()
        type_name = re.sub(r"\s+not\s+null$", "", type_name.strip(), flags=re.IGNORECASE)
        out.append((name.strip("`"), type_name))
    return out


def schema_type_names(value, where: str) -> Optional[dict[str, str]]:
    """A connector's ``schema`` argument as {column: Arrow alias name} (None stays None).

    Takes a dict of type names, a DDL string, a pyspark StructType or a pyarrow Schema."""
    if value is None:
        return None
    example = 'e.g. {"user": "string", "n": "bigint"} or "user string, n bigint"'
    if isinstance(value, str):
        try:
            pairs = _ddl_columns(value)
        except ValueError as exc:
            raise GraphValidationError(f"{where}: schema {value!r} is not a DDL column list ({exc}), {example}") \
                from None
    elif isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, pa.Schema):
        pairs = [(f.name, str(f.type)) for f in value]
    elif hasattr(value, "fields") and all(hasattr(f, "dataType") for f in getattr(value, "fields")):
        pairs = [(f.name, f.dataType.simpleString()) for f in value.fields]  # a pyspark StructType
    else:
        raise GraphValidationError(f"{where}: schema must be a dict of column -> type name, a DDL string, a "
                                   f"pyspark StructType or a pyarrow Schema ({example}), got {value!r}")
    if not pairs:
        raise GraphValidationError(f"{where}: schema has no columns ({example})")
    names: dict[str, str] = {}
    for column, type_name in pairs:
        if not isinstance(column, str) or not column:
            raise GraphValidationError(f"{where}: schema must be keyed by column names (non-empty strings), "
                                       f"got {column!r}")
        if column in names:
            raise GraphValidationError(f"{where}: schema names column {column!r} twice")
        try:
            names[column] = arrow_type_name(type_name)
        except ValueError:
            raise GraphValidationError(f"{where}: schema column {column!r} has unknown type {type_name!r} "
                                       f"(accepted: {ACCEPTED})") from None
    return names


def declared_schema(params: dict) -> Optional[pa.Schema]:
    """The rows a source with a declared ``schema`` emits (and its ``id_field`` first, as text)."""
    schema = parse_schema(params.get("schema") or None, "the declared schema")  # as the source parses it
    if schema is not None and params.get("id_field"):
        schema = schema.insert(0, pa.field(params["id_field"], pa.string()))
    if schema is None:
        return None
    for column in params.get("metadata") or []:  # a Kafka record's key, offset, ...
        schema = schema.append(pa.field(column, parse_type(KAFKA_METADATA_TYPES[column])))
    return schema


# ---------------------------------------------------------------------- what each operator receives
def _sequence(spec: OperatorSpec, fn: Optional[Callable], table: Optional[pa.Table]) -> Optional[pa.Table]:
    seq = np.arange(SAMPLE_ROWS, dtype=np.int64)
    return pa.table({"seq": seq}) if fn is None else to_table(fn(seq), spec.where())


def _declared(spec: OperatorSpec, fn: Optional[Callable], table: Optional[pa.Table]) -> Optional[pa.Table]:
    schema = declared_schema(spec.params)
    return None if schema is None else schema.empty_table()


def _function(spec: OperatorSpec, fn: Optional[Callable], table: Optional[pa.Table]) -> Optional[pa.Table]:
    if fn is None or table is None or table.num_rows == 0:
        return None  # a function's output on no rows says little of its output on rows
    return to_table(fn(table.to_pandas()), spec.where())


def _key_count(spec: OperatorSpec, fn: Optional[Callable], table: Optional[pa.Table]) -> Optional[pa.Table]:
    if table is None:
        return None
    return table.select(spec.params["key"]).append_column("count", pa.array([1] * table.num_rows, pa.int64()))


def _rowtime(spec: OperatorSpec, fn: Optional[Callable], table: Optional[pa.Table]) -> Optional[pa.Table]:
    if table is None or not spec.params.get("assigner"):
        return table
    if fn is None or table.num_rows == 0:
        return None
    from cluster.graph.event_time import timestamps_from
    stamps = timestamps_from(fn(table.to_pandas()), table.num_rows, spec.where())
    column = spec.params["column"]
    if column in table.column_names:
        return table.set_column(table.column_names.index(column), column, stamps)
    return table.append_column(column, stamps)


# How the sample of a kind's output is made from its input's, by its declared Output (a source
# has no input). Output.UNKNOWN has none: its sample is unknown.
SAMPLERS: dict[Output, Callable[[OperatorSpec, Optional[Callable], Optional[pa.Table]], Optional[pa.Table]]] = {
    Output.SEQUENCE: _sequence,
    Output.DECLARED: _declared,
    Output.FUNCTION: _function,
    Output.INPUT: lambda spec, fn, table: table,
    Output.KEY_COUNT: _key_count,
    Output.ROWTIME: _rowtime,
}


def _sample_of(node: StreamNode, table: Optional[pa.Table]) -> Optional[pa.Table]:
    spec = node.spec
    kind = KINDS[spec.kind]
    if kind.output is Output.UNKNOWN:  # before unpickling: a Spark step's function would import pyspark
        return None
    if not kind.is_source and table is None:
        return None
    fn = cloudpickle.loads(spec.udf) if spec.udf is not None else None
    return SAMPLERS[kind.output](spec, fn, table)


def _merged(inputs: list[Optional[pa.Table]]) -> Optional[pa.Table]:
    """The sample of what an operator receives: known only if every input is."""
    if not inputs or any(t is None for t in inputs):
        return None
    if len(inputs) == 1:
        return inputs[0]
    try:
        return pa.concat_tables(inputs, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None  # a union whose schemas do not merge fails at run time, saying so


def _walk_samples(nodes: list[StreamNode], samplers: Optional[dict] = None
                  ) -> Iterator[tuple[StreamNode, Optional[pa.Table], dict[str, Optional[pa.Table]]]]:
    """Each node (creation order is a topological order) with the sample of what it receives and
    the samples so far, by uid; the node's own sample is added once the caller goes on.
    ``samplers`` make the sample of a kind whose output the client can work out otherwise
    (kind -> fn(node, input sample)), as the SQL planner does for a per-batch query."""
    samples: dict[str, Optional[pa.Table]] = {}
    for node in nodes:
        table = _merged([samples.get(e.source) if e.side_output is None else None for e in node.inputs])
        yield node, table, samples
        sampler = (samplers or {}).get(node.spec.kind)
        try:
            samples[node.uid] = sampler(node, table) if sampler else _sample_of(node, table)
        except Exception:
            samples[node.uid] = None  # the job itself will report this step's error properly


def input_samples(nodes: list[StreamNode], edges: list, samplers: Optional[dict] = None) -> Optional[pa.Table]:
    """The sample of what an operator with these input edges would receive (None: not known)."""
    wanted = {e.source for e in edges}
    samples: dict[str, Optional[pa.Table]] = {}
    for _, _, samples in _walk_samples(nodes, samplers):
        if wanted <= samples.keys():
            break
    return _merged([samples.get(e.source) if e.side_output is None else None for e in edges])


# ---------------------------------------------------------------------- the columns each operator names
def needed_columns(node: StreamNode) -> list[tuple[str, str]]:
    """(column, what names it) for every input column the operator reads by name."""
    params = node.spec.params
    needed = [(column, "key_by column {}") for edge in node.inputs if edge.ship_strategy == ShipStrategy.HASH
              for column in edge.key]
    needed += [(column, "key_by column {}") for column in params.get("key") or ()]
    aggregations = params.get("partial_aggregate") or \
        (params.get("aggregations") if not params.get("pre_aggregated") else None)
    for out, (column, func) in (aggregations or {}).items():
        needed.append((column, "column {} of " + f"{out}=({column!r}, {func!r})"))
    needed += [(column, "timestamp column {}") for column in rowtime_columns(node.spec)]
    return list(dict.fromkeys(needed))


def rowtime_columns(spec: OperatorSpec) -> list[str]:
    """The event-time columns an operator reads (a window's, a join's two, a watermark strategy's)."""
    params = spec.params
    if spec.kind == "timestamps-watermarks":
        return [] if params.get("assigner") else [params["column"]]
    return [c for c in (params.get("rowtime"), params.get("left_rowtime"), params.get("right_rowtime")) if c]


def check_rowtime_types(spec: OperatorSpec, table: pa.Table) -> None:
    for column in rowtime_columns(spec):
        kind = table.schema.field(column).type if column in table.column_names else None
        if kind is not None and not (pa.types.is_timestamp(kind) or pa.types.is_integer(kind) or pa.types.is_date(kind)):
            raise GraphValidationError(f"{spec.where()}: the timestamp column {column!r} is {kind}, not a time: "
                                       "give a timestamp column or integer epoch milliseconds")


def check_columns(nodes: list[StreamNode]) -> None:
    """Check the columns every operator names against what it will receive, where the client
    knows it; give each Spark step its input schema, and each Spark step whose output is keyed
    the key columns its consumers need, for the TaskManager to check when the task opens.

    Raises GraphValidationError at the first operator that names a column its input lacks."""
    needs = {n.uid: needed_columns(n) for n in nodes}
    if not any(needs.values()) and not any(KINDS[n.spec.kind].spark for n in nodes):
        return  # nothing to check: do not call the user's functions for nothing
    by_uid = {n.uid: n for n in nodes}
    consumer_columns: dict[str, list] = {}
    for node, table, _ in _walk_samples(nodes):
        if table is not None:
            for column, what in needs[node.uid]:
                if column not in table.column_names:
                    raise GraphValidationError(missing_column(node.spec.where(), column, what, table.column_names))
            check_rowtime_types(node.spec, table)
            if KINDS[node.spec.kind].spark:
                node.spec.params["input_schema"] = table.schema.serialize().to_pybytes()
        for edge in node.inputs:
            upstream = by_uid[edge.source]
            if edge.ship_strategy == ShipStrategy.HASH and KINDS[upstream.spec.kind].spark:
                consumer_columns.setdefault(upstream.uid, []).extend(
                    [column, "key_by column {}", node.spec.where()] for column in edge.key)
    for uid, columns in consumer_columns.items():  # assigned, not added to: a graph may be built twice
        by_uid[uid].spec.params["consumer_columns"] = columns
