"""Record values read into typed rows: the JSON format's batch reader, and the record-by-record
check and conversion of parsed values (JSON's, Avro's) against an Arrow schema (see formats.py).

The record-by-record path is the definition: a value fits its column or the record is unfit,
with a reason naming the field (its path: ``customer.address.zip``, ``scores[1]``) and the value.
The fast path is Arrow's JSON reader over a whole batch. It refuses a batch for one record that
does not fit; the batch is then read again in chunks, and a refused chunk halved, until the
records it refuses are found and read one by one. The reader is never given what it mishandles:
tombstones, values not starting with "{" (a ``null`` line crashes it), values with a line break
(it would split them). It takes only what the Python path takes, converting it alike; a string
column takes any JSON value as its text (as Flink's JSON format does), which only the Python
path does, so such records are read there.
"""
from __future__ import annotations

import datetime as dt
import functools
import io
import json
import re
from typing import Any, Callable, Optional

import pyarrow as pa
import pyarrow.json as pj

from cluster.graph.schema import type_name

_LEAF = 32  # below this many records a refused batch is read record by record: cheaper than halving on
_CHUNK = 1024  # a refused batch is read again in chunks of this size, to keep the chunks that fit
_BLOCK = 1 << 22  # Arrow's JSON reader parses blocks of this size in parallel
# below this many records a batch is read record by record: the reader's fixed cost (some 300 us a
# call, whatever the batch) is what the Python path takes for 60 records (5 us each); a slow
# stream's batches of a record or two spent most of their latency there (bench/kafka.py at 1,000/s)
SMALL_BATCH = 64
# the ISO-8601 forms Arrow's reader and Python's fromisoformat both take; group 1: the fraction
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}(?::\d{2}(?::\d{2}(\.\d+)?)?)?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?")
_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError, TypeError,
                 OverflowError)


class Unfit(Exception):
    """One record does not fit the schema; the message is the reason."""


def decode_json(values: list[Optional[bytes]], schema: pa.Schema) -> tuple[pa.Table, dict[int, str]]:
    """JSON object values -> (table of ``schema`` of those that fit, in order; {row: reason})."""
    if len(values) < SMALL_BATCH:
        return decode_records(values, schema, json_object)
    return read_batch(values, schema)


def read_batch(values: list[Optional[bytes]], schema: pa.Schema) -> tuple[pa.Table, dict[int, str]]:
    """decode_json by Arrow's reader where it may read the records (any number of them)."""
    fast = _reader_types(schema)
    pieces: list[pa.Table] = []
    bad: dict[int, str] = {}

    def one_by_one(start: int, stop: int) -> None:
        table, unfit = decode_records(values[start:stop], schema, json_object)
        pieces.append(table)
        bad.update({start + i: reason for i, reason in unfit.items()})

    def settle(start: int, stop: int) -> None:
        """[start, stop) was refused as a whole: find the records the reader refuses."""
        middle = (start + stop) // 2
        halves = [] if stop - start <= _LEAF else \
            [(_read_json(values[start:middle], schema), start, middle), (_read_json(values[middle:stop], schema),
                                                                          middle, stop)]
        if not halves or all(table is None for table, _, _ in halves):  # few, or dense: halving on costs more
            one_by_one(start, stop)
            return
        for table, low, high in halves:
            if table is None:
                settle(low, high)
            else:
                pieces.append(table)

    def read(start: int, stop: int) -> None:
        table = _read_json(values[start:stop], schema)
        if table is not None:
            pieces.append(table)
        elif stop - start <= _CHUNK:
            settle(start, stop)
        else:
            for low in range(start, stop, _CHUNK):
                read(low, min(stop, low + _CHUNK))

    if fast and _all_readable(values):  # the usual batch, checked without a Python step per record
        read(0, len(values))
        return pa.concat_tables(pieces) if pieces else schema.empty_table(), bad
    # runs of records the reader may see, and of those it must not, kept in order
    start = 0
    while start < len(values):
        readable = fast and _readable(values[start])
        stop = start + 1
        while stop < len(values) and (fast and _readable(values[stop])) == readable:
            stop += 1
        (read if readable else one_by_one)(start, stop)
        start = stop
    table = pa.concat_tables(pieces) if pieces else schema.empty_table()
    return table, bad


def _reader_types(schema: pa.Schema) -> bool:
    """Whether Arrow's JSON reader converts every column as the record-by-record path does
    (it cannot read maps, and reads dates and decimals otherwise)."""
    def ok(t: pa.DataType) -> bool:
        if pa.types.is_struct(t):
            return all(ok(f.type) for f in t)
        if pa.types.is_list(t):
            return ok(t.value_type)
        # the reader refuses a non-string in a string column: that batch is halved, and the record
        # read by the Python path, which takes its JSON text
        return (pa.types.is_boolean(t) or pa.types.is_integer(t) or t in (pa.float32(), pa.float64())
                or pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_timestamp(t))
    return all(ok(f.type) for f in schema)


def _readable(value: Optional[bytes]) -> bool:
    # a JSON `null` line crashes Arrow's reader; a line break would split a record in two
    return value is not None and value[:1] == b"{" and b"\n" not in value and b"\r" not in value


def _all_readable(values: list[Optional[bytes]]) -> bool:
    """Whether every value is _readable: found in the values joined by line breaks, which then
    hold one line break per gap and each followed by "{" (a byte count in C, not a step per value:
    the per-value check cost more than the reader itself)."""
    if not values or None in values:
        return False
    data = b"\n".join(values)  # type: ignore[arg-type]  # no None, checked above
    gaps = len(values) - 1
    return data[:1] == b"{" and data.count(b"\n") == gaps and data.count(b"\n{") == gaps and b"\r" not in data


def _read_json(values: list[Optional[bytes]], schema: pa.Schema) -> Optional[pa.Table]:
    """The records as a table by Arrow's JSON reader, or None if it refuses any of them."""
    data = b"\n".join(values)  # type: ignore[arg-type]  # only readable values get here
    try:
        data.decode("utf-8")  # the reader does not check the text of fields it skips
        block = max(_BLOCK, max(len(v) for v in values if v is not None) + 2)  # a record fits in a block
        table = pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(block_size=block),
                             parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"))
        table.validate(full=True)
    except (UnicodeDecodeError, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.num_rows != len(values):  # '{..}{..}' is two rows: its record is malformed
        return None
    return table.select(schema.names).cast(schema)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    result = dict(pairs)
    if len(result) != len(pairs):  # Arrow's reader refuses it too; Python's json would keep the last
        names = [k for k, _ in pairs]
        raise ValueError(f"field {next(k for k in names if names.count(k) > 1)!r} appears twice")
    return result


def json_object(value: bytes) -> dict:
    try:
        record = json.loads(value, object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as exc:
        raise Unfit(f"not valid UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:
        raise Unfit(f"not valid JSON ({exc})") from None
    if not isinstance(record, dict):
        raise Unfit(f"not a JSON object but {_kind(record)}")
    return record


def decode_records(values: list[Optional[bytes]], schema: pa.Schema,
                   parse: Callable[[bytes], dict]) -> tuple[pa.Table, dict[int, str]]:
    """Record by record: each value parsed to a dict, each field checked and converted."""
    converters = _converters(schema)
    rows: list[tuple] = []
    bad: dict[int, str] = {}
    for row, value in enumerate(values):
        try:
            if value is None:
                raise Unfit("the record has no value (a tombstone)")
            record = parse(value)
            converted = []
            for name, convert in converters:
                item = record.get(name)
                try:
                    converted.append(None if item is None else convert(item))
                except _Mismatch as exc:
                    raise Unfit(exc.reason(name)) from None
        except Unfit as exc:
            bad[row] = str(exc)
            continue
        rows.append(tuple(converted))
    # the rows as one struct array: one conversion for the batch, not one per column (a slow stream's
    # batch of a record or two: 10 us, not 26); the struct is made from this schema, not cached with
    # the converters, whose cache takes schemas that differ only in their fields' metadata for one
    table = pa.Table.from_struct_array(pa.array(rows, pa.struct(schema)))
    return (table.replace_schema_metadata(schema.metadata) if schema.metadata else table), bad


@functools.lru_cache(maxsize=64)
def _converters(schema: pa.Schema) -> list[tuple[str, Convert]]:
    """Each field's converter, made once per schema (a slow stream reads a batch per record)."""
    return [(f.name, _converter(f.type)) for f in schema]


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: "an object",
             list: "an array", bytes: "bytes", type(None): "null"}
    return names.get(type(value), type(value).__name__)


class _Mismatch(Exception):
    """A value that does not fit its type; the containers on the way up add where it is."""

    def __init__(self, value: Any, t: pa.DataType, detail: str = ""):
        super().__init__()
        self.value, self.type, self.detail = value, t, detail
        self.path: list[str] = []

    def within(self, part: str) -> _Mismatch:
        self.path.insert(0, part)
        return self

    def reason(self, column: str) -> str:
        shown = repr(self.value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return (f"field {column + ''.join(self.path)!r}: {shown} ({_kind(self.value)}) is not a valid "
                f"{type_name(self.type)}" + (f" ({self.detail})" if self.detail else ""))


Convert = Callable[[Any], Any]


def _converter(t: pa.DataType) -> Convert:
    """A function from a parsed non-null value to the Python value Arrow builds ``t`` from; it
    raises _Mismatch if the value does not fit. Made once per batch: per value it only checks."""
    if pa.types.is_struct(t):
        fields = [(f.name, _converter(f.type)) for f in t]

        def struct(value: Any) -> Any:
            if not isinstance(value, dict):
                raise _Mismatch(value, t)
            out = {}
            for name, convert in fields:
                item = value.get(name)
                try:
                    out[name] = None if item is None else convert(item)
                except _Mismatch as exc:
                    raise exc.within(f".{name}") from None
            return out
        return struct
    if pa.types.is_map(t):
        key, item = _converter(t.key_type), _converter(t.item_type)

        def mapping(value: Any) -> Any:
            if not isinstance(value, dict):
                raise _Mismatch(value, t)
            try:
                return [(key(k), None if v is None else item(v)) for k, v in value.items()]
            except _Mismatch as exc:
                bad = next(k for k, v in value.items() if not _fits(key, k) or not _fits(item, v))
                raise exc.within(f"[{bad!r}]") from None
        return mapping
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        element = _converter(t.value_type)

        def sequence(value: Any) -> Any:
            if not isinstance(value, list):
                raise _Mismatch(value, t)
            try:
                return [None if v is None else element(v) for v in value]
            except _Mismatch as exc:
                raise exc.within(f"[{next(i for i, v in enumerate(value) if not _fits(element, v))}]") from None
        return sequence
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _text
    if pa.types.is_boolean(t):
        return _checked(t, lambda v: type(v) is bool)
    if pa.types.is_integer(t):
        bits = t.bit_width - pa.types.is_signed_integer(t)
        low, high = (-(1 << bits), (1 << bits) - 1) if pa.types.is_signed_integer(t) else (0, (1 << bits) - 1)

        def integer(value: Any) -> Any:
            if type(value) is not int:  # Arrow would truncate 1.5 to 1, and take True as 1
                raise _Mismatch(value, t)
            if not low <= value <= high:
                raise _Mismatch(value, t, f"out of the {t} range")
            return value
        return integer
    if pa.types.is_floating(t):
        return _checked(t, lambda v: type(v) in (int, float))
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        def binary(value: Any) -> Any:
            if isinstance(value, str):
                return value.encode("utf-8")  # as Arrow's reader takes a string into binary
            if not isinstance(value, bytes):
                raise _Mismatch(value, t)
            return value
        return binary
    if pa.types.is_timestamp(t):
        return _parsed(t, dt.datetime, lambda text: _timestamp(text, t))
    if pa.types.is_date(t):
        return _parsed(t, dt.date, lambda text: pa.array([text]).cast(t)[0].as_py())

    def other(value: Any) -> Any:
        try:
            return pa.scalar(value, t).as_py()
        except _ARROW_ERRORS as exc:
            raise _Mismatch(value, t, str(exc).splitlines()[0] if str(exc) else "") from None
    return other


def _fits(convert: Convert, value: Any) -> bool:
    """Only on the way to a reason: which element did not fit."""
    try:
        None if value is None else convert(value)
    except _Mismatch:
        return False
    return True


def _checked(t: pa.DataType, fits: Callable[[Any], bool]) -> Convert:
    def check(value: Any) -> Any:
        if not fits(value):
            raise _Mismatch(value, t)
        return value
    return check


def _parsed(t: pa.DataType, kind: type, parse: Callable[[str], Any]) -> Convert:
    """A converter to a time type, from its Python value (Avro's) or its ISO-8601 text (JSON's)."""
    def convert(value: Any) -> Any:
        if isinstance(value, kind):
            return value
        if not isinstance(value, str):
            raise _Mismatch(value, t)
        try:
            return parse(value)
        except _ARROW_ERRORS as exc:
            raise _Mismatch(value, t, str(exc).splitlines()[0] if str(exc) else "") from None
    return convert


def _text(value: Any) -> str:
    """A string column takes any value: a non-string as its JSON text, as Flink's JSON format does."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate escape, "\ud800"
            raise _Mismatch(value, pa.string(), str(exc)) from None
    return text


def _timestamp(text: str, t: pa.TimestampType) -> Any:
    """An ISO-8601 string as the fast path's reader parses it (a cast would refuse "Z" and offsets)."""
    match = _ISO.fullmatch(text)
    digits = {"s": 0, "ms": 3, "us": 6}.get(t.unit)
    if match is not None and digits is not None and len(match.group(1) or ".") - 1 <= digits:
        try:
            value = dt.datetime.fromisoformat(text)  # the common forms, without a reader per value
        except ValueError:
            pass  # Arrow decides
        else:
            if value.tzinfo is not None and t.tz is None:
                value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
            return value
    return pj.read_json(io.BytesIO(json.dumps({"v": text}).encode()), parse_options=pj.ParseOptions(
        explicit_schema=pa.schema([("v", t)]))).column(0)[0].as_py()
