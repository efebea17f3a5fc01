"""A service started while its cluster is unreachable waits for it, with back-off, for a
bounded time (``KafkaSettings.start_wait_s``, ``--wait-for-kafka-ms``), then fails with the one
line a command gives at once: the CLI's reachability check, and the admin look-ups of the
services' start paths (topic layout and configs, the group protocol)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from broker.cli.connection import check_reachable, cluster_settings
from broker.errors import ConfigurationError, KafkaUnreachable
from broker.kafka_io import consumer_group_protocol, delete_retention_ms, partition_counts
from broker.settings import KafkaSettings


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


def unreachable_for(times: int, *, retriable: bool = True) -> tuple[list[int], Callable[..., None]]:
    """The calls of an attempt of ``check_reachable`` that fails ``times`` times, and the attempt."""
    calls: list[int] = []

    def reach(_settings: Any, **_k: Any) -> None:
        calls.append(1)
        if len(calls) <= times:
            exc = KafkaUnreachable("cannot reach Kafka at 127.0.0.1:1: Connection refused")
            exc.retriable = retriable
            raise exc

    return calls, reach


def test_a_service_waits_for_a_cluster_that_comes_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls, attempt = unreachable_for(4)
    clock = Stepped()
    check_reachable(KafkaSettings("127.0.0.1:1"), wait_s=120, sleep=clock.sleep, clock=clock.clock, attempt=attempt)
    assert len(calls) == 5
    assert clock.pauses == [1.0, 2.0, 4.0, 8.0]  # growing, capped at 10 s
    said = [r.getMessage() for r in caplog.records]
    assert said == ["cannot reach Kafka at 127.0.0.1:1: Connection refused; trying again for up to 120s"]


def test_a_service_gives_up_after_the_bound_with_the_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    calls, attempt = unreachable_for(1_000)
    clock = Stepped()
    with pytest.raises(KafkaUnreachable, match=r"^cannot reach Kafka at 127\.0\.0\.1:1: Connection refused$"):
        check_reachable(KafkaSettings("127.0.0.1:1"), wait_s=60, sleep=clock.sleep, clock=clock.clock, attempt=attempt)
    assert clock.now <= 60 and clock.pauses[-1] == 10.0
    assert len(calls) == len(clock.pauses) + 1


def test_a_command_and_a_refused_authentication_fail_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Stepped()
    _, attempt = unreachable_for(1_000)
    with pytest.raises(KafkaUnreachable):  # wait_s 0: a command
        check_reachable(KafkaSettings("127.0.0.1:1"), sleep=clock.sleep, clock=clock.clock, attempt=attempt)
    _, attempt = unreachable_for(1_000, retriable=False)
    with pytest.raises(KafkaUnreachable):
        check_reachable(KafkaSettings("127.0.0.1:1"), wait_s=120, sleep=clock.sleep, clock=clock.clock, attempt=attempt)
    assert clock.pauses == []


@pytest.mark.parametrize(("wait", "expected"), [(None, 120.0), (5_000, 5.0), (0, 0.0)])
def test_a_service_command_waits_as_long_as_wait_for_kafka_says(
    monkeypatch: pytest.MonkeyPatch, wait: int | None, expected: float
) -> None:
    waited: list[float] = []
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    args = argparse.Namespace(local=False, bootstrap="127.0.0.1:1", verbose=False, command="acker", wait_for_kafka_ms=wait,
                              reach=lambda s, **k: waited.append(k["wait_s"]))
    assert cluster_settings(args).start_wait_s == expected
    del args.wait_for_kafka_ms  # an admin command (status, topics ...): fails at once
    cluster_settings(args)
    assert waited == [expected, 0.0]


def test_start_wait_must_not_be_negative() -> None:
    with pytest.raises(ConfigurationError, match="start_wait_s"):
        KafkaSettings("127.0.0.1:1", start_wait_s=-1)


class Future:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def result(self, timeout: float | None = None) -> Any:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


class Entry:
    value = "86400000"


class Admin:
    """Answers with a transport failure ``failures`` times, then with configs and metadata."""

    failures = 0
    calls = 0

    def __init__(self, _conf: dict[str, Any]) -> None:
        pass

    @classmethod
    def _answer(cls, ok: Any) -> Any:
        Admin.calls += 1
        if Admin.calls <= Admin.failures:
            return KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"))
        return ok

    def describe_configs(self, resources: list[Any], **_k: Any) -> dict[Any, Future]:
        return {r: Future(self._answer({"delete.retention.ms": Entry()})) for r in resources}

    def list_topics(self, timeout: float = -1) -> Any:
        answer = self._answer(argparse.Namespace(topics={}))
        if isinstance(answer, BaseException):
            raise answer
        return answer


@pytest.fixture
def admin() -> type[Admin]:
    Admin.failures, Admin.calls = 3, 0
    return Admin


def test_start_up_look_ups_retry_a_transport_failure(admin: type[Admin]) -> None:
    """Seen: an acker restarted a second before a broker crash exited with "Broker transport
    failure" from an admin call of its start()."""
    settings = KafkaSettings("127.0.0.1:1")
    assert delete_retention_ms(settings, "ns.ledger", admin=admin({})) == 86_400_000
    admin.calls = 0
    assert consumer_group_protocol(settings, "g", admin=admin({})) is True
    admin.calls = 0
    assert partition_counts(settings, ["t"], admin=admin({})) == {"t": None}
    assert admin.calls == 4


def test_start_up_look_ups_give_up_after_start_wait_s(admin: type[Admin]) -> None:
    admin.failures = 10**9
    settings = KafkaSettings("127.0.0.1:1", start_wait_s=0)
    with pytest.raises(KafkaException):
        partition_counts(settings, ["t"], admin=admin({}))
    assert admin.calls == 1
    assert delete_retention_ms(settings, "ns.ledger", admin=admin({})) is None  # cannot be read: the caller assumes the least
