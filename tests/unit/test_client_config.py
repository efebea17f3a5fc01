"""The effective librdkafka config of Source, Task and Acker: a user's override of a tunable
(``KafkaSettings.extra``, ``SourceConfig.producer``, ``TaskConfig.consumer`` ...) wins over
the service's default; one that contradicts what the guarantee depends on is refused."""

from __future__ import annotations

from typing import Any

import pytest

from broker.acker import Acker, AckerConfig
from broker.errors import ConfigurationError
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig
from tests.unit.fakes import FakeKafka


class Clients(FakeKafka):
    """Stands in for Producer and Consumer (an acker's Kafka port: ``kafka=``); keeps every
    config it was built with."""

    def __init__(self) -> None:
        super().__init__()
        self.producers: list[dict[str, Any]] = []
        self.consumers: list[dict[str, Any]] = []

    def producer(self, conf: dict[str, Any]) -> object:
        self.producers.append(conf)
        return object()

    def consumer(self, conf: dict[str, Any]) -> object:
        self.consumers.append(conf)
        return object()


@pytest.fixture
def clients() -> Clients:
    return Clients()


def settings(**extra: Any) -> KafkaSettings:
    return KafkaSettings("fake:9092", extra=extra)


def task(clients: Clients, settings: KafkaSettings, config: TaskConfig | None = None) -> Task:
    return Task(settings, "unit", ["orders", "orders.replay"], "g", lambda r, c: None, config, kafka=clients)


# ------------------------------------------------------------------ tunables: the user wins


def test_extra_wins_over_the_settings_defaults() -> None:
    conf = settings(**{"linger.ms": 50, "compression.type": "zstd"}).producer_config(defaults={"linger.ms": 1})
    assert conf["linger.ms"] == 50
    assert conf["compression.type"] == "zstd"


def test_source_producer_takes_the_users_linger(clients: Clients) -> None:
    Source(settings(**{"linger.ms": 50}), "unit", kafka=clients)
    Source(settings(), "unit", SourceConfig(producer={"linger.ms": 70}), kafka=clients)
    # Two producers each: persist records alternate between them by epoch (broker.delivery).
    assert [c["linger.ms"] for c in clients.producers] == [50, 50, 70, 70]


def test_task_takes_the_users_tunables(clients: Clients) -> None:
    task(clients, settings(**{"fetch.wait.max.ms": 500, "linger.ms": 50}))
    task(clients, settings(**{"fetch.wait.max.ms": 500}), TaskConfig(consumer={"fetch.wait.max.ms": 300}))
    assert [c["fetch.wait.max.ms"] for c in clients.consumers] == [500, 300]
    assert clients.producers[0]["linger.ms"] == 50


def test_acker_takes_the_users_tunables(clients: Clients) -> None:
    Acker(settings(**{"fetch.wait.max.ms": 500, "linger.ms": 50}), "unit", AckerConfig(instance_id="a"), kafka=clients)
    assert clients.producers[0]["linger.ms"] == 50
    assert {c["group.id"]: c["fetch.wait.max.ms"] for c in clients.consumers} == {
        "unit.acker": 500, "unit.acker.restore": 500, "unit.acker.fetch": 500,
    }
    clients.consumers.clear()
    Acker(settings(), "unit", AckerConfig(instance_id="a", consumer={"max.poll.interval.ms": 6_000}), kafka=clients)
    assert clients.consumers[0]["group.id"] == "unit.acker"
    assert clients.consumers[0]["max.poll.interval.ms"] == 6_000
    clients.consumers.clear()
    Acker(settings(), "unit", AckerConfig(instance_id="a", group_protocol="classic", consumer={"session.timeout.ms": 6_000}), kafka=clients)
    assert clients.consumers[0]["session.timeout.ms"] == 6_000


def test_acker_group_consumer_protocol_and_static_membership(clients: Clients) -> None:
    Acker(settings(), "unit", AckerConfig(instance_id="a"), kafka=clients)
    group = clients.consumers[0]
    assert (group["group.protocol"], group["group.remote.assignor"]) == ("consumer", "range")
    assert group["group.instance.id"] == "unit.acker.a"
    assert "session.timeout.ms" not in group and "partition.assignment.strategy" not in group
    clients.consumers.clear()
    Acker(settings(), "unit", AckerConfig(instance_id="a", static_membership=False), kafka=clients)
    assert "group.instance.id" not in clients.consumers[0]
    clients.consumers.clear()
    Acker(settings(), "unit", AckerConfig(), kafka=clients)  # a generated id is new at every start: never static
    assert "group.instance.id" not in clients.consumers[0]
    clients.consumers.clear()
    Acker(settings(), "unit", AckerConfig(instance_id="a", group_protocol="classic"), kafka=clients)
    classic = clients.consumers[0]
    assert classic["partition.assignment.strategy"] == "range"
    assert classic["session.timeout.ms"] == 10_000
    assert "group.protocol" not in classic


def test_the_acker_group_members_client_id_says_whether_it_keeps_standbys(clients: Clients) -> None:
    # Its standby consumer has no group: the member's name is what the group's description
    # (the console's Overview) can show of the role, on a user's client.id too.
    for config in (AckerConfig(instance_id="a", standby=True), AckerConfig(instance_id="b"),
                   AckerConfig(instance_id="c", standby=True, consumer={"client.id": "mine"})):
        Acker(settings(), "unit", config, kafka=clients)
    assert [c["client.id"] for c in clients.consumers if c["group.id"] == "unit.acker"] == [
        "unit.acker.a+standby", "unit.acker.b", "mine+standby",
    ]


@pytest.mark.parametrize("key", ["session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"])
def test_acker_refuses_client_side_group_settings_with_the_consumer_protocol(clients: Clients, key: str) -> None:
    # librdkafka would refuse them when the consumer is created; say what sets them instead.
    with pytest.raises(ConfigurationError, match=key.replace(".", r"\.")):
        Acker(settings(), "unit", AckerConfig(instance_id="a", consumer={key: 6_000}), kafka=clients)
    with pytest.raises(ConfigurationError, match=key.replace(".", r"\.")):
        Acker(settings(**{key: 6_000}), "unit", AckerConfig(instance_id="a"), kafka=clients)


# ------------------------------------------------------------------ the guarantee: refused


def test_a_contradicting_required_setting_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigurationError, match=r"enable\.idempotence"):
        settings(**{"enable.idempotence": False}).producer_config()
    with pytest.raises(ConfigurationError, match=r"enable\.auto\.commit"):
        settings(**{"enable.auto.commit": True}).consumer_config("g")


def test_an_agreeing_required_setting_is_accepted() -> None:
    conf = settings(**{"acks": -1, "enable.idempotence": "true"}).producer_config()
    assert conf["acks"] == "all"
    assert conf["enable.idempotence"] is True


def test_source_refuses_a_contradicting_transactional_id(clients: Clients) -> None:
    with pytest.raises(ConfigurationError, match=r"transactional\.id"):
        Source(settings(), "unit", SourceConfig(producer={"transactional.id": "other"}), transactional_id="mine", kafka=clients)
    with pytest.raises(ConfigurationError, match="acks"):
        Source(settings(), "unit", SourceConfig(producer={"acks": 1}), kafka=clients)


@pytest.mark.parametrize(
    ("key", "value"),
    [("partition.assignment.strategy", "roundrobin"), ("isolation.level", "read_uncommitted")],
)
def test_task_refuses_a_contradicting_consumer_setting(clients: Clients, key: str, value: str) -> None:
    with pytest.raises(ConfigurationError, match=key.replace(".", r"\.")):
        task(clients, settings(), TaskConfig(consumer={key: value}))


@pytest.mark.parametrize(
    ("extra", "consumer"),
    [
        ({}, {"isolation.level": "read_uncommitted"}),
        ({}, {"enable.auto.offset.store": True}),
        ({"partition.assignment.strategy": "cooperative-sticky"}, {}),
        ({"allow.auto.create.topics": True}, {}),
    ],
)
def test_acker_refuses_a_contradicting_setting(
    clients: Clients, extra: dict[str, Any], consumer: dict[str, Any]
) -> None:
    (key,) = {**extra, **consumer}
    with pytest.raises(ConfigurationError, match=key.replace(".", r"\.")):
        Acker(settings(**extra), "unit", AckerConfig(instance_id="a", consumer=consumer), kafka=clients)
