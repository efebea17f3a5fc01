from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition
from pyspark.sql import SparkSession

from broker.acker import Acker, AckerConfig
from broker.dev import maven
from broker.dev.testing import KafkaCluster
from broker.settings import KafkaSettings
from broker.topics import Namespace
from spark_jobs.session import build_spark_session


@pytest.fixture(scope="session")
def spark(kafka: KafkaCluster) -> Iterator[SparkSession]:
    """ONE Spark session for the whole run. ``build_spark_session`` always loads the Kafka
    connector jars (and Delta's, resolved here first): they cannot be added to a JVM that is
    already running, and every later ``getOrCreate`` (the demo's too) returns this session.

    It depends on ``kafka`` only to be stopped before it: Spark's cached Kafka producers
    would otherwise retry a vanished broker until the JVM exits."""
    maven.spark_kafka_connector_jars()  # resolved once (no-op when `setup` did it already)
    maven.delta_jars()
    session = build_spark_session(app_name="replaybroker-e2e")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def start_acker(bootstrap: str) -> Iterator[Callable[[Namespace], contextlib.AbstractContextManager[Acker]]]:
    """``with start_acker(ns) as acker:`` - an acker serving ``ns`` in a thread; stopped (and
    checked for a crash) on leaving the block."""

    @contextlib.contextmanager
    def start(ns: Namespace) -> Iterator[Acker]:
        acker = Acker(KafkaSettings(bootstrap), ns, AckerConfig(instance_id=f"{ns.name}-acker"))
        errors: list[BaseException] = []

        def run() -> None:
            try:
                acker.run()
            except BaseException as exc:
                errors.append(exc)
                raise

        thread = threading.Thread(target=run, name=f"acker-{ns.name}", daemon=True)
        thread.start()
        try:
            yield acker
        finally:
            acker.stop()
            thread.join(60)
        assert not errors, errors

    yield start


def consume(bootstrap: str, topic: str, partitions: int, count: int, timeout_s: float = 60.0) -> list[Message]:
    """The first ``count`` committed messages of ``topic`` (waits for them up to ``timeout_s``)."""
    consumer = Consumer(KafkaSettings(bootstrap).consumer_config(None, defaults={"group.id": "e2e.consume"}))
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < count and time.monotonic() < deadline:
            out += [m for m in consumer.consume(1000, 0.5) if m.error() is None]
    finally:
        consumer.close()
    return out


@pytest.fixture
def consume_topic(bootstrap: str) -> Callable[..., list[Message]]:
    return functools.partial(consume, bootstrap)
