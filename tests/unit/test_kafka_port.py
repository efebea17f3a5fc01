"""One Kafka port per service (broker.kafka_port): the services reach Kafka through what they
were handed, the real clients by default; the in-memory fakes offer every call of it."""

from __future__ import annotations

import inspect

import pytest

from broker.acker import Acker, AckerConfig
from broker.app import App
from broker.bridge import Bridge, BridgeConfig
from broker.kafka_port import KafkaClients, KafkaPort
from broker.settings import KafkaSettings
from broker.source import Source
from broker.task import Task
from tests.unit.log_cluster import Cluster
from tests.unit.test_acker_timeouts import FakeKafka

PORT_CALLS = sorted(n for n, _ in inspect.getmembers(KafkaPort, inspect.isfunction) if not n.startswith("_"))


def test_the_port_has_the_calls_the_services_make() -> None:
    assert PORT_CALLS == [
        "check", "consumer", "consumer_group_protocol", "delete_retention_ms", "max_message_bytes",
        "partition_counts", "producer", "set_group_timeouts", "watermarks",
    ]


@pytest.mark.parametrize("port", [KafkaClients, Cluster, FakeKafka])
def test_every_port_offers_every_call_with_its_parameters(port: type) -> None:
    for name in PORT_CALLS:
        want = inspect.signature(getattr(KafkaPort, name)).parameters
        got = inspect.signature(getattr(port, name)).parameters
        assert list(got) == list(want), (port.__name__, name)


def test_services_default_to_the_real_clients_of_their_settings() -> None:
    settings = KafkaSettings("fake:9092")
    acker = Acker(settings, "unit", AckerConfig(instance_id="a"))
    task = Task(settings, "unit", ["orders"], "g", lambda r, c: None)
    source = Source(settings, "unit")
    bridge = Bridge(settings, "unit", BridgeConfig(input_topic="legacy"))
    for service in (acker, task, source, bridge):
        assert isinstance(service.kafka, KafkaClients) and service.kafka.settings is settings


def test_a_service_makes_its_clients_with_the_port_it_was_handed() -> None:
    cluster = Cluster()
    acker = Acker(KafkaSettings("fake:9092"), "unit", AckerConfig(instance_id="a"), kafka=cluster)
    task = Task(KafkaSettings("fake:9092"), "unit", ["orders"], "g", lambda r, c: None, kafka=cluster)
    made = {id(c) for c in [*cluster.producers, *cluster.consumers]}
    assert id(acker.live.producer) in made and id(acker.live.consumer) in made
    assert id(task._producer) in made and id(task._consumer) in made
    assert len(cluster.consumers) == 4  # the acker's group, restorer and fetcher; the task's group


def test_a_bridge_and_its_source_make_their_clients_with_the_port_they_were_handed() -> None:
    cluster = Cluster()
    bridge = Bridge(KafkaSettings("fake:9092"), "unit", BridgeConfig(input_topic="legacy"), kafka=cluster)
    assert bridge.source.kafka is cluster
    assert bridge._consumer in cluster.consumers and bridge.source._producer in cluster.producers


def test_an_app_hands_its_port_to_every_service() -> None:
    cluster = Cluster()
    app = App("unit", settings=KafkaSettings("fake:9092"), kafka=cluster)
    orders = app.topic("orders")
    app.task("copy", [orders], lambda r, c: None)
    app.acker()
    assert app.source().kafka is cluster
    assert all(app.service(role).kafka is cluster for role in app.roles)
