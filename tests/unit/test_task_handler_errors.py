"""A per-record handler's exception fails that input only - the others of the batch are acked
as usual - and, with ``fail_on_exception`` off, stops the task with what ran before it counted."""

from __future__ import annotations

import logging

import pytest

import broker.task
from broker.errors import ConfigurationError
from broker.headers import Tracking
from broker.schemas import XorBatch
from broker.settings import KafkaSettings
from broker.task import Task, TaskConfig, TaskContext, TaskCounters, TaskRecord
from broker.task_acks import Events, TaskAcks
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


class BadInput(Exception):
    pass


def _rejecting(record: TaskRecord, ctx: TaskContext) -> None:
    if record.offset == 1:
        ctx.reject("no such sku")
    elif record.offset == 2:
        raise BadInput("not json")
    elif record.offset == 4:
        raise ValueError("flaky")


@pytest.mark.parametrize("fail_on_exception", [True, False])
def test_a_rejection_or_a_fatal_exception_dead_letters_its_input_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, fail_on_exception: bool
) -> None:
    """Issue 43 item 2: ``ctx.reject`` and ``TaskConfig(fatal=...)`` reject an input (its
    attempts are not spent on an error that comes back every time); any other exception fails
    it as before - or stops the task without ``fail_on_exception``, while a fatal one never does."""
    monkeypatch.setattr(broker.task, "Producer", Producer)
    monkeypatch.setattr(broker.task, "Consumer", Consumer)
    monkeypatch.setattr(broker.task, "check", lambda *_a, **_k: 2)
    config = TaskConfig(fatal=(BadInput,), fail_on_exception=fail_on_exception)
    task = Task(KafkaSettings("fake:9092"), "unit", ["orders"], "g", _rejecting, config)
    sent: list[Events] = []
    monkeypatch.setattr(TaskAcks, "send", lambda _self, events: sent.append(events))
    tracking = [Tracking.from_headers(m.headers()) for m in _inputs()]
    if not fail_on_exception:
        with pytest.raises(ValueError, match="flaky"):
            task.handle_batch(_inputs())
        return
    task.handle_batch(_inputs())
    (events,) = sent
    assert events.rejected == {
        tracking[0].srid: "no such sku",  # type: ignore[union-attr]
        tracking[1].srid: "exception: BadInput: not json",  # type: ignore[union-attr]
    }
    assert set(events.failed) == {tracking[3].srid}  # type: ignore[union-attr]
    c = task.counters
    assert (c.processed, c.acked, c.failed, c.rejected, c.errors) == (4, 0, 1, 2, 2)


def test_a_fatal_setting_is_exception_classes() -> None:
    assert TaskConfig(fatal=BadInput).fatal == (BadInput,)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"TaskConfig\.fatal must be exception classes"):
        TaskConfig(fatal=("ValueError",))  # type: ignore[arg-type]


def test_rejections_go_to_their_ledger_partitions_with_their_reasons() -> None:
    produced: list[tuple[int, bytes]] = []

    class Outputs:
        def produce(self, topic: str, *, value: bytes, partition: int) -> None:
            produced.append((partition, value))

    events = Events()
    events.srids, events.xors = [4], [40]
    events.rejected = {6: "a", 7: "b", 8: "c"}
    TaskAcks(Outputs(), "unit.acks", "t", TaskCounters(), lambda: 2).send(events)  # type: ignore[arg-type]
    batches = {lp: XorBatch.decode(v) for lp, v in produced}
    assert batches[0].srids.tolist() == [4]
    assert (batches[0].rejected.tolist(), batches[0].rejected_reasons) == ([6, 8], ("a", "c"))
    assert (batches[1].rejected.tolist(), batches[1].rejected_reasons) == ([7], ("b",))
