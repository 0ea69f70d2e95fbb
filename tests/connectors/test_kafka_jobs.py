"""Kafka jobs end to end: the session cluster against a real Kafka broker (KRaft), results
compared with pandas over what a read_committed consumer of confluent-kafka sees."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from cluster.protocol.states import JobState
from kernel_runtime import JobCancelledError, JobExecutionError, StreamEnvironment
from kernel_runtime.api import (Duration, GraphValidationError, KafkaSink, KafkaSource, Time,
                                TumblingEventTimeWindows, WatermarkStrategy)
from kernel_runtime.api.schema import schema_type_names
from tests.conftest import wait_for
from tests.connectors.kafka_topics import add_partitions, new_topic, produce, produce_rows, read_frame

SCHEMA = "user string, amount bigint, price double, ts bigint"


def orders(n: int, start: int = 0) -> pd.DataFrame:
    seq = np.arange(start, start + n)
    return pd.DataFrame({"user": [f"u{i}" for i in (seq * 7919) % 7], "amount": seq % 11, "price": seq / 8,
                         "ts": seq * 10})


def expected_windows(frame: pd.DataFrame) -> pd.DataFrame:
    kept = frame[frame.amount > 2].assign(amount2=lambda df: df.amount * 2)
    kept = kept.assign(start=kept.ts - kept.ts % 1_000)
    out = kept.groupby(["user", "start"]).agg(n=("amount2", "count"), total=("amount2", "sum")).reset_index()
    out["window_start"] = pd.to_datetime(out.start, unit="ms")
    return out[["user", "window_start", "n", "total"]].sort_values(["user", "window_start"]).reset_index(drop=True)


def windows_of(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.assign(window_start=pd.to_datetime(frame.window_start))
    return frame[["user", "window_start", "n", "total"]].sort_values(["user", "window_start"]).reset_index(drop=True)


def job(env, servers: str, source_topic: str, out_topic: str, delivery: str = "exactly-once", **source):
    # keyed by user, each partition's records are in event-time order; with a watermark per
    # partition (not per subtask, which reads several) no record is late, so the result is exact
    stream = env.from_source(
        KafkaSource.json(servers, source_topic, schema=SCHEMA, **source),
        WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(0)).with_timestamp_column("ts"))
    (stream.sql("SELECT user, amount * 2 AS amount2, ts FROM input WHERE amount > 2")
        .key_by("user").window(TumblingEventTimeWindows.of(Time.seconds(1)))
        .aggregate(n=("amount2", "count"), total=("amount2", "sum"))
        .sink_to(KafkaSink.json(servers, out_topic, delivery=delivery, key="user")))
    return env


def test_kafka_sql_window_to_kafka_exactly_once_equals_pandas(cluster, client, kafka_bootstrap):
    source, out = new_topic(kafka_bootstrap, 3), new_topic(kafka_bootstrap, 2)
    frame = orders(3_000)
    produce_rows(kafka_bootstrap, source, frame, key="user")
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir,
                            config={"execution.checkpointing.interval": "300 ms"})
    job(env, kafka_bootstrap, source, out, bounded=True, batch_size=200)
    result = env.execute_async("kafka windows", client=client).wait(120)
    assert result.state == JobState.FINISHED
    pd.testing.assert_frame_equal(windows_of(read_frame(kafka_bootstrap, out)), expected_windows(frame),
                                  check_dtype=False)


@pytest.mark.parametrize("parallelism", [1, 4])
def test_every_partition_is_read_once_whatever_the_parallelism(cluster, client, kafka_bootstrap, parallelism):
    topic = new_topic(kafka_bootstrap, 3)
    # keyed, so the records spread over the partitions: keyless ones go where librdkafka's sticky
    # partitioner sticks for linger.ms, which may be one partition for all 900
    produce(kafka_bootstrap, topic, (json.dumps({"i": i}).encode() for i in range(900)),
            (str(i).encode() for i in range(900)))
    env = StreamEnvironment(parallelism=parallelism, cluster=cluster.cluster_dir)
    (env.from_source(KafkaSource.json(kafka_bootstrap, topic, schema="i bigint", bounded=True,
                                      metadata=["partition", "offset"], batch_size=50))
        .collect("rows"))
    rows = env.execute_async(f"partitions at p{parallelism}", client=client).wait(120).to_pandas("rows")
    assert sorted(rows.i) == list(range(900))
    assert len(rows.drop_duplicates(["partition", "offset"])) == 900
    assert set(rows.partition) == {0, 1, 2}


def test_a_partition_added_while_the_job_runs_is_read_from_its_start(cluster, client, kafka_bootstrap):
    topic = new_topic(kafka_bootstrap, 2)
    produce(kafka_bootstrap, topic, (json.dumps({"i": i}).encode() for i in range(100)))
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_source(KafkaSource.json(kafka_bootstrap, topic, schema="i bigint", metadata=["partition"],
                                      discovery_interval=0.2))
        .collect("rows"))
    handle = env.execute_async("partition discovery", client=client)
    try:
        handle.wait_for_rows(100, timeout=120, sink="rows")
        add_partitions(kafka_bootstrap, topic, 3)
        # written before the job finds the partition: read all the same, from the partition's start
        produce(kafka_bootstrap, topic, (json.dumps({"i": i}).encode() for i in range(100, 150)), partition=2)
        handle.wait_for_rows(150, timeout=120, sink="rows")
        rows = handle.results_of("rows")
        # what the dashboard's source view shows: each partition's offset and lag, the new one's too
        offset = f"KafkaSourceReader.topic.{topic}.partition.2.currentOffset"
        wait_for(lambda: any((s.get("metrics") or {}).get(offset) == 50
                             for s in client.job_details(handle.job_id)["subtasks"]), 60, "partition 2's offset")
    finally:
        handle.cancel()
        with pytest.raises(JobCancelledError):
            handle.wait(60)
    assert sorted(rows.i) == list(range(150))
    assert sorted(rows[rows.partition == 2].i) == list(range(100, 150))


def test_malformed_records_and_records_that_do_not_fit_go_to_the_side_output(cluster, client, kafka_bootstrap):
    topic = new_topic(kafka_bootstrap, 1)
    produce(kafka_bootstrap, topic, [b'{"i": 1, "s": "a"}', b'{not json', b'{"i": "two", "s": "b"}', b'[1, 2]',
                                     b'{"i": 3}'])
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    stream = env.from_source(KafkaSource.json(kafka_bootstrap, topic, schema="i bigint, s string", bounded=True))
    stream.collect("rows")
    stream.get_side_output("malformed").collect("malformed")
    result = env.execute_async("malformed kafka records", client=client).wait(120)
    rows = result.to_pandas("rows").sort_values("i").reset_index(drop=True)
    assert rows.i.tolist() == [1, 3] and rows.s.tolist()[0] == "a" and pd.isna(rows.s.iloc[1])
    bad = result.to_pandas("malformed").sort_values("position").reset_index(drop=True)
    assert bad.source.tolist() == [topic] * 3
    assert bad.position.tolist() == ["0:1", "0:2", "0:3"]
    assert bad.raw.tolist() == ['{not json', '{"i": "two", "s": "b"}', '[1, 2]']
    assert all(bad.reason.str.len() > 0) and "'i'" in bad.reason.iloc[1]


def test_an_unknown_broker_is_a_clear_error_naming_the_servers(cluster, client):
    servers = "127.0.0.1:1"
    with pytest.raises(GraphValidationError, match=r"cannot reach the Kafka brokers at 127\.0\.0\.1:1"):
        KafkaSource.json(servers, "orders", request_timeout=2)  # the schema is inferred: asked now
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    env.from_source(KafkaSource.json(servers, "orders", schema="i bigint", bounded=True, request_timeout=2)).collect()
    with pytest.raises(JobExecutionError, match=r"cannot reach the Kafka brokers at 127\.0\.0\.1:1 within 2 s"):
        env.execute_async("unknown broker", client=client).wait(120)


def test_a_missing_topic_is_an_error_naming_it(cluster, client, kafka_bootstrap):
    with pytest.raises(GraphValidationError, match=r"topic 'no-such-topic' does not exist"):
        KafkaSource.json(kafka_bootstrap, "no-such-topic")
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    env.from_source(KafkaSource.json(kafka_bootstrap, "no-such-topic", schema="i bigint", bounded=True)).collect()
    with pytest.raises(JobExecutionError, match=r"topic 'no-such-topic' does not exist"):
        env.execute_async("missing topic", client=client).wait(120)


def test_a_missing_sink_topic_fails_the_job_at_submission_naming_it(cluster, client, kafka_bootstrap):
    # however many restarts its strategy allows: the brokers do not create topics, so none would help
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir, config={
        "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 1000,
        "restart-strategy.fixed-delay.delay": "100 ms"})
    env.from_generator(count=10).sink_to(KafkaSink.json(kafka_bootstrap, "no-such-sink-topic", name="orders out"))
    handle = env.execute_async("missing sink topic", client=client)
    with pytest.raises(JobExecutionError) as failed:
        handle.wait(120)
    message = failed.value.failure
    assert "KafkaTopicMissing: operator 'orders out'" in message
    assert f"topic 'no-such-sink-topic' does not exist on the Kafka brokers at {kafka_bootstrap}" in message
    assert "The job was not restarted: no restart can fix its failure." in message
    assert "failed on TaskManager" not in message  # found before any task was deployed
    status = client.job_status(handle.job_id)
    assert status.state == JobState.FAILED and status.attempt == 1  # its first, never restarted
    assert all(row["status"] == "CANCELED" for row in client.job_details(handle.job_id)["subtasks"])


KNOWN_RECORDS = [
    {"id": 1, "price": 2.5, "name": "a", "ok": True, "at": "2026-11-26T10:00:00",
     "address": {"city": "Oslo", "zip": 150}, "tags": ["x", "y"]},
    {"id": 2, "price": 3, "name": "b", "ok": False, "at": "2026-11-26T10:00:01.250",
     "address": {"city": "Rome"}, "tags": []},
    {"id": 3, "name": "c", "at": "2026-11-26T10:00:02", "tags": ["z"], "address": {"zip": 100}},
]
DECLARED = ("id bigint, price double, name string, ok boolean, at timestamp, "
            "address struct<city: string, zip: bigint>, tags array<string>")


def test_an_inferred_schema_equals_the_declared_one_and_a_record_that_does_not_fit_goes_aside(
        cluster, client, kafka_bootstrap, capsys):
    topic = new_topic(kafka_bootstrap, 1)  # one partition: the records are sampled in the order written
    produce(kafka_bootstrap, topic, (json.dumps(r).encode() for r in KNOWN_RECORDS))
    inferred = KafkaSource.json(kafka_bootstrap, topic, bounded=True)
    assert inferred.params["schema"] == schema_type_names(DECLARED, "declared")
    shown = capsys.readouterr().out
    assert "schema inferred from the newest 3 records" in shown and "KafkaSource.json(..., schema=" in shown
    # the schema is fixed in the job graph: a later record of another shape is malformed, not a failure
    produce(kafka_bootstrap, topic, [json.dumps({"id": "four"}).encode()])
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    stream = env.from_source(inferred)
    stream.collect("rows")
    stream.get_side_output("malformed").collect("malformed")
    result = env.execute_async("inferred schema", client=client).wait(120)
    rows = result.to_pandas("rows").sort_values("id").reset_index(drop=True)
    assert rows.id.tolist() == [1, 2, 3]
    assert rows.address.tolist()[0] == {"city": "Oslo", "zip": 150} and list(rows.tags[0]) == ["x", "y"]
    assert pd.Timestamp(rows["at"][1]) == pd.Timestamp("2026-11-26T10:00:01.250")
    assert result.to_pandas("malformed").raw.tolist() == ['{"id": "four"}']
