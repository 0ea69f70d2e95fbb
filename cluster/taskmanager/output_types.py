"""Each operator's output keeps the column types it started with.

A stream has one schema (Flink's, Spark's). A user's function whose column changes type between
batches (a generator giving numbers, then strings) used to fail at the next exchange, when the
batches bound for one channel were concatenated, with Arrow's words about an internal column
(``Field __t__s has incompatible types``, a pre-aggregate's partial sum) and no operator. Checked
at every operator's output in the chain, the first operator whose output changed is named, with
the user's column, both types and the cell line. A change Arrow unifies without loss (a column of
nulls only, in a batch or before) passes, as it does at the exchange.

Task thread only, as the chain that holds them.
"""
from __future__ import annotations

import re
from typing import Optional

import pyarrow as pa

from cluster.common.failures import UserFunctionError

# a keyed pre-aggregate's partial column: __<output>__<partial kind> (operators/keyed.py)
_PARTIAL = re.compile(r"^__(?P<output>.+)__(?P<kind>[a-z]+)$")


class ColumnTypeChanged(UserFunctionError):
    """A column of a stream changed type from one batch to the next."""


def describe_column(name: str) -> str:
    partial = _PARTIAL.match(name)
    if partial is None:
        return f"column '{name}'"
    return f"the partial {partial['kind']!r} of aggregate column '{partial['output']}' (from its input column)"


def _hint(before: pa.DataType, now: pa.DataType) -> str:
    if pa.types.is_integer(before) and pa.types.is_floating(now):
        return ("; pandas makes an integer column float when it holds a missing value: give it the "
                "nullable 'Int64' dtype, or fill the gaps")
    return "; convert it in the function (astype) so that every batch has the same type"


class OutputTypes:
    """The types an operator's output has had so far; ``check`` each output table."""

    def __init__(self, where: str):
        self.where = where
        self.schema: Optional[pa.Schema] = None

    def check(self, table: pa.Table) -> None:
        schema = table.schema
        if self.schema is None:
            if table.num_columns:
                self.schema = schema
            return
        if schema.equals(self.schema) or not table.num_columns:
            return
        fields = list(self.schema)
        for field in schema:
            index = self.schema.get_field_index(field.name)
            if index < 0:
                fields.append(field)
                continue
            before = self.schema.field(index)
            if before.type.equals(field.type):
                continue
            try:
                fields[index] = pa.unify_schemas([pa.schema([before]), pa.schema([field])]).field(0)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                raise ColumnTypeChanged(
                    f"{self.where}: {describe_column(field.name)} is {field.type} in this batch but was "
                    f"{before.type} in the batches before it: a stream's columns keep one type"
                    f"{_hint(before.type, field.type)}") from None
        self.schema = pa.schema(fields)
