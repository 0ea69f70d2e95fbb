"""A real Apache Kafka broker (KRaft, jars from Maven Central: make kafka-jars) for the session.

Started once per test session (per pytest-xdist worker), on free ports, in a temporary folder,
stopped after; a broker that cannot start fails the tests that need it, never skips them."""
from __future__ import annotations

import pytest

from kernel_runtime.deploy.kafka_broker import KafkaBroker, KafkaSetupError


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    try:
        broker = KafkaBroker(tmp_path_factory.mktemp("kafka")).start()
    except KafkaSetupError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield broker
    broker.stop()


@pytest.fixture
def kafka_bootstrap(kafka_broker) -> str:
    return kafka_broker.bootstrap
