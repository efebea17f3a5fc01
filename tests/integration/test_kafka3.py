"""The acker on a Kafka 3.x cluster (issue 32): its default group protocol (``consumer``,
KIP-848) needs Kafka >= 4.0 - on 3.9 librdkafka's member waits forever without an error. The
acker tells from the cluster and joins with the classic protocol and the range assignor, in
one log line; so does a task (cooperative-sticky); records complete through them with the
default settings.

A Kafka 3.9 of its own, started by the embedded launcher from Maven Central jars
(``REPLAYBROKER_KAFKA_VERSION``; resolved once into the local Maven repository)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.completions import OutcomeTail
from broker.dev.kafka_local import LocalKafka
from broker.dev.testing import unique_name
from broker.kafka_io import consumer_group_protocol
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskContext, TaskRecord

pytestmark = pytest.mark.integration

KAFKA_3 = "3.9.0"
RECORDS = 200


@pytest.fixture(scope="module")
def kafka3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REPLAYBROKER_KAFKA_VERSION", KAFKA_3)
        broker = LocalKafka(Path(tmp_path_factory.mktemp("kafka3")) / "run")
        state = broker.start()
    assert state.kafka_version == KAFKA_3
    try:
        yield state.bootstrap
    finally:
        broker.stop()


def test_the_shared_broker_has_the_consumer_protocol(bootstrap: str) -> None:
    assert consumer_group_protocol(KafkaSettings(bootstrap), unique_name("g")) is True


def test_records_complete_through_an_acker_with_default_settings_on_kafka_3(
    kafka3: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = KafkaSettings(kafka3)
    assert consumer_group_protocol(settings, unique_name("g")) is False
    ns = topics.Namespace(unique_name("kafka3"))
    data = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {data: 2})

    def ack(record: TaskRecord, ctx: TaskContext) -> None:
        return None

    caplog.set_level(logging.INFO, "broker.acker")
    caplog.set_level(logging.INFO, "broker.task")
    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("a"), stats_interval_ms=3_600_000))
    task = Task(settings, ns, [data, topics.replay_topic(data)], unique_name("leaf"), ack)
    tail = OutcomeTail(settings, ns)
    stop = threading.Event()
    threads = [threading.Thread(target=acker.run, kwargs={"until": lambda _a: stop.is_set()}, daemon=True),
               threading.Thread(target=task.run, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        with Source(settings, ns, SourceConfig(timeout_ms=600_000)) as source:
            sent = {source.send(data, f"k{i}", b"v").origin for i in range(RECORDS)}
        deadline = time.monotonic() + 120
        while not sent <= set(tail.log.completed_origins()):
            assert time.monotonic() < deadline, (
                f"{len(sent - set(tail.log.completed_origins()))} of {RECORDS} never completed"
            )
            tail.poll(0.2)
    finally:
        stop.set()
        task.stop()
        for thread in threads:
            thread.join(30)
        tail.close()
    assert all(n == 1 for n in tail.log.completed_origins().values())
    assert acker.config.group_protocol == "classic"
    said = [r.getMessage() for r in caplog.records if "consumer group protocol" in r.getMessage()]
    assert len(said) == 2, said
    assert "--group-protocol classic" in next(m for m in said if "the acker" in m)
    assert "cooperative-sticky" in next(m for m in said if "task" in m)
    assert sorted(acker.last_assignment["owned"]) == [0, 1]  # type: ignore[call-overload]
