"""What the file and Redis sources share: turning raw records into typed Arrow tables, and
reporting the records that do not fit (malformed) instead of dropping them.

A record that does not fit fails the job, naming the operator, where the record is and why,
unless the job reads the operator's side output "malformed": then it goes there as one row of
MALFORMED_SCHEMA. Either way no input record silently vanishes.
"""
from __future__ import annotations

import json
from typing import Optional

import pyarrow as pa

from cluster.graph.schema import MalformedInputError

MALFORMED = "malformed"

# One schema for every source, so the side outputs of several sources can be united.
MALFORMED_SCHEMA = pa.schema([
    ("source", pa.string()),    # file path or stream key
    ("position", pa.string()),  # line number (files) or entry id (Redis), as text
    ("raw", pa.string()),       # the record as it was read
    ("reason", pa.string()),
])

_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError, TypeError,
                 OverflowError)


def schema_to_bytes(schema: Optional[pa.Schema]) -> Optional[bytes]:
    """A schema as plain data, for positions (an inferred schema must survive a restore)."""
    return None if schema is None else schema.serialize().to_pybytes()


def schema_from_bytes(data: Optional[bytes]) -> Optional[pa.Schema]:
    return None if data is None else pa.ipc.read_schema(pa.py_buffer(data))


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _parse(strings: pa.Array, target: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(target) and target.unit != "ns":
        # Arrow parses "…:20.000000" as timestamp[ns] only; the safe cast then refuses real loss of precision
        return strings.cast(pa.timestamp("ns", target.tz)).cast(target)
    return strings.cast(target)


def _from_text(values: list, target: pa.DataType) -> pa.Array:
    if pa.types.is_string(target) or pa.types.is_large_string(target):
        return pa.array(values, pa.string()).cast(target)
    # an empty field is a missing value, as in every CSV reader
    return _parse(pa.array([None if v == "" else v for v in values], pa.string()), target)


def _from_json(values: list, target: pa.DataType) -> pa.Array:
    # pa.array(values, type=int64) would truncate 1.5 to 1 silently: infer, check, then cast safely
    array = pa.array(values)
    source = array.type
    fits = (pa.types.is_null(source) or source == target
            or (_is_number(source) and _is_number(target))
            or (pa.types.is_string(source) and pa.types.is_temporal(target)))
    if not fits:
        raise TypeError(f"expected {target}, got {_json_type(values)}")
    return _parse(array, target) if pa.types.is_string(source) else array.cast(target)


def _json_type(values: list) -> str:
    kinds = {type(v).__name__ for v in values if v is not None}
    names = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean",
             "dict": "an object", "list": "an array"}
    return " or ".join(sorted(names.get(k, k) for k in kinds))


def _reason(name: str, value, target: pa.DataType, exc: Exception) -> str:
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"column {name!r}: {value!r} is not a valid {target} ({detail})"


def _column(convert, values: list, target: pa.DataType) -> pa.Array:
    try:
        return convert(values, target)
    except _ARROW_ERRORS:  # every value fits alone, not all at once (Arrow cannot infer mixed JSON types)
        return pa.concat_arrays([convert([v], target) for v in values])


def to_table(columns: dict[str, list], schema: pa.Schema, text: bool) -> tuple[pa.Table, dict[int, str]]:
    """Rows as columns of Python values -> (table of the rows that fit ``schema``, {row: reason}).

    ``text``: the values are strings to parse (CSV fields, Redis values); else JSON values,
    which must already have a fitting type. The fast path converts whole columns; only a column
    that fails is converted value by value, to find which rows are malformed and why."""
    convert = _from_text if text else _from_json
    arrays: dict[str, pa.Array] = {}
    bad: dict[int, str] = {}
    for field in schema:
        values = columns[field.name]
        try:
            arrays[field.name] = convert(values, field.type)
        except _ARROW_ERRORS:
            for row, value in enumerate(values):
                if row not in bad:
                    try:
                        convert([value], field.type)
                    except _ARROW_ERRORS as exc:
                        bad[row] = _reason(field.name, value, field.type, exc)
    if bad or len(arrays) < len(schema):
        keep = [row for row in range(len(columns[schema[0].name])) if row not in bad]
        arrays = {f.name: _column(convert, [columns[f.name][row] for row in keep], f.type) for f in schema}
    return pa.Table.from_arrays([arrays[f.name] for f in schema], schema=schema), bad


def infer_schema(columns: dict[str, list], text: bool) -> pa.Schema:
    """The schema of the first records read, when the user gave none: strings for text formats
    (as Spark reads CSV without inferSchema), the JSON values' own types otherwise."""
    if text:
        return pa.schema([(name, pa.string()) for name in columns])
    fields = []
    for name, values in columns.items():
        try:
            t = pa.array(values).type
        except _ARROW_ERRORS:
            t = pa.string()  # mixed types in the first records: let the rows that are not strings be malformed
        fields.append((name, pa.string() if pa.types.is_null(t) else t))
    return pa.schema(fields)


class MalformedRecords:
    """Collects the malformed records of one poll; ``flush`` sends them to the side output.

    Without a reader of the side output the first one fails the job at once, naming the
    operator, where the record is (``unit``: "line" or "entry") and why."""

    def __init__(self, operator, unit: str):
        self.operator = operator
        self.unit = unit
        self.routed = operator.has_side_output(MALFORMED)
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, source: str, position, raw: str, reason: str) -> None:
        if not self.routed:
            shown = raw if len(raw) <= 200 else raw[:200] + "..."
            raise MalformedInputError(
                f"{self.operator.spec.where()}: malformed record in {source}, {self.unit} {position}: "
                f"{reason}; the record: {shown!r}. To keep the job running and route such records "
                f"elsewhere, read stream.get_side_output({MALFORMED!r})")
        self.rows.append((source, str(position), raw, reason))

    def flush(self) -> None:
        if self.rows:
            self.operator.side_output(MALFORMED, pa.Table.from_arrays(
                [pa.array(list(col), pa.string()) for col in zip(*self.rows)], schema=MALFORMED_SCHEMA))
            self.rows = []


def raw_json(fields: dict) -> str:
    return json.dumps(fields, ensure_ascii=False, sort_keys=True)
