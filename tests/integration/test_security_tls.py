"""SASL_SSL on the embedded broker: a client that trusts the local CA (made with keytool)
authenticates and round-trips a record; one that does not trust it gets nothing."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from broker import topics
from broker.dev.kafka_sasl import ADMIN, SaslKafka
from broker.dev.testing import unique_name
from broker.settings import KafkaSettings, Secret

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def collect_clients() -> Iterator[None]:
    """Clients caught in reference cycles (by a raised KafkaException's traceback) are freed
    here, on the main thread: freed on a librdkafka thread they would abort the process."""
    yield
    gc.collect()


@pytest.fixture(scope="module")
def secured_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslKafka]:
    kafka = SaslKafka(tmp_path_factory.mktemp("kafka-tls"), tls=True)
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


def test_round_trip_over_sasl_ssl(secured_tls: SaslKafka) -> None:
    conf = secured_tls.client_config(ADMIN)
    assert conf["security.protocol"] == "SASL_SSL"
    settings = KafkaSettings(
        secured_tls.bootstrap, security_protocol="SASL_SSL", sasl_mechanism=conf["sasl.mechanism"],
        sasl_username=ADMIN, sasl_password=Secret(conf["sasl.password"]), ssl_ca_location=conf["ssl.ca.location"],
    )
    ns = topics.Namespace(unique_name("tls"))
    topics.create(settings, ns, 1)
    producer = Producer(settings.producer_config())
    producer.produce(ns.acks, b"over-tls", partition=0)
    assert producer.flush(60) == 0
    consumer = Consumer(settings.consumer_config(unique_name("g")))
    consumer.assign([TopicPartition(ns.acks, 0, 0)])
    msg = None
    for _ in range(60):
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            break
    consumer.close()
    assert msg is not None and msg.value() == b"over-tls"


def test_client_without_the_ca_is_refused(secured_tls: SaslKafka) -> None:
    conf = {**secured_tls.client_config(ADMIN), "log_level": 0}
    del conf["ssl.ca.location"]  # the system's CAs only: the local CA is not among them
    with pytest.raises(KafkaException):
        AdminClient(conf).list_topics(timeout=5)
