"""``App`` without a cluster: how it names topics, builds its services' configurations and
refuses what it cannot run (tests/integration/test_app.py runs it on Kafka)."""

from __future__ import annotations

import pytest

from broker import App, BytesSerde, ConfigurationError, JsonSerde, KafkaSettings, Topic
from broker.task import Task, TaskRecord


def _app() -> App:
    return App("shop", settings=KafkaSettings("fake:9092"), serde=JsonSerde())


def _handler(record: TaskRecord, ctx: object) -> None:
    pass


def test_topics_are_named_in_the_namespace_and_are_strs() -> None:
    app = _app()
    orders = app.topic("orders", partitions=4)
    assert isinstance(orders, Topic) and isinstance(orders, str)
    assert orders == "shop.orders" and orders.replay == "shop.orders.replay" and orders.partitions == 4
    assert app.topic("orders", partitions=4) is orders  # declared again alike: the same
    with pytest.raises(ConfigurationError, match="other settings"):
        app.topic("orders", partitions=8)
    for bad in ("", "a.b", "x.replay"):
        with pytest.raises(ConfigurationError):
            app.topic(bad)
    with pytest.raises(ConfigurationError, match="at least 1"):
        app.topic("empty", partitions=0)


def test_a_task_reads_its_topics_and_their_replay_topics_with_their_serdes() -> None:
    app = _app()
    orders = app.topic("orders", partitions=4)
    raw = app.topic("raw", partitions=2, serde=BytesSerde())
    assert app.task("enrich", [orders, "raw"], _handler, batch_size=10) is _handler
    decorated = app.task("leaf", orders)(_handler)
    assert decorated is _handler
    assert app.roles == ["task:enrich", "task:leaf"]
    app.acker(commit_interval_ms=50)
    assert app.roles == ["acker", "task:enrich", "task:leaf"]
    task = app.service("task:enrich")
    assert isinstance(task, Task)
    assert task.topics == ["shop.orders", "shop.orders.replay", "shop.raw", "shop.raw.replay"]
    assert task.group_id == "shop.enrich" and task.config.batch_size == 10
    assert isinstance(task.config.serde, JsonSerde)
    assert task.serde(orders) is task.config.serde and task.serde(raw.replay) is raw.serde
    assert app.serdes() == {raw: raw.serde, raw.replay: raw.serde}


def test_what_the_app_cannot_run_is_refused_in_one_line() -> None:
    app = _app()
    with pytest.raises(ConfigurationError, match="not declared"):
        app.task("enrich", "orders", _handler)
    app.topic("orders", partitions=1)
    app.task("enrich", "orders", _handler)
    with pytest.raises(ConfigurationError, match="declared already"):
        app.task("enrich", "orders", _handler)
    with pytest.raises(ConfigurationError, match="reads no topic"):
        app.task("idle", [], _handler)
    with pytest.raises(ConfigurationError, match=r"no role 'acker'.*task:enrich"):
        app.service("acker")
    with pytest.raises(ConfigurationError, match="ledger_partitions"):
        App("shop", ledger_partitions=0)


def test_a_source_gets_the_apps_serde_and_the_topics_own() -> None:
    app = _app()
    raw = app.topic("raw", partitions=2, serde=BytesSerde())
    source = app.source(max_attempts=2)
    assert source.config.max_attempts == 2 and isinstance(source.config.serde, JsonSerde)
    assert source.serde(raw) is raw.serde and source.serde("shop.orders") is source.config.serde
