"""A Spark DDL schema inferred from sampled JSON records (a KafkaSource.json without a schema).

Types are widened over the sample as Spark's JSON schema inference does: bigint and double meet
at double, a field whose values disagree otherwise (a string and a number, an object and an
array) is a string, as is a field that is null or missing everywhere. A string field is a
timestamp only if every non-null value of it is an ISO-8601 date-time (what the JSON decoder
parses into a timestamp column, "Z" or an offset included). Objects become structs whose fields
are merged over the sample, arrays arrays of their widened elements. Columns and struct fields
keep the order in which they were first seen. Every column is nullable, so a field missing from
some records is still typed from the others.

A name that DDL's parsers cannot hold even backquoted (one with a backquote, a comma, <, >, ( or
), or the empty name) is left out: its values are then ignored as unknown fields.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from typing import Optional, Union

# An inferred type: a Spark simple type name, ("struct", {name: type}), ("array", element type),
# or None while only nulls (or empty arrays) were seen.
Inferred = Union[None, str, tuple]

_INT64 = (-(1 << 63), (1 << 63) - 1)
# a date and a time of day at least to the minute; up to microseconds, as the timestamp columns keep
_ISO_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?")
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UNSAYABLE = set("`,<>()")


def is_iso_timestamp(text: str) -> bool:
    if _ISO_TIMESTAMP.fullmatch(text) is None:
        return False
    try:
        dt.datetime.fromisoformat(text)  # a real calendar date and time of day
    except ValueError:
        return False
    return True


def _type_of(value: object) -> Inferred:
    if value is None:
        return None
    if isinstance(value, bool):  # before int: a bool is an int in Python
        return "boolean"
    if isinstance(value, int):
        return "bigint" if _INT64[0] <= value <= _INT64[1] else "double"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "timestamp" if is_iso_timestamp(value) else "string"
    if isinstance(value, dict):
        fields: dict[str, Inferred] = {}
        for name, item in value.items():
            if _sayable(name):
                fields[name] = _merge(fields.get(name), _type_of(item))
        return ("struct", fields)
    if isinstance(value, list):
        element: Inferred = None
        for item in value:
            element = _merge(element, _type_of(item))
        return ("array", element)
    return "string"


def _merge(a: Inferred, b: Inferred) -> Inferred:
    if a is None:
        return b
    if b is None or a == b:
        return a
    if isinstance(a, str) and isinstance(b, str):
        return "double" if {a, b} == {"bigint", "double"} else "string"
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0]:
        if a[0] == "array":
            return ("array", _merge(a[1], b[1]))
        fields = dict(a[1])
        for name, t in b[1].items():
            fields[name] = _merge(fields.get(name), t)
        return ("struct", fields)
    return "string"  # a conflict (also timestamp and string: not every value is a timestamp)


def _sayable(name: object) -> bool:
    return isinstance(name, str) and bool(name) and not (_UNSAYABLE & set(name))


def _name(name: str) -> str:
    return name if _PLAIN_NAME.fullmatch(name) else f"`{name}`"


def _ddl_type(t: Inferred) -> str:
    if t is None:
        return "string"
    if isinstance(t, str):
        return t
    if t[0] == "array":
        return f"array<{_ddl_type(t[1])}>"
    if not t[1]:
        return "string"  # only empty objects were seen: no struct without fields in Spark DDL
    return "struct<" + ",".join(f"{_name(n)}:{_ddl_type(f)}" for n, f in t[1].items()) + ">"


def infer_ddl(records: list[object]) -> str:
    """The Spark DDL ("a bigint, b struct<c:string>") of the JSON objects among ``records``
    (parsed values; anything but an object is skipped); "" if they hold no field."""
    columns: dict[str, Inferred] = {}
    for record in records:
        if isinstance(record, dict):
            for name, value in record.items():
                if _sayable(name):
                    columns[name] = _merge(columns.get(name), _type_of(value))
    return ", ".join(f"{_name(name)} {_ddl_type(t)}" for name, t in columns.items())


def infer_ddl_from_values(values: list[bytes]) -> tuple[str, int]:
    """(DDL of the JSON objects among record ``values``, how many of the values were used): a value
    that is not a JSON object (not JSON, not UTF-8, null, an array) is skipped."""
    records: list[object] = []
    for value in values:
        record = _parsed(value)
        if record is not None:
            records.append(record)
    return infer_ddl(records), len(records)


def _parsed(value: Optional[bytes]) -> Optional[dict]:
    if value is None:
        return None
    try:
        record = json.loads(value)
    except ValueError:  # UnicodeDecodeError is one
        return None
    return record if isinstance(record, dict) else None
