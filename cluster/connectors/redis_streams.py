"""Redis Streams connectors: a replayable source (its position is the last entry id read per
stream) and a sink that appends each row as an entry.

Stream keys are assigned to the source's subtasks by their order in the connector (key i to
subtask i % parallelism). Entry values are text; a schema says how to parse them, and an entry
that does not fit it is malformed (see records.py).
"""
from __future__ import annotations

import json
from typing import Optional

import pyarrow as pa
import redis
from redis.typing import EncodableT, FieldT

from cluster.operators.base import Operator, SourceOperator
from cluster.connectors.records import MalformedRecords, infer_schema, raw_json, schema_from_bytes, schema_to_bytes, to_table
from cluster.graph.schema import parse_schema

IDLE_WAIT_MS = 100  # the longest a poll blocks in XREAD, so cancellation stays quick


def entry_id(text: str) -> tuple[int, int]:
    """An entry id ("1700000000000-3", or just "0") as a comparable pair."""
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _text_id(raw: object, key: str) -> str:
    # connect() asks for decoded responses, so ids come back as str; anything else is a client misconfigured
    if not isinstance(raw, str):
        raise TypeError(f"stream {key!r}: entry id {raw!r} is not text (the Redis client must decode responses)")
    return raw


def _xread_entries(reply: object) -> dict[str, list[tuple[str, dict]]]:
    """XREAD's reply (RESP2: [[key, [[id, fields], ...]], ...], or None on timeout) by stream key."""
    if reply is None:
        return {}
    if not isinstance(reply, list):
        raise TypeError(f"XREAD replied with a {type(reply).__name__}, not the list of streams of RESP2")
    return {key: [(_text_id(eid, key), fields) for eid, fields in entries] for key, entries in reply}


def connect(url: str, where: str) -> redis.Redis:
    client = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5, socket_timeout=30)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        raise ConnectionError(f"{where}: cannot reach Redis at {url}: {exc}") from None
    return client


class RedisStreamSource(SourceOperator, kind="redis-stream-source"):
    """params: url, streams (keys), start_id (as XREAD's: the entries after it; "0" all, "$" only
    those added from now on), bounded (stop at each stream's last entry at the start), count
    (stop after that many entries of each stream), batch_size (entries per stream and read),
    schema (field -> type name; without it every field of the first entry, as text), id_field (a
    column for the entry id, or None).

    Position: per stream, the last entry id read, how many were read, and where a bounded read
    ends; keyed by stream, so positions of several subtasks can be merged for a rescale."""

    def open(self) -> None:
        params = self.params
        self.redis = connect(params["url"], self.spec.where())
        p, i = self.ctx.parallelism, self.ctx.subtask
        self.streams: list[str] = [key for n, key in enumerate(params["streams"]) if n % p == i]
        self.batch_size = int(params.get("batch_size") or 1000)
        self.count: Optional[int] = params.get("count")
        self.bounded = bool(params.get("bounded"))
        self.id_field: Optional[str] = params.get("id_field")
        self.schema: Optional[pa.Schema] = parse_schema(params.get("schema"), self.spec.where())
        start = params.get("start_id") or "0"
        # "$" is resolved now, so that the position names a real entry
        self.last = {key: self._last_entry(key) if start == "$" else start for key in self.streams}
        self.read = {key: 0 for key in self.streams}
        self.end = {key: self._last_entry(key) for key in self.streams} if self.bounded else {}

    def _last_entry(self, key: str) -> str:
        newest = self.redis.xrevrange(key, count=1)
        return _text_id(newest[0][0], key) if newest else "0-0"

    def _finished(self, key: str) -> bool:
        return (self.count is not None and self.read[key] >= self.count) or \
            (self.bounded and entry_id(self.last[key]) >= entry_id(self.end[key]))

    def snapshot_position(self) -> dict:
        return {"last": dict(self.last), "read": dict(self.read), "end": dict(self.end),
                "schema": schema_to_bytes(self.schema)}

    def restore_position(self, position: dict) -> None:
        for state, saved in ((self.last, position["last"]), (self.read, position["read"]),
                             (self.end, position["end"])):
            state.update({key: saved[key] for key in self.streams if key in saved})
        if self.params.get("schema") is None and position.get("schema") is not None:
            self.schema = schema_from_bytes(position["schema"])  # inferred before: keep it

    def poll(self) -> Optional[pa.Table]:
        active = {key: self.last[key] for key in self.streams if not self._finished(key)}
        if not active:
            if self.is_bounded:
                return None
            self.ctx.cancelled.wait(IDLE_WAIT_MS / 1000)  # this subtask was given no stream
            return pa.table({})
        # redis-py types ``streams`` as an invariant Dict[KeyT, StreamIdT]; a dict[str, str] is what it takes
        reply = self.redis.xread(active, count=self.batch_size,  # type: ignore[arg-type]
                                 block=None if self.bounded else max(1, int(self.waiting(IDLE_WAIT_MS / 1000) * 1000)))
        received = _xread_entries(reply)
        rows: list[tuple[str, str, dict]] = []
        for key in active:
            entries = received.get(key, [])
            kept = [e for e in entries if not self.bounded or entry_id(e[0]) <= entry_id(self.end[key])]
            # nothing more up to the end (entries between may have been deleted)
            reached_end = self.bounded and (len(kept) < len(entries) or not entries)
            if self.count is not None:
                kept = kept[:self.count - self.read[key]]
            if kept:
                self.last[key] = kept[-1][0]
                self.read[key] += len(kept)
                rows.extend((key, eid, fields) for eid, fields in kept)
            if reached_end and not self._finished(key):
                self.last[key] = self.end[key]
        return self._to_table(rows)

    def _to_table(self, rows: list[tuple[str, str, dict]]) -> pa.Table:
        if not rows:
            return pa.table({})
        if self.schema is None:
            self.schema = infer_schema({field: [] for field in rows[0][2]}, text=True)
        columns = {f.name: [fields.get(f.name) for _, _, fields in rows] for f in self.schema}
        table, unfit = to_table(columns, self.schema, text=True)
        malformed = MalformedRecords(self, "entry")
        for row, reason in unfit.items():
            key, eid, fields = rows[row]
            malformed.add(key, eid, raw_json(fields), reason)
        malformed.flush()
        if self.id_field is not None:
            ids = [eid for row, (_, eid, _) in enumerate(rows) if row not in unfit]
            table = table.add_column(0, self.id_field, pa.array(ids, pa.string()))
        return table

    def close(self) -> None:
        self.redis.close()


def as_text(column: pa.ChunkedArray) -> list[Optional[str]]:
    """A column's values as stream entry values: Arrow's text form (which the source's schema parses back)."""
    try:
        return column.cast(pa.string()).to_pylist()
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # nested values: as JSON
        return [None if v is None else json.dumps(v, default=str) for v in column.to_pylist()]


class RedisStreamSink(Operator, kind="redis-stream-sink"):
    """params: url, stream, maxlen (trim the stream to about that many entries, or None), approximate.

    Each row becomes one entry (XADD, id "*"): its columns are the fields, null values are left
    out. At least once: entries written after the last checkpoint are written again on replay."""

    def open(self) -> None:
        self.redis = connect(self.params["url"], self.spec.where())
        self.stream: str = self.params["stream"]
        self.maxlen: Optional[int] = self.params.get("maxlen")
        self.approximate = bool(self.params.get("approximate", True))

    def process(self, table: pa.Table) -> list[pa.Table]:
        if not table.num_rows:
            return []
        columns = {name: as_text(table.column(name)) for name in table.column_names}
        pipe = self.redis.pipeline(transaction=False)
        for row in range(table.num_rows):
            fields: dict[FieldT, EncodableT] = {}
            for name, values in columns.items():
                value = values[row]
                if value is not None:
                    fields[name] = value
            if not fields:
                raise ValueError(f"{self.spec.where()}: a row whose values are all null cannot be a stream entry "
                                 f"(columns: {table.column_names})")
            pipe.xadd(self.stream, fields, maxlen=self.maxlen, approximate=self.approximate)
        pipe.execute()
        return []

    def close(self) -> None:
        self.redis.close()
