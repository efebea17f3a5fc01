"""A static acker restarted while its predecessor's session still holds the instance id: the
group refuses it (librdkafka: a fatal UNRELEASED_INSTANCE_ID on every new consumer) until the
session ends. The real ``Acker`` on the in-memory stand-ins of test_acker_timeouts waits it out
with back-off, says so once per wait period, and then serves as ever."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import pytest
from confluent_kafka import KafkaError

from broker.acker.membership import (
    GROUP_CLIENT_LOG,
    Rejoins,
    consumer_protocol_refused,
    instance_in_use,
)
from broker.ledger.clock import ManualClock
from tests.unit.fakes import FakeConsumer, FakeKafka, FakeMessage
from tests.unit.test_acker_timeouts import (
    NS,
    R1,
    S1,
    T0,
    acks_msg,
    fake_kafka,  # noqa: F401 - the fixture
    make_acker,
    outcomes,
    persist_msg,
    persisted,
    run_steps,
)

# As librdkafka hands it to poll(): _FATAL, the cause only in the text.
IN_USE = KafkaError(
    KafkaError._FATAL,
    "Fatal error: Broker: The instance ID is still used by another member in the consumer group: "
    "ConsumerGroupHeartbeat fatal error: Broker: The instance ID is still used by another member in the consumer group",
    fatal=True,
)


class FatalMessage(FakeMessage):
    def __init__(self, err: KafkaError) -> None:
        super().__init__("", -1, -1, None, None)
        self.err = err

    def error(self) -> KafkaError:  # type: ignore[override]
        return self.err


class RefusedConsumer(FakeConsumer):
    """The next ``refusals`` group consumers made are refused at their first poll."""

    refusals: ClassVar[int] = 0

    def consume(self, *args: Any) -> list[FakeMessage]:
        if self.conf.get("group.id", "").endswith(".acker") and RefusedConsumer.refusals and self.rest is None:
            RefusedConsumer.refusals -= 1
            return [FatalMessage(IN_USE)]
        return super().consume(*args)


def test_a_refused_instance_id_is_waited_out_with_back_off_and_one_line(
    fake_kafka: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    RefusedConsumer.refusals = 5
    clock = ManualClock(T0)
    acker, _, producer = make_acker(clock, kafka=FakeKafka(consumers=RefusedConsumer))  # session timeout 10 s: waits capped at 5 s
    waits: list[float] = []
    monkeypatch.setattr(acker._stop, "wait", waits.append)
    caplog.set_level(logging.DEBUG, "broker.acker")

    run_steps(acker, 6)  # five refusals, then the sixth consumer is in
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert sorted(acker.states) == [0, 1]
    consumer = FakeConsumer.last
    assert consumer is not None
    consumer.batches.append([persist_msg(persisted(S1, R1, T0))])
    consumer.batches.append([acks_msg(0, 0, [S1], [R1])])
    run_steps(acker, 2)
    assert outcomes(producer) == {S1: b"completed"}

    above_debug = [r for r in caplog.records if r.levelno > logging.DEBUG and "still" in r.getMessage()]
    assert [r.levelno for r in above_debug] == [logging.WARNING]  # one line for the wait period
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert (acker.membership.in_use, acker.membership.periods, acker.rejoins) == (5, 1, 5)

    # Refused again later, after it had owned partitions: a new wait period, from the start.
    RefusedConsumer.refusals = 1
    consumer.rest = None
    run_steps(acker, 2)
    assert waits[5:] == [1.0]
    assert (acker.membership.in_use, acker.membership.periods) == (6, 2)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING and "still a member" in r.getMessage()]) == 2


def test_another_fatal_error_is_logged_as_one_and_waits_the_first_pause(caplog: pytest.LogCaptureFixture) -> None:
    rejoins = Rejoins(1.0, 10_000, "ns.acker.a")
    assert rejoins.wait_after(IN_USE, owned=False) == 1.0
    assert rejoins.wait_after(IN_USE, owned=False) == 2.0
    other = KafkaError(KafkaError._FATAL, "Fatal error: Broker: Group authorization failed", fatal=True)
    assert rejoins.wait_after(other, owned=False) == 1.0  # ends the wait period
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.ERROR]
    assert rejoins.wait_after(IN_USE, owned=False) == 1.0
    assert rejoins.periods == 2


@pytest.mark.parametrize(
    ("err", "in_use"),
    [
        (IN_USE, True),
        (KafkaError(KafkaError.UNRELEASED_INSTANCE_ID), True),
        (KafkaError(KafkaError.FENCED_INSTANCE_ID), True),
        (KafkaError(KafkaError._FATAL, "Fatal consumer error: Broker: Static consumer fenced by other consumer "
                    "with same group.instance.id", fatal=True), True),
        (KafkaError(KafkaError._FATAL, "Fatal error: Broker: Group authorization failed", fatal=True), False),
        (KafkaError(KafkaError._TRANSPORT), False),
    ],
)
def test_instance_in_use_as_librdkafka_reports_it(err: KafkaError, in_use: bool) -> None:
    assert instance_in_use(err) is in_use


# --------------------------------------------------------------------------- Kafka 3.x


@pytest.mark.parametrize("supported", [True, None])
def test_the_consumer_protocol_stays_where_the_cluster_has_it_or_cannot_say(
    fake_kafka: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, supported: bool | None  # noqa: F811
) -> None:
    acker, consumer, _ = make_acker(ManualClock(T0), kafka=FakeKafka(protocol=supported))
    acker.start()
    assert acker.config.group_protocol == "consumer" and acker.live.incremental
    assert acker.live.consumer is consumer and consumer.conf["group.protocol"] == "consumer"
    assert "no consumer group protocol" not in caplog.text


def test_on_a_cluster_without_the_consumer_protocol_the_acker_joins_with_the_classic_one(
    fake_kafka: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    """Kafka 3.9 knows no group configs, and librdkafka's consumer-protocol member waits there
    forever without an error (seen): the acker falls back to the classic protocol with the
    range assignor, in one line, and serves."""
    kafka = FakeKafka(protocol=False)
    acker, first, producer = make_acker(ManualClock(T0), kafka=kafka)
    config_before = acker.config
    caplog.set_level(logging.INFO, "broker.acker")
    acker.start()
    assert kafka.protocol_asked == [f"{NS.name}.acker"]
    assert acker.config.group_protocol == "classic" and not acker.live.incremental
    assert config_before.group_protocol == "consumer"  # the caller's config is not changed
    consumer = acker.live.consumer
    assert consumer is not first and isinstance(consumer, FakeConsumer)
    assert "group.protocol" not in consumer.conf and consumer.conf["partition.assignment.strategy"] == "range"
    assert consumer.conf["group.instance.id"] == f"{NS.name}.acker.unit"
    assert acker.transactions.consumer is consumer and acker.expiry.consumer is consumer
    assert kafka.timeouts_set == []  # a group's session timeout is the classic member's own
    lines = [r for r in caplog.records if "consumer group protocol" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING]
    assert "--group-protocol classic" in lines[0].getMessage()

    consumer.batches.append([persist_msg(persisted(S1, R1, T0))])
    consumer.batches.append([acks_msg(0, 0, [S1], [R1])])
    run_steps(acker, 2)
    assert outcomes(producer) == {S1: b"completed"}


PROTOCOL_OFF = KafkaError(
    KafkaError._FATAL,
    "Fatal error: Broker: API version not supported: ConsumerGroupHeartbeat fatal error: Broker: API version not supported",
    fatal=True,
)  # as seen from an embedded Kafka 4.3.1 with group.coordinator.rebalance.protocols=classic


class ProtocolOffConsumer(FakeConsumer):
    """A consumer-protocol member is refused at its first poll."""

    def consume(self, *args: Any) -> list[FakeMessage]:
        if self.conf.get("group.protocol") == "consumer" and self.conf.get("group.id", "").endswith(".acker"):
            return [FatalMessage(PROTOCOL_OFF)]
        return super().consume(*args)


def test_a_cluster_that_refuses_the_consumer_protocol_gets_a_classic_member(
    fake_kafka: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    """Kafka >= 4.0 knows group configs, so start() keeps the consumer protocol; with the
    protocol switched off its heartbeat is refused (a fatal error, every time): the acker
    joins with the classic one on its next join, in one line, not an ERROR per second."""
    acker, _, producer = make_acker(ManualClock(T0), kafka=FakeKafka(consumers=ProtocolOffConsumer))
    waits: list[float] = []
    monkeypatch.setattr(acker._stop, "wait", waits.append)
    caplog.set_level(logging.INFO, "broker.acker")
    run_steps(acker, 2)
    assert acker.config.group_protocol == "classic" and not acker.live.incremental
    consumer = FakeConsumer.last
    assert consumer is not None and "group.protocol" not in consumer.conf
    assert consumer.conf["partition.assignment.strategy"] == "range"
    assert waits == [1.0] and acker.rejoins == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    (line,) = [r.getMessage() for r in caplog.records if "consumer group protocol" in r.getMessage()]
    assert "--group-protocol classic" in line
    consumer.batches.append([persist_msg(persisted(S1, R1, T0))])
    consumer.batches.append([acks_msg(0, 0, [S1], [R1])])
    run_steps(acker, 2)
    assert outcomes(producer) == {S1: b"completed"}


@pytest.mark.parametrize(
    ("err", "refused"),
    [(PROTOCOL_OFF, True), (KafkaError(KafkaError.UNSUPPORTED_VERSION), True), (IN_USE, False),
     (KafkaError(KafkaError._FATAL, "Fatal error: Broker: Group authorization failed", fatal=True), False)],
)
def test_consumer_protocol_refused_as_librdkafka_reports_it(err: KafkaError, refused: bool) -> None:
    assert consumer_protocol_refused(err) is refused


def test_librdkafkas_fatal_line_for_a_refusal_is_debug_and_others_stay(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    GROUP_CLIENT_LOG.critical("FATAL [ns.acker.a#consumer-3] [thrd:main]: %s", IN_USE.str())
    GROUP_CLIENT_LOG.critical("FATAL [ns.acker.a#consumer-4] [thrd:main]: %s", PROTOCOL_OFF.str())
    GROUP_CLIENT_LOG.critical("FATAL [ns.acker.a#consumer-5] [thrd:main]: Fatal error: Broker: Group authorization failed")
    assert [r.getMessage()[-30:] for r in caplog.records] == ["Broker: Group authorization failed"[-30:]]
