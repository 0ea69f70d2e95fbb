"""Schema inference from JSON records (cluster/common/json_schema.py): the inferred DDL parses to the
schema a user would declare, and the records decode under it without an unfit one."""
from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa

from cluster.common.json_schema import infer_ddl, infer_ddl_from_values
from cluster.connectors.kafka.formats import decode
from cluster.graph.schema import parse_schema
from kernel_runtime.api.schema import schema_type_names

RECORDS = [
    {"id": 1, "price": 9.5, "name": "pen", "active": True, "at": "2024-05-01T12:00:00Z",
     "customer": {"name": "ann", "address": {"city": "Oslo"}}, "tags": ["a", "b"], "qty": [1, 2]},
    {"id": 2, "price": 3, "name": "ink", "active": False, "at": "2024-05-01 12:00:01.5+02:00",
     "customer": {"name": "bob", "vip": True}, "tags": [], "qty": [1.5], "note": None},
    {"id": 3, "name": "cap", "at": None, "customer": {"address": {"zip": 1234}}, "code": 7,
     "events": [{"kind": "view"}, {"kind": "buy", "n": 2}]},
    {"id": 4, "price": None, "code": "A-7", "when": "2024-05-01", "odd name": 1, "nothing": None},
]
DECLARED = ("id bigint, price double, name string, active boolean, at timestamp, "
            "customer struct<name:string,address:struct<city:string,zip:bigint>,vip:boolean>, "
            "tags array<string>, qty array<double>, note string, code string, "
            "events array<struct<kind:string,n:bigint>>, when string, `odd name` bigint, nothing string")


def arrow(ddl: str) -> pa.Schema:
    """A DDL string as the client and the TaskManager parse it."""
    schema = parse_schema(schema_type_names(ddl, "test"), "test")
    assert schema is not None
    return schema


def test_inferred_equals_declared():
    ddl = infer_ddl(RECORDS)
    assert ddl == DECLARED
    assert arrow(ddl) == arrow(DECLARED)
    assert arrow(ddl).field("customer").type == pa.struct([
        ("name", pa.string()), ("address", pa.struct([("city", pa.string()), ("zip", pa.int64())])),
        ("vip", pa.bool_())])
    assert arrow(ddl).field("at").type == pa.timestamp("us")


def test_every_sampled_record_fits_the_inferred_schema():
    values = [json.dumps(r).encode() for r in RECORDS]
    ddl, used = infer_ddl_from_values(values)
    table, unfit = decode(values, "json", arrow(ddl), {})
    assert unfit == {}
    assert table.column("at").to_pylist() == [dt.datetime(2024, 5, 1, 12), dt.datetime(2024, 5, 1, 10, 0, 1, 500000),
                                              None, None]
    assert table.column("code").to_pylist() == [None, None, "7", "A-7"]  # conflicting: its text
    assert table.column("price").to_pylist() == [9.5, 3.0, None, None]
    assert table.column("customer").to_pylist()[2] == {"name": None, "address": {"city": None, "zip": 1234},
                                                      "vip": None}


def test_widening_and_conflicts():
    assert infer_ddl([{"a": 1}, {"a": 2.5}]) == "a double"
    assert infer_ddl([{"a": 1}, {"a": "x"}]) == "a string"
    assert infer_ddl([{"a": True}, {"a": 1}]) == "a string"
    assert infer_ddl([{"a": {"b": 1}}, {"a": [1]}]) == "a string"
    assert infer_ddl([{"a": "2024-01-01T00:00:00"}, {"a": "soon"}]) == "a string"
    assert infer_ddl([{"a": "2024-13-01T00:00:00"}]) == "a string"  # not a date
    assert infer_ddl([{"a": [1, 2.0]}, {"a": [None]}]) == "a array<double>"
    assert infer_ddl([{"a": [[1], ["x"]]}]) == "a array<array<string>>"
    assert infer_ddl([{"a": None}, {"a": []}, {"a": {}}]) == "a string"
    assert infer_ddl([{"a": 2 ** 70}]) == "a double"
    assert infer_ddl([{"a.b": 1, "x y": 2, "bad,name": 3, "`q`": 4, "ok_1": 5}]) == \
        "`a.b` bigint, `x y` bigint, ok_1 bigint"  # names DDL cannot hold are left out
    assert infer_ddl([[1], "text", None]) == ""


def test_from_values_skips_what_is_not_a_json_object():
    values = [b'{"a": 1}', b"not json", b"[1]", b"\xff", None, b'{"b": "x"}']
    ddl, used = infer_ddl_from_values(values)  # type: ignore[arg-type]
    assert (ddl, used) == ("a bigint, b string", 2)
    assert infer_ddl_from_values([]) == ("", 0)
