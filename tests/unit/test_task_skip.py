"""A task skips superseded replays: acks them as leaves without running the handler
(docs/design.md §6). No Kafka: the task's delivery path on a fake producer, markers in memory."""

from __future__ import annotations

from typing import Any

from broker.markers import SupersededMarkers
from broker.schemas import XorBatch
from broker.task import Task, TaskContext, TaskRecord
from broker.task.superseded import SupersededSkip
from tests.unit.test_task_redelivery import NS, FakeConsumer, FakeMessage, FakeProducer, make_task


def Msg(offset: int, srid: int, origin: int, attempt: int) -> FakeMessage:
    return FakeMessage(offset, srid, b"v", origin, attempt)


def markers(*srids: int) -> SupersededMarkers:
    m = SupersededMarkers.__new__(SupersededMarkers)
    m.srids, m.read, m._consumer = dict.fromkeys(srids), len(srids), None
    return m


def task_with(marked: SupersededMarkers | None, **config: Any) -> tuple[Task, FakeProducer, list[int]]:
    producer = FakeProducer()
    task = make_task(producer, **config)
    task._consumer = FakeConsumer()
    task._skip = None if marked is None else SupersededSkip(
        marked, task.counters, producer.flush, slow_batch_ms=task.config.slow_batch_ms,
        superseded_wait_ms=task.config.superseded_wait_ms,
    )
    ran: list[int] = []

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        assert record.tracking is not None
        ran.append(record.tracking.srid)
        ctx.output("sink", record.key, record.value)

    task.handler = handler
    return task, producer, ran


def events(producer: FakeProducer) -> dict[int, int]:
    out: dict[int, int] = {}
    for t, kw in producer.delivered:
        if t == NS.acks:
            xb = XorBatch.decode(kw["value"])
            out.update(zip(xb.srids.tolist(), xb.xors.tolist(), strict=True))
    return out


def test_a_marked_replay_is_acked_as_a_leaf_without_running_the_handler() -> None:
    task, producer, ran = task_with(markers(12))
    task.process_batch([Msg(0, 10, 10, 1), Msg(1, 12, 11, 2), Msg(2, 14, 13, 2)])
    assert ran == [10, 14]  # the first attempt and the unmarked replay
    assert [kw["value"] for t, kw in producer.delivered if t == "sink"] == [b"v", b"v"]
    assert events(producer)[12] == 12 + 1000  # its record id: the replay's tree completes
    assert (task.counters.skipped, task.counters.processed, task.counters.acked) == (1, 2, 2)
    assert task._consumer.commits == [[("in", 0, 3)]]


def test_a_first_attempt_is_never_skipped_and_no_markers_change_nothing() -> None:
    task, _, ran = task_with(markers(10))  # a marker can only name a replay
    task.process_batch([Msg(0, 10, 10, 1)])
    assert ran == [10] and task.counters.skipped == 0
    task, _, ran = task_with(None)
    task.process_batch([Msg(0, 12, 11, 2)])
    assert ran == [12] and task.counters.skipped == 0


def test_replays_of_a_slow_batch_wait_for_their_markers_in_one_shared_window(monkeypatch: Any) -> None:
    marked = markers()
    waits: list[float] = []

    def wait_for(srid: int, timeout_s: float) -> bool:
        waits.append(timeout_s)
        return srid == 22  # its marker arrives while the task waits

    monkeypatch.setattr(marked, "wait_for", wait_for)
    task, _, ran = task_with(marked, slow_batch_ms=0, superseded_wait_ms=300)
    task.process_batch([Msg(0, 20, 20, 1), Msg(1, 30, 30, 1), Msg(2, 40, 40, 1)])  # "slow": > 0 s
    task.process_batch([Msg(3, 22, 20, 2), Msg(4, 32, 30, 2), Msg(5, 52, 50, 2)])
    assert ran == [20, 30, 40, 32, 52]  # 22 skipped after its wait; 52's origin was not slow
    assert task.counters.skipped == 1 and task.counters.superseded_waits == 2
    assert len(waits) == 2 and all(w <= 0.3 for w in waits) and waits[1] <= waits[0]  # one window

