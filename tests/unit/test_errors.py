"""Every error a caller of the public API meets is a ``ReplayBrokerError``: what Kafka refuses
leaves as ``KafkaClientError``, with the ``KafkaError`` (``error``), whether the same call may
succeed again (``retriable``) and the ``KafkaException`` as its cause."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

import broker
import broker.source
import broker.topics
from broker.background import in_background
from broker.errors import (
    BackgroundError,
    ConfigurationError,
    KafkaClientError,
    ReplayBrokerError,
)
from broker.kafka_io import client_error, kafka_error, kafka_errors
from broker.settings import KafkaSettings
from broker.source import Source
from broker.task.records import _no_handler
from broker.topics import Namespace
from tests.unit.fakes import FakeKafka

SETTINGS = KafkaSettings("fake:9092")


@pytest.mark.parametrize(
    ("error", "retriable"),
    [
        (KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True), True),
        (KafkaError(KafkaError.NOT_COORDINATOR), True),  # librdkafka says no; the code says yes
        (KafkaError(KafkaError.INVALID_CONFIG, "bad"), False),
        (KafkaError(KafkaError._FENCED, "fenced", fatal=True), False),
        (KafkaError(KafkaError._TIMED_OUT, "fatal wins", retriable=True, fatal=True), False),
    ],
)
def test_a_wrapped_kafka_error_keeps_the_error_its_cause_and_whether_it_is_retriable(
    error: KafkaError, retriable: bool
) -> None:
    cause = KafkaException(error)
    with pytest.raises(KafkaClientError) as raised, kafka_errors("creating topics"):
        raise cause
    wrapped = raised.value
    assert isinstance(wrapped, ReplayBrokerError)
    assert wrapped.__cause__ is cause and wrapped.error is error and kafka_error(wrapped) is error
    assert wrapped.retriable is retriable
    assert str(wrapped) == f"creating topics: {error.str()}" and wrapped.reason == error.str()


def test_the_kafka_error_and_the_records_error_types_are_exported() -> None:
    for name in ("KafkaClientError", "SendFailure", "BackgroundError", "BridgeFenced"):
        assert name in broker.__all__ and getattr(broker, name) is not None
    assert broker.SendFailure is broker.source.SendFailure


def test_a_producer_setting_kafka_refuses_is_a_kafka_client_error() -> None:
    with pytest.raises(KafkaClientError) as raised:
        Source(SETTINGS, "unit", broker.SourceConfig(producer={"no.such.setting": "1"}))
    assert isinstance(raised.value.__cause__, KafkaException)
    assert raised.value.error.code() == KafkaError._INVALID_ARG
    assert not raised.value.retriable
    assert "no.such.setting" in str(raised.value)


class _Producer:
    """A transactional producer whose every transactional call fails with ``error``."""

    error = KafkaError(KafkaError._TIMED_OUT, "coordinator not available", retriable=True)

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf

    def _fail(self, *_a: Any, **_k: Any) -> None:
        raise KafkaException(_Producer.error)

    init_transactions = send_offsets_to_transaction = _fail

    def begin_transaction(self) -> None:
        pass

    def abort_transaction(self, *_a: Any) -> None:
        pass

    def poll(self, *_a: Any) -> int:
        return 0

    def flush(self, *_a: Any) -> int:
        return 0

    def __len__(self) -> int:
        return 0


@pytest.fixture
def transactional() -> Source:
    return Source(SETTINGS, "unit", transactional_id="unit.tx", kafka=FakeKafka(producers=_Producer))


@pytest.mark.parametrize(
    "error",
    [KafkaError(KafkaError._TIMED_OUT, "coordinator not available", retriable=True),
     KafkaError(KafkaError._FENCED, "fenced by a newer producer", fatal=True)],
)
def test_init_transactions_that_fails_raises_a_kafka_client_error(
    transactional: Source, monkeypatch: pytest.MonkeyPatch, error: KafkaError
) -> None:
    monkeypatch.setattr(_Producer, "error", error)
    with pytest.raises(KafkaClientError) as raised:
        transactional.init_transactions()
    assert raised.value.error is error and raised.value.retriable is not error.fatal()
    with pytest.raises(KafkaClientError), transactional.transaction():  # the same, from transaction()
        pass


def test_send_offsets_that_fails_raises_a_kafka_client_error(transactional: Source, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transactional, "_transactions_ready", True)
    monkeypatch.setattr(transactional, "_in_transaction", True)
    with pytest.raises(KafkaClientError) as raised:
        transactional.send_offsets([TopicPartition("in", 0, 5)], object())
    assert isinstance(raised.value.__cause__, KafkaException) and raised.value.retriable


def test_topic_admin_calls_raise_kafka_client_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    class Admin:
        def __init__(self, _conf: dict[str, Any]) -> None:
            pass

        def list_topics(self, **_: Any) -> None:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Connection refused"))

    admin: Any = Admin({})
    for call in (lambda: broker.topics.create(SETTINGS, Namespace("unit"), 2, admin=admin),
                 lambda: broker.topics.delete(SETTINGS, ["unit.persist"], admin=admin),
                 lambda: broker.topics.check_replication(SETTINGS, Namespace("unit"), admin=admin)):
        with pytest.raises(KafkaClientError) as raised:
            call()
        assert raised.value.error.code() == KafkaError._TRANSPORT and raised.value.retriable


def test_a_service_that_stops_in_the_background_raises_a_replay_broker_error() -> None:
    def run() -> None:
        raise client_error(KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True)), "running")

    with pytest.raises(BackgroundError) as raised, in_background("unit", run, lambda: None):
        pass
    assert isinstance(raised.value, ReplayBrokerError) and isinstance(raised.value.__cause__, KafkaClientError)


def test_a_task_with_a_batch_handler_refuses_a_per_record_call() -> None:
    with pytest.raises(ConfigurationError):
        _no_handler(None, None)  # type: ignore[arg-type]
