"""A per-record handler's exception fails that input only - the others of the batch are acked
as usual - and, with ``fail_on_exception`` off, stops the task with what ran before it counted."""

from __future__ import annotations

import logging

import pytest

import broker.task
from broker.headers import Tracking
from broker.settings import KafkaSettings
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from tests.unit.test_task_batch_handler import _by_srid, _inputs, _task
from tests.unit.test_task_interval_commit import Consumer, Producer


def _handler(record: TaskRecord, ctx: TaskContext) -> None:
    if record.offset == 2:
        raise ValueError("boom")
    if record.offset == 4:
        ctx.fail("mine")
        raise ValueError("after failing")


def test_an_exception_fails_its_input_and_the_batch_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    task, sent = _task(monkeypatch, handler=_handler)
    with caplog.at_level(logging.WARNING, "broker.task"):
        task.handle_batch(_inputs())
    tracking = [Tracking.from_headers(m.headers()) for m in _inputs()]
    assert all(t is not None for t in (tracking[0], tracking[1], tracking[3]))
    acked, failed = _by_srid(sent[0])
    assert acked == {tracking[0].srid: tracking[0].record_id}  # type: ignore[union-attr]
    assert failed == {tracking[1].srid, tracking[3].srid}  # type: ignore[union-attr]
    c = task.counters
    assert (c.processed, c.acked, c.failed, c.untracked, c.errors) == (4, 1, 2, 1, 2)
    # One line for the input the exception failed; an input failed already is not failed again.
    assert [r.getMessage() for r in caplog.records] == ["handler failed on orders[0]@2: ValueError('boom')"]


def test_an_exception_stops_the_task_without_fail_on_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker.task, "Producer", Producer)
    monkeypatch.setattr(broker.task, "Consumer", Consumer)
    monkeypatch.setattr(broker.task, "check", lambda *_a, **_k: 2)
    task = Task(KafkaSettings("fake:9092"), "unit", ["orders"], "g", _handler, TaskConfig(fail_on_exception=False))
    with pytest.raises(ValueError, match="boom"):
        task.handle_batch(_inputs())
    c = task.counters
    assert (c.processed, c.acked, c.failed, c.errors) == (2, 1, 0, 1)  # the first ran; the second raised
    assert task._uncommitted == {}  # nothing of the batch is committed
