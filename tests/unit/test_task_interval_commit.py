"""A task delivers and commits once per commit interval, and never leaves handled inputs
uncommitted when its partitions are revoked or it closes - nor commits offsets of partitions
it has lost.

Before the interval, every poll batch paid a producer flush and a synchronous commit: under
load most of the task's requests to the broker, and small batches."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import TopicPartition

from broker.headers import tracking_headers
from broker.settings import KafkaSettings
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from tests.unit.fakes import FakeKafka


class Producer:
    def __init__(self, conf: dict[str, Any]) -> None:
        self.produced: list[str] = []
        self.flushes = 0

    def produce(self, topic: str, **_: Any) -> None:
        self.produced.append(topic)

    def flush(self, *_: Any) -> int:
        self.flushes += 1
        return 0

    def poll(self, *_: Any) -> int:
        return 0


class Consumer:
    def __init__(self, conf: dict[str, Any]) -> None:
        self.commits: list[list[tuple[str, int, int]]] = []

    def commit(self, offsets: list[TopicPartition], **_: Any) -> None:
        self.commits.append(sorted((tp.topic, tp.partition, tp.offset) for tp in offsets))

    def close(self) -> None:
        pass


class Message:
    def __init__(self, partition: int, offset: int) -> None:
        self._partition, self._offset = partition, offset
        srid = 1000 + offset
        self._headers = tracking_headers(srid, srid + 1, srid, 1)

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers


@pytest.fixture
def task(monkeypatch: pytest.MonkeyPatch) -> Task:
    def handle(record: TaskRecord, ctx: TaskContext) -> None:
        ctx.emit("out", record.key, record.value)

    return Task(KafkaSettings("fake:9092"), "unit", ["orders"], "g", handle, TaskConfig(commit_interval_ms=60_000), kafka=FakeKafka(producers=Producer, consumers=Consumer, partitions=2))


def test_batches_are_handled_at_once_and_committed_together_at_finish(task: Task) -> None:
    consumer, producer = task._consumer, task._producer
    task.handle_batch([Message(0, 5), Message(1, 9)])  # type: ignore[list-item]
    task.handle_batch([Message(0, 6)])  # type: ignore[list-item]
    # Events went out as each batch was handled; nothing waited or committed yet.
    assert producer.produced.count("unit.acks") >= 2 and "out" in producer.produced  # type: ignore[attr-defined]
    assert consumer.commits == [] and producer.flushes == 0  # type: ignore[attr-defined]
    assert task.finish() == set()
    assert producer.flushes == 1  # type: ignore[attr-defined]
    assert consumer.commits == [[("orders", 0, 7), ("orders", 1, 10)]]  # type: ignore[attr-defined]
    task.finish()  # nothing new: nothing committed
    assert len(consumer.commits) == 1  # type: ignore[attr-defined]


class OtherTopic(Message):
    def topic(self) -> str:
        return "other"


def test_a_batch_commits_the_offset_after_the_last_input_of_each_partition_read_in_runs(task: Task) -> None:
    # Partitions alternate within a batch; the same partition index of another topic is
    # another partition.
    batch = [Message(0, 5), Message(0, 6), OtherTopic(0, 3), Message(1, 9), Message(0, 7), OtherTopic(0, 4)]
    task.handle_batch(batch)  # type: ignore[arg-type]
    task.finish()
    assert task._consumer.commits == [  # type: ignore[attr-defined]
        [("orders", 0, 8), ("orders", 1, 10), ("other", 0, 5)]
    ]
    assert task.counters.processed == 6
    assert batch == []  # handle_batch lets go of each message once read


def test_process_batch_still_delivers_and_commits_its_batch(task: Task) -> None:
    task.process_batch([Message(0, 3)])  # type: ignore[list-item]
    assert task._consumer.commits == [[("orders", 0, 4)]]  # type: ignore[attr-defined]


def test_revoked_partitions_are_committed_before_they_go(task: Task) -> None:
    task.handle_batch([Message(0, 5), Message(1, 9)])  # type: ignore[list-item]
    task._on_revoke(task._consumer, [TopicPartition("orders", 0), TopicPartition("orders", 1)])
    assert task._consumer.commits == [[("orders", 0, 6), ("orders", 1, 10)]]  # type: ignore[attr-defined]
    assert task._producer.flushes == 1  # type: ignore[attr-defined]


def test_lost_partitions_are_not_committed_by_a_member_that_no_longer_owns_them(task: Task) -> None:
    task.handle_batch([Message(0, 5), Message(1, 9)])  # type: ignore[list-item]
    task._on_lost(task._consumer, [TopicPartition("orders", 0)])
    task.finish()
    assert task._consumer.commits == [[("orders", 1, 10)]]  # type: ignore[attr-defined]


def test_close_commits_what_was_handled(task: Task) -> None:
    task.handle_batch([Message(1, 2)])  # type: ignore[list-item]
    task.close()
    assert task._consumer.commits == [[("orders", 1, 3)]]  # type: ignore[attr-defined]
