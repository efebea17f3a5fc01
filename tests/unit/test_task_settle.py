"""The per-record handler's path settles each input as ``_settle`` states it (its usual input,
a leaf acked, without the call): the same events and counters as the batch handler's path
for leaves, parents, failed, unacked and untracked inputs; and it lets go of each message."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from broker import ids
from broker.dev.faults import skip_ack, skipped_acks
from broker.headers import Tracking
from broker.task import TaskContext, TaskRecord
from tests.unit.test_task_batch_handler import Untracked, _task
from tests.unit.test_task_interval_commit import Message


def _inputs() -> list[Any]:
    return [Message(0, 1), Message(0, 2), Untracked(0, 3), Message(1, 4), Message(1, 5), Message(1, 6)]


def _act(record: TaskRecord, ctx: TaskContext) -> None:
    if record.offset == 2:
        ctx.emit("out", b"k", b"a")
        ctx.emit("out", b"k", b"b")
    elif record.offset == 4:
        ctx.fail("no")
    elif record.offset == 5:
        skip_ack(ctx)


def _run(monkeypatch: pytest.MonkeyPatch, per_batch: bool) -> tuple[list[int], list[int], list[int], Any]:
    child_ids = itertools.count(1000)
    monkeypatch.setattr(ids, "new_id", lambda: next(child_ids))

    def each(records: list[TaskRecord], contexts: list[TaskContext]) -> None:
        for record, ctx in zip(records, contexts, strict=True):
            _act(record, ctx)

    task, sent = _task(monkeypatch, **({"batch_handler": each} if per_batch else {"handler": _act}))
    batch = _inputs()
    task.handle_batch(batch)
    assert batch == []  # each message let go once read
    events, = sent
    return events.srids, events.xors, events.failed, (task.counters, skipped_acks(task))


def test_each_input_settles_as_with_the_batch_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    t = [Tracking.from_headers(m.headers()) for m in _inputs()]
    leaf, parent, _untracked, failed, _unacked, last = t
    assert leaf and parent and failed and last
    srids, xors, fails, counters = _run(monkeypatch, per_batch=False)
    assert srids == [leaf.srid, parent.srid, last.srid]
    assert xors == [leaf.record_id, parent.record_id ^ 1000 ^ 1001, last.record_id]
    assert fails == [failed.srid]
    c, unacked = counters
    assert (c.processed, c.acked, c.failed, unacked, c.untracked, c.emitted) == (6, 3, 1, 1, 1, 2)
    assert _run(monkeypatch, per_batch=True) == (srids, xors, fails, counters)
