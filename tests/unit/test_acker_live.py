"""LiveClients: the acker's group consumer and producer as they are now. A replacement is seen
by every part that uses them (the transactions, the expiry gate), which read them through it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from broker.acker.clients import AckerClients
from broker.acker.commit import Transactions
from broker.acker.config import AckerConfig
from broker.acker.lag import ExpiryGate
from broker.acker.live import LiveClients
from broker.acker.refusals import Refusals
from broker.settings import KafkaSettings
from broker.topics import Namespace

NS = Namespace("live")


class Client:
    """Stands in for a Producer or a Consumer: its config, and what was done to it."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.calls: list[str] = []

    def flush(self, _timeout: float) -> int:
        self.calls.append("flush")
        return 0

    def close(self) -> None:
        self.calls.append("close")


def make_live(stop: threading.Event | None = None) -> LiveClients:
    configs = AckerClients(KafkaSettings("fake:9092"), NS, AckerConfig(instance_id="a", group_protocol="consumer"))
    return LiveClients(configs, make_consumer=Client, make_producer=Client, stop=stop or threading.Event())


def test_a_new_producer_reaches_the_transactions_and_the_old_one_is_flushed() -> None:
    live = make_live()
    transactions = Transactions(NS, live, Refusals(NS.dlq), exactly_once=True)
    old = live.producer
    live.producer_stale = True
    live.replace_producer({**live.producer_config, "message.max.bytes": 2_000_000})
    assert old.calls == ["flush"]
    assert transactions.producer is live.producer is not old
    assert live.producer.conf["message.max.bytes"] == 2_000_000
    assert not live.producer_stale


@pytest.mark.parametrize("wait_s", [None, 1.5])
def test_a_new_consumer_reaches_every_user_after_the_old_one_left(monkeypatch: pytest.MonkeyPatch, wait_s: float | None) -> None:
    stop = threading.Event()
    waits: list[float] = []
    monkeypatch.setattr(stop, "wait", waits.append)
    live = make_live(stop)
    transactions = Transactions(NS, live, Refusals(NS.dlq), exactly_once=True)
    gate = ExpiryGate(NS, live)
    old = live.consumer
    live.replace_consumer(wait_s)
    assert old.calls == ["close"]
    assert waits == ([] if wait_s is None else [wait_s])
    assert transactions.consumer is gate.consumer is live.consumer is not old


def test_the_fall_back_to_classic_changes_the_next_consumer_and_the_config() -> None:
    live = make_live()
    assert live.incremental and live.consumer.conf["group.protocol"] == "consumer"
    live.fall_back_to_classic("the cluster has no consumer group protocol")
    assert not live.incremental and live.configs.config.group_protocol == "classic"
    live.replace_consumer()
    assert "group.protocol" not in live.consumer.conf
    assert live.consumer.conf["partition.assignment.strategy"] == "range"
