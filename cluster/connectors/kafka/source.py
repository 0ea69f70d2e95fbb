"""Flink's KafkaSource (FLIP-27) on librdkafka: partitions are the splits, offsets live in
checkpoints.

Each subtask reads the partitions it owns by Flink's assignment (client.partition_owner), which
every subtask computes alike, and looks for new partitions every ``partition.discovery.interval.ms``;
a partition found after the start is read from its earliest offset, as Flink does. The position
is the next offset per partition (and, bounded, where each ends), keyed by partition, so a restore
at another parallelism hands every partition to its new owner. Offsets reach the consumer group
only when a checkpoint completes, for monitoring (Flink's commit.offsets.on.checkpoint).

Thread use: the task thread calls everything here.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Optional, Union, cast

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from cluster.connectors.kafka.client import (DEFAULT_REQUEST_TIMEOUT_S, KafkaConnectorError, consumer_config,
                                             describe, offsets_for_timestamp, parse_split_id, partition_owner,
                                             split_id, topic_partitions)
from cluster.connectors.kafka.formats import decode
from cluster.connectors.records import MALFORMED, MALFORMED_SCHEMA
from cluster.graph.event_time import SPLIT_ROWS_METADATA
from cluster.graph.schema import KAFKA_METADATA_TYPES, parse_schema, parse_type
from cluster.operators.base import OperatorSnapshot, SourceOperator

log = logging.getLogger(__name__)

POLL_TIMEOUT_S = 0.1
LINGER_S = 0.025  # a fast stream's batch gathers records this long after its first (see _fetched)
# records/s from which a stream's batches gather (_fetched): a slower one's records go on as they come
GATHER_FROM_PER_S = 10_000
RATE_WINDOW_S = 1.0  # how long the rate that decides is counted over
METRICS_INTERVAL_S = 1.0  # the longest a poll waits for records, so barriers and cancellation stay quick


class KafkaSource(SourceOperator, kind="kafka-source"):
    """params: servers, topics (names) or pattern (a regular expression over topic names), format
    and format_options (formats.decode), schema (field -> type name: fixed when the job is built,
    inferred by the client if the user gave none), start ("earliest", "latest", "committed",
    {"timestamp": epoch ms} or {"offsets": {"topic-partition": offset}}), bounded (stop at the
    offsets that were the latest at the start), group_id, metadata (columns to add: key, topic,
    partition, offset, timestamp, headers), discovery_interval_ms, batch_size (records per poll),
    request_timeout_s, properties (librdkafka settings, which win)."""

    figures: dict = {}  # the last measured metrics (replaced whole, never changed in place)

    def open(self) -> None:
        params = self.params
        self.where = self.spec.where()
        self.servers: str = params["servers"]
        self.topics: list[str] = list(params.get("topics") or [])
        self.pattern: Optional[str] = params.get("pattern")
        self.format: str = params.get("format") or "json"
        self.format_options: dict = params.get("format_options") or {}
        self.schema = parse_schema(params.get("schema"), self.where)
        if self.schema is None:
            raise KafkaConnectorError(f"{self.where}: no value schema (the client infers one when none is given)")
        self.metadata: list[str] = list(params.get("metadata") or [])
        self.bounded = bool(params.get("bounded"))
        self.batch_size = int(params.get("batch_size") or 10_000)
        self.rate_per_s = 0.0  # records fetched per second, over the last RATE_WINDOW_S (task thread)
        self._counted, self._counting_since = 0, time.monotonic()
        self.timeout_s = float(params.get("request_timeout_s") or DEFAULT_REQUEST_TIMEOUT_S)
        self.discovery_s = (params.get("discovery_interval_ms", 300_000) or 0) / 1000
        self.group_id: Optional[str] = params.get("group_id")
        self.consumer = Consumer(consumer_config(self.servers, self.group_id, params.get("properties") or {},
                                                 self.timeout_s))
        self.positions: dict[str, int] = {}   # split -> next offset to read
        self.ends: dict[str, int] = {}        # split -> where a bounded read stops
        self.finished: set[str] = set()
        self.restored: Optional[dict[str, int]] = None  # positions of the restored checkpoint
        self.restored_ends: dict[str, int] = {}
        self.started = False                  # the partitions of the start are assigned
        self.next_discovery = 0.0
        self.committing: dict[int, list[TopicPartition]] = {}
        self.malformed = 0
        self.next_measure = 0.0
        self.split_watermarks = bool(params.get("split_watermarks"))
        self.splits: dict[tuple[str, int], str] = {}  # (topic, partition) -> its split id

    # ------------------------------------------------------------------ splits
    def _discover(self) -> None:
        partitions = topic_partitions(self.consumer, self.servers, self.topics, self.pattern, self.timeout_s,
                                      self.where)
        p, i = self.ctx.parallelism, self.ctx.subtask
        new = [TopicPartition(topic, n) for topic, count in sorted(partitions.items()) for n in range(count)
               if partition_owner(topic, n, p) == i and split_id(topic, n) not in self.positions]
        if new:
            self._assign(new, first=not self.started)
        self.started = True
        self.next_discovery = time.monotonic() + self.discovery_s

    def _assign(self, parts: list[TopicPartition], first: bool) -> None:
        offsets = self._start_offsets(parts, first)
        for tp in parts:
            split = split_id(tp.topic, tp.partition)
            tp.offset = self.positions[split] = offsets[split]
            if self.bounded:
                self.ends[split] = self.restored_ends[split] if split in self.restored_ends else \
                    self._high_watermark(tp)
                if tp.offset >= self.ends[split]:
                    self.finished.add(split)
        log.info("%s: reads %s", self.where, ", ".join(f"{split_id(tp.topic, tp.partition)}@{tp.offset}" for tp in parts))
        self.consumer.incremental_assign(parts)
        done = [tp for tp in parts if split_id(tp.topic, tp.partition) in self.finished]
        if done:
            self.consumer.pause(done)

    def _start_offsets(self, parts: list[TopicPartition], first: bool) -> dict[str, int]:
        """Concrete offsets, so that a checkpoint names real places: the restored position, else
        the start the user asked for (partitions of the start) or the earliest (found later)."""
        start = self.params.get("start", "earliest") if first and self.restored is None else "earliest"
        offsets: dict[str, int] = {}
        for tp in parts:
            split = split_id(tp.topic, tp.partition)
            if self.restored is not None and split in self.restored:
                offsets[split] = self.restored[split]
        rest = [tp for tp in parts if split_id(tp.topic, tp.partition) not in offsets]
        if not rest:
            return offsets
        if isinstance(start, dict) and "timestamp" in start:
            found = offsets_for_timestamp(self.consumer, rest, int(start["timestamp"]), self.timeout_s)
            return offsets | {split_id(t, n): o for (t, n), o in found.items()}
        committed = self._committed(rest) if start == "committed" else {}
        given = start.get("offsets", {}) if isinstance(start, dict) else {}
        for tp in rest:
            split = split_id(tp.topic, tp.partition)
            low, high = self.consumer.get_watermark_offsets(tp, timeout=self.timeout_s)
            if split in given:
                offsets[split] = min(max(int(given[split]), low), high)
            elif split in committed:
                offsets[split] = committed[split]
            else:  # earliest, latest, and a partition without a committed or given offset (Flink: earliest)
                offsets[split] = high if start == "latest" else low
        return offsets

    def _committed(self, parts: list[TopicPartition]) -> dict[str, int]:
        try:
            found = self.consumer.committed(parts, timeout=self.timeout_s)
        except KafkaException as exc:
            raise KafkaConnectorError(f"{self.where}: cannot read the committed offsets of group "
                                      f"{self.group_id!r} at {self.servers}: {describe(exc)}") from None
        return {split_id(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0}

    def _high_watermark(self, tp: TopicPartition) -> int:
        # read_committed: the last stable offset, so a bounded read never waits on an open transaction
        return self.consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=self.timeout_s)[1]

    # ------------------------------------------------------------------ reading
    def poll(self) -> Optional[pa.Table]:
        if not self.started or (not self.bounded and self.discovery_s and time.monotonic() >= self.next_discovery):
            self._discover()
        if self.bounded and len(self.finished) == len(self.positions):
            return None
        if not self.positions:
            self.ctx.cancelled.wait(self.waiting(POLL_TIMEOUT_S))  # this subtask owns no partition (yet)
            return pa.table({})
        self._measure()
        kept: list[Message] = []
        # a step per record: its names bound once, the split's id made once per partition
        positions, finished, ends, bounded, split_of = self.positions, self.finished, self.ends, self.bounded, self._split_of
        for message in self._fetched():
            error = message.error()
            if error is not None:
                self._on_error(error, message, split_id(*place(message)[:2]))
                continue
            split = split_of(message)
            offset = cast(int, message.offset())  # a record (no error) has one
            if split in finished or split not in positions:
                continue  # fetched before the partition was paused
            if bounded and offset >= ends[split]:
                self._finish(split, message)
                continue
            kept.append(message)
            positions[split] = offset + 1
            if bounded and offset + 1 >= ends[split]:
                self._finish(split, message)
        return self._to_table(kept) if kept else pa.table({})

    def _split_of(self, record: Message) -> str:
        """A record's split id, made once per partition (a record, not an error, names its partition)."""
        partition = cast(tuple[str, int], (record.topic(), record.partition()))
        return self.splits.get(partition) or self.splits.setdefault(partition, split_id(*partition))

    def _fetched(self) -> list[Message]:
        """Up to batch_size records: what the client has fetched, or the first to arrive within
        POLL_TIMEOUT_S, then what the client has with it, and for a stream of GATHER_FROM_PER_S
        records/s or more what arrives within LINGER_S more. librdkafka's consume waits for a full
        batch or the timeout, which held every record of a slow stream (1,000 rows/s) up to 100 ms;
        a fast stream's batches taken as they come were so small that their fixed cost (a poll, a
        JSON read, a Spark step) took the throughput down; a slow stream's waited LINGER_S for
        a few records more (p50 29 ms at 1,000 records/s, bench/kafka.py)."""
        consume, size = self.consumer.consume, self.batch_size
        messages = consume(size, timeout=0) or consume(1, timeout=self.waiting(POLL_TIMEOUT_S))
        if messages and len(messages) < size:
            messages += consume(size - len(messages), timeout=LINGER_S if self.rate_per_s >= GATHER_FROM_PER_S else 0)
        self._count(len(messages))
        return messages

    def _count(self, fetched: int) -> None:
        now = time.monotonic()
        self._counted += fetched
        if now - self._counting_since >= RATE_WINDOW_S:
            self.rate_per_s = self._counted / (now - self._counting_since)
            self._counted, self._counting_since = 0, now

    def _on_error(self, error: KafkaError, message: Message, split: str) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            if split in self.positions:
                # past transaction markers too, which are never delivered as records
                self.positions[split] = max(self.positions[split], place(message)[2])
                if self.bounded and self.positions[split] >= self.ends[split]:
                    self._finish(split, message)
            return
        if error.fatal() or error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            raise KafkaConnectorError(f"{self.where}: reading {split} from {self.servers} failed: "
                                      f"{error.name()}: {error.str()}")
        log.warning("%s: %s from %s (the client retries): %s", self.where, error.name(), self.servers, error.str())

    def _finish(self, split: str, message: Message) -> None:
        self.finished.add(split)
        topic, partition, _ = place(message)
        self.consumer.pause([TopicPartition(topic, partition)])

    def _to_table(self, messages: list[Message]) -> pa.Table:
        if self.split_watermarks:  # each partition's rows together, in offset order
            messages.sort(key=lambda m: place(m)[:2])
        table, unfit = decode([m.value() for m in messages], self.format, self.schema, self.format_options)
        if unfit:
            self._route_malformed(messages, unfit)
        kept = [m for row, m in enumerate(messages) if row not in unfit] if unfit else messages
        for name in self.metadata:
            table = table.append_column(name, _metadata_column(name, kept))
        if self.split_watermarks:
            table = table.replace_schema_metadata({SPLIT_ROWS_METADATA: json.dumps(self._split_rows(kept))})
        return table

    def _split_rows(self, kept: list[Message]) -> dict:
        rows: list[list] = []
        for m in kept:
            split = self._split_of(m)
            if rows and rows[-1][0] == split:
                rows[-1][1] += 1
            else:
                rows.append([split, 1])
        return {"assigned": sorted(set(self.positions) - self.finished), "rows": rows}

    def _route_malformed(self, messages: list[Message], unfit: dict[int, str]) -> None:
        """A record that does not fit goes to the side output "malformed", never fails the job (it
        stays in the topic); unread, it is logged and counted."""
        self.malformed += len(unfit)
        rows = [(messages[row].topic(), f"{messages[row].partition()}:{messages[row].offset()}",
                 _text(messages[row].value()), reason) for row, reason in sorted(unfit.items())]
        if self.has_side_output(MALFORMED):
            self.side_output(MALFORMED, pa.Table.from_arrays(
                [pa.array(list(col), pa.string()) for col in zip(*rows)], schema=MALFORMED_SCHEMA))
        else:
            topic, position, raw, reason = rows[0]
            log.warning("%s: %d malformed record(s) skipped, first at %s %s: %s; the record: %r (read "
                        "stream.get_side_output(%r) to keep them)", self.where, len(rows), topic, position,
                        reason, raw[:200], MALFORMED)

    # ------------------------------------------------------------------ checkpoints
    def snapshot_position(self) -> dict:
        return {"offsets": dict(self.positions), "ends": dict(self.ends)}

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        if self.group_id is not None:
            self.committing[checkpoint_id] = [
                TopicPartition(*parse_split_id(split), offset) for split, offset in self.positions.items()]
        return OperatorSnapshot({"position": self.snapshot_position()})

    def restore_position(self, position: dict) -> None:
        self.restore_state([{"position": position}])

    def restore_state(self, handles: list[dict]) -> None:
        """Every old subtask's partitions: this subtask reads those it owns now."""
        self.restored, self.restored_ends = {}, {}
        for handle in handles:
            self.restored.update(handle["position"]["offsets"])
            self.restored_ends.update(handle["position"].get("ends", {}))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        done = [c for c in self.committing if c <= checkpoint_id]
        if not done:
            return
        offsets = self.committing[max(done)]
        for c in done:
            del self.committing[c]
        if offsets:
            try:
                self.consumer.commit(offsets=offsets, asynchronous=True)
            except KafkaException as exc:  # for monitoring only: the checkpoint holds the truth
                log.warning("%s: committing offsets to group %r failed: %s", self.where, self.group_id, describe(exc))

    def _measure(self) -> None:
        """Flink's pendingRecords (the consumer lag) and, per partition, its offset and lag
        (KafkaSourceReader.topic.<t>.partition.<p>.*), from the high watermark that each fetch
        brings (no request to the broker): measured on the task thread, read by any."""
        now = time.monotonic()
        if now < self.next_measure:
            return
        self.next_measure = now + METRICS_INTERVAL_S
        figures: dict = {"numRecordsMalformed": self.malformed}
        pending = 0
        for split, offset in self.positions.items():
            topic, partition = parse_split_id(split)
            high = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)[1]
            lag = max(0, high - offset) if high is not None and high >= 0 else 0
            pending += lag
            figures[f"KafkaSourceReader.topic.{topic}.partition.{partition}.currentOffset"] = offset
            figures[f"KafkaSourceReader.topic.{topic}.partition.{partition}.pendingRecords"] = lag
        figures["pendingRecords"] = pending
        self.figures = figures

    def metrics(self) -> dict:
        """Any thread: what the task thread measured last."""
        return self.figures

    def close(self) -> None:
        self.consumer.close()


def place(message: Message) -> tuple[str, int, int]:
    """A record's topic, partition and offset (an error of the client as a whole has none)."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    return topic or "", -1 if partition is None else partition, -1 if offset is None else offset


def _text(value: Union[str, bytes, None]) -> str:
    if isinstance(value, str):
        return value
    return "" if value is None else value.decode("utf-8", errors="replace")


def _metadata_column(name: str, messages: list[Message]) -> pa.Array:
    if name == "key":
        return pa.array([None if m.key() is None else _text(m.key()) for m in messages], pa.string())
    if name == "topic":
        return pa.array([m.topic() for m in messages], pa.string())
    if name == "partition":
        return pa.array([m.partition() for m in messages], pa.int32())
    if name == "offset":
        return pa.array([m.offset() for m in messages], pa.int64())
    if name == "timestamp":
        return pa.array([m.timestamp()[1] for m in messages], pa.int64()).cast(pa.timestamp("ms"))
    if name == "headers":
        return pa.array([[(k, None if v is None else _text(v)) for k, v in _headers(m)] for m in messages],
                        parse_type(KAFKA_METADATA_TYPES["headers"]))
    raise KafkaConnectorError(f"unknown metadata column {name!r} (known: {', '.join(KAFKA_METADATA_TYPES)})")


def _headers(message: Message) -> list[tuple[str, Union[str, bytes, None]]]:
    headers = message.headers() or []
    return list(headers.items()) if isinstance(headers, dict) else list(headers)
