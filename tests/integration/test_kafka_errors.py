"""What a real Kafka refuses reaches the caller as ``KafkaClientError``: the broker's
``KafkaError`` kept (``error``, ``retriable``), the ``KafkaException`` as the cause."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from broker import KafkaClientError, ReplayBrokerError, topics
from broker.dev.testing import unique_name
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig

pytestmark = pytest.mark.integration


def test_creating_a_topic_with_a_config_the_broker_refuses(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("badconfig"))
    data = f"{ns.name}.orders"
    with pytest.raises(KafkaClientError) as raised:
        topics.create(settings, ns, 1, {data: 1}, overrides={data: {"cleanup.policy": "no-such-policy"}})
    assert isinstance(raised.value, ReplayBrokerError) and isinstance(raised.value.__cause__, KafkaException)
    assert raised.value.error.code() == KafkaError.INVALID_CONFIG
    assert not raised.value.retriable
    topics.delete(settings, [*ns.own_topics, data, topics.replay_topic(data)])


def test_a_transactional_source_whose_init_fails(bootstrap: str) -> None:
    """A transaction timeout above the broker's transaction.max.timeout.ms (15 min by default):
    the coordinator refuses the producer's registration."""
    settings = KafkaSettings(bootstrap)
    source = Source(settings, unique_name("txinit"), SourceConfig(producer={"transaction.timeout.ms": 3_600_000}),
                    transactional_id=unique_name("tx"))
    with pytest.raises(KafkaClientError) as raised:
        source.init_transactions()
    assert isinstance(raised.value.__cause__, KafkaException)
    assert raised.value.error.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT
    assert not raised.value.retriable
