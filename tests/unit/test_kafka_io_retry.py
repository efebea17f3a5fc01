"""``kafka_io.retrying``: transient look-up errors are retried with growing, bounded pauses;
anything else - and a transient error that outlasts the bound - is raised."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException

from broker.kafka_io import is_transient, retrying


class Stepped:
    """A monotonic clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def sleep(self, s: float) -> None:
        self.pauses.append(s)
        self.now += s

    def clock(self) -> float:
        return self.now


def failing(times: int, code: int = KafkaError.NOT_LEADER_FOR_PARTITION) -> tuple[list[int], Callable[[], tuple[int, int]]]:
    calls: list[int] = []

    def call() -> tuple[int, int]:
        calls.append(1)
        if len(calls) <= times:
            raise KafkaException(KafkaError(code, "Failed to get watermark offsets"))
        return (0, 42)

    return calls, call


def test_a_transient_error_is_retried_until_the_call_succeeds() -> None:
    t = Stepped()
    calls, call = failing(3)
    assert retrying(call, "watermarks", sleep=t.sleep, clock=t.clock) == (0, 42)
    assert len(calls) == 4
    assert t.pauses == [0.05, 0.1, 0.2]


def test_a_transient_error_that_lasts_is_raised_after_the_bound() -> None:
    t = Stepped()
    calls, call = failing(10_000, KafkaError._TIMED_OUT)
    with pytest.raises(KafkaException):
        retrying(call, "watermarks", retry_for_s=10, sleep=t.sleep, clock=t.clock)
    assert t.now <= 10 and max(t.pauses) <= 2.0 and len(calls) > 5


def test_a_permanent_error_is_raised_at_once() -> None:
    t = Stepped()
    calls, call = failing(1, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException):
        retrying(call, "watermarks", sleep=t.sleep, clock=t.clock)
    assert len(calls) == 1 and not t.pauses


def test_fatal_errors_are_never_transient() -> None:
    assert is_transient(KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)))
    assert is_transient(KafkaException(KafkaError(KafkaError._DESTROY_BROKER)))  # a crashed node's handle
    assert not is_transient(KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, fatal=True)))
    assert not is_transient(KafkaException("no KafkaError"))
