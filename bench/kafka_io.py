"""Kafka plumbing of bench/kafka.py: topics, the pre-loaded input, a paced producer (a process of
its own), the output topic's end offsets and its records' timestamps, the peers' connector jars, and
the client-loop peer (a process of its own).

Everything here talks to the broker through confluent-kafka directly, never through streamlab's
connectors, so every peer is measured by the same yardstick.

    python bench/kafka_io.py produce SERVERS TOPIC RATE SECONDS FIRST_SEQ TS_FILE   (run by kafka.py)
    python bench/kafka_io.py loop SERVERS TOPIC OUT_TOPIC                           (run by kafka.py)
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
JARS = Path.home() / ".cache/streamlab/kafka-bench-jars"
POM = BENCH / "kafka" / "pom.xml"

# the filter keeps amount > 2: amount = seq % 50, so 47 in 50 records pass
SCHEMA = "seq bigint, user string, amount bigint, price double, ts bigint"


def record(seq: int, ts: int) -> bytes:
    return (f'{{"seq": {seq}, "user": "u{seq % 100}", "amount": {seq % 50}, "price": {seq % 7 + 0.5}, '
            f'"ts": {ts}}}').encode()


def passes(seqs: np.ndarray) -> np.ndarray:
    return seqs % 50 > 2


def admin(servers: str):
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": servers, "log_level": 3})


def new_topic(servers: str, prefix: str, partitions: int = 1) -> str:
    from confluent_kafka.admin import NewTopic
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client = admin(servers)  # held until the future is done: its futures fail once it is collected
    client.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(30)
    return name


def preload(servers: str, topic: str, n: int, first: int = 0) -> float:
    """n records (seq first..first+n-1), round-robin over the topic's partitions; seconds taken."""
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 50, "batch.size": 1_000_000,
                         "batch.num.messages": 100_000, "queue.buffering.max.messages": 2_000_000,
                         "enable.idempotence": False, "acks": 1})
    deadline = time.monotonic() + 30
    while not (parts := len(producer.list_topics(topic, timeout=30).topics[topic].partitions)):
        if time.monotonic() > deadline:  # a new topic's partitions show once their leader is elected
            raise RuntimeError(f"pre-loading {topic}: the broker shows no partition of it within 30 s")
        time.sleep(0.1)
    started = time.perf_counter()
    ts = int(time.time() * 1000)
    produce = producer.produce
    for seq in range(first, first + n):
        while True:
            try:
                produce(topic, record(seq, ts), partition=seq % parts)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(300):
        raise RuntimeError(f"pre-loading {topic}: records not acknowledged within 300 s")
    return time.perf_counter() - started


class Offsets:
    """The end offsets of topics (one request per partition to the broker; nothing is read)."""

    def __init__(self, servers: str):
        from confluent_kafka import Consumer
        self.consumer = Consumer({"bootstrap.servers": servers, "group.id": "bench-offsets",
                                  "enable.auto.commit": False})
        self.partitions: dict[str, int] = {}

    def end(self, topic: str) -> int:
        from confluent_kafka import TopicPartition
        if topic not in self.partitions:
            self.partitions[topic] = len(self.consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        return sum(self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                   for p in range(self.partitions[topic]))

    def wait(self, topic: str, n: int, timeout: float, failed=lambda: None, every: float = 0.01) -> tuple[float, float]:
        """Poll until the topic's end offsets add up to n: (monotonic time of the first record seen,
        of the n-th). ``failed()`` names a peer's failure (its error text) or returns None."""
        deadline, first = time.perf_counter() + timeout, None
        while True:
            end, now = self.end(topic), time.perf_counter()
            if end and first is None:
                first = now
            if end >= n:
                return first, now
            if now > deadline:
                raise TimeoutError(f"{topic}: {end:,} of {n:,} records after {timeout:g} s")
            error = failed()
            if error:
                raise RuntimeError(error)
            time.sleep(every)

    def close(self) -> None:
        self.consumer.close()


def output_timestamps(servers: str, topic: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(seq, Kafka timestamp in ms) of the first n records of the output topic."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        seqs, stamps = np.empty(n, np.int64), np.empty(n, np.int64)
        got, deadline = 0, time.monotonic() + 300
        loads = json.loads
        while got < n and time.monotonic() < deadline:
            for m in consumer.consume(10_000, timeout=0.5):
                if m.error() is None and got < n:
                    seqs[got], stamps[got] = loads(m.value())["seq"], m.timestamp()[1]
                    got += 1
        return seqs[:got], stamps[:got]
    finally:
        consumer.close()


def start_producer(servers: str, topic: str, rate: int, seconds: float, first_seq: int, ts_file: Path):
    return subprocess.Popen([sys.executable, str(Path(__file__)), "produce", servers, topic, str(rate),
                             str(seconds), str(first_seq), str(ts_file)], stdout=subprocess.PIPE, text=True)


def produce_paced(servers: str, topic: str, rate: int, seconds: float, first_seq: int, ts_file: str) -> None:
    """Produce ``rate`` records a second for ``seconds``, each stamped (its Kafka CreateTime) when it
    is handed to the client; save every record's stamp (index: seq - first_seq) to ts_file."""
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 1, "enable.idempotence": False, "acks": 1,
                         "queue.buffering.max.messages": 2_000_000})
    total = int(rate * seconds)
    stamps = np.zeros(total, np.int64)
    produce, sent = producer.produce, 0
    started = time.perf_counter()
    while sent < total:
        due = min(total, int((time.perf_counter() - started) * rate) + 1)
        if due > sent:
            now_ms = int(time.time() * 1000)
            for i in range(sent, due):
                produce(topic, record(first_seq + i, now_ms), timestamp=now_ms)
            stamps[sent:due] = now_ms
            sent = due
            producer.poll(0)
        else:
            time.sleep(0.0002)
    elapsed = time.perf_counter() - started
    producer.flush(60)
    np.save(ts_file, stamps)
    print(json.dumps({"sent": sent, "seconds": elapsed}), flush=True)


def jars(profile: str, version: str) -> Path:
    """bench/kafka/pom.xml's profile (flink, spark) at a connector version, fetched with Maven into
    ~/.cache/streamlab/kafka-bench-jars/<profile>-<version>/ once."""
    prop = "flink.kafka.version" if profile == "flink" else "spark.version"
    return maven_jars(POM, JARS / f"{profile}-{version}", f"-P{profile}", f"-D{prop}={version}")


def maven_jars(pom: Path, home: Path, *options: str) -> Path:
    """A POM's runtime dependencies (``options``: a profile, properties) fetched with Maven into
    ``home`` once; nothing is built."""
    stamp = home / ".fetched"
    if stamp.exists():
        return home
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("Maven (mvn) is needed to fetch the peers' jars: make system-deps")
    shutil.rmtree(home, ignore_errors=True)
    done = subprocess.run([mvn, "-q", "-B", "-U", "-f", str(pom), *options, "dependency:copy-dependencies",
                           "-DincludeScope=runtime", f"-DoutputDirectory={home}"], capture_output=True, text=True)
    if done.returncode != 0:
        text = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)
        lines = [x for x in text.splitlines() if "ERROR" in x]
        raise RuntimeError(f"mvn -f {pom} {' '.join(options)} failed: {lines[0] if lines else done.stdout[-500:]}")
    stamp.write_text(" ".join(options))
    return home


def client_loop(servers: str, topic: str, out: str) -> None:
    """The bench's job without an engine: confluent-kafka's consumer, json.loads, the filter and
    projection in Python, json.dumps, its producer; the floor of Python's Kafka client here."""
    import uuid
    from confluent_kafka import Consumer, Producer
    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"client-loop-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    consumer.subscribe([topic])
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 5, "batch.num.messages": 10_000,
                         "queue.buffering.max.messages": 1_000_000, "acks": 1})
    consume, produce, loads, dumps = consumer.consume, producer.produce, json.loads, json.dumps
    while True:
        for message in consume(10_000, timeout=0) or consume(1, timeout=0.1):
            if message.error() is None:
                row = loads(message.value())
                if row["amount"] > 2:
                    total = row["amount"] * row["price"]
                    while True:
                        try:
                            produce(out, dumps({"seq": row["seq"], "user": row["user"], "total": total}).encode())
                            break
                        except BufferError:
                            producer.poll(0.05)
        producer.poll(0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["produce"]:
        s, t, r, secs, first, out = sys.argv[2:8]
        produce_paced(s, t, int(r), float(secs), int(first), out)
    elif sys.argv[1:2] == ["loop"]:
        client_loop(*sys.argv[2:5])
    else:
        sys.exit(__doc__)
