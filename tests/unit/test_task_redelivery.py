"""The task's delivery-failure path as pure logic, against a fake producer that fails like a
broker does: a produce batch holding one record over the limit is refused whole; other
errors are per record. (tests/integration/test_task_delivery.py runs it on real Kafka.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from confluent_kafka import KafkaError

from broker import delivery
from broker.delivery import Outputs
from broker.headers import tracking_headers
from broker.schemas import XorBatch
from broker.task import Task, TaskConfig, TaskContext, TaskCounters, TaskRecord
from broker.task.acks import TaskAcks
from broker.task.outage import Outage, OutageHold
from broker.topics import Namespace

NS = Namespace("unit")
LIMIT = 100  # bytes a produce batch may hold


class FakeProducer:
    """Queues produces; ``flush`` delivers them one produce batch per topic, refusing a batch
    with a too-large record whole; ``error_for`` fails single records."""

    def __init__(self, error_for: Callable[[str, dict[str, Any]], int | None] = lambda t, kw: None) -> None:
        self.error_for = error_for
        self.queue: list[tuple[str, dict[str, Any], Any]] = []
        self.delivered: list[tuple[str, dict[str, Any]]] = []
        self.flushes = 0

    def produce(self, topic: str, on_delivery: Any = None, **kwargs: Any) -> None:
        self.queue.append((topic, kwargs, on_delivery))

    def flush(self, timeout: float | None = None) -> int:
        self.flushes += 1
        queue, self.queue = self.queue, []
        for topic in {t for t, _, _ in queue}:
            batch = [(kw, cb) for t, kw, cb in queue if t == topic]
            refused = any(len(kw.get("value") or b"") > LIMIT for kw, _ in batch)
            for kw, cb in batch:
                code = KafkaError.MSG_SIZE_TOO_LARGE if refused else self.error_for(topic, kw)
                if code is None:
                    self.delivered.append((topic, kw))
                cb(None if code is None else KafkaError(code), None)
        return 0

    def poll(self, timeout: float = 0) -> int:
        return 0


def make_task(producer: FakeProducer, **config: Any) -> Task:
    task = Task.__new__(Task)  # no Kafka: only the delivery path is exercised
    task.ns, task._ledger_partitions, task.name = NS, 2, "unit-task"
    task.config = TaskConfig(**{"retry_backoff_ms": 10, **config})
    task.counters = TaskCounters()
    task._producer = producer
    task._outputs = Outputs(producer, task.config.delivery_retries, task.config.retry_backoff_ms / 1000)
    task._outputs_pending = False
    task._uncommitted, task._commit_due = {}, 0.0
    task._skip = None
    task._acks = TaskAcks(task._outputs, NS.acks, task.name, task.counters, lambda: task.ledger_partitions)
    task._hold = OutageHold(Outage(task.config.outage_retry, task.config.outage_max_ms, 1_000), task._acks,
                            task.counters, lambda: None, task.config.touch_timeout_ms)  # type: ignore[arg-type,return-value]
    return task


def emit(task: Task, srid: int, value: bytes, topic: str = "out") -> None:
    task._produce(topic, key=b"k", value=value, headers=tracking_headers(srid, srid + 1000, srid, 1))


def fail_marks(producer: FakeProducer) -> list[int]:
    return sorted(
        srid for t, kw in producer.delivered if t == NS.acks for srid in XorBatch.decode(kw["value"]).failed.tolist()
    )


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(delivery.time, "sleep", slept.append)
    return slept


def test_small_records_refused_with_a_big_one_go_through_alone_and_only_the_big_ones_input_fails(
    sleeps: list[float],
) -> None:
    producer = FakeProducer()
    task = make_task(producer)
    for srid in (11, 12, 13):
        emit(task, srid, b"small %d" % srid)
    emit(task, 14, b"x" * 500)
    task._deliver()
    assert sorted(kw["value"] for t, kw in producer.delivered if t == "out") == [b"small 11", b"small 12", b"small 13"]
    assert fail_marks(producer) == [14]
    assert (task.counters.undeliverable, task.counters.retried_batches) == (1, 1)
    assert sleeps == [0.01]  # one round: alone, the big record is refused for good


def test_transient_errors_are_retried_with_back_off_a_bounded_number_of_times(sleeps: list[float]) -> None:
    producer = FakeProducer(lambda t, kw: KafkaError._MSG_TIMED_OUT if t == "out" else None)
    task = make_task(producer, delivery_retries=3)
    emit(task, 21, b"a")
    emit(task, 22, b"b")
    task._deliver()
    assert sleeps == [0.01, 0.02, 0.04]
    assert fail_marks(producer) == [21, 22]
    assert task.counters.undeliverable == 2


def test_a_transient_error_that_heals_fails_nothing(sleeps: list[float]) -> None:
    failures = iter([KafkaError._MSG_TIMED_OUT])
    producer = FakeProducer(lambda t, kw: next(failures, None))
    task = make_task(producer)
    emit(task, 31, b"a")
    task._deliver()
    assert [kw["value"] for t, kw in producer.delivered] == [b"a"]
    assert fail_marks(producer) == [] and task.counters.undeliverable == 0
    assert sleeps == [0.01]


def test_a_missing_topic_is_not_retried(sleeps: list[float]) -> None:
    producer = FakeProducer(lambda t, kw: KafkaError.UNKNOWN_TOPIC_OR_PART if t == "missing" else None)
    task = make_task(producer)
    emit(task, 41, b"a", topic="missing")
    emit(task, 42, b"b")
    task._deliver()
    assert sleeps == []
    assert fail_marks(producer) == [41]


def test_an_undeliverable_event_batch_fails_its_source_records_and_untracked_outputs_are_dropped(
    sleeps: list[float],
) -> None:
    producer = FakeProducer(
        lambda t, kw: KafkaError.UNKNOWN_TOPIC_OR_PART if kw.get("value", b"").startswith(b"x") or (
            t == NS.acks and XorBatch.decode(kw["value"]).srids.size
        ) else None
    )
    task = make_task(producer)
    task._produce("plain", key=None, value=b"x-untracked", headers=[])
    batch = XorBatch(0, *(np.asarray(a, dtype=np.int64) for a in ([52, 54], [1, 2], [56])), "unit-task")
    task._produce(NS.acks, value=batch.encode(), partition=0)
    task._deliver()
    assert fail_marks(producer) == [52, 54, 56]
    assert (task.counters.undeliverable, task.counters.dropped) == (3, 1)



class FakeMessage:
    def __init__(self, offset: int, srid: int, value: bytes, origin: int | None = None, attempt: int = 1) -> None:
        self._offset, self._value = offset, value
        self._headers = tracking_headers(srid, srid + 1000, srid if origin is None else origin, attempt)

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "in"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers


class FakeConsumer:
    def __init__(self) -> None:
        self.commits: list[list[tuple[str, int, int]]] = []

    def commit(self, offsets: list[Any], asynchronous: bool = True) -> None:
        self.commits.append([(tp.topic, tp.partition, tp.offset) for tp in offsets])


def events_sent(producer: FakeProducer) -> list[int]:
    return sorted(
        srid for t, kw in producer.delivered if t == NS.acks for srid in XorBatch.decode(kw["value"]).srids.tolist()
    )


def test_an_undeliverable_sink_output_fails_its_input_instead_of_acking_it_and_the_batch_is_committed(
    sleeps: list[float],
) -> None:
    producer = FakeProducer()
    task = make_task(producer)
    task._consumer = FakeConsumer()
    calls: list[int] = []

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        calls.append(record.offset)
        ctx.output("sink", record.key, record.value)  # b"big..." is over the sink's limit
        ctx.emit("out", record.key, b"child")

    task.handler = handler
    srid_small, srid_big = 71, 72
    failed = task.process_batch([FakeMessage(0, srid_small, b"small"), FakeMessage(1, srid_big, b"big" * 100)])
    assert failed == {srid_big}
    assert calls == [0, 1]  # the handler ran once per input: only the output was sent again
    assert [kw["value"] for t, kw in producer.delivered if t == "sink"] == [b"small"]
    # The event of the big input's tree never went out: its fail mark did, in the same batch.
    assert events_sent(producer) == [srid_small] and fail_marks(producer) == [srid_big]
    assert (task.counters.acked, task.counters.undeliverable) == (1, 1)
    assert task._consumer.commits == [[("in", 0, 2)]]
    assert sleeps == [0.01]


def test_a_sink_output_that_heals_is_acked_normally(sleeps: list[float]) -> None:
    failures = iter([KafkaError._MSG_TIMED_OUT])
    producer = FakeProducer(lambda t, kw: next(failures, None) if t == "sink" else None)
    task = make_task(producer)
    task._consumer = FakeConsumer()
    task.handler = lambda record, ctx: ctx.output("sink", record.key, record.value)
    assert task.process_batch([FakeMessage(0, 81, b"a")]) == set()
    assert events_sent(producer) == [81] and fail_marks(producer) == []
    assert (task.counters.acked, task.counters.undeliverable, task.counters.retried_batches) == (1, 0, 1)
