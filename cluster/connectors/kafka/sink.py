"""Flink's KafkaSink on librdkafka, with Flink's three DeliveryGuarantees.

``none``: records are handed to the producer and forgotten. ``at-least-once``: the barrier waits
until every record before it is acknowledged by the brokers (flush), so a checkpoint never covers
a record that could be lost; a replay may write some again.

``exactly-once``: a record becomes visible when the checkpoint that covers it completes, in a
Kafka transaction. Flink keeps one transaction open per checkpoint and, on restore, resumes the
transactions of the restored checkpoint by their producer id and epoch, through reflection into
the Java client. librdkafka cannot resume another producer's transaction, so this sink writes
ahead instead: the records encoded since the last barrier go into the checkpoint (a file beside
the keyed state), and the checkpoint's completion writes and commits them in one transaction
that also commits a marker (the checkpoint id as an offset of the sink subtask's own consumer
group, atomically with the records). A restore reads the marker after fencing the failed
attempt's producer (init_transactions, which aborts what it left open) and writes again only what
no committed transaction holds. Readers with isolation.level=read_committed see every record
once.

Thread use: the task thread calls everything here; librdkafka's delivery callbacks run inside
the producer's poll and flush, which the task thread calls.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import pyarrow as pa
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from cluster.connectors.kafka.client import DEFAULT_REQUEST_TIMEOUT_S, KafkaConnectorError, describe, require_topics
from cluster.connectors.kafka.formats import encode
from cluster.operators.base import Operator, OperatorSnapshot

log = logging.getLogger(__name__)

DELIVERY_GUARANTEES = ("none", "at-least-once", "exactly-once")
WAL_SCHEMA = pa.schema([("checkpoint", pa.int64()), ("key", pa.binary()), ("value", pa.binary())])
Records = tuple[list[Optional[bytes]], list[bytes]]  # keys, values


class WriteAhead:
    """The records of the checkpoints not yet committed, as the task writes them beside the state."""

    def __init__(self, prepared: dict[int, Records]):
        self.prepared = prepared

    def write(self, path: Path) -> dict:
        checkpoints = [c for c, (keys, _) in self.prepared.items() for _ in keys]
        keys = [k for keys, _ in self.prepared.values() for k in keys]
        values = [v for _, values in self.prepared.values() for v in values]
        table = pa.table([pa.array(checkpoints, pa.int64()), pa.array(keys, pa.binary()),
                          pa.array(values, pa.binary())], schema=WAL_SCHEMA)
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, WAL_SCHEMA) as writer:
            writer.write_table(table)
        return {"records": table.num_rows}

    @staticmethod
    def read(path: Path) -> dict[int, Records]:
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_file(source).read_all()
        prepared: dict[int, Records] = {}
        for c, k, v in zip(*(table.column(n).to_pylist() for n in WAL_SCHEMA.names)):
            keys, values = prepared.setdefault(c, ([], []))
            keys.append(k)
            values.append(v)
        return prepared


class KafkaSink(Operator, kind="kafka-sink"):
    """params: servers, topic, delivery, format and format_options (formats.encode), key (a column
    whose text is the record key, or None), headers (columns sent as headers), partitioner
    (librdkafka's; murmur2_random hashes keys as Kafka's Java clients do), transactional_id_prefix,
    request_timeout_s, properties (librdkafka settings, which win)."""

    def open(self) -> None:
        params = self.params
        self.where = self.spec.where()
        self.servers: str = params["servers"]
        self.topic: str = params["topic"]
        self.delivery: str = params.get("delivery") or "at-least-once"
        if self.delivery not in DELIVERY_GUARANTEES:
            raise KafkaConnectorError(f"{self.where}: delivery must be one of {', '.join(DELIVERY_GUARANTEES)}, "
                                      f"got {self.delivery!r}")
        self.format: str = params.get("format") or "json"
        self.format_options: dict = params.get("format_options") or {}
        self.key: Optional[str] = params.get("key")
        self.headers: list[str] = list(params.get("headers") or [])
        self.timeout_s = float(params.get("request_timeout_s") or DEFAULT_REQUEST_TIMEOUT_S)
        self.prefix: str = params.get("transactional_id_prefix") or f"streamlab-{self.spec.uid[:16]}"
        self.errors: list[str] = []
        self.exactly_once = self.delivery == "exactly-once"
        self.checkpointing = bool(self.ctx.config.checkpointing)
        self.buffer: Records = ([], [])
        self.prepared: dict[int, Records] = {}  # checkpoint id -> its records, until it completes
        self.groups: dict[str, Consumer] = {}
        self.producer = self._producer(self.ctx.subtask) if self.exactly_once else Producer(self._config(None))
        self._check_topic()

    def _config(self, transactional_id: Optional[str]) -> dict:
        config = {"bootstrap.servers": self.servers, "linger.ms": 5, "batch.num.messages": 10_000,
                  "queue.buffering.max.messages": 1_000_000, "partitioner": self.params.get("partitioner")
                  or "murmur2_random", "socket.timeout.ms": int(self.timeout_s * 1000),
                  "message.timeout.ms": 120_000, "log_level": 3,
                  # a report per failed record only: a Python call per delivered record cost as much
                  # as its produce, and flush() still waits for every record
                  "delivery.report.only.error": True, "on_delivery": self._delivered}
        if self.delivery != "none":
            config["enable.idempotence"] = True
        if transactional_id is not None:
            config |= {"transactional.id": transactional_id, "transaction.timeout.ms": 900_000}
        return config | dict(self.params.get("properties") or {})

    def _producer(self, subtask: int) -> Producer:
        """The transactional producer of a sink subtask: starting it fences every earlier producer of
        the same id (a failed attempt's) and ends what it left open."""
        producer = Producer(self._config(f"{self.prefix}-{subtask}"))
        try:
            producer.init_transactions(self.timeout_s)
        except KafkaException as exc:
            raise KafkaConnectorError(f"{self.where}: cannot start a transactional producer at {self.servers} "
                                      f"({describe(exc)})") from None
        return producer

    def _check_topic(self) -> None:
        try:
            topics = self.producer.list_topics(timeout=self.timeout_s).topics
        except KafkaException as exc:
            raise KafkaConnectorError(f"{self.where}: cannot reach the Kafka brokers at {self.servers} within "
                                      f"{self.timeout_s:g} s ({describe(exc)})") from None
        require_topics([name for name, t in topics.items() if t.error is None], [self.topic], self.servers,
                       self.where)

    # ------------------------------------------------------------------ writing
    def process(self, table: pa.Table) -> list[pa.Table]:
        if not table.num_rows:
            return []
        if self.key is not None and self.key not in table.column_names:
            raise KafkaConnectorError(f"{self.where}: the key column {self.key!r} is not among the columns "
                                      f"{table.column_names}")
        values = encode(table, self.format, self.format_options)
        keys: list[Optional[bytes]] = [None] * table.num_rows if self.key is None else [
            None if k is None else str(k).encode() for k in table.column(self.key).to_pylist()]
        if self.exactly_once and self.checkpointing:
            self.buffer[0].extend(keys)
            self.buffer[1].extend(values)
        elif self.exactly_once:  # no checkpoints: each batch is a transaction of its own
            self._transaction(self.producer, (keys, values), None)
        else:
            self._send(self.producer, keys, values, self._header_rows(table))
        return []

    def _header_rows(self, table: pa.Table) -> Optional[list[list[tuple[str, Optional[bytes]]]]]:
        if not self.headers:
            return None
        columns = {name: table.column(name).to_pylist() for name in self.headers}
        return [[(name, None if col[row] is None else str(col[row]).encode()) for name, col in columns.items()]
                for row in range(table.num_rows)]

    def _send(self, producer: Producer, keys: list[Optional[bytes]], values: list[bytes],
              headers: Optional[list] = None) -> None:
        produce, topic = producer.produce, self.topic
        for row, (key, value) in enumerate(zip(keys, values)):
            while True:
                try:
                    if headers is None:
                        produce(topic, value, key)
                    else:
                        produce(topic, value, key, headers=headers[row])
                    break
                except BufferError:  # librdkafka's queue is full: let it send
                    producer.poll(0.05)
        producer.poll(0)
        self._raise_errors()

    def _delivered(self, error, message) -> None:
        if error is not None:
            self.errors.append(f"{error.name()}: {error.str()}")

    def _raise_errors(self) -> None:
        if self.errors:
            first, count = self.errors[0], len(self.errors)
            self.errors = []
            raise KafkaConnectorError(f"{self.where}: {count} record(s) could not be written to {self.topic!r} "
                                      f"at {self.servers}: {first}")

    def _flush(self, producer: Producer) -> None:
        remaining = producer.flush(self.timeout_s * 4)
        self._raise_errors()
        if remaining:
            raise KafkaConnectorError(f"{self.where}: {remaining} record(s) not acknowledged by {self.servers} "
                                      f"within {self.timeout_s * 4:g} s")

    def _transaction(self, producer: Producer, records: Records, marker: Optional[tuple[str, int]]) -> None:
        """Write ``records`` and commit them, with the marker (group, checkpoint id) when given."""
        try:
            producer.begin_transaction()
            self._send(producer, *records)
            if marker is not None:
                group, checkpoint_id = marker
                producer.send_offsets_to_transaction(
                    [TopicPartition(self.topic, 0, checkpoint_id, metadata=self.ctx.job_id)],
                    self._group(group).consumer_group_metadata(), self.timeout_s)
            producer.commit_transaction(self.timeout_s * 4)
        except KafkaException as exc:
            raise KafkaConnectorError(f"{self.where}: a transaction on {self.topic!r} at {self.servers} "
                                      f"failed: {describe(exc)}") from None
        self._raise_errors()

    # ------------------------------------------------------------------ checkpoints
    def snapshot_state(self, checkpoint_id: int) -> Optional[OperatorSnapshot]:
        if self.delivery == "at-least-once":
            self._flush(self.producer)
            return None
        if not self.exactly_once:
            return None
        self.prepared[checkpoint_id], self.buffer = self.buffer, ([], [])
        return OperatorSnapshot({"job_id": self.ctx.job_id, "prefix": self.prefix}, keyed=WriteAhead(dict(self.prepared)))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        done = sorted(c for c in self.prepared if c <= checkpoint_id)
        if done:
            records: Records = ([], [])
            for c in done:
                keys, values = self.prepared.pop(c)
                records[0].extend(keys)
                records[1].extend(values)
            self._transaction(self.producer, records, (self._marker_group(self.ctx.subtask), done[-1]))

    def _marker_group(self, subtask: int) -> str:
        return f"{self.prefix}-{subtask}"

    def _group(self, group: str) -> Consumer:
        """A consumer of a marker group (never subscribed): its metadata for a transaction's offset
        commit, and what the group committed."""
        if group not in self.groups:
            self.groups[group] = Consumer({"bootstrap.servers": self.servers, "group.id": group,
                                           "enable.auto.commit": False, "isolation.level": "read_committed",
                                           "log_level": 3})
        return self.groups[group]

    def restore_state(self, handles: list[dict]) -> None:
        """The old subtasks' records that no committed transaction holds are written now: by the new
        subtask of their index mod p, each under the old subtask's transactional id and marker."""
        if not self.exactly_once:
            return
        for handle in handles:
            old = handle["subtask"]
            if old % self.ctx.parallelism != self.ctx.subtask or not handle.get("keyed_file"):
                continue
            prepared = WriteAhead.read(Path(handle["directory"]) / handle["keyed_file"])
            if not prepared:
                continue
            producer = self.producer if old == self.ctx.subtask else self._producer(old)
            committed = self._committed_marker(self._marker_group(old), handle["job_id"])
            records: Records = ([], [])
            for c in sorted(c for c in prepared if c > committed):
                records[0].extend(prepared[c][0])
                records[1].extend(prepared[c][1])
            if records[0]:
                log.info("%s: writes %d record(s) of checkpoints after %d left uncommitted by subtask %d",
                         self.where, len(records[0]), committed, old)
                self._transaction(producer, records, (self._marker_group(old), max(prepared)))
            if producer is not self.producer:
                producer.flush(self.timeout_s)

    def _committed_marker(self, group: str, job_id: str) -> int:
        """The last checkpoint whose records a committed transaction holds (0: none of this job)."""
        try:
            found = self._group(group).committed([TopicPartition(self.topic, 0)], timeout=self.timeout_s)
        except KafkaException as exc:
            raise KafkaConnectorError(f"{self.where}: cannot read what group {group!r} committed at "
                                      f"{self.servers}: {describe(exc)}") from None
        marker = found[0]
        return marker.offset if marker.offset >= 0 and marker.metadata == job_id else 0

    def finish(self) -> list[pa.Table]:
        # the end of a bounded input: what the final checkpoint prepared, then anything after it
        if self.exactly_once and self.checkpointing:
            self.notify_checkpoint_complete(max(self.prepared, default=0))
            if self.buffer[0]:
                self._transaction(self.producer, self.buffer, None)
                self.buffer = ([], [])
        self._flush(self.producer)
        return []

    def metrics(self) -> dict:
        return {"pendingCommitRecords": sum(len(keys) for keys, _ in self.prepared.values()) + len(self.buffer[0])}

    def close(self) -> None:
        # records of a failed attempt that were never committed stay invisible: the next attempt's
        # init_transactions aborts an open transaction
        self.producer.flush(0)
        for consumer in self.groups.values():
            consumer.close()

