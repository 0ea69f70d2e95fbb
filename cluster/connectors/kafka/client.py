"""What the Kafka source and sink share: librdkafka's configuration, errors that name the servers
and the topic, and which source subtask owns which partition.

Nothing of Kafka's protocol is ours: confluent-kafka (librdkafka) does all of it.
"""
from __future__ import annotations

import re
from typing import Collection, Optional

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

DEFAULT_REQUEST_TIMEOUT_S = 30.0  # Flink's request.timeout.ms default for the Kafka clients


class KafkaConnectorError(RuntimeError):
    """A Kafka source or sink cannot go on: the message names the servers, the topic and the operator."""


class KafkaTopicMissing(KafkaConnectorError):
    """A topic the job names is not on the brokers, which answered: the brokers do not create
    topics, so every attempt would fail the same way."""
    restart_cannot_fix = True  # cluster.common.failures


# how long a check at submission waits for the brokers: one that gets no answer lets the job start
# (brokers that are down are something a restart fixes; the tasks say so, or run once they are up)
SUBMISSION_CHECK_TIMEOUT_S = 5.0


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (32-bit, signed), which Flink's partition assignment starts from."""
    data = text.encode("utf-16-be")  # Java hashes UTF-16 code units
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_owner(topic: str, partition: int, parallelism: int) -> int:
    """The source subtask that reads ``partition`` of ``topic``: Flink's KafkaSourceEnumerator
    spreads a topic's partitions round-robin from a start index that depends on the topic, so
    every subtask computes the same assignment without asking anyone, and a partition added
    later lands on a known subtask."""
    start = ((java_string_hash(topic) * 31) & 0x7FFFFFFF) % parallelism
    return (start + partition) % parallelism


def split_id(topic: str, partition: int) -> str:
    """A partition as Flink names its split (topic-partition), the key of positions and metrics."""
    return f"{topic}-{partition}"


def parse_split_id(split: str) -> tuple[str, int]:
    topic, _, partition = split.rpartition("-")
    return topic, int(partition)


def consumer_config(servers: str, group_id: Optional[str], properties: dict, request_timeout_s: float) -> dict:
    config = {
        "bootstrap.servers": servers,
        # offsets live in checkpoints: the group only hears of them when a checkpoint completes
        "group.id": group_id or "streamlab-unused",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,  # a bounded read knows it reached the end of a partition
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "socket.timeout.ms": int(request_timeout_s * 1000),
        "topic.metadata.refresh.interval.ms": 60_000,
        "fetch.wait.max.ms": 50,  # a poll returns soon, so barriers and cancellation are not held up
        "queued.max.messages.kbytes": 65_536,
        # librdkafka's default, 1 s, held the next fetch that long each time the fetched records passed
        # queued.min.messages (100,000): a source that reads 100k records/s then ran dry and waited
        # for most of each second (bench/kafka.py: 109k -> 262k rows/s on the pandas path)
        "fetch.queue.backoff.ms": 10,
        "log_level": 3,
    }
    return config | dict(properties)


def topic_partitions(consumer: Consumer, servers: str, topics: list[str], pattern: Optional[str],
                     timeout_s: float, where: str) -> dict[str, int]:
    """topic -> partition count of the topics read (the pattern's matches, or the named topics,
    each of which must exist)."""
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise KafkaConnectorError(f"{where}: cannot reach the Kafka brokers at {servers} within "
                                  f"{timeout_s:g} s ({describe(exc)})") from None
    known = {name: len(t.partitions) for name, t in metadata.topics.items()
             if t.error is None and not name.startswith("__")}
    if pattern is not None:
        matcher = re.compile(pattern)
        return {name: n for name, n in known.items() if matcher.fullmatch(name)}
    require_topics(known, topics, servers, where)
    return {t: known[t] for t in topics}


def require_topics(known: Collection[str], topics: list[str], servers: str, where: str) -> None:
    """Raise KafkaTopicMissing unless every one of ``topics`` is among the ``known`` ones."""
    missing = [t for t in topics if t not in known]
    if missing:
        raise KafkaTopicMissing(f"{where}: topic {', '.join(map(repr, missing))} does not exist on the "
                                f"Kafka brokers at {servers} (known topics: {', '.join(sorted(known)) or 'none'})")


def check_topics_at_submission(servers: str, topics: list[str], properties: dict, where: str) -> None:
    """Before a job is deployed (the JobManager, off its loop): raise KafkaTopicMissing if the
    brokers answer that a topic the job reads or writes does not exist; nothing if they do not
    answer within SUBMISSION_CHECK_TIMEOUT_S."""
    if not topics:
        return
    try:
        config: dict[str, str | int | float | bool] = {
            "bootstrap.servers": servers, "log_level": 3, "socket.timeout.ms": int(SUBMISSION_CHECK_TIMEOUT_S * 1000)}
        admin = AdminClient(config | dict(properties))
        metadata = admin.list_topics(timeout=SUBMISSION_CHECK_TIMEOUT_S)
    except KafkaException:  # properties librdkafka refuses, or no answer: the tasks report what it is
        return
    known = {name for name, t in metadata.topics.items() if t.error is None}
    require_topics(known, topics, servers, where)


def describe(exc: BaseException) -> str:
    error = exc.args[0] if exc.args else None
    if isinstance(error, KafkaError):
        return f"{error.name()}: {error.str()}"
    return str(exc)


def offsets_for_timestamp(consumer: Consumer, parts: list[TopicPartition], timestamp_ms: int,
                          timeout_s: float) -> dict[tuple[str, int], int]:
    """The first offset at or after ``timestamp_ms`` per partition (the end where none is)."""
    asked = [TopicPartition(tp.topic, tp.partition, timestamp_ms) for tp in parts]
    found = consumer.offsets_for_times(asked, timeout=timeout_s)
    result = {}
    for tp in found:
        offset = tp.offset
        if offset < 0:  # no record that late: the end of the partition
            offset = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=timeout_s)[1]
        result[(tp.topic, tp.partition)] = offset
    return result
