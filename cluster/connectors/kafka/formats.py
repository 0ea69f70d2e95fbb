"""Kafka record values <-> Arrow rows, in Flink's value formats: json, csv, avro, raw, string.

``decode`` never raises for a record: one that does not fit the schema comes back as
{row index: reason}, for the source to send to its side output "malformed". A wrong schema or
options (a configuration mistake, not a record's) raise FormatError, naming what is wrong.

JSON, as Flink's and Spark's JSON formats read it: fields by name, unknown fields ignored, a
missing field or null is null, nested objects to structs, arrays to lists, ISO-8601 strings to
timestamps (an offset or "Z" is converted to UTC), an integer to a floating column; a string
column takes any JSON value (a non-string as its JSON text). How, fast: json_values.py. Avro
records are checked against the schema as parsed JSON is, by name.
"""
from __future__ import annotations

import base64
import csv
import datetime as dt
import decimal
import io
import json
from typing import Any, Callable, Optional

import fastavro
import pyarrow as pa
import pyarrow.compute as pc

from cluster.connectors.kafka.json_values import Unfit, decode_json, decode_records
from cluster.connectors.records import to_table

FORMATS = ("json", "csv", "avro", "raw", "string")
# below this many rows json.dumps writes the values: Arrow's kernels cost some 170 us a table
# whatever its rows, json.dumps 2 us a row (a slow stream's batches are of a row or two)
SMALL_TABLE = 100


class FormatError(ValueError):
    """A format, its options or the schema cannot work together (not one record's fault)."""


def check_format(fmt: str, schema: pa.Schema, options: dict) -> None:
    """Raise FormatError if ``fmt`` cannot read or write rows of ``schema`` with ``options``."""
    if fmt not in FORMATS:
        raise FormatError(f"unknown value format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "csv":
        nested = [f.name for f in schema if pa.types.is_nested(f.type)]
        if nested:
            raise FormatError(f"the csv format holds flat columns only; {nested} are nested: use json or avro")
        delimiter = options.get("delimiter", ",")
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            raise FormatError(f"csv option delimiter must be one character, got {delimiter!r}")
    elif fmt == "avro":
        _avro_schema(options)
    elif fmt in ("raw", "string"):
        want = "binary" if fmt == "raw" else "string"
        kinds = (pa.types.is_binary, pa.types.is_large_binary) if fmt == "raw" else \
            (pa.types.is_string, pa.types.is_large_string)
        if len(schema) != 1 or not any(k(schema[0].type) for k in kinds):
            raise FormatError(f"the {fmt} format reads one {want} column (schema 'value {want}'), got {schema}")


# ---------------------------------------------------------------------- decode
def decode(values: list[Optional[bytes]], fmt: str, schema: pa.Schema,
           options: dict) -> tuple[pa.Table, dict[int, str]]:
    """Record values -> (table of ``schema`` of the records that fit, in order; {row: reason})."""
    check_format(fmt, schema, options)
    if fmt == "raw":
        return pa.Table.from_arrays([pa.array(values, pa.binary()).cast(schema[0].type)], schema=schema), {}
    if fmt == "string":
        return _decode_string(values, schema)
    if fmt == "csv":
        return _decode_csv(values, schema, options.get("delimiter", ","))
    if fmt == "avro":
        return decode_records(values, schema, _avro_reader(_avro_schema(options)))
    return decode_json(values, schema)


def _decode_string(values: list[Optional[bytes]], schema: pa.Schema) -> tuple[pa.Table, dict[int, str]]:
    raw = pa.array(values, pa.binary())
    try:
        return pa.Table.from_arrays([raw.cast(schema[0].type)], schema=schema), {}  # the cast checks UTF-8
    except pa.ArrowInvalid:
        bad: dict[int, str] = {}
        for row, value in enumerate(values):
            try:
                None if value is None else value.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad[row] = f"not valid UTF-8 text ({exc.reason} at byte {exc.start})"
        kept = [v for row, v in enumerate(values) if row not in bad]
        return pa.Table.from_arrays([pa.array(kept, pa.binary()).cast(schema[0].type)], schema=schema), bad


def _decode_csv(values: list[Optional[bytes]], schema: pa.Schema, delimiter: str) -> tuple[pa.Table, dict[int, str]]:
    columns: dict[str, list] = {f.name: [] for f in schema}
    rows: list[int] = []
    bad: dict[int, str] = {}
    for row, value in enumerate(values):
        try:
            if value is None:
                raise Unfit("the record has no value (a tombstone)")
            text = value.decode("utf-8")
            lines = list(csv.reader(io.StringIO(text), delimiter=delimiter, strict=True))
            if len(lines) != 1:
                raise Unfit(f"expected one CSV line, got {len(lines)}")
            if len(lines[0]) != len(schema):
                raise Unfit(f"expected {len(schema)} fields ({', '.join(schema.names)}), got {len(lines[0])}")
        except UnicodeDecodeError as exc:
            bad[row] = f"not valid UTF-8 text ({exc.reason} at byte {exc.start})"
            continue
        except (Unfit, csv.Error) as exc:
            bad[row] = str(exc) if isinstance(exc, Unfit) else f"not a valid CSV line ({exc})"
            continue
        rows.append(row)
        for field, text_value in zip(schema, lines[0]):
            columns[field.name].append(text_value)
    if not rows:
        return schema.empty_table(), bad
    table, unfit = to_table(columns, schema, text=True)  # records.py's parsing, as the file sources do
    bad.update({rows[i]: reason for i, reason in unfit.items()})
    return table, dict(sorted(bad.items()))


# ---------------------------------------------------------------------- avro
def _avro_schema(options: dict) -> Any:
    text = options.get("avro_schema")
    if text is None:
        raise FormatError("the avro format needs format option avro_schema: the Avro schema as JSON text")
    try:
        parsed = fastavro.parse_schema(json.loads(text) if isinstance(text, str) else text)
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise FormatError(f"avro_schema is not a valid Avro schema: {exc}") from None
    if not (isinstance(parsed, dict) and parsed.get("type") == "record"):
        raise FormatError(f"avro_schema must be an Avro record, got {text!r}")
    return parsed


def _avro_reader(parsed: Any) -> Callable[[bytes], dict]:
    def read(value: bytes) -> dict:
        buffer = io.BytesIO(value)
        try:
            record = fastavro.schemaless_reader(buffer, parsed, None)
        except Exception as exc:  # fastavro raises what the bytes make it: EOFError, IndexError, ...
            raise Unfit(f"not valid Avro of the given schema ({type(exc).__name__}: {exc})") from None
        if buffer.tell() != len(value):
            raise Unfit(f"not valid Avro of the given schema ({len(value) - buffer.tell()} bytes left over "
                         "after the record)")
        return record  # type: ignore[return-value]
    return read


# ---------------------------------------------------------------------- encode
def encode(table: pa.Table, fmt: str, options: dict) -> list[bytes]:
    """Each row's record value: json (an object of the row's columns by name), csv, avro
    (options["avro_schema"]), raw or string (the column options.get("column", "value"))."""
    if fmt in ("raw", "string"):
        name = options.get("column", "value")
        if name not in table.column_names:
            raise FormatError(f"the {fmt} format writes column {name!r} (format option column), which is not "
                              f"among {table.column_names}")
        column = table.column(name)
        if column.null_count:
            raise FormatError(f"the {fmt} format cannot write a null {name!r} (row "
                              f"{column.to_pylist().index(None)}): filter or fill the nulls first")
        if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            return column.to_pylist()
        return [str(v).encode("utf-8") for v in column.to_pylist()]
    check_format(fmt, table.schema, options)
    if fmt == "csv":
        return _encode_csv(table, options.get("delimiter", ","))
    if fmt == "json" and table.num_rows >= SMALL_TABLE:
        flat = _encode_flat_json(table)
        if flat is not None:
            return flat
    rows = [{n: _plain(v, table.schema.field(n).type) for n, v in row.items()} for row in table.to_pylist()] \
        if any(_has_map(f.type) for f in table.schema) else table.to_pylist()
    if fmt == "avro":
        parsed = _avro_schema(options)
        out = []
        for row, record in enumerate(rows):
            buffer = io.BytesIO()
            try:
                fastavro.schemaless_writer(buffer, parsed, record)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise FormatError(f"row {row} does not fit the Avro schema: {exc}; the row: {record!r}") from None
            out.append(buffer.getvalue())
        return out
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_json_default).encode
    return [dumps(record).encode("utf-8") for record in rows]


def _encode_flat_json(table: pa.Table) -> Optional[list[bytes]]:
    """The JSON objects of a table of integer, floating, boolean and string columns, built column by
    column by Arrow's kernels: the same values as json.dumps gives of each row (a float as Python
    writes one: shortest round-trip digits, ".0" on a whole number), some ten times faster, which a
    sink writing every row of a stream needs. None when a column is of another type, or holds what
    json.dumps writes otherwise (NaN, infinities, control characters in a string)."""
    if not table.num_columns or not table.num_rows:
        return None
    parts: list[Any] = []
    for n, (name, column) in enumerate(zip(table.column_names, table.columns)):
        t = column.type
        if pa.types.is_integer(t) or pa.types.is_boolean(t):
            text = pc.cast(column, pa.string())
        elif t == pa.float64():  # a narrower float: Python writes the double it widens to, Arrow its own digits
            if pc.any(pc.invert(pc.is_finite(column))).as_py():
                return None
            text = pc.cast(column, pa.string())
            whole = pc.match_substring_regex(text, r"^-?\d+$")
            text = pc.if_else(whole, pc.binary_join_element_wise(text, ".0", ""), text)
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            if pc.any(pc.match_substring_regex(column, "[\x00-\x1f]")).as_py():
                return None
            escaped = pc.replace_substring(pc.replace_substring(column, "\\", "\\\\"), '"', '\\"')
            text = pc.binary_join_element_wise('"', escaped, '"', "")
        else:
            return None
        parts += [("{" if n == 0 else ",") + json.dumps(name, ensure_ascii=False) + ":", pc.fill_null(text, "null")]
    joined = pc.binary_join_element_wise(*parts, "}", "")
    return pc.cast(joined, pa.binary()).to_pylist()


def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_map(f.type) for f in t)
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and _has_map(t.value_type)


def _plain(value: Any, t: pa.DataType) -> Any:
    """A row value with its maps as dicts (Arrow gives a map as a list of pairs)."""
    if value is None:
        return None
    if pa.types.is_map(t):
        return {k: _plain(v, t.item_type) for k, v in value}
    if pa.types.is_struct(t):
        return {f.name: _plain(value.get(f.name), f.type) for f in t}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_plain(v, t.value_type) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()  # what the JSON reader parses back (an offset is kept)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")  # the reader takes a string into binary as its UTF-8 bytes
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    if isinstance(value, decimal.Decimal):
        return float(value)
    raise TypeError(f"a {type(value).__name__} has no JSON form: {value!r}")


def _encode_csv(table: pa.Table, delimiter: str) -> list[bytes]:
    columns = []
    for column in table.columns:
        if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            texts = [None if v is None else v.decode("utf-8", errors="replace") for v in column.to_pylist()]
        else:
            texts = pc.cast(column, pa.string()).to_pylist()  # what records.to_table parses back
        columns.append(texts)
    special = (delimiter, '"', "\n", "\r")

    def field(text: Optional[str]) -> str:
        if text is None:
            return ""
        return '"' + text.replace('"', '""') + '"' if any(c in text for c in special) else text
    return [delimiter.join(field(col[row]) for col in columns).encode("utf-8") for row in range(table.num_rows)]
