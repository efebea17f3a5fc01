"""Bad pairs in an XorBatch: only they are quarantined, the good pairs of the same batch are
folded at once (the real ``Acker`` on a ``ManualClock`` with in-memory Kafka clients, as in
test_acker_timeouts). A batch whose ledger_partition is wrong, or that is undecodable, is still
quarantined whole, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

from broker import ids
from broker.headers import persist_headers
from broker.ledger.clock import ManualClock
from broker.schemas import XorBatch
from tests.unit.test_acker_timeouts import (
    NS,
    R1,
    R2,
    S1,
    S2,
    T0,
    FakeMessage,
    FakeProducer,
    HeaderMessage,
    Produced,
    acks_msg,
    fake_kafka,  # noqa: F401 - the fixture
    make_acker,
    outcomes,
    persist_msg,
    persisted,
    run_steps,
)

S3 = S1 + 1  # ledger partition 1 of 2: not this batch's
EMPTY = np.empty(0, np.int64)


def dlq(producer: FakeProducer) -> list[Produced]:
    return [p for p in producer.committed if p.topic == NS.dlq]


@pytest.mark.parametrize(
    ("bad_srids", "bad_failed", "why"),
    [
        ([S3], [], b"1 event(s) of"),  # an event of another ledger partition
        ([0], [], b"1 event(s) of"),  # srid 0
        ([], [S3], b"1 fail mark(s) of"),  # a fail mark of another ledger partition
        ([0, S3], [0], b"2 event(s) and 1 fail mark(s) of"),  # several bad ones: all of them, and only them
    ],
)
def test_only_the_bad_pairs_of_a_batch_are_quarantined(
    fake_kafka: None, bad_srids: list[int], bad_failed: list[int], why: bytes  # noqa: F811
) -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    consumer.batches.append([persist_msg(persisted(S1, R1, T0)), persist_msg(persisted(S2, R2, T0), 1)])
    bad_xors = [0x51 + i for i in range(len(bad_srids))]
    srids, xors = [S1, *bad_srids, S2], [R1, *bad_xors, R2]  # the bad pairs in the middle
    consumer.batches.append([acks_msg(0, 7, srids, xors, bad_failed)])
    run_steps(acker, 2)

    # the good trees complete at once, no timeout needed
    assert outcomes(producer) == {S1: b"completed", S2: b"completed"}
    c = acker.counters()
    assert (c["completed"], c["folded"], c["quarantined"], c["pending"]) == (2, 2, 1, 0)
    assert c["fail_marks"] == 0  # a bad fail mark is not folded either

    # exactly the bad pairs, as an XorBatch of their own, with the reason and the source
    (record,) = dlq(producer)
    assert record.headers["rb-source"] == f"{NS.acks}/0/7".encode()
    reason = record.headers["rb-reason"] or b""
    assert reason.startswith(b"quarantine: ") and why in reason
    kept = XorBatch.decode(record.value)
    assert kept.ledger_partition == 0 and kept.producer == "unit"
    assert kept.srids.tolist() == bad_srids and kept.xors.tolist() == bad_xors
    assert kept.failed.tolist() == bad_failed


def test_a_batch_of_only_bad_pairs_is_kept_byte_for_byte(fake_kafka: None) -> None:  # noqa: F811
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    msg = acks_msg(0, 3, [S3, 0], [R1, R2], [S3])
    consumer.batches.append([msg])
    run_steps(acker)
    (record,) = dlq(producer)
    assert record.value == msg.value() and acker.counters()["quarantined"] == 1
    assert acker.counters()["folded"] == 0


def test_a_batch_for_another_ledger_partition_is_quarantined_whole(fake_kafka: None) -> None:  # noqa: F811
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    consumer.batches.append([persist_msg(persisted(S1, R1, T0))])
    value = XorBatch(1, np.array([S1], np.int64), np.array([R1], np.int64), EMPTY, "unit").encode()
    consumer.batches.append([FakeMessage(NS.acks, 0, 0, None, value), FakeMessage(NS.acks, 0, 1, None, b"\x07")])
    run_steps(acker, 2)
    assert [p.value for p in dlq(producer)] == [value, b"\x07"]
    c = acker.counters()
    assert (c["quarantined"], c["folded"], c["completed"], c["pending"]) == (2, 0, 0, 1)


@pytest.mark.parametrize(
    ("created_ms", "timeout_ms"),
    [(T0, 2**63 - 1), (2**63 - 1, 1), (-(2**63), -2)],
)
def test_a_persist_record_whose_deadline_is_past_64_bits_is_quarantined(
    fake_kafka: None, created_ms: int, timeout_ms: int  # noqa: F811
) -> None:
    """Without the registration headers the deadline is created_ms + timeout_ms, two Avro
    longs whose sum need not be one: such a record is bad input, not the acker's end."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    bad = persist_msg(persisted(S1, R1, created_ms, timeout_ms=timeout_ms))
    consumer.batches.append([bad, persist_msg(persisted(S2, R2, T0), 1)])
    consumer.batches.append([acks_msg(0, 0, [S2], [R2])])
    run_steps(acker, 2)

    (record,) = dlq(producer)
    assert (record.key, record.value) == (bad.key(), bad.value())
    assert record.headers["rb-source"] == f"{NS.persist}/0/0".encode()
    assert (record.headers["rb-reason"] or b"").startswith(b"quarantine: ")
    assert outcomes(producer) == {S2: b"completed"}
    c = acker.counters()
    assert (c["quarantined"], c["registered"], c["completed"], c["pending"]) == (1, 1, 1, 0)


def test_a_registered_record_whose_timeout_gives_no_replay_deadline_is_quarantined(fake_kafka: None) -> None:  # noqa: F811
    """Registered from its 8-byte headers, its value is read only when it fails: a replay's
    deadline is now + timeout_ms, which must fit the 8-byte rb-deadline header."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    record = persisted(S1, R1, T0, timeout_ms=2**63 - 1 - T0 // 2)
    msg = HeaderMessage(NS.persist, 0, 0, ids.encode_id(S1), record.encode(), headers=persist_headers(R1, T0 + 30_000))
    consumer.batches.append([msg])
    run_steps(acker)
    clock.advance(30_100)
    run_steps(acker)

    (kept,) = dlq(producer)
    assert (kept.key, kept.value) == (msg.key(), msg.value())
    assert (kept.headers["rb-reason"] or b"").startswith(b"quarantine: ")
    assert outcomes(producer) == {S1: b"dlq"}
    c = acker.counters()
    assert (c["quarantined"], c["timed_out"], c["replayed"], c["pending"]) == (1, 1, 0, 0)
