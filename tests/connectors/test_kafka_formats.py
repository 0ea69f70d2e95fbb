"""Kafka value formats (cluster/connectors/kafka/formats.py): round trips and unfit records, no broker."""
from __future__ import annotations

import datetime as dt
import io
import json

import fastavro
import pyarrow as pa
import pytest

from cluster.connectors.kafka.formats import SMALL_TABLE, FormatError, decode, encode
from cluster.connectors.kafka.json_values import SMALL_BATCH, decode_json, read_batch

TS = pa.timestamp("us")
SCHEMA = pa.schema([
    ("id", pa.int64()), ("user", pa.string()), ("amount", pa.float64()), ("ok", pa.bool_()), ("at", TS),
])
ROWS = pa.table({
    "id": [1, 2, 3],
    "user": ["ann", "bob, \"the\" builder", "zoë"],
    "amount": [1.5, -2.25, 0.1],
    "ok": [True, False, None],
    "at": pa.array([dt.datetime(2024, 5, 1, 12, 0, 0, 123456), dt.datetime(2024, 5, 1, 12, 0, 1), None], TS),
}, schema=SCHEMA)
NESTED = pa.schema([
    ("id", pa.int64()),
    ("customer", pa.struct([("name", pa.string()), ("tags", pa.list_(pa.string())),
                            ("address", pa.struct([("zip", pa.int32()), ("city", pa.string())]))])),
    ("scores", pa.list_(pa.float64())),
    ("at", TS),
])
NESTED_ROWS = pa.Table.from_pylist([
    {"id": 1, "customer": {"name": "ann", "tags": ["a", "b"], "address": {"zip": 1000, "city": "Oslo"}},
     "scores": [1.0, 2.5], "at": dt.datetime(2024, 1, 1)},
    {"id": 2, "customer": {"name": "bob", "tags": [], "address": None}, "scores": None, "at": None},
    {"id": 3, "customer": None, "scores": [None, 3.0], "at": dt.datetime(2024, 1, 2, 3, 4, 5)},
], schema=NESTED)
AVRO_SCHEMA = json.dumps({"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"},
    {"name": "user", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "ok", "type": ["null", "boolean"]},
    {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
]})


@pytest.mark.parametrize("fmt, options", [("json", {}), ("csv", {}), ("csv", {"delimiter": ";"}),
                                          ("avro", {"avro_schema": AVRO_SCHEMA})])
def test_round_trip(fmt, options):
    values = encode(ROWS, fmt, options)
    assert len(values) == 3 and all(isinstance(v, bytes) for v in values)
    table, unfit = decode(values, fmt, SCHEMA, options)
    assert unfit == {}
    assert table.equals(ROWS)


def test_json_values_are_objects_by_name():
    values = encode(ROWS, "json", {})
    assert json.loads(values[0]) == {"id": 1, "user": "ann", "amount": 1.5, "ok": True,
                                     "at": "2024-05-01T12:00:00.123456"}
    assert json.loads(values[2])["at"] is None


@pytest.fixture(params=["small batch", "batch reader"])
def read_json(request):
    """JSON values read as a small batch is (record by record) and as a large one is (Arrow's
    reader): both give the same rows and reasons."""
    if request.param == "small batch":
        def read(values, schema):
            assert len(values) < SMALL_BATCH
            return decode_json(values, schema)
        return read
    return read_batch


def test_json_nested_round_trip(read_json):
    values = encode(NESTED_ROWS, "json", {})
    assert json.loads(values[0])["customer"] == {"name": "ann", "tags": ["a", "b"],
                                                 "address": {"zip": 1000, "city": "Oslo"}}
    table, unfit = read_json(values, NESTED)
    assert unfit == {}
    assert table.equals(NESTED_ROWS)


def test_json_by_name_missing_unknown_and_timestamps(read_json):
    values = [b'{"at": "2024-01-01T10:00:00Z", "id": 7, "extra": [1, {"x": 2}]}',
              b'{"id": 8, "amount": 3, "at": "2024-01-01T12:00:00+02:00"}',
              b'  {"id": 9, "user": 42, "ok": null}',          # a string column takes a number as its text
              b'{\n  "id": 10,\n  "user": {"a": [1, true]}\n}']  # a record on several lines
    table, unfit = read_json(values, SCHEMA)
    assert unfit == {}
    assert table.to_pylist() == [
        {"id": 7, "user": None, "amount": None, "ok": None, "at": dt.datetime(2024, 1, 1, 10)},
        {"id": 8, "user": None, "amount": 3.0, "ok": None, "at": dt.datetime(2024, 1, 1, 10)},
        {"id": 9, "user": "42", "amount": None, "ok": None, "at": None},
        {"id": 10, "user": '{"a": [1, true]}', "amount": None, "ok": None, "at": None},
    ]


def test_json_unfit_records_with_reasons(read_json):
    good = b'{"id": 1, "user": "ann"}'
    values = [good, b'{"id": 1, "user": ', b'{"id": "two"}', b'[1, 2]', b'null', None, b'{"id": 1.5}',
              b'{"id": 1, "ok": "yes"}', b'{"user": "\xff"}', b'{"id": 1}{"id": 2}', b'{"id": 1, "id": 2}',
              b'{"at": "yesterday"}', b'{"id": 99999999999999999999}', b'', good]
    table, unfit = read_json(values, SCHEMA)
    assert table.column("id").to_pylist() == [1, 1]
    assert table.column("user").to_pylist() == ["ann", "ann"]
    assert unfit == {
        1: "not valid JSON (Expecting value: line 1 column 19 (char 18))",
        2: "field 'id': 'two' (a string) is not a valid int64",
        3: "not a JSON object but an array",
        4: "not a JSON object but null",
        5: "the record has no value (a tombstone)",
        6: "field 'id': 1.5 (a number) is not a valid int64",
        7: "field 'ok': 'yes' (a string) is not a valid bool",
        8: "not valid UTF-8 text (invalid start byte at byte 10)",
        9: "not valid JSON (Extra data: line 1 column 10 (char 9))",
        10: "not valid JSON (field 'id' appears twice)",
        11: "field 'at': 'yesterday' (a string) is not a valid timestamp[us] (Failed to convert JSON to timestamp[us], "
            "couldn't parse:yesterday)",
        12: "field 'id': 99999999999999999999 (an integer) is not a valid int64 (out of "
            "the int64 range)",
        13: "not valid JSON (Expecting value: line 1 column 1 (char 0))",
    }


def test_json_nested_unfit_names_the_path(read_json):
    values = [b'{"id": 1, "customer": {"address": {"zip": "x"}}}', b'{"id": 2, "scores": [1, "a"]}',
              b'{"id": 3, "customer": [1]}', b'{"id": 4, "customer": {"tags": ["t"]}}']
    table, unfit = read_json(values, NESTED)
    assert table.to_pylist() == [{"id": 4, "customer": {"name": None, "tags": ["t"], "address": None},
                                  "scores": None, "at": None}]
    assert unfit == {0: "field 'customer.address.zip': 'x' (a string) is not a valid int32",
                     1: "field 'scores[1]': 'a' (a string) is not a valid double",
                     2: "field 'customer': [1] (an array) is not a valid struct<`name`:string,`tags`:array<string>,"
                        "`address`:struct<`zip`:int32,`city`:string>>"}


def test_json_large_batch_with_few_bad_records_keeps_order():
    """The fast path halves a refused batch; the rows that fit come out in their order."""
    values = [json.dumps({"id": i, "user": f"u{i % 7}", "amount": i / 4}).encode() for i in range(5000)]
    for row in (0, 1234, 4999):
        values[row] = b'{"id": "bad"}'
    values[2500] = b'{"id": 2500, "user": 2500}'  # fits: the reader refuses it, the Python path takes it
    table, unfit = decode(values, "json", SCHEMA, {})
    assert sorted(unfit) == [0, 1234, 4999]
    expected = [i for i in range(5000) if i not in (0, 1234, 4999)]
    assert table.column("id").to_pylist() == expected
    assert table.column("user").to_pylist() == [str(i) if i == 2500 else f"u{i % 7}" for i in expected]
    assert table.column("amount").to_pylist() == [None if i == 2500 else i / 4 for i in expected]


def test_json_map_column_is_read_record_by_record():
    schema = pa.schema([("attrs", pa.map_(pa.string(), pa.int64()))])
    table, unfit = decode([b'{"attrs": {"a": 1, "b": 2}}', b'{"attrs": {"a": "x"}}'], "json", schema, {})
    assert table.column("attrs").to_pylist() == [[("a", 1), ("b", 2)]]
    assert unfit == {1: "field \"attrs['a']\": 'x' (a string) is not a valid int64"}
    assert json.loads(encode(table, "json", {})[0]) == {"attrs": {"a": 1, "b": 2}}


def test_csv_unfit_records():
    values = [b"1,ann,1.5,true,2024-05-01 12:00:00", b"2,bob", b"x,bob,1,true,", b"3,\xffx,1,false,", None,
              b'4,"quoted, name",2,false,']
    table, unfit = decode(values, "csv", SCHEMA, {})
    assert table.column("id").to_pylist() == [1, 4]
    assert table.column("user").to_pylist() == ["ann", "quoted, name"]
    assert table.column("at").to_pylist() == [dt.datetime(2024, 5, 1, 12), None]
    assert unfit[1] == "expected 5 fields (id, user, amount, ok, at), got 2"
    assert unfit[2].startswith("column 'id': 'x' is not a valid int64")
    assert unfit[3] == "not valid UTF-8 text (invalid start byte at byte 2)"
    assert unfit[4] == "the record has no value (a tombstone)"
    assert sorted(unfit) == [1, 2, 3, 4]


def test_avro_unfit_records():
    options = {"avro_schema": AVRO_SCHEMA}
    good = encode(ROWS, "avro", options)[0]
    table, unfit = decode([b"\x02", good, good + b"\x00", b"", None], "avro", SCHEMA, options)
    assert table.to_pylist() == ROWS.slice(0, 1).to_pylist()
    assert unfit[0].startswith("not valid Avro of the given schema (")
    assert unfit[2] == "not valid Avro of the given schema (1 bytes left over after the record)"
    assert unfit[3].startswith("not valid Avro of the given schema (")
    assert unfit[4] == "the record has no value (a tombstone)"
    assert sorted(unfit) == [0, 2, 3, 4]


def test_avro_reads_what_fastavro_writes_by_name():
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "n", "type": "int"}, {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema),
                               {"n": 5, "tags": ["x"], "at": dt.datetime(2024, 1, 1, 1, tzinfo=dt.timezone.utc)})
    target = pa.schema([("at", pa.timestamp("ms")), ("tags", pa.list_(pa.string())), ("n", pa.int64()),
                        ("missing", pa.string())])
    table, unfit = decode([buffer.getvalue()], "avro", target, {"avro_schema": json.dumps(schema)})
    assert unfit == {}
    assert table.to_pylist() == [{"at": dt.datetime(2024, 1, 1, 1), "tags": ["x"], "n": 5, "missing": None}]


def test_raw_and_string():
    raw_schema = pa.schema([("value", pa.binary())])
    table, unfit = decode([b"\x00\xff", None, b""], "raw", raw_schema, {})
    assert unfit == {} and table.column("value").to_pylist() == [b"\x00\xff", None, b""]
    assert encode(table.slice(0, 1), "raw", {}) == [b"\x00\xff"]

    string_schema = pa.schema([("value", pa.string())])
    table, unfit = decode(["zoë".encode(), b"ok\xff", None, b"b"], "string", string_schema, {})
    assert table.column("value").to_pylist() == ["zoë", None, "b"]
    assert unfit == {1: "not valid UTF-8 text (invalid start byte at byte 2)"}
    assert encode(pa.table({"line": ["zoë", "b"]}), "string", {"column": "line"}) == ["zoë".encode(), b"b"]
    values = encode(pa.table({"value": ["a", "zoë"]}), "string", {})
    assert decode(values, "string", string_schema, {})[0].column("value").to_pylist() == ["a", "zoë"]


def test_configuration_mistakes_raise_clearly():
    with pytest.raises(FormatError, match="unknown value format 'xml'"):
        decode([b"x"], "xml", SCHEMA, {})
    with pytest.raises(FormatError, match="the raw format reads one binary column"):
        decode([b"x"], "raw", SCHEMA, {})
    with pytest.raises(FormatError, match="needs format option avro_schema"):
        decode([b"x"], "avro", SCHEMA, {})
    with pytest.raises(FormatError, match="avro_schema is not a valid Avro schema"):
        decode([b"x"], "avro", SCHEMA, {"avro_schema": '{"type": "recrd"}'})
    with pytest.raises(FormatError, match=r"flat columns only; \['customer', 'scores'\] are nested"):
        encode(NESTED_ROWS, "csv", {})
    with pytest.raises(FormatError, match="writes column 'value'"):
        encode(ROWS, "raw", {})
    with pytest.raises(FormatError, match="cannot write a null 'value' \\(row 1\\)"):
        encode(pa.table({"value": ["a", None]}), "string", {})
    with pytest.raises(FormatError, match="row 0 does not fit the Avro schema"):
        encode(pa.table({"id": ["not a long"]}), "avro", {"avro_schema": AVRO_SCHEMA})


def test_fast_reader_and_record_by_record_path_agree():
    """The batch reader is only a faster way to the record-by-record result."""
    from cluster.connectors.kafka.json_values import decode_records, json_object, read_batch
    values = encode(NESTED_ROWS, "json", {}) + [
        b'{"id": 5, "scores": [1, 2], "at": "2024-01-01T10:00:00Z"}',
        b'{"id": 6, "at": "2024-01-01 10:00:00.5+02:00", "customer": {"address": {"zip": 7, "extra": 1}}}',
        b'{"id": 7, "at": "2024-01-01T10:00", "customer": {"name": "\\u00e9"}}',
        b'{"id": 8, "at": "2024-01-01"}',
    ]
    fast, unfit = read_batch(values, NESTED)
    slow, slow_unfit = decode_records(values, NESTED, json_object)
    assert unfit == slow_unfit == {}
    assert fast.equals(slow)
    assert fast.column("at").to_pylist()[3:] == [dt.datetime(2024, 1, 1, 10), dt.datetime(2024, 1, 1, 8, 0, 0, 500000),
                                                 dt.datetime(2024, 1, 1, 10), dt.datetime(2024, 1, 1)]


def test_json_of_flat_columns_is_built_by_arrow_with_the_values_json_dumps_gives():
    from cluster.connectors.kafka.formats import _encode_flat_json
    flat = pa.table({"s": ["a\"b\\c", None, "zoë", "\u2028", ""], "f": [2.0, None, -0.0, 1e-5, 0.1 + 0.2],
                     "b": [True, None, False, True, False], "i": pa.array([1, None, -3, 2**62, 0], pa.int64()),
                     "we\"ird": pa.array([1, 2, 3, 4, 5], pa.int8())})
    fast = _encode_flat_json(flat)
    assert fast is not None
    # a small table is written by json.dumps: the same values (Arrow writes 1e-05 as 0.00001)
    assert [json.loads(v) for v in fast] == [json.loads(v) for v in encode(flat, "json", {})] == flat.to_pylist()
    many = pa.concat_tables([flat] * (SMALL_TABLE // flat.num_rows + 1))
    assert encode(many, "json", {}) == _encode_flat_json(many)  # a large one by Arrow's kernels
    assert fast[0] == b'{"s":"a\\"b\\\\c","f":2.0,"b":true,"i":1,"we\\"ird":1}'  # whole floats keep their ".0"
    table, unfit = decode(fast, "json", flat.schema, {})
    assert unfit == {} and table.equals(flat)
    # what json.dumps writes otherwise, and other types, take the row by row path
    for other in ({"s": ["a\nb"]}, {"f": [float("nan")]}, {"f": pa.array([0.1], pa.float32())}, {"at": ROWS["at"]}):
        assert _encode_flat_json(pa.table(other)) is None
    assert json.loads(encode(pa.table({"s": ["a\nb"]}), "json", {})[0]) == {"s": "a\nb"}
