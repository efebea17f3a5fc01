"""librdkafka's logs and errors through Python logging, each distinct one at most once per
interval, with the number of repeats held back."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from broker import kafka_log
from broker.kafka_log import RepeatFilter, RepeatLimiter, error_cb
from broker.settings import KafkaSettings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_key_is_admitted_once_per_interval_and_its_repeats_counted() -> None:
    clock = Clock()
    limiter = RepeatLimiter(30.0, clock)
    assert limiter.admit("refused") == 0
    assert [limiter.admit("refused") for _ in range(3)] == [None, None, None]
    assert limiter.admit("other") == 0  # another key is not held back by the first
    clock.now += 29.9
    assert limiter.admit("refused") is None
    clock.now += 0.1
    assert limiter.admit("refused") == 4  # admitted again, with the 4 held back
    assert limiter.admit("refused") is None
    clock.now += 30
    assert limiter.admit("refused") == 1


def test_error_cb_logs_each_distinct_error_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limiter = RepeatLimiter(30.0, clock)
    refused = KafkaError(KafkaError._TRANSPORT, "Connect to 127.0.0.1:1 failed: Connection refused")
    down = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")
    with caplog.at_level(logging.WARNING, logger=kafka_log.log.name):
        for _ in range(100):
            error_cb(refused, limiter)
            error_cb(down, limiter)
        clock.now += 30
        error_cb(refused, limiter)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "Kafka client error: Connect to 127.0.0.1:1 failed: Connection refused",
        "Kafka client error: 1/1 brokers are down",
        "Kafka client error: Connect to 127.0.0.1:1 failed: Connection refused "
        "(99 repeats in the last 30s not shown)",
    ]


def test_librdkafka_lines_that_differ_only_in_timing_are_one_line() -> None:
    clock = Clock()
    limit = RepeatFilter(RepeatLimiter(30.0, clock))

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("replaybroker.librdkafka", logging.ERROR, __file__, 0,
                                 "%s [%s] %s", ("FAIL", "replaybroker#producer-1", message), None)

    first = record("Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)")
    again = record("Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 3ms in state CONNECT, "
                   "5 identical error(s) suppressed)")
    other = record("Connect to ipv4#127.0.0.1:2 failed: Connection refused (after 0ms in state CONNECT)")
    assert limit.filter(first)
    assert not limit.filter(again)
    assert limit.filter(other)
    clock.now += 30
    later = record("Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 1ms in state CONNECT)")
    assert limit.filter(later)
    assert later.getMessage().endswith("(1 repeats in the last 30s not shown)")


def test_every_client_config_routes_logs_and_errors_to_python_logging() -> None:
    settings = KafkaSettings("fake:9092")
    for conf in (settings.client_config(), settings.producer_config(), settings.consumer_config("g")):
        assert conf["logger"] is kafka_log.LIBRDKAFKA
        assert conf["error_cb"] is error_cb
