"""The per-record produce calls pass their arguments by position (``kafka_io.PRODUCE_ARGS``):
this checks that order on the installed confluent-kafka, without a broker - a purged
record's delivery report shows where each argument went."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer

from broker.kafka_io import PRODUCE_ARGS


def _producer() -> Producer:
    # Nothing listens there: records stay queued until purged.
    return Producer({"bootstrap.servers": "127.0.0.1:9", "message.timeout.ms": 60_000, "log_level": 0})


def test_positional_arguments_land_where_their_names_say() -> None:
    producer = _producer()
    reports: list[tuple[Any, Any]] = []
    args = {
        "topic": "orders", "value": b"the value", "key": b"the key", "partition": 3,
        "on_delivery": lambda err, msg: reports.append((err, msg)), "callback": None, "timestamp": 0,
        "headers": [("rb-t", b"0123456789abcdef")],
    }
    producer.produce(*(args[name] for name in PRODUCE_ARGS))
    producer.purge()
    producer.poll(0)
    [(err, msg)] = reports
    assert err.code() == KafkaError._PURGE_QUEUE
    assert (msg.topic(), msg.value(), msg.key(), msg.partition()) == ("orders", b"the value", b"the key", 3)


def test_the_headers_come_last_after_the_timestamp() -> None:
    producer = _producer()
    producer.produce("orders", b"v", b"k", 0, None, None, 0, [("h", b"x")])
    with pytest.raises(TypeError):
        producer.produce("orders", b"v", b"k", 0, None, None, [("h", b"x")])
    producer.purge()
