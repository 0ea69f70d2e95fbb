"""Kafka -> .sql -> keyed tumbling window -> Kafka through 5 TaskManager SIGKILLs at random moments
and a stop-with-savepoint and resume in the middle: what a read_committed consumer sees of the
output topic equals pandas' windows row for row (exactly-once); the same windows written by an
at-least-once sink of the same job lose nothing.

Each partition's records are in event-time order and the source keeps a watermark per partition,
so no record is late and the windows are exact whatever the timing (tests/connectors/test_kafka_jobs.py).
"""
from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pandas as pd
import pytest

from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.api import Duration, KafkaSink, KafkaSource, Time, TumblingEventTimeWindows, WatermarkStrategy
from tests.conftest import start_cluster, wait_for
from tests.connectors.kafka_topics import new_topic, produce_rows, read_frame
from tests.connectors.test_kafka_jobs import SCHEMA, expected_windows, orders, windows_of
from tests.e2e.test_exactly_once import FAULTS, attempt_running, kill_repeatedly

# a replacement TaskManager starts its SparkSession (for .sql) before a restart needs it, and
# three of them leave warm slots to restart on
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
FAULT_CLUSTER = FAULTS | {"taskmanager.spark.startup": "eager"}

N = 24_000
BATCH = 50


def held_back_while(gate: str):
    """The job's map step: while the test kills TaskManagers (the ``gate`` file exists) each source
    batch takes half a second more, so that the job cannot end before the last kill however fast
    the machine; once the gate is gone, the job runs at full speed to its end."""
    def slowly(df: pd.DataFrame) -> pd.DataFrame:
        if os.path.exists(gate):
            time.sleep(0.5)
        return df
    return slowly


def submit(local, servers: str, source: str, outs: dict[str, str], gate: str, savepoint: str = ""):
    """One job, the windows written to a topic per delivery guarantee (``outs``: guarantee -> topic)."""
    config = {"execution.checkpointing.interval": "500 ms", "restart-strategy.type": "fixed-delay",
              "restart-strategy.fixed-delay.attempts": 100, "restart-strategy.fixed-delay.delay": "200 ms",
              # the .sql step's Spark stage takes a source batch at a time: by default it gathers what
              # the source reads while Spark is busy (a loaded machine's first Spark job: the whole
              # topic), and the held-back step after it then slept once for all of it, the job
              # ending before the first kill
              "execution.spark.max-batch-rows": BATCH}
    if savepoint:
        config["execution.savepoint.path"] = savepoint
    env = StreamEnvironment(parallelism=2, cluster=local.cluster_dir, config=config)
    stream = env.from_source(
        KafkaSource.json(servers, source, schema=SCHEMA, bounded=True, batch_size=BATCH),
        WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(0)).with_timestamp_column("ts"))
    windows = (stream.sql("SELECT user, amount * 2 AS amount2, ts FROM input WHERE amount > 2")
               .map_batches(held_back_while(gate), name="slowly")
               .key_by("user").window(TumblingEventTimeWindows.of(Time.seconds(1)))
               .aggregate(n=("amount2", "count"), total=("amount2", "sum")))
    for delivery, out in outs.items():
        windows.sink_to(KafkaSink.json(servers, out, delivery=delivery, key="user",
                                       transactional_id_prefix=f"{out}-{delivery}"), name=f"to Kafka, {delivery}")
    client = JobClient(local.info)
    return client, env.execute_async("kafka " + " and ".join(outs), client=client)


@pytest.fixture(scope="module")
def fault_cluster(tmp_path_factory):
    local = start_cluster(tmp_path_factory.mktemp("kafka-faults"), taskmanagers=3, **FAULT_CLUSTER)
    yield local
    local.stop()


@pytest.fixture(scope="module")
def input_topic(kafka_broker):
    topic = new_topic(kafka_broker.bootstrap, 3)
    frame = orders(N)
    produce_rows(kafka_broker.bootstrap, topic, frame, key="user")
    return topic, expected_windows(frame)


def run_with_kills(local, servers: str, source: str, outs: dict[str, str], kills: int, gate: Path,
                   savepoint: str = "", stop_in: str = "") -> str:
    """Submit, SIGKILL a busy TaskManager ``kills`` times while the job is held back, then let it
    run to its end, or stop it with a savepoint into ``stop_in`` (returned) while still held back."""
    gate.touch()
    client, handle = submit(local, servers, source, outs, str(gate), savepoint)
    try:
        kill_repeatedly(local, handle, client, kills=kills, running_within=240)
        if stop_in:  # once the attempt after the last kill runs (a failing job takes no savepoint)
            wait_for(lambda: attempt_running(local, handle, client, kills + 1), 240, f"attempt {kills + 1} running")
        location = handle.stop(target_directory=stop_in) if stop_in else ""
        gate.unlink()
        assert handle.wait(300).state.name == "FINISHED"
        return location
    finally:
        client.close()


def test_exactly_once_through_kills_and_a_stop_with_savepoint(fault_cluster, kafka_broker, input_topic, tmp_path):
    random.seed("kafka-exactly-once")
    servers = kafka_broker.bootstrap
    source, expected = input_topic
    # the same windows through the same kills, written exactly once and at least once
    outs = {"exactly-once": new_topic(servers, 2), "at-least-once": new_topic(servers, 2)}
    gate = tmp_path / "held-back"
    savepoint = run_with_kills(fault_cluster, servers, source, outs, 3, gate, stop_in=str(tmp_path / "savepoints"))
    run_with_kills(fault_cluster, servers, source, outs, 2, gate, savepoint=savepoint)
    got = windows_of(read_frame(servers, outs["exactly-once"]))
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    # at least once: a window fired again after a restart writes the same row again; nothing else may differ
    again = windows_of(read_frame(servers, outs["at-least-once"]))
    pd.testing.assert_frame_equal(again.drop_duplicates().reset_index(drop=True), expected, check_dtype=False)
