"""The Task's consumer: the consumer group protocol with the broker's range assignor
(co-partitions a data topic and its replay topic, moves only what changes owner), the classic
protocol with cooperative-sticky as the fallback; the user's TaskConfig.consumer cannot
override the assignor."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from broker.errors import ConfigurationError
from broker.settings import KafkaSettings
from broker.task import Task, TaskConfig
from tests.unit.fakes import FakeKafka


class Recorder:
    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        Recorder.made.append(conf)
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def consumer_conf() -> list[dict[str, Any]]:
    Recorder.made = []
    return Recorder.made


@pytest.fixture
def kafka(consumer_conf: list[dict[str, Any]]) -> FakeKafka:
    """The task's port: its consumers record their settings, its producer is none."""
    return FakeKafka(producers=lambda conf: None, consumers=Recorder)


def test_task_consumer_uses_the_consumer_protocol_and_the_range_assignor(consumer_conf: list[dict[str, Any]], kafka: FakeKafka) -> None:
    Task(KafkaSettings("fake:9092"), "unit", ["orders", "orders.replay"], "g", lambda r, c: None, kafka=kafka)
    (conf,) = consumer_conf
    assert (conf["group.protocol"], conf["group.remote.assignor"]) == ("consumer", "range")
    assert conf["isolation.level"] == "read_committed"
    # librdkafka refuses them with the consumer protocol (the common defaults' included)
    assert not {"partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms"} & conf.keys()


def test_task_session_timeout_goes_to_the_group_not_the_client(consumer_conf: list[dict[str, Any]], kafka: FakeKafka) -> None:
    config = TaskConfig(consumer={"session.timeout.ms": 6_000, "heartbeat.interval.ms": 1_000})
    Task(KafkaSettings("fake:9092"), "unit", ["orders"], "g", lambda r, c: None, config, kafka=kafka)
    (conf,) = consumer_conf
    assert "session.timeout.ms" not in conf and "heartbeat.interval.ms" not in conf


def test_classic_task_consumer_is_cooperative_sticky(consumer_conf: list[dict[str, Any]], kafka: FakeKafka) -> None:
    config = TaskConfig(group_protocol="classic", consumer={"session.timeout.ms": 6_000})
    Task(KafkaSettings("fake:9092"), "unit", ["orders", "orders.replay"], "g", lambda r, c: None, config, kafka=kafka)
    (conf,) = consumer_conf
    assert conf["partition.assignment.strategy"] == "cooperative-sticky"
    assert conf["session.timeout.ms"] == 6_000
    assert "group.protocol" not in conf


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_task_consumer_refuses_another_assignor(consumer_conf: list[dict[str, Any]], kafka: FakeKafka, protocol: str) -> None:
    """The assignor is what co-partitions a data topic and its replay topic: a user's
    strategy that would override it is refused (tests/unit/test_client_config.py: tunables
    still win)."""
    config = TaskConfig(group_protocol=protocol, consumer={"partition.assignment.strategy": "roundrobin"})
    with pytest.raises(ConfigurationError, match=r"partition\.assignment\.strategy"):
        Task(KafkaSettings("fake:9092"), "unit", ["orders", "orders.replay"], "g", lambda r, c: None, config, kafka=kafka)
    assert consumer_conf == []


def test_task_refuses_an_unknown_group_protocol() -> None:
    with pytest.raises(ConfigurationError, match="group_protocol"):
        TaskConfig(group_protocol="eager")


def test_task_falls_back_to_classic_on_a_cluster_without_the_consumer_protocol(
    consumer_conf: list[dict[str, Any]], kafka: FakeKafka, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    kafka.protocol = False
    task = Task(KafkaSettings("fake:9092"), "unit", ["orders", "orders.replay"], "g", lambda r, c: None, kafka=kafka)
    first = task._consumer
    task._join_group()
    assert first.closed
    assert [c.get("group.protocol") for c in consumer_conf] == ["consumer", None]
    assert consumer_conf[1]["partition.assignment.strategy"] == "cooperative-sticky"
    assert "classic group protocol" in caplog.text


def test_task_sets_its_session_timeout_on_the_group(
    consumer_conf: list[dict[str, Any]], kafka: FakeKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = TaskConfig(consumer={"session.timeout.ms": "6000"})
    Task(KafkaSettings("fake:9092"), "unit", ["orders"], "g", lambda r, c: None, config, kafka=kafka)._join_group()
    assert kafka.timeouts_set == [("g", 6000, None)]
    assert len(consumer_conf) == 1
