"""The acker's producer takes records as large as the topics it writes take
(broker.acker.limits): the broker decides what fits, not a smaller client limit."""

from __future__ import annotations

import pytest

from broker.acker import Acker, AckerConfig
from broker.acker.limits import HEADROOM_BYTES, KAFKA_DEFAULT_MAX_MESSAGE_BYTES
from broker.ledger.clock import ManualClock
from broker.settings import KafkaSettings
from tests.unit.fakes import FakeKafka
from tests.unit.test_acker_timeouts import NS, T0, fake_kafka  # noqa: F401 - the fixture


def _started(monkeypatch: pytest.MonkeyPatch, persist_max: int | None, **extra: object) -> Acker:
    acker = Acker(KafkaSettings("fake:9092", extra=extra), NS, AckerConfig(instance_id="unit"), clock=ManualClock(T0),
                  kafka=FakeKafka(persist_max_bytes=persist_max))
    acker.start()
    return acker


@pytest.mark.parametrize(
    ("persist_max", "limit"),
    [
        (None, KAFKA_DEFAULT_MAX_MESSAGE_BYTES + HEADROOM_BYTES),  # unreadable: Kafka's default assumed
        (KAFKA_DEFAULT_MAX_MESSAGE_BYTES, KAFKA_DEFAULT_MAX_MESSAGE_BYTES + HEADROOM_BYTES),
        (8_388_608, 8_388_608 + HEADROOM_BYTES),
    ],
)
def test_the_producer_limit_follows_what_persist_takes(
    fake_kafka: None, monkeypatch: pytest.MonkeyPatch, persist_max: int | None, limit: int  # noqa: F811
) -> None:
    acker = _started(monkeypatch, persist_max)
    assert acker.live.producer_config["message.max.bytes"] == limit
    assert acker.live.producer.conf["message.max.bytes"] == limit  # type: ignore[attr-defined] - the stand-in's
    assert acker.transactions.producer is acker.live.producer
    assert limit > 1_000_000  # librdkafka's default, below what a topic takes by default


def test_a_limit_the_user_set_stays(fake_kafka: None, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    acker = _started(monkeypatch, 8_388_608, **{"message.max.bytes": 2_000_000})
    assert acker.live.producer.conf["message.max.bytes"] == 2_000_000  # type: ignore[attr-defined]


@pytest.mark.parametrize(("partitions", "wait_ms"), [(4, 20), (100, 20), (500, 100), (1000, 200), (4000, 200)])
def test_the_group_consumers_fetch_wait_follows_p(
    fake_kafka: None, monkeypatch: pytest.MonkeyPatch, partitions: int, wait_ms: int  # noqa: F811
) -> None:
    """Measured at P = 1 000 on three brokers: one idle acker fetching its 2 000 input
    partitions every 20 ms cost the brokers 96 % of a core (no incremental fetch sessions in
    librdkafka: every fetch lists every partition). The wait grows with P, bounded."""
    acker = Acker(KafkaSettings("fake:9092"), NS, AckerConfig(instance_id="unit"), clock=ManualClock(T0),
                  kafka=FakeKafka(partitions=partitions))
    before = acker.live.consumer
    assert before.conf["fetch.wait.max.ms"] == 20  # type: ignore[attr-defined] - P unknown before start()
    acker.start()
    assert acker.live.consumer_config["fetch.wait.max.ms"] == wait_ms
    assert acker.live.consumer.conf["fetch.wait.max.ms"] == wait_ms  # type: ignore[attr-defined]
    assert (acker.live.consumer is before) == (wait_ms == 20)  # replaced only when it differs


def test_a_fetch_wait_the_user_set_stays_at_any_p(fake_kafka: None, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    acker = Acker(KafkaSettings("fake:9092"), NS, AckerConfig(instance_id="unit", consumer={"fetch.wait.max.ms": 35}),
                  clock=ManualClock(T0), kafka=FakeKafka(partitions=1000))
    acker.start()
    assert acker.live.consumer.conf["fetch.wait.max.ms"] == 35  # type: ignore[attr-defined]
