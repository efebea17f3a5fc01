"""Touches in the real ``Acker`` on a ``ManualClock`` with in-memory Kafka clients (as in
test_acker_timeouts): a touch moves a pending record's timeout, never shortens it, never
completes it; a touch read before its srid's persist record is kept for it; touches of
srid 0 or of another ledger partition are quarantined while the rest of the batch is folded."""

from __future__ import annotations

import numpy as np

from broker.ledger.clock import ManualClock
from broker.schemas import XorBatch
from tests.unit.fakes import FakeMessage
from tests.unit.test_acker_timeouts import (
    NS,
    R1,
    S1,
    T0,
    fake_kafka,  # noqa: F401 - the fixture
    make_acker,
    outcomes,
    persist_msg,
    persisted,
    run_steps,
)

S3 = S1 + 1  # ledger partition 1 of 2
EMPTY = np.empty(0, np.int64)


def touch_msg(offset: int, srids: list[int], deadlines: list[int], events: tuple[list[int], list[int]] = ([], [])) -> FakeMessage:
    batch = XorBatch(0, np.array(events[0], np.int64), np.array(events[1], np.int64), EMPTY, "unit",
                     np.array(srids, np.int64), np.array(deadlines, np.int64))
    return FakeMessage(NS.acks, 0, offset, None, batch.encode())


def test_a_touch_moves_the_timeout_and_an_earlier_one_does_not_shorten_it(fake_kafka: None) -> None:  # noqa: F811
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    consumer.batches.append([persist_msg(persisted(S1, R1, created_ms=T0, timeout_ms=1_000))])
    run_steps(acker)
    consumer.batches.append([touch_msg(0, [S1], [T0 + 5_000])])
    run_steps(acker)
    consumer.batches.append([touch_msg(1, [S1], [T0 + 2_000])])  # earlier: ignored
    run_steps(acker)
    clock.advance(4_900)
    run_steps(acker, 3)
    c = acker.counters()
    assert (c["timed_out"], c["touched"], c["pending"]) == (0, 2, 1) and not outcomes(producer)
    clock.advance(200)
    run_steps(acker, 3)
    assert acker.counters()["timed_out"] == 1 and outcomes(producer) == {S1: b"replay"}


def test_a_touch_read_before_its_persist_record_is_kept(fake_kafka: None) -> None:  # noqa: F811
    """ns.acks read ahead of ns.persist: the touch waits in an unregistered entry, and the
    registration takes the later of the record's deadline and the touched one."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    consumer.batches.append([touch_msg(0, [S1], [T0 + 5_000])])
    run_steps(acker)
    consumer.batches.append([persist_msg(persisted(S1, R1, created_ms=T0, timeout_ms=1_000))])
    run_steps(acker)
    clock.advance(4_900)
    run_steps(acker, 3)
    assert not outcomes(producer)  # not timed out at the record's 1 s: touched to 5 s
    clock.advance(200)
    run_steps(acker, 3)
    assert outcomes(producer) == {S1: b"replay"}
    c = acker.counters()
    assert (c["touched"], c.get("touches_ignored", 0), c["orphans"]) == (1, 0, 0)


def test_bad_touches_are_quarantined_and_the_events_of_their_batch_folded(fake_kafka: None) -> None:  # noqa: F811
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    consumer.batches.append([persist_msg(persisted(S1, R1, created_ms=T0))])
    consumer.batches.append([touch_msg(3, [S3, 0, S1], [T0 + 9_000, T0 + 9_000, T0 + 9_000], ([S1], [R1]))])
    run_steps(acker, 2)
    assert outcomes(producer) == {S1: b"completed"}
    c = acker.counters()
    # S1's touch came with its completing event: applied first.
    assert (c["completed"], c["quarantined"], c["touched"], c.get("touches_ignored", 0)) == (1, 1, 1, 0)
    (record,) = [p for p in producer.committed if p.topic == NS.dlq]
    assert b"2 touch(es) of srid 0 or of other ledger partitions" in (record.headers["rb-reason"] or b"")
    kept = XorBatch.decode(record.value)
    assert kept.touched.tolist() == [S3, 0] and kept.srids.size == 0
