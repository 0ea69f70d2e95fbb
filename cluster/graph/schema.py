"""A connector's declared schema (column name -> type name), as Arrow's schema.

The sources parse it when they open (cluster.connectors) and the client when it works out, before
the job runs, what a source will emit (kernel_runtime.api.schema): one parser, so that both
agree on every type name. A type name is an Arrow alias ("int64", "timestamp[ms]"), a Spark
simple type ("bigint", "timestamp"), or Spark's nested DDL types over them: ``array<T>``,
``map<K,V>``, ``struct<name:T,...>`` (what a schema inferred from JSON records holds).
"""
from __future__ import annotations

import base64
import re
from typing import Optional

import pyarrow as pa


def quoted(name: str) -> str:
    """A column name as a Spark SQL identifier, whatever its characters."""
    return "`" + name.replace("`", "``") + "`"


def schema_to_text(schema: Optional[pa.Schema]) -> Optional[str]:
    """An Arrow schema as text, for JSON (a job graph's params, checkpoint metadata)."""
    return None if schema is None else base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_of_text(text: Optional[str]) -> Optional[pa.Schema]:
    return None if text is None else pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


class MalformedInputError(Exception):
    """Input that cannot become rows: a malformed record nobody reads, or a file that does not fit."""


# Spark's simple type names (DataType.simpleString and their SQL synonyms) as Arrow alias names.
SPARK_TYPES = {
    "boolean": "bool", "tinyint": "int8", "byte": "int8", "smallint": "int16", "short": "int16",
    "int": "int32", "integer": "int32", "bigint": "int64", "long": "int64", "float": "float", "real": "float",
    "double": "double", "string": "string", "binary": "binary", "date": "date32",
    # Spark keeps microseconds; the session time zone is UTC on the TaskManagers
    "timestamp": "timestamp[us]", "timestamp_ntz": "timestamp[us]", "timestamp_ltz": "timestamp[us]",
}
_TEXT = re.compile(r"^(var)?char\(\s*\d+\s*\)$")  # Spark's varchar(n)/char(n) are strings
ACCEPTED = ("Spark: " + ", ".join(SPARK_TYPES) + ", varchar(n), array<T>, map<K,V>, struct<name:T,...>; "
            "Arrow: int8..int64, uint8..uint64, float, double, string, bool, binary, date32, timestamp[s|ms|us|ns], ...")

# Kafka record metadata a KafkaSource adds as columns when asked (Flink's metadata columns)
KAFKA_METADATA_TYPES = {"key": "string", "topic": "string", "partition": "int32", "offset": "int64",
                        "timestamp": "timestamp[ms]", "headers": "map<string,string>"}


def split_top_level(text: str) -> list[str]:
    """``text`` cut at the commas outside any <...> or (...)."""
    parts, depth, part = [], 0, ""
    for char in text + ",":
        if char == "," and depth == 0:
            parts.append(part.strip())
            part = ""
            continue
        depth += (char in "(<") - (char in ")>")
        part += char
    return parts


def parse_type(type_name: object) -> pa.DataType:
    """A Spark or Arrow type name, nested or not, as an Arrow type; ValueError if it is neither."""
    if not isinstance(type_name, str):
        raise ValueError(f"a type name must be a string, got {type_name!r}")
    name = type_name.strip()
    lower = name.lower()
    if lower in SPARK_TYPES:
        return pa.type_for_alias(SPARK_TYPES[lower])
    if _TEXT.match(lower):
        return pa.string()
    nested = re.fullmatch(r"(array|map|struct)\s*<(.*)>", name, flags=re.IGNORECASE | re.DOTALL)
    if nested is not None:
        kind, inner = nested.group(1).lower(), nested.group(2)
        parts = split_top_level(inner)
        if kind == "array" and len(parts) == 1:
            return pa.list_(parse_type(parts[0]))
        if kind == "map" and len(parts) == 2:
            return pa.map_(parse_type(parts[0]), parse_type(parts[1]))
        if kind == "struct":
            fields = []
            for part in parts:
                match = re.fullmatch(r"(`[^`]+`|[^\s:`]+)\s*(?::\s*|\s+)(.+)", part, flags=re.DOTALL)
                if match is None:
                    raise ValueError(f"struct field {part!r} is not 'name:type'")
                fields.append(pa.field(match.group(1).strip("`"), parse_type(match.group(2))))
            return pa.struct(fields)
        raise ValueError(f"unknown type {type_name!r}")
    try:
        return pa.type_for_alias(name)
    except (ValueError, TypeError, KeyError):
        raise ValueError(f"unknown type {type_name!r}") from None


def type_name(t: pa.DataType) -> str:
    """An Arrow type as a name that parse_type reads back (aliases, or Spark's nested forms)."""
    if pa.types.is_map(t):
        return f"map<{type_name(t.key_type)},{type_name(t.item_type)}>"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"array<{type_name(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"`{f.name}`:{type_name(f.type)}" for f in t) + ">"
    return str(t)


def parse_schema(schema: Optional[dict], where: str) -> Optional[pa.Schema]:
    """A connector's schema (column name -> type name such as "int64", "timestamp[ms]") as Arrow's."""
    if schema is None:
        return None
    fields = []
    for name, type_name_ in schema.items():
        try:
            fields.append(pa.field(name, parse_type(type_name_)))
        except ValueError:
            raise MalformedInputError(f"{where}: schema column {name!r} has unknown type {type_name_!r}") from None
    return pa.schema(fields)
