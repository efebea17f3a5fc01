"""The Task's consumer: range assignment (co-partitions a data topic and its replay topic),
and the user's TaskConfig.consumer still wins."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

import broker.task
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


def test_task_consumer_overrides_win(consumer_conf: list[dict[str, Any]]) -> None:
    config = TaskConfig(consumer={"partition.assignment.strategy": "roundrobin", "isolation.level": "read_uncommitted"})
    Task(KafkaSettings("fake:9092"), "unit", ["orders", "orders.replay"], "g", lambda r, c: None, config)
    (conf,) = consumer_conf
    assert conf["partition.assignment.strategy"] == "roundrobin"
    assert conf["isolation.level"] == "read_uncommitted"
