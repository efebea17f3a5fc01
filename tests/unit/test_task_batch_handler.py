"""A task's batch handler: one call per poll batch, with the per-record handler's semantics for
each input - returning acks it (``input.id ^ children``), ``ctx.fail`` fails it, an exception
fails every input not failed already, untracked inputs are processed and never acked."""

from __future__ import annotations

from typing import Any

import pytest

from broker.errors import ConfigurationError
from broker.headers import Tracking
from broker.settings import KafkaSettings
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from broker.task.acks import Events, TaskAcks
from tests.unit.fakes import FakeKafka
from tests.unit.test_task_interval_commit import Consumer, Message, Producer


class Untracked(Message):
    def headers(self) -> list[tuple[str, bytes]]:
        return [("user", b"x")]


def _task(monkeypatch: pytest.MonkeyPatch, **handlers: Any) -> tuple[Task, list[Events]]:
    task = Task(KafkaSettings("fake:9092"), "unit", ["orders"], "g", config=TaskConfig(), **handlers, kafka=FakeKafka(producers=Producer, consumers=Consumer, partitions=2))
    sent: list[Events] = []
    monkeypatch.setattr(TaskAcks, "send", lambda _self, events: sent.append(events))
    return task, sent


def _by_srid(events: Events) -> tuple[dict[int, int], set[int]]:
    return dict(zip(events.srids, events.xors, strict=True)), set(events.failed)


def _inputs() -> list[Any]:
    return [Message(0, 1), Message(0, 2), Untracked(0, 3), Message(1, 4)]


def test_the_batch_handler_gets_the_whole_batch_and_acks_like_the_record_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    children: dict[int, int] = {}

    def handle_batch(records: list[TaskRecord], contexts: list[TaskContext]) -> None:
        calls.append(len(records))
        for record, ctx in zip(records, contexts, strict=True):
            assert ctx.record is record
            if record.offset == 2:
                ctx.fail("no")
            elif record.tracking is not None:
                children[record.tracking.srid] = ctx.emit("out", record.key, record.value)

    task, sent = _task(monkeypatch, batch_handler=handle_batch)
    task.handle_batch(_inputs())
    assert calls == [4]
    acked, failed = _by_srid(sent[0])
    tracking = [Tracking.from_headers(m.headers()) for m in _inputs()]
    assert acked == {t.srid: t.record_id ^ children[t.srid] for t in (tracking[0], tracking[3]) if t}
    assert failed == {tracking[1].srid if tracking[1] else 0}
    c = task.counters
    assert (c.processed, c.acked, c.failed, c.untracked, c.emitted) == (4, 2, 1, 1, 2)


def test_an_exception_fails_every_input_not_failed_already(monkeypatch: pytest.MonkeyPatch) -> None:
    def handle_batch(records: list[TaskRecord], contexts: list[TaskContext]) -> None:
        contexts[0].fail("mine")
        raise ValueError("boom")

    task, sent = _task(monkeypatch, batch_handler=handle_batch)
    task.handle_batch(_inputs())
    acked, failed = _by_srid(sent[0])
    assert acked == {} and len(failed) == 3  # the untracked input has nothing to fail
    assert (task.counters.errors, task.counters.failed) == (1, 3)


def test_an_exception_stops_the_task_without_fail_on_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    def handle_batch(records: list[TaskRecord], contexts: list[TaskContext]) -> None:
        raise ValueError("boom")

    task = Task(KafkaSettings("fake:9092"), "unit", ["orders"], "g", config=TaskConfig(fail_on_exception=False),
                batch_handler=handle_batch, kafka=FakeKafka(producers=Producer, consumers=Consumer, partitions=2))
    with pytest.raises(ValueError, match="boom"):
        task.handle_batch(_inputs())


def test_a_task_takes_one_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="one of them"):
        _task(monkeypatch)
    with pytest.raises(ConfigurationError, match="one of them"):
        _task(monkeypatch, handler=lambda _r, _c: None, batch_handler=lambda _r, _c: None)
