"""Kafka connectors for the pipeline API, in the style of FileSource.csv / FileSink.parquet:

    orders = env.from_source(KafkaSource.json("127.0.0.1:9092", "orders", bounded=True))
    totals.sink_to(KafkaSink.json("127.0.0.1:9092", "totals", delivery="exactly-once", key="user"))

Without a schema, ``KafkaSource.json`` samples the topic's newest records now, infers a Spark DDL
schema from them, prints it with the line that pins it, and fixes it in the job graph: every later
record is checked against it, and one that does not fit goes to the side output "malformed".
"""
from __future__ import annotations

import json
import time
from typing import Optional, Sequence, Union

from cluster.common.json_schema import infer_ddl_from_values
from cluster.graph.job_graph import GraphValidationError
from cluster.graph.schema import KAFKA_METADATA_TYPES

from kernel_runtime.api.connectors import Connector, _Check
from kernel_runtime.api.schema import SchemaLike

__all__ = ["KafkaSource", "KafkaSink", "sample_values"]

STARTS = ("earliest", "latest", "committed")
DELIVERIES = ("none", "at-least-once", "exactly-once")
SAMPLE_RECORDS = 1000  # the newest records of a topic that an inferred schema is made from, at most

Start = Union[str, int, dict]


class KafkaSource(Connector):
    """Records of Kafka topics as rows (Flink's KafkaSource): one factory per value format.

    ``topic``: a name or a list of names; ``pattern`` (a regular expression over topic names)
    instead reads every topic that matches, found again every ``discovery_interval`` seconds with
    new partitions. Partitions are spread over the source's subtasks; their offsets are kept in
    checkpoints and savepoints, and committed to ``group_id`` (if given) when a checkpoint completes,
    for monitoring. ``start``: "earliest", "latest", "committed" (the group's offsets), a timestamp
    (epoch milliseconds: the first record at or after it) or {"topic-partition": offset}. A partition
    found while the job runs is read from its start. ``bounded=True`` stops at the offsets that
    were the latest when the job started. ``metadata`` adds columns of the record's
    key, topic, partition, offset, timestamp, headers. ``properties`` are librdkafka settings."""

    @classmethod
    def json(cls, servers: str, topic: Union[str, Sequence[str], None] = None, schema: SchemaLike = None,
             start: Start = "earliest", bounded: bool = False, **options) -> "KafkaSource":
        """JSON objects; without ``schema``, inferred from the topic's newest records (see the module)."""
        check = _Check("KafkaSource.json")
        if schema is None:
            schema = _inferred_schema(check, servers, topic, options)
        return cls._make(check, "json", {}, servers, topic, schema, start, bounded, options)

    @classmethod
    def csv(cls, servers: str, topic: Union[str, Sequence[str], None] = None, schema: SchemaLike = None,
            start: Start = "earliest", bounded: bool = False, *, delimiter: str = ",", **options) -> "KafkaSource":
        """One CSV line per record, its fields in the order of ``schema`` (required)."""
        check = _Check("KafkaSource.csv")
        if schema is None:
            check.fail("schema", "given (it names and types the CSV fields, in order)", schema)
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            check.fail("delimiter", "one character", delimiter)
        return cls._make(check, "csv", {"delimiter": delimiter}, servers, topic, schema, start, bounded, options)

    @classmethod
    def avro(cls, servers: str, topic: Union[str, Sequence[str], None] = None, avro_schema: Union[str, dict, None] = None,
             start: Start = "earliest", bounded: bool = False, *, schema: SchemaLike = None,
             **options) -> "KafkaSource":
        """Avro binary records (no schema registry prefix) of the given Avro record schema; the
        columns are its fields, or ``schema`` (Spark's DDL) where the mapping is not plain."""
        check = _Check("KafkaSource.avro")
        text = _avro_text(check, avro_schema)
        return cls._make(check, "avro", {"avro_schema": text}, servers, topic, schema or _avro_ddl(check, text),
                         start, bounded, options)

    @classmethod
    def raw(cls, servers: str, topic: Union[str, Sequence[str], None] = None, start: Start = "earliest",
            bounded: bool = False, **options) -> "KafkaSource":
        """Each record's value as bytes, in one column ``value``."""
        return cls._make(_Check("KafkaSource.raw"), "raw", {}, servers, topic, "value binary", start, bounded, options)

    @classmethod
    def string(cls, servers: str, topic: Union[str, Sequence[str], None] = None, start: Start = "earliest",
               bounded: bool = False, **options) -> "KafkaSource":
        """Each record's value as UTF-8 text, in one column ``value``."""
        return cls._make(_Check("KafkaSource.string"), "string", {}, servers, topic, "value string", start,
                         bounded, options)

    @classmethod
    def _make(cls, check: _Check, fmt: str, format_options: dict, servers, topic, schema, start, bounded,
              options: dict) -> "KafkaSource":
        pattern = options.pop("pattern", None)
        group_id = check.text("group_id", options.pop("group_id", None), optional=True)
        metadata = options.pop("metadata", ())
        discovery = options.pop("discovery_interval", 300.0)
        batch_size = check.integer("batch_size", options.pop("batch_size", 10_000))
        timeout = check.number("request_timeout", options.pop("request_timeout", 30.0))
        properties = options.pop("properties", None) or {}
        name = check.text("name", options.pop("name", "kafka source"))
        if options:
            raise GraphValidationError(f"{check.where}: unknown argument(s) {', '.join(sorted(options))}")
        topics, pattern = _topics(check, topic, pattern)
        if isinstance(metadata, str) or not all(m in KAFKA_METADATA_TYPES for m in metadata):
            check.fail("metadata", f"a list of {', '.join(KAFKA_METADATA_TYPES)}", metadata)
        columns = check.schema(schema) or {}
        clash = [m for m in metadata if m in columns]
        if clash:
            check.fail("metadata", f"columns that the value schema does not have ({clash[0]!r} is in both)", metadata)
        if not isinstance(properties, dict) or not all(isinstance(k, str) for k in properties):
            check.fail("properties", "a dict of librdkafka settings", properties)
        if start == "committed" and group_id is None:
            check.fail("group_id", 'given when start="committed"', group_id)
        params = {"servers": _servers(check, servers), "topics": topics, "pattern": pattern, "format": fmt,
                  "format_options": format_options, "schema": columns, "start": _start(check, start),
                  "bounded": check.flag("bounded", bounded), "group_id": group_id, "metadata": list(metadata),
                  "discovery_interval_ms": int(check.number("discovery_interval", discovery) * 1000)
                  if discovery else 0, "batch_size": batch_size, "request_timeout_s": timeout,
                  "properties": properties, "split_watermarks": False}
        return cls(kind="kafka-source", name=name, params=params)


class KafkaSink(Connector):
    """Rows as records of one Kafka topic (Flink's KafkaSink). ``delivery``: "none",
    "at-least-once" or "exactly-once" (Flink's DeliveryGuarantee): exactly-once makes a
    checkpoint's records visible to read_committed readers in one transaction when the checkpoint
    completes (so it needs checkpointing; without it every batch is a transaction of its own and a
    restart writes from the start again). ``key``: a column whose text is the record key (Kafka's
    default partitioner hashes it); ``headers``: columns sent as headers; ``transactional_id_prefix``
    names the sink's transactions (default: from the operator's uid; two jobs writing at once need
    different ones)."""

    @classmethod
    def json(cls, servers: str, topic: str, delivery: str = "exactly-once", key: Optional[str] = None,
             **options) -> "KafkaSink":
        """Each row as a JSON object of its columns by name."""
        return cls._make(_Check("KafkaSink.json"), "json", {}, servers, topic, delivery, key, options)

    @classmethod
    def csv(cls, servers: str, topic: str, delivery: str = "exactly-once", key: Optional[str] = None, *,
            delimiter: str = ",", **options) -> "KafkaSink":
        return cls._make(_Check("KafkaSink.csv"), "csv", {"delimiter": delimiter}, servers, topic, delivery, key,
                         options)

    @classmethod
    def avro(cls, servers: str, topic: str, avro_schema: Union[str, dict, None] = None,
             delivery: str = "exactly-once", key: Optional[str] = None, **options) -> "KafkaSink":
        check = _Check("KafkaSink.avro")
        return cls._make(check, "avro", {"avro_schema": _avro_text(check, avro_schema)}, servers, topic, delivery,
                         key, options)

    @classmethod
    def raw(cls, servers: str, topic: str, delivery: str = "exactly-once", key: Optional[str] = None, *,
            column: str = "value", **options) -> "KafkaSink":
        """The bytes (or text, as UTF-8) of one column as each record's value."""
        check = _Check("KafkaSink.raw")
        return cls._make(check, "raw", {"column": check.text("column", column)}, servers, topic, delivery, key,
                         options)

    @classmethod
    def _make(cls, check: _Check, fmt: str, format_options: dict, servers, topic, delivery, key,
              options: dict) -> "KafkaSink":
        if delivery not in DELIVERIES:
            check.fail("delivery", f"one of {', '.join(DELIVERIES)}", delivery)
        headers = options.pop("headers", ())
        if isinstance(headers, str) or not all(isinstance(h, str) and h for h in headers):
            check.fail("headers", "a list of column names", headers)
        properties = options.pop("properties", None) or {}
        params = {"servers": _servers(check, servers), "topic": check.text("topic", topic), "delivery": delivery,
                  "format": fmt, "format_options": format_options, "key": check.text("key", key, optional=True),
                  "headers": list(headers), "partitioner": check.text("partitioner", options.pop("partitioner", None),
                                                                      optional=True),
                  "transactional_id_prefix": check.text("transactional_id_prefix",
                                                        options.pop("transactional_id_prefix", None), optional=True),
                  "request_timeout_s": check.number("request_timeout", options.pop("request_timeout", 30.0)),
                  "properties": properties}
        name = check.text("name", options.pop("name", "kafka sink"))
        if options:
            raise GraphValidationError(f"{check.where}: unknown argument(s) {', '.join(sorted(options))}")
        return cls(kind="kafka-sink", name=name, params=params)


# ---------------------------------------------------------------------- argument checks
def _servers(check: _Check, servers) -> str:
    if isinstance(servers, (list, tuple)):
        servers = ",".join(servers)
    if not isinstance(servers, str) or not servers or not all(":" in s for s in servers.split(",")):
        check.fail("servers", 'bootstrap servers as "host:port" or "host:port,host:port"', servers)
    return servers


def _topics(check: _Check, topic, pattern) -> tuple[list[str], Optional[str]]:
    if pattern is not None:
        if topic is not None:
            check.fail("topic", "None when a pattern is given", topic)
        import re
        try:
            re.compile(check.text("pattern", pattern))
        except re.error as exc:
            check.fail("pattern", f"a regular expression ({exc})", pattern)
        return [], pattern
    topics = [topic] if isinstance(topic, str) else topic
    if not isinstance(topics, (list, tuple)) or not topics or not all(isinstance(t, str) and t for t in topics):
        check.fail("topic", "a topic name or a list of them (or pattern=...)", topic)
    return list(topics), None


def _start(check: _Check, start) -> Union[str, dict]:
    if start in STARTS:
        return start
    if isinstance(start, int) and not isinstance(start, bool) and start >= 0:
        return {"timestamp": start}
    if isinstance(start, dict) and start and all(isinstance(k, str) and k.rpartition("-")[2].isdigit()
                                                 and isinstance(v, int) and v >= 0 for k, v in start.items()):
        return {"offsets": dict(start)}
    check.fail("start", '"earliest", "latest", "committed", a timestamp in epoch ms or {"topic-partition": offset}',
               start)


def _avro_text(check: _Check, avro_schema) -> str:
    if isinstance(avro_schema, dict):
        return json.dumps(avro_schema)
    if isinstance(avro_schema, str):
        try:
            json.loads(avro_schema)
            return avro_schema
        except ValueError:
            pass
    check.fail("avro_schema", "an Avro record schema (a dict or its JSON text)", avro_schema)


_AVRO_TYPES = {"int": "int", "long": "bigint", "float": "float", "double": "double", "string": "string",
               "boolean": "boolean", "bytes": "binary"}
_AVRO_LOGICAL = {"timestamp-millis": "timestamp", "timestamp-micros": "timestamp", "date": "date"}


def _avro_ddl(check: _Check, text: str) -> str:
    """The Spark DDL of an Avro record's fields (primitive, nullable unions, timestamps, dates)."""
    record = json.loads(text)
    if not isinstance(record, dict) or record.get("type") != "record":
        check.fail("avro_schema", "an Avro schema of type record", record)
    columns = []
    for field in record.get("fields", []):
        t = field.get("type")
        if isinstance(t, list):  # ["null", T]: a nullable T
            others = [x for x in t if x != "null"]
            t = others[0] if len(others) == 1 else None
        if isinstance(t, dict):
            t = _AVRO_LOGICAL.get(t.get("logicalType", ""), t.get("type"))
            spark = t if t in _AVRO_LOGICAL.values() else _AVRO_TYPES.get(str(t))
        else:
            spark = _AVRO_TYPES.get(t) if isinstance(t, str) else None
        if spark is None:
            check.fail("schema", f"given: the Avro field {field.get('name')!r} has type {field.get('type')!r}, "
                       "which has no plain column type", None)
        columns.append(f"`{field['name']}` {spark}")
    return ", ".join(columns)


# ---------------------------------------------------------------------- schema inference
def sample_values(servers: str, topics: list[str], limit: int, timeout_s: float, where: str) -> list[bytes]:
    """The values of the newest ``limit`` records of the topics (spread over their partitions),
    read_committed; a clear error when the brokers cannot be reached or a topic does not exist."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": servers, "group.id": "streamlab-schema-sample",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True, "log_level": 0})
    try:
        try:
            known = consumer.list_topics(timeout=timeout_s).topics
        except KafkaException as exc:
            raise GraphValidationError(f"{where}: cannot reach the Kafka brokers at {servers} within "
                                       f"{timeout_s:g} s ({exc.args[0].str() if exc.args else exc})") from None
        for topic in topics:
            if topic not in known or known[topic].error is not None:
                raise GraphValidationError(f"{where}: topic {topic!r} does not exist on the Kafka brokers at "
                                           f"{servers}")
        parts = [TopicPartition(t, p) for t in topics for p in sorted(known[t].partitions)]
        each = max(1, limit // max(1, len(parts)))
        wanted = {}
        for tp in parts:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
            if high > low:
                wanted[(tp.topic, tp.partition)] = high
                tp.offset = max(low, high - each)
        parts = [tp for tp in parts if (tp.topic, tp.partition) in wanted]
        if not parts:
            return []
        consumer.assign(parts)
        found: list[tuple[tuple[int, int, int], bytes]] = []
        deadline = time.monotonic() + timeout_s
        while wanted and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.2):
                key = (message.topic(), message.partition())
                value, offset = message.value(), message.offset() or 0
                if message.error() is None and isinstance(value, bytes):
                    found.append(((message.timestamp()[1], message.partition() or 0, offset), value))
                if key in wanted and (message.error() is not None or offset + 1 >= wanted[key]):
                    del wanted[key]  # at the end (or past transaction markers to it)
        # in the order they were written, as far as Kafka knows it (the inferred columns' order is first seen)
        return [value for _, value in sorted(found, key=lambda item: item[0])]
    finally:
        consumer.close()


def _inferred_schema(check: _Check, servers, topic, options: dict) -> str:
    if options.get("pattern") is not None:
        check.fail("schema", "given when topics are chosen by a pattern", None)
    topics, _ = _topics(check, topic, None)
    timeout = check.number("request_timeout", options.get("request_timeout", 30.0))
    values = sample_values(_servers(check, servers), topics, SAMPLE_RECORDS, timeout, check.where)
    ddl, used = infer_ddl_from_values(values)
    if not used:
        raise GraphValidationError(f"{check.where}: no schema given and none can be inferred: topic(s) "
                                   f"{', '.join(map(repr, topics))} hold no JSON object to sample; give schema=...")
    print(f"{check.where}: schema inferred from the newest {used} records of {', '.join(topics)}:\n"
          f"    {ddl}\n  to pin it: KafkaSource.json(..., schema={ddl!r})")
    return ddl
