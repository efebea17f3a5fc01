"""A dependency that is down (broker.task.outage, ``TaskConfig.outage``): the input is put back - its
partition sought back to it, nothing of it acked, failed or committed, every partition paused,
the records held touched - and tried again after a back-off; the first input that goes through
ends the outage; one still in it after ``outage_max_ms`` is failed as any failure. No Kafka:
the consumer is a stand-in that records what the task asks of it."""

from __future__ import annotations

import random
from typing import Any

import pytest
from confluent_kafka import TopicPartition

import broker.task.service
from broker.errors import ConfigurationError
from broker.headers import Tracking
from broker.retry import RetryPolicy
from broker.settings import KafkaSettings
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from broker.task.acks import Events, TaskAcks
from tests.unit.fakes import FakeKafka
from tests.unit.test_task_interval_commit import Message, Producer


class Consumer:
    def __init__(self, conf: dict[str, Any]) -> None:
        self.sought: list[tuple[str, int, int]] = []
        self.paused: set[tuple[str, int]] = set()
        self.assigned = [TopicPartition("orders", p) for p in range(2)]
        self.commits: list[list[tuple[str, int, int]]] = []

    def seek(self, tp: TopicPartition) -> None:
        self.sought.append((tp.topic, tp.partition, tp.offset))

    def assignment(self) -> list[TopicPartition]:
        return self.assigned

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in tps}

    def commit(self, offsets: list[TopicPartition], **_: Any) -> None:
        self.commits.append(sorted((tp.topic, tp.partition, tp.offset) for tp in offsets))

    def close(self) -> None:
        pass


class Down(Exception):
    pass


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(monkeypatch: pytest.MonkeyPatch, handler: Any, **config: Any) -> tuple[Task, list[Events], list[int], Clock]:
    settings = {"outage": (Down,), "outage_retry": RetryPolicy(100, 2.0, 1_000, 0.0), **config}
    task = Task(KafkaSettings("fake:9092"), "unit", ["orders"], "g", handler, TaskConfig(**settings), kafka=FakeKafka(producers=Producer, consumers=Consumer, partitions=2))
    clock = Clock()
    task._outage._clock = clock
    sent: list[Events] = []
    touched: list[int] = []
    monkeypatch.setattr(TaskAcks, "send", lambda _self, events: sent.append(events))
    monkeypatch.setattr(TaskAcks, "touch", lambda _self, srid, _deadline: touched.append(srid))
    return task, sent, touched, clock


def srid(offset: int) -> int:
    tracking = Tracking.from_headers(Message(0, offset).headers())
    assert tracking is not None
    return tracking.srid


def test_an_outage_puts_the_input_and_the_rest_of_the_batch_back_and_tries_again_after_a_back_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    down = {"until": 3}
    calls: list[int] = []

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        calls.append(record.offset)
        if record.offset == 2 and down["until"] > 0:
            down["until"] -= 1
            raise Down("the service is down")

    task, sent, touched, clock = make(monkeypatch, handler)
    consumer = task._consumer
    task.handle_batch([Message(0, 1), Message(0, 2), Message(0, 3), Message(1, 7)])
    (events,) = sent
    assert events.srids == [srid(1)] and not events.failed and not events.rejected  # only what went through
    assert consumer.sought == [("orders", 0, 2), ("orders", 1, 7)]  # read again from the input put back
    assert task._uncommitted == {("orders", 0): 2, ("orders", 1): 7}  # committed no further
    assert consumer.paused == {("orders", 0), ("orders", 1)}
    assert sorted(touched) == sorted([srid(2), srid(3), srid(7)])  # what it holds does not time out
    c = task.counters
    assert (c.outages, c.outage_tries, c.failed, c.errors, c.processed) == (1, 1, 0, 0, 1)
    assert task.metrics.registry.get_sample_value("replaybroker_task_outage_seconds") == 0.0

    task._hold.wait_out()  # not due yet: still paused
    assert consumer.paused and task._outage.paused
    clock.now += 0.1  # the first back-off: 100 ms
    task._hold.wait_out()
    assert not consumer.paused  # resumed: the next poll reads the input again
    task.handle_batch([Message(0, 2), Message(0, 3)])  # still down: the next back-off doubles
    assert task._outage.next_try == pytest.approx(clock.now + 0.2)
    assert (task.counters.outages, task.counters.outage_tries) == (1, 2)
    clock.now += 5.0
    assert task.metrics.registry.get_sample_value("replaybroker_task_outage_seconds") == pytest.approx(5.1)
    task._hold.wait_out()
    task.handle_batch([Message(0, 2), Message(0, 3)])
    task._hold.wait_out()
    task.handle_batch([Message(0, 2), Message(0, 3)])  # up again: the outage is over
    assert [e.srids for e in sent[-1:]] == [[srid(2), srid(3)]]
    assert task._outage.since is None and not task._outage.paused
    assert calls == [1, 2, 2, 2, 2, 3]  # one call to the service per try, not one per record
    assert not any(e.failed for e in sent)  # no attempt was spent


def test_an_input_still_in_the_outage_after_outage_max_ms_is_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        raise Down("still down")

    task, sent, _touched, clock = make(monkeypatch, handler, outage_max_ms=10_000)
    task.handle_batch([Message(0, 1)])
    assert not sent[-1].failed and task._outage.paused
    clock.now += 10.0
    task._hold.wait_out()
    task.handle_batch([Message(0, 1), Message(0, 2)])
    assert sent[-1].failed == [srid(1)]  # failed as before: replayed, an attempt spent
    # ... and the next input in it begins a new outage: put back, not failed
    assert task._outage.since == clock.now and task._consumer.sought[-1] == ("orders", 0, 2)
    assert (task.counters.failed, task.counters.outages) == (1, 2)


def test_a_batch_handler_puts_its_whole_batch_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def batch_handler(records: list[TaskRecord], contexts: list[TaskContext]) -> None:
        raise Down("down")

    task = Task(KafkaSettings("fake:9092"), "unit", ["orders"], "g", batch_handler=batch_handler,
                config=TaskConfig(outage=(Down,)), kafka=FakeKafka(producers=Producer, consumers=Consumer, partitions=2))
    sent: list[Events] = []
    monkeypatch.setattr(TaskAcks, "send", lambda _self, events: sent.append(events))
    monkeypatch.setattr(TaskAcks, "touch", lambda *_a: None)
    task.handle_batch([Message(0, 4), Message(1, 9)])
    assert task._consumer.sought == [("orders", 0, 4), ("orders", 1, 9)]
    assert not sent or not (sent[-1].srids or sent[-1].failed)
    assert task.counters.processed == 0 and task.counters.outages == 1


def test_outage_settings_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="outage must be exception classes"):
        TaskConfig(outage=(KeyboardInterrupt,))  # type: ignore[arg-type]
    assert TaskConfig(outage=Down).outage == (Down,)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="outage_max_ms"):
        TaskConfig(outage_max_ms=-1)


@pytest.mark.parametrize(
    ("fields", "match"),
    [({"initial_ms": 0}, "initial_ms"), ({"initial_ms": -5}, "initial_ms"), ({"multiplier": 0.5}, "multiplier"),
     ({"multiplier": float("nan")}, "multiplier"), ({"max_ms": 10, "initial_ms": 100}, "max_ms"),
     ({"jitter": 1.5}, "jitter"), ({"jitter": -0.1}, "jitter")],
)
def test_a_retry_policy_that_makes_no_sense_is_refused(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        RetryPolicy(**fields)


def test_retry_delays_grow_to_their_cap_within_their_jitter() -> None:
    policy = RetryPolicy(100, 3.0, 2_000, 0.0)
    assert [policy.delay_ms(n) for n in range(1, 6)] == [100, 300, 900, 2_000, 2_000]
    assert policy.delay_ms(10_000) == 2_000  # no overflow however many tries
    jittered = RetryPolicy(1_000, 2.0, 60_000, 0.2)
    rng = random.Random(7)
    delays = [jittered.delay_ms(1, rng) for _ in range(500)]
    assert 800 <= min(delays) < 850 and 1_150 < max(delays) <= 1_200


def test_an_outage_sends_a_beat_at_once_then_every_second_never_past_outage_max_ms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The records queued behind the paused task are unknown to it: it reports the outage to
    every ledger partition instead (broker.ledger.outages)."""
    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        raise Down("down")

    task, _sent, _touched, clock = make(monkeypatch, handler, outage_max_ms=4_000)
    beats: list[tuple[int, int]] = []
    monkeypatch.setattr(TaskAcks, "outage_beat", lambda _self, since, until: beats.append((since, until)))
    wall = {"ms": 1_700_000_000_000}
    monkeypatch.setattr(broker.task.service.time, "time", lambda: wall["ms"] / 1000)
    task.handle_batch([Message(0, 1)])
    since = task._outage.since_ms
    assert since is not None and beats == [(since, wall["ms"] + 3_000)]  # at once, covering 3 s ahead
    clock.now += 0.5
    wall["ms"] += 500
    task._hold.wait_out()
    assert len(beats) == 1  # not due yet
    clock.now += 0.5
    wall["ms"] += 500
    task._hold.wait_out()
    assert beats[-1] == (since, wall["ms"] + 3_000) and task.counters.outage_beats == 2
    clock.now += 2.0
    wall["ms"] += 2_000
    task._hold.wait_out()
    assert beats[-1] == (since, since + 4_000)  # never past outage_max_ms after it began


def test_the_beat_goes_to_every_ledger_partition_with_its_key() -> None:
    from broker.schemas import OUTAGE_BEAT_KEY, OutageBeat

    produced: list[tuple[str, dict[str, Any]]] = []

    class Recording(Producer):
        def produce(self, topic: str, **kwargs: Any) -> None:
            produced.append((topic, kwargs))

    outputs = type("Outputs", (), {"producer": Recording({})})()
    acks = TaskAcks(outputs, "unit.acks", "g", broker.task.service.TaskCounters(), lambda: 3)  # type: ignore[arg-type]
    acks.outage_beat(1_000, 4_000)
    assert [(t, k["partition"], k["key"]) for t, k in produced] == [("unit.acks", p, OUTAGE_BEAT_KEY) for p in range(3)]
    assert OutageBeat.decode(produced[0][1]["value"]) == OutageBeat("g", 1_000, 4_000)
