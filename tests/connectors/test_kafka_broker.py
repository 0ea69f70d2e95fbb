"""The test broker itself (kernel_runtime.deploy.kafka_broker): it runs transactions as a
connector's exactly-once sink needs them, and ``streamlab kafka start|stop`` runs one for a user."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kernel_runtime.deploy.kafka_broker import BROKER_FILE, KafkaBroker
from tests.conftest import wait_for

STREAMLAB = Path(sys.executable).parent / "streamlab"


def read_to_end(bootstrap: str, topic: str, isolation: str) -> list[tuple[bytes, bytes]]:
    """Every record of the topic's one partition that this isolation level shows, up to its end."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.partition.eof": True,
                         "isolation.level": isolation})
    consumer.subscribe([topic])
    records: list[tuple[bytes, bytes]] = []
    try:
        def at_end() -> bool:
            msg = consumer.poll(0.5)
            if msg is None:
                return False
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                return True
            records.append((msg.key(), msg.value()))
            return False
        wait_for(at_end, 60, f"the end of {topic}")
    finally:
        consumer.close()
    return records


def committed_in_a_new_topic(bootstrap: str, prefix: str, records: int) -> tuple[str, Producer]:
    """A new topic of one partition with ``records`` records (k<i>, v<i>) committed in one
    transaction; the topic and its transactional producer."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held: its futures fail once it is collected
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(records):
        producer.produce(topic, value=f"v{i}".encode(), key=f"k{i}".encode())
    producer.commit_transaction(30)
    return topic, producer


def test_a_committed_transaction_is_read_and_an_aborted_one_is_not(kafka_bootstrap):
    topic, producer = committed_in_a_new_topic(kafka_bootstrap, "txn", 10)
    producer.begin_transaction()
    for i in range(10, 15):
        producer.produce(topic, value=f"v{i}".encode(), key=f"k{i}".encode())
    producer.flush(30)  # on the broker, then thrown away: only read_uncommitted may see them
    producer.abort_transaction(30)

    committed = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(10)]
    assert read_to_end(kafka_bootstrap, topic, "read_committed") == committed
    assert read_to_end(kafka_bootstrap, topic, "read_uncommitted") == committed + [
        (f"k{i}".encode(), f"v{i}".encode()) for i in range(10, 15)]


def test_the_cli_starts_a_broker_that_answers_and_stops_it(tmp_path):
    directory = tmp_path / "broker"
    started = subprocess.run([str(STREAMLAB), "kafka", "start", "--dir", str(directory)],
                             capture_output=True, text=True, timeout=300)
    try:
        assert started.returncode == 0, started.stderr
        address = started.stdout.strip()
        pid = json.loads((directory / BROKER_FILE).read_text())["pid"]
        assert address == f"127.0.0.1:{json.loads((directory / BROKER_FILE).read_text())['port']}"
        broker = KafkaBroker.from_dir(directory)
        assert broker.running() and broker.answers()

        again = subprocess.run([str(STREAMLAB), "kafka", "start", "--dir", str(directory)],
                               capture_output=True, text=True, timeout=60)
        assert (again.returncode, again.stdout.strip()) == (0, address)  # the same broker, not a second

        stopped = subprocess.run([str(STREAMLAB), "kafka", "stop", "--dir", str(directory)],
                                 capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or not broker.running(), 30, "the broker's process to end")
        assert not (directory / BROKER_FILE).exists()
        assert not broker.answers()

        again = subprocess.run([str(STREAMLAB), "kafka", "stop", "--dir", str(directory)],
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and f"no Kafka broker was started in {directory}" in again.stderr
    finally:
        if (directory / BROKER_FILE).exists():
            KafkaBroker.from_dir(directory).stop()


def test_a_cluster_id_that_begins_with_a_dash_formats_and_starts(tmp_path, monkeypatch):
    # a random id begins with "-" one time in 64 (URL-safe base64); StorageTool's parser took it
    # for an option, and the broker of a whole test worker failed to start (CI)
    from kernel_runtime.deploy import kafka_broker
    random_id = kafka_broker.random_cluster_id
    monkeypatch.setattr(kafka_broker, "random_cluster_id", lambda: "-" + random_id()[1:])
    broker = KafkaBroker(tmp_path / "dash").start()
    try:
        assert broker.answers()
    finally:
        broker.stop()


def test_a_restarted_broker_keeps_its_address_topics_and_committed_records(tmp_path):
    broker = KafkaBroker(tmp_path / "restarted").start()
    try:
        address = broker.bootstrap
        topic, _ = committed_in_a_new_topic(address, "kept", 5)
        before = broker.pid()
        broker.restart()
        assert broker.pid() != before and broker.bootstrap == address and broker.answers()
        assert read_to_end(address, topic, "read_committed") == [(f"k{i}".encode(), f"v{i}".encode()) for i in range(5)]
    finally:
        broker.stop()
