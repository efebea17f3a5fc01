"""The Task's consumer: range assignment (co-partitions a data topic and its replay topic),
which the user's TaskConfig.consumer cannot override."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

import broker.task
from broker.errors import ConfigurationError
from broker.settings import KafkaSettings
from broker.task import Task, TaskConfig


class Recorder:
    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        Recorder.made.append(conf)


@pytest.fixture
def consumer_conf(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    Recorder.made = []
    monkeypatch.setattr(broker.task, "Consumer", Recorder)
    monkeypatch.setattr(broker.task, "Producer", lambda conf: None)
    return Recorder.made


def test_task_consumer_uses_the_range_assignor(consumer_conf: list[dict[str, Any]]) -> None:
    Task(KafkaSettings("fake:9092"), "unit", ["orders", "orders.replay"], "g", lambda r, c: None)
    (conf,) = consumer_conf
    assert conf["partition.assignment.strategy"] == "range"
    assert conf["isolation.level"] == "read_committed"


def test_task_consumer_refuses_to_give_up_range(consumer_conf: list[dict[str, Any]]) -> None:
    """Range is what co-partitions a data topic and its replay topic: a user's strategy that
    would override it is refused (tests/unit/test_client_config.py: tunables still win)."""
    config = TaskConfig(consumer={"partition.assignment.strategy": "roundrobin"})
    with pytest.raises(ConfigurationError, match=r"partition\.assignment\.strategy"):
        Task(KafkaSettings("fake:9092"), "unit", ["orders", "orders.replay"], "g", lambda r, c: None, config)
    assert consumer_conf == []
