"""A task whose offsets cannot be committed because the group moved on keeps running.

Seen in a chaos run: ``Commit failed: Broker: Unknown member`` killed a task process after a
rebalance. The batch's new owner redoes it from the committed offsets; this member logs,
counts and goes on."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from broker.errors import KafkaClientError
from broker.settings import KafkaSettings
from broker.task import Task, TaskContext, TaskRecord
from tests.unit.fakes import FakeKafka


class Producer:
    def __init__(self, conf: dict[str, Any]) -> None:
        self.produced: list[str] = []

    def produce(self, topic: str, **_: Any) -> None:
        self.produced.append(topic)

    def flush(self, *_: Any) -> int:
        return 0

    def poll(self, *_: Any) -> int:
        return 0


class Consumer:
    error = KafkaError.UNKNOWN_MEMBER_ID

    def __init__(self, conf: dict[str, Any]) -> None:
        self.commits = 0

    def commit(self, **_: Any) -> None:
        self.commits += 1
        raise KafkaException(KafkaError(Consumer.error, "injected"))


class Message:
    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 7

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> None:
        return None


@pytest.fixture
def task(monkeypatch: pytest.MonkeyPatch) -> Task:
    def handle(record: TaskRecord, ctx: TaskContext) -> None:
        ctx.emit("out", record.key, record.value)

    return Task(KafkaSettings("fake:9092"), "unit", ["orders"], "g", handle, kafka=FakeKafka(producers=Producer, consumers=Consumer, partitions=2))


@pytest.mark.parametrize("code", [KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION])
def test_a_commit_lost_to_a_rebalance_is_counted_not_fatal(
    task: Task, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    monkeypatch.setattr(Consumer, "error", code)
    task.process_batch([Message()])  # type: ignore[list-item]
    assert task.counters.commits_lost == 1 and task.counters.processed == 1


def test_other_commit_errors_still_raise(task: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Consumer, "error", KafkaError._MSG_TIMED_OUT)
    with pytest.raises(KafkaClientError) as raised:
        task.process_batch([Message()])  # type: ignore[list-item]
    assert isinstance(raised.value.__cause__, KafkaException)
    assert raised.value.error.code() == KafkaError._MSG_TIMED_OUT


@pytest.mark.parametrize(
    "code", [KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR]
)
def test_a_coordinator_not_ready_defers_the_commit_to_the_next_batch(
    task: Task, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    # Seen in a chaos run: right after a broker restart the task's commit got
    # COORDINATOR_LOAD_IN_PROGRESS and the task process exited.
    monkeypatch.setattr(Consumer, "error", code)
    task.process_batch([Message()])  # type: ignore[list-item]
    assert task.counters.commits_deferred == 1 and task.counters.processed == 1
    assert task._uncommitted == {("orders", 0): 8}  # kept for the next commit

    committed: list[Any] = []
    monkeypatch.setattr(Consumer, "commit", lambda self, **kw: committed.append(kw["offsets"]))
    task.finish()
    assert [(tp.topic, tp.partition, tp.offset) for tp in committed[0]] == [("orders", 0, 8)]
    assert task._uncommitted == {}


def test_a_revocation_commits_the_partitions_that_go_before_it_lets_go(
    task: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Incremental rebalancing revokes some partitions while the others stay: what was handled
    of the ones that go is committed first, even through a coordinator that is not ready at
    once, so their next owner redoes nothing."""
    monkeypatch.setattr(Consumer, "error", KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    task.handle_batch([Message()])  # type: ignore[list-item]
    task._uncommitted[("orders", 1)] = 3  # a partition that stays
    calls: list[list[tuple[str, int, int]]] = []
    real = Consumer.commit

    def commit(self: Consumer, **kw: Any) -> None:
        calls.append([(tp.topic, tp.partition, tp.offset) for tp in kw["offsets"]])
        if len(calls) < 3:
            real(self, **kw)

    monkeypatch.setattr(Consumer, "commit", commit)
    task._on_revoke(None, [TopicPartition("orders", 0)])  # type: ignore[arg-type]
    assert calls[0] == [("orders", 0, 8), ("orders", 1, 3)]  # finish(): everything handled, deferred
    assert calls[1:] == [[("orders", 0, 8)], [("orders", 0, 8)]]  # then the revoked one, until taken
    assert task._uncommitted == {("orders", 1): 3}  # the partition that stays: with the next commit
