"""Grouped partial aggregates by Arrow's hash aggregation, for the window pre-aggregation and the
window blocks' merge: on the batches windows see (tens of thousands of rows, keys and window bounds
as group columns) it is several times faster than pandas' groupby, and it reads Arrow tables as
they come off the wire.

It answers as the pandas groupby it stands in for (dropna=False, a NaN is missing, a sum of
nothing is 0), and only where the types come out the same: integer or string group columns,
int64 or float64 values. ``groupable`` says when; elsewhere the callers keep pandas.

Thread use: any thread (pure functions).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

# a partial kind (cluster.operators.keyed.PARTIALS) over rows, and over partials of its kind
SUM_OF_NOTHING_IS_ZERO = pc.ScalarAggregateOptions(skip_nulls=True, min_count=0)
OVER_ROWS = {"s": ("sum", SUM_OF_NOTHING_IS_ZERO), "c": ("count", None), "min": ("min", None),
             "max": ("max", None)}
OVER_PARTIALS = {"s": ("sum", SUM_OF_NOTHING_IS_ZERO), "c": ("sum", SUM_OF_NOTHING_IS_ZERO),
                 "min": ("min", None), "max": ("max", None)}


def _plain_key(type_: pa.DataType) -> bool:
    return pa.types.is_integer(type_) or pa.types.is_string(type_) or pa.types.is_large_string(type_)


def _plain_value(type_: pa.DataType) -> bool:
    return type_ == pa.int64() or type_ == pa.float64()


def groupable(schema: pa.Schema, by: list[str], values: list[str]) -> bool:
    """Whether Arrow groups these columns as pandas would (same answer, same types)."""
    return (all(_plain_key(schema.field(name).type) for name in by)
            and all(_plain_value(schema.field(name).type) for name in values))


def missing_as_null(table: pa.Table, columns: list[str]) -> pa.Table:
    """NaN as null in these float columns: pandas skips both, Arrow's count and sum only nulls."""
    for name in dict.fromkeys(columns):
        column = table.column(name)
        if not pa.types.is_floating(column.type):
            continue
        nan = pc.is_nan(column)
        if pc.any(nan).as_py():
            table = table.set_column(table.schema.get_field_index(name), name,
                                     pc.if_else(nan, pa.scalar(None, column.type), column))
    return table


def aggregate(table: pa.Table, by: list[str], outputs: list[tuple[str, str, str, pc.FunctionOptions | None]],
              rows: str | None = None) -> pa.Table:
    """One row per group of ``by``: the group columns, then each output ``(name, column, function,
    options)`` and, given ``rows``, that column with the rows of the group. Groups come in the order
    they are first met."""
    specs: list[tuple] = [(column, function, options) if options is not None else (column, function)
                          for _, column, function, options in outputs]
    if rows is not None:
        specs.append(([], "count_all"))
    grouped = table.group_by(by, use_threads=False).aggregate(specs)
    # Arrow names an output "<column>_<function>" (two can share a name), beside the group columns
    names = [name for name, _, _, _ in outputs] + ([rows] if rows is not None else [])
    columns = grouped.columns
    keys_first = grouped.column_names[:len(by)] == by
    results = columns[len(by):] if keys_first else columns[:len(names)]
    keys = columns[:len(by)] if keys_first else columns[len(names):]
    return pa.table(keys + results, names=by + names)
