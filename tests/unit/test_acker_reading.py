"""The acker's reading order (broker.acker.reading): events newer than the persist records read
wait while ``ns.persist[i]`` is ``behind`` (here 5) records or more behind - its table, then the
transitions, against a consumer whose position and watermarks are scripted."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_INVALID,
    TIMESTAMP_CREATE_TIME,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from broker.acker.reading import ReadingOrder
from broker.topics import Namespace

NS = Namespace("order")
START = {(NS.persist, 0): 10, (NS.persist, 1): 10}  # the offsets assigned: the acker's positions


class Msg:
    def __init__(self, ms: int, offset: int = 0) -> None:
        self.ms = ms
        self._offset = offset

    def timestamp(self) -> tuple[int, int]:
        return (TIMESTAMP_CREATE_TIME, self.ms)

    def offset(self) -> int:
        return self._offset


class Consumer:
    def __init__(self) -> None:
        self.high: dict[int, int] = {}  # persist lp -> cached high watermark
        self.position_of: dict[int, int] = {}  # persist lp -> position
        self.calls: list[tuple[str, int]] = []
        self.seeks: list[tuple[int, int]] = []

    def seek(self, tp: TopicPartition) -> None:
        assert tp.topic == NS.acks
        self.seeks.append((tp.partition, tp.offset))

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float | None = None, cached: bool = False) -> tuple[int, int]:
        assert cached and tp.topic == NS.persist
        return (0, self.high.get(tp.partition, OFFSET_INVALID))

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.position_of.get(tp.partition, OFFSET_INVALID)) for tp in partitions]

    def pause(self, tps: list[TopicPartition]) -> None:
        self.calls += [("pause", tp.partition) for tp in tps if tp.topic == NS.acks]

    def resume(self, tps: list[TopicPartition]) -> None:
        self.calls += [("resume", tp.partition) for tp in tps if tp.topic == NS.acks]


class Gate:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def paused(self, tp: TopicPartition) -> None:
        self.calls.append(("paused", tp.partition))

    def resumed(self, tp: TopicPartition) -> None:
        self.calls.append(("resumed", tp.partition))


def make() -> tuple[ReadingOrder, Consumer, Gate]:
    gate = Gate()
    return ReadingOrder(NS, gate, behind=5), Consumer(), gate  # type: ignore[arg-type]


def read(order: ReadingOrder, consumer: Consumer, lp: int, *, persist_ms: int | None = None,
         acks_ms: int | None = None) -> list[Any]:
    """One poll's messages of ``lp``; returns the ack messages folded."""
    persist: dict[int, list[Any]] = {} if persist_ms is None else {lp: [Msg(persist_ms - 1), Msg(persist_ms)]}
    acks: dict[int, list[Any]] = {} if acks_ms is None else {lp: [Msg(acks_ms)]}
    order.admit(consumer, persist, acks, START)  # type: ignore[arg-type]
    return acks.get(lp, [])


@pytest.mark.parametrize(
    ("position", "high", "persist_ms", "acks_ms", "paused"),
    [
        (10, 10, 100, 200, False),  # persist read to its end: acks are never held back
        (6, 10, 100, 200, False),  # fewer than ``behind`` unread: as good as read
        (5, 10, 200, 100, False),  # events older than the persist records read
        (5, 10, 200, 200, False),  # as old
        (5, 10, 100, 200, True),  # unread persist records, newer events: paused
        (OFFSET_INVALID, OFFSET_INVALID, 100, 200, True),  # no fetch of persist since the assignment
        (OFFSET_INVALID, 10, 100, 200, False),  # fetched, nothing after the offset assigned
        (OFFSET_INVALID, 15, 100, 200, True),  # fetched, records after the offset assigned
        (5, 10, None, 200, True),  # events read, no persist record yet, persist unread
        (5, 10, 100, None, False),  # no event read yet
    ],
)
def test_the_table(position: int, high: int, persist_ms: int | None, acks_ms: int | None, paused: bool) -> None:
    order, consumer, gate = make()
    consumer.position_of[0], consumer.high[0] = position, high
    read(order, consumer, 0, persist_ms=persist_ms, acks_ms=acks_ms)
    order.apply(consumer, [0], START)  # type: ignore[arg-type]
    assert consumer.calls == ([("pause", 0)] if paused else [])
    assert gate.calls == ([("paused", 0)] if paused else [])
    assert order.paused == ({0} if paused else set())


def test_paused_until_persist_catches_up_in_time_then_until_its_end() -> None:
    order, consumer, gate = make()
    consumer.position_of[0], consumer.high[0] = 5, 100
    read(order, consumer, 0, persist_ms=100, acks_ms=300)
    order.apply(consumer, [0], START)  # type: ignore[arg-type]
    order.apply(consumer, [0], START)  # type: ignore[arg-type]  # nothing new: stays paused, once
    read(order, consumer, 0, persist_ms=200)
    order.apply(consumer, [0], START)  # type: ignore[arg-type]
    assert order.paused == {0}
    read(order, consumer, 0, persist_ms=300)  # read as far in time as the events
    consumer.position_of[0] = 50
    order.apply(consumer, [0], START)  # type: ignore[arg-type]
    assert consumer.calls == [("pause", 0), ("resume", 0)] and gate.calls == [("paused", 0), ("resumed", 0)]
    read(order, consumer, 0, acks_ms=900)  # ahead again (a task clock ahead of the source's)
    order.apply(consumer, [0], START)  # type: ignore[arg-type]
    consumer.position_of[0] = 100  # persist read to its end: resumed, whatever the clocks say
    order.apply(consumer, [0], START)  # type: ignore[arg-type]
    assert consumer.calls[2:] == [("pause", 0), ("resume", 0)]
    assert order.pauses == 2


def test_partitions_are_apart_and_forgotten_ones_are_left_to_their_restore() -> None:
    order, consumer, _ = make()
    for lp in (0, 1):
        consumer.position_of[lp], consumer.high[lp] = 5, 10
        read(order, consumer, lp, persist_ms=100, acks_ms=200 if lp == 0 else 50)
    order.apply(consumer, [0, 1], START)  # type: ignore[arg-type]
    assert order.paused == {0}
    order.forget([0])  # revoked, lost or rewound: its inputs are the restore's to resume
    order.apply(consumer, [1], START)  # type: ignore[arg-type]
    assert consumer.calls == [("pause", 0)] and order.paused == set()


def test_an_ack_batch_is_cut_at_its_first_event_newer_than_the_persist_records_read() -> None:
    """What a poll already delivered is not folded ahead either: the acks partition is sought
    back to the first newer event, and paused until persist is read that far."""
    order, consumer, _ = make()
    consumer.position_of[0], consumer.high[0] = 5, 100
    persist = {0: [Msg(90), Msg(100)]}
    acks = {0: [Msg(80, 7), Msg(100, 8), Msg(101, 9), Msg(99, 10)]}
    order.admit(consumer, persist, acks, START)  # type: ignore[arg-type]
    assert [m.offset() for m in acks[0]] == [7, 8] and consumer.seeks == [(0, 9)]
    order.apply(consumer, [0], START)  # type: ignore[arg-type]
    assert consumer.calls == [("pause", 0)]
    only_newer = {0: [Msg(120, 9)]}
    order.admit(consumer, {}, only_newer, START)  # type: ignore[arg-type]
    assert only_newer == {} and consumer.seeks[-1] == (0, 9) and order.held == 3
    consumer.position_of[0] = 100  # persist read to its end: nothing is cut
    whole = {0: [Msg(101, 9), Msg(120, 10)]}
    order.admit(consumer, {}, whole, START)  # type: ignore[arg-type]
    assert [m.offset() for m in whole[0]] == [9, 10]


def test_a_failing_seek_keeps_the_whole_batch() -> None:
    order, consumer, _ = make()
    consumer.position_of[0], consumer.high[0] = 5, 100

    def refuse(tp: TopicPartition) -> None:
        raise KafkaException(KafkaError(KafkaError._STATE))

    consumer.seek = refuse  # type: ignore[method-assign]
    acks = {0: [Msg(80, 7), Msg(200, 8)]}
    order.admit(consumer, {0: [Msg(100)]}, acks, START)  # type: ignore[arg-type]
    assert [m.offset() for m in acks[0]] == [7, 8]
