"""A connector's declared schema (column name -> Arrow type name), as Arrow's schema.

The sources parse it when they open (cluster.connectors) and the client when it works out, before
the job runs, what a source will emit (kernel_runtime.api.schema): one parser, so that both
agree on every type name. The names are Arrow's aliases ("int64", "timestamp[ms]"), to which the
client's API normalises Spark's and Arrow's names before they travel in the operator's params.
"""
from __future__ import annotations

from typing import Optional

import pyarrow as pa


class MalformedInputError(Exception):
    """Input that cannot become rows: a malformed record nobody reads, or a file that does not fit."""


def parse_schema(schema: Optional[dict], where: str) -> Optional[pa.Schema]:
    """A connector's schema (column name -> type name such as "int64", "timestamp[ms]") as Arrow's."""
    if schema is None:
        return None
    fields = []
    for name, type_name in schema.items():
        try:
            fields.append(pa.field(name, pa.type_for_alias(type_name)))
        except (ValueError, TypeError):
            raise MalformedInputError(f"{where}: schema column {name!r} has unknown type {type_name!r}") from None
    return pa.schema(fields)
