"""A per-record handler's exception fails that input only - the others of the batch are acked
as usual - and, with ``fail_on_exception`` off, stops the task with what ran before it counted."""

from __future__ import annotations

import logging

import pytest

from broker.errors import ConfigurationError
from broker.headers import Tracking
from broker.retry import checked_retry_after_ms
from broker.schemas import XorBatch
from broker.settings import KafkaSettings
from broker.task import Task, TaskConfig, TaskContext, TaskCounters, TaskRecord
from broker.task.acks import Events, TaskAcks
from tests.unit.fakes import FakeKafka
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
    task = Task(KafkaSettings("fake:9092"), "unit", ["orders"], "g", _handler, TaskConfig(fail_on_exception=False), kafka=FakeKafka(producers=Producer, consumers=Consumer, partitions=2))
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
    config = TaskConfig(fatal=(BadInput,), fail_on_exception=fail_on_exception)
    task = Task(KafkaSettings("fake:9092"), "unit", ["orders"], "g", _rejecting, config, kafka=FakeKafka(producers=Producer, consumers=Consumer, partitions=2))
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


def _asking(record: TaskRecord, ctx: TaskContext) -> None:
    if record.offset == 1:
        ctx.fail("429 Too Many Requests", retry_after_ms=30_000)
    elif record.offset == 2:
        ctx.fail("flaky")
    elif record.offset == 4:
        ctx.fail("nonsense", retry_after_ms=-1)


def test_a_fail_with_retry_after_goes_out_beside_its_fail_mark_and_a_bad_one_is_an_exception(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 43 item 1: ``ctx.fail(retry_after_ms=...)`` overrides the back-off of that one
    failure; a value out of range raises, and the exception fails the input as any other."""
    task, sent = _task(monkeypatch, handler=_asking)
    task.handle_batch(_inputs())
    tracking = [Tracking.from_headers(m.headers()) for m in _inputs()]
    (events,) = sent
    assert events.retry_after_ms == {tracking[0].srid: 30_000}  # type: ignore[union-attr]
    assert set(events.failed) == {tracking[0].srid, tracking[1].srid, tracking[3].srid}  # type: ignore[union-attr]
    assert task.counters.errors == 1  # the bad retry_after_ms


def test_retry_afters_go_out_aligned_with_their_partitions_fail_marks() -> None:
    produced: list[tuple[int, bytes]] = []

    class Outputs:
        def produce(self, topic: str, *, value: bytes, partition: int) -> None:
            produced.append((partition, value))

    events = Events()
    events.failed = [6, 7, 8, 9]
    events.retry_after_ms = {8: 0, 7: 2_500}
    TaskAcks(Outputs(), "unit.acks", "t", TaskCounters(), lambda: 2).send(events)  # type: ignore[arg-type]
    batches = {lp: XorBatch.decode(v) for lp, v in produced}
    assert (batches[0].failed.tolist(), batches[0].retry_after_ms.tolist()) == ([6, 8], [-1, 0])
    assert (batches[1].failed.tolist(), batches[1].retry_after_ms.tolist()) == ([7, 9], [2_500, -1])
    events.retry_after_ms = {}
    produced.clear()
    TaskAcks(Outputs(), "unit.acks", "t", TaskCounters(), lambda: 2).send(events)  # type: ignore[arg-type]
    assert all(XorBatch.decode(v).retry_after_ms.size == 0 for _, v in produced)  # the shorter encoding


@pytest.mark.parametrize("ms", [-1, 86_400_001, 1.5, True, "10"])
def test_a_retry_after_outside_0_to_24_h_is_refused(ms: object) -> None:
    with pytest.raises(ValueError, match="retry_after_ms must be a whole number of ms from 0 to 86400000"):
        checked_retry_after_ms(ms)
