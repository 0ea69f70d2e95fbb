"""Redis Streams source and sink driven directly against a real redis-server."""
from __future__ import annotations

import re

import pyarrow as pa
import pytest
import redis

from cluster.graph.schema import MalformedInputError
from kernel_runtime.api.connectors import RedisStreamSink, RedisStreamSource

from .harness import WHERE, Driven, free_port, rows

SCHEMA = {"user": "string", "amount": "int64"}


@pytest.fixture
def r(redis_url):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def fill(r, key: str, n: int, start: int = 0) -> list[str]:
    return [r.xadd(key, {"user": f"u{i % 3}", "amount": str(i)}) for i in range(start, start + n)]


def test_bounded_read_stops_at_the_last_entry_at_start_and_splits_streams(r, redis_url):
    fill(r, "a", 5)
    fill(r, "b", 3, start=100)
    connector = RedisStreamSource(redis_url, ["a", "b", "c"], schema=SCHEMA, bounded=True, batch_size=2)
    subtasks = [Driven(connector, subtask=i, parallelism=2) for i in range(2)]
    assert [s.op.streams for s in subtasks] == [["a", "c"], ["b"]]
    fill(r, "a", 2, start=50)  # added after the start: not part of this bounded read
    tables = [s.drain() for s in subtasks]
    assert [t.num_rows for t in tables[0]] == [2, 2, 1]
    assert tables[0][0].schema == pa.schema([("user", pa.string()), ("amount", pa.int64())])
    assert [row["amount"] for row in rows(tables[0])] == [0, 1, 2, 3, 4]
    assert [row["amount"] for row in rows(tables[1])] == [100, 101, 102]


def test_count_start_id_and_id_field(r, redis_url):
    ids = fill(r, "s", 6)
    connector = RedisStreamSource(redis_url, "s", schema=SCHEMA, start_id=ids[1], count=3, id_field="id")
    out = rows(Driven(connector).drain())
    assert out == [{"id": ids[i], "user": f"u{i % 3}", "amount": i} for i in (2, 3, 4)]


def test_resume_from_any_position_loses_and_repeats_nothing(r, redis_url):
    fill(r, "x", 7)
    fill(r, "y", 4, start=100)
    connector = RedisStreamSource(redis_url, ["x", "y"], schema=SCHEMA, bounded=True, batch_size=3)
    for cut in range(6):
        reference, before = Driven(connector), Driven(connector)
        fill(r, "x", 1, start=200 + cut)  # after their start: the end in the position must hold after a restore
        whole = reference.drain()
        assert sum(t.num_rows for t in whole) == 11 + cut  # not the entry just added
        first = before.poll(cut)
        after = Driven(connector)
        after.op.restore_position(before.position())
        assert sorted(map(str, rows(first + after.drain()))) == sorted(map(str, rows(whole))), f"cut {cut}"


def test_unbounded_source_waits_briefly_and_picks_up_new_entries(r, redis_url):
    fill(r, "live", 2)
    driven = Driven(RedisStreamSource(redis_url, "live", schema=SCHEMA, start_id="$"))
    assert not driven.op.is_bounded
    assert driven.op.poll().num_rows == 0  # nothing new (returned after its short XREAD block): the entries before "$" are not read
    fill(r, "live", 3, start=10)
    assert [row["amount"] for row in rows(driven.poll(1))] == [10, 11, 12]
    idle = Driven(RedisStreamSource(redis_url, ["live"]), subtask=1, parallelism=2)  # no stream for it
    assert idle.op.poll().num_rows == 0


def test_malformed_entries_fail_or_go_to_the_side_output(r, redis_url):
    r.xadd("m", {"user": "ann", "amount": "1"})
    bad_id = r.xadd("m", {"user": "bob", "amount": "lots"})
    r.xadd("m", {"user": "cid"})  # a missing field is a null, not malformed
    connector = RedisStreamSource(redis_url, "m", schema=SCHEMA, bounded=True)
    with pytest.raises(MalformedInputError) as info:
        Driven(connector).drain()
    assert str(info.value).startswith(f"{WHERE}: malformed record in m, entry {bad_id}: column 'amount': "
                                      "'lots' is not a valid int64")
    driven = Driven(connector, side=True)
    assert rows(driven.drain()) == [{"user": "ann", "amount": 1}, {"user": "cid", "amount": None}]
    (bad,) = driven.malformed().to_pylist()
    assert (bad["source"], bad["position"], bad["raw"]) == ("m", bad_id, '{"amount": "lots", "user": "bob"}')


def test_without_schema_the_fields_of_the_first_entry_as_text(r, redis_url):
    r.xadd("t", {"b": "1", "a": "x"})
    r.xadd("t", {"a": "y", "c": "ignored"})
    (table,) = Driven(RedisStreamSource(redis_url, "t", bounded=True)).drain()
    assert table.schema == pa.schema([("b", pa.string()), ("a", pa.string())])
    assert table.to_pylist() == [{"b": "1", "a": "x"}, {"b": None, "a": "y"}]


def test_sink_writes_rows_that_the_source_reads_back(r, redis_url):
    table = pa.table({"user": ["a", None, "c"], "amount": [1, 2, None], "price": [0.5, 1e20, 2.25],
                      "ok": [True, False, None], "at": pa.array([0, 1, 2_000], pa.timestamp("ms"))})
    sink = Driven(RedisStreamSink(redis_url, "out")).op
    sink.process(table)
    sink.finish()
    sink.close()
    entries = r.xrange("out")
    assert [fields for _, fields in entries][1] == {"amount": "2", "price": "1e+20", "ok": "false",
                                                    "at": "1970-01-01 00:00:00.001"}
    schema = {"user": "string", "amount": "int64", "price": "double", "ok": "bool", "at": "timestamp[ms]"}
    back = Driven(RedisStreamSource(redis_url, "out", schema=schema, bounded=True)).drain()
    assert rows(back) == table.to_pylist()


def test_sink_trims_with_maxlen_and_refuses_all_null_rows(r, redis_url):
    sink = Driven(RedisStreamSink(redis_url, "trim", maxlen=10, approximate=False)).op
    for start in range(0, 50, 10):
        sink.process(pa.table({"n": list(range(start, start + 10))}))
    assert [f["n"] for _, f in r.xrange("trim")] == [str(i) for i in range(40, 50)]
    with pytest.raises(ValueError, match=re.escape(WHERE) + ": a row whose values are all null"):
        sink.process(pa.table({"n": pa.array([None], pa.int64())}))


def test_unreachable_redis_is_a_clear_error():
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(ConnectionError, match=re.escape(f"{WHERE}: cannot reach Redis at {url}")):
        Driven(RedisStreamSource(url, "s"))
