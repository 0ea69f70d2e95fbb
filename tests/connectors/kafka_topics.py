"""Topics of the test broker: made, filled and read back with confluent-kafka, never through our code."""
from __future__ import annotations

import json
import uuid
from typing import Iterable, Optional

import pandas as pd
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from tests.conftest import wait_for


def new_topic(servers: str, partitions: int, prefix: str = "t") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": servers})  # held: its futures fail once it is collected
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(30)
    return name


def add_partitions(servers: str, topic: str, total: int) -> None:
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_partitions([NewPartitions(topic, total)])[topic].result(30)


def produce(servers: str, topic: str, values: Iterable[bytes], keys: Optional[Iterable[Optional[bytes]]] = None,
            partition: Optional[int] = None) -> int:
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 5, "enable.idempotence": True})
    if partition is not None:
        # a partition added just now may be missing from this producer's first metadata (CI run 17:
        # _UNKNOWN_PARTITION): wait until the broker's metadata has it
        wait_for(lambda: partition in producer.list_topics(topic, timeout=10).topics[topic].partitions, 60,
                 f"partition {partition} of {topic} in the producer's metadata")
    failed: list = []
    n = 0
    for i, (value, key) in enumerate(zip(values, keys if keys is not None else _nones())):
        kwargs = {} if partition is None else {"partition": partition}
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=lambda err, msg: err and failed.append(err), **kwargs)
                break
            except BufferError:
                producer.poll(0.05)
        n = i + 1
    assert producer.flush(60) == 0 and not failed, failed[:1]
    return n


def _nones():
    while True:
        yield None


def produce_rows(servers: str, topic: str, frame: pd.DataFrame, key: Optional[str] = None) -> int:
    records = frame.to_dict(orient="records")
    keys = None if key is None else [str(r[key]).encode() for r in records]
    return produce(servers, topic, (json.dumps(r).encode() for r in records), keys)


def read_committed(servers: str, topic: str, expected: Optional[int] = None) -> list:
    """Every record of the topic a read_committed consumer sees, up to its end now (or until
    ``expected`` records arrived): Message objects, partition by partition in offset order."""
    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        messages: list = []
        at_end: set[int] = set()

        def caught_up() -> bool:
            for m in consumer.consume(1000, timeout=0.2):
                if m.error() is None:
                    messages.append(m)
                    at_end.discard(m.partition())
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
            if expected is not None:
                return len(messages) >= expected
            return len(at_end) == len(partitions)

        wait_for(caught_up, 120, f"the records of {topic}")
        return messages
    finally:
        consumer.close()


def read_frame(servers: str, topic: str, expected: Optional[int] = None) -> pd.DataFrame:
    return pd.DataFrame([json.loads(m.value()) for m in read_committed(servers, topic, expected)])
