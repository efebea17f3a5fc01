"""Bad pairs in an XorBatch: only they are quarantined, the good pairs of the same batch are
folded at once (the real ``Acker`` on a ``ManualClock`` with in-memory Kafka clients, as in
test_acker_timeouts). A batch whose ledger_partition is wrong, or that is undecodable, is still
quarantined whole, byte for byte."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from confluent_kafka import KafkaError
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.acker.domain import domain_errors
from broker.headers import ADAPTIVE_FALLBACK_MS, AUTO_TIMEOUT_MS
from broker.ledger.clock import ManualClock
from broker.schemas import (
    PERSIST_ADAPTIVE,
    PERSIST_PREFIX_LEN,
    PersistedRecord,
    XorBatch,
    decode_placement,
    read_persist_prefixes,
)
from tests.unit.fakes import FakeKafka, FakeMessage, FakeProducer, Produced
from tests.unit.test_acker_timeouts import (
    NS,
    R1,
    R2,
    S1,
    S2,
    T0,
    FailingOnceProducer,
    acks_msg,
    fake_kafka,  # noqa: F401 - the fixture
    make_acker,
    outcomes,
    persist_msg,
    persist_msg_of,
    persist_value,
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
    """The deadline is created_ms + timeout_ms, two Avro longs whose sum need not be one
    (the prefix holds it at the largest long): such a record is bad input, not the acker's end."""
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
    """Registered from its prefix, its value is read only when it fails: a replay's deadline
    is now + timeout_ms, which must fit the 8 bytes of the replay's prefix."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    record = persisted(S1, R1, T0, timeout_ms=2**63 - 1 - T0 // 2)
    msg = _with_deadline(record, T0 + 30_000)
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


# --------------------------------------------------------------------------- the rule's domain

def _auto_msg(record: PersistedRecord, offset: int = 0) -> FakeMessage:
    """An adaptive-timeout persist record as a Source writes it (its prefix flags it adaptive)."""
    return persist_msg_of(record, offset, value=persist_value(record, flags=PERSIST_ADAPTIVE))


def _with_deadline(record: PersistedRecord, deadline_ms: int) -> FakeMessage:
    """``record`` with a prefix whose deadline is ``deadline_ms``, whatever the record says."""
    return persist_msg_of(record, value=persist_value(record, deadline_ms=deadline_ms, flags=0))


def _with(**fields: Any) -> PersistedRecord:
    return dataclasses.replace(persisted(S1, R1, T0), **fields)


OUT_OF_DOMAIN = [
    pytest.param(lambda: persist_msg_of(_with(attempt=0)), b"attempt 0 outside 1..max_attempts (5)", id="attempt-0"),
    pytest.param(lambda: persist_msg_of(_with(attempt=-(2**31))), b"attempt -2147483648 outside", id="attempt-min-int"),
    pytest.param(lambda: persist_msg_of(_with(attempt=6)), b"attempt 6 outside 1..max_attempts (5)", id="attempt-past-max"),
    pytest.param(lambda: persist_msg_of(_with(max_attempts=0, attempt=1)), b"max_attempts 0 < 1", id="max-attempts-0"),
    pytest.param(lambda: persist_msg_of(_with(max_attempts=-3, attempt=1)), b"max_attempts -3 < 1", id="max-attempts-negative"),
    pytest.param(lambda: persist_msg_of(_with(timeout_ms=0)), b"is not after created_ms %d (timeout_ms <= 0)" % T0, id="timeout-0"),
    pytest.param(lambda: persist_msg(_with(timeout_ms=-5)), b"(timeout_ms <= 0)", id="timeout-negative"),
    pytest.param(lambda: persist_msg_of(_with(partitioner="murmur3")), b"unknown partitioner (code 0; known: kafka, spark)",
                 id="partitioner"),
    pytest.param(lambda: persist_msg(_with(partitioner="")), b"unknown partitioner (code 0", id="partitioner-empty"),
    pytest.param(lambda: persist_msg_of(_with(), value=persist_value(_with(), partitioner=3)), b"unknown partitioner (code 3",
                 id="partitioner-code-unknown"),
    pytest.param(lambda: persist_msg_of(_with(max_attempts=1001, attempt=1)), b"max_attempts 1001 > 1000",
                 id="max-attempts-past-bound"),
    # Issue 43 item 6: a placement no replay could go to. -1 was replayed to "any partition",
    # below -1 aborted every commit (and rewound the partitions on every try), at or above the
    # replay topic's count it was dead-lettered at its deadline as if the record were real.
    pytest.param(lambda: persist_msg(_with(key_hash_partition=-1)), b"key_hash_partition -1 < 0", id="khp-minus-1"),
    pytest.param(lambda: persist_msg(_with(key_hash_partition=-5)), b"key_hash_partition -5 < 0", id="khp-negative"),
    pytest.param(lambda: persist_msg(_with(key_hash_partition=4)),
                 b"key_hash_partition 4 is not one of the 4 partitions of orders.replay", id="khp-past-count"),
    pytest.param(lambda: persist_msg(_with(key_hash_partition=2**40)), b"key_hash_partition 1099511627776 is not one",
                 id="khp-huge"),
    pytest.param(lambda: persist_msg(_with(topic="")), b"topic '' is not a Kafka topic name", id="topic-empty"),
    pytest.param(lambda: persist_msg(_with(topic="orders and more")), b"is not a Kafka topic name", id="topic-spaces"),
    pytest.param(lambda: persist_msg(_with(topic="t" * 250)), b"is not a Kafka topic name", id="topic-too-long"),
    pytest.param(lambda: persist_msg_of(_with(), value=_with().encode()[:PERSIST_PREFIX_LEN + 40]),
                 b"persist record ends before its topic and key_hash_partition", id="cut-before-placement"),
    pytest.param(lambda: _with_deadline(_with(), T0 - 1), b"deadline", id="deadline-before-creation"),
    pytest.param(lambda: _with_deadline(_with(), T0), b"deadline %d is not after created_ms %d" % (T0, T0),
                 id="deadline-at-creation"),
]


@pytest.mark.parametrize(("bad", "why"), OUT_OF_DOMAIN)
def test_a_persist_record_outside_the_rules_domain_is_quarantined_never_registered_or_replayed(
    fake_kafka: None, bad: Callable[[], FakeMessage], why: bytes  # noqa: F811
) -> None:
    """Issue 30 item 9: by ``replay.decide`` (``attempt >= max_attempts``) a record with attempt
    -2^31 that nobody acks would be replayed 2^31 times; a timeout of 0 or an unknown
    partitioner were registered, timed out and replayed. Each is quarantined at registration
    with its reason, read from the value's prefix, and its valid neighbour goes on as ever."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    msg = bad()
    consumer.batches.append([msg, persist_msg(persisted(S2, R2, T0), 1)])
    run_steps(acker)
    c = acker.counters()
    assert (c["quarantined"], c["registered"], c["pending"]) == (1, 1, 1)
    (record,) = dlq(producer)
    assert (record.key, record.value) == (msg.key(), msg.value())
    assert record.headers["rb-source"] == f"{NS.persist}/0/0".encode()
    reason = record.headers["rb-reason"] or b""
    assert reason.startswith(b"quarantine: persist record outside the rule's domain: ") and why in reason

    clock.advance(10 * 30_000)  # long past any deadline: only S2 times out and is replayed
    run_steps(acker)
    c = acker.counters()
    assert (c["timed_out"], c["replayed"], c["quarantined"], c["pending"]) == (1, 1, 1, 0)
    replays = [p for p in producer.committed if p.topic == "orders.replay"]
    assert len(replays) == 1
    assert S1 not in outcomes(producer)  # never registered: nothing to tombstone


VALID = [
    pytest.param(lambda: persist_msg_of(_with(attempt=5)), id="last-attempt"),
    pytest.param(lambda: persist_msg_of(_with(attempt=1, max_attempts=1)), id="one-attempt"),
    pytest.param(lambda: persist_msg_of(_with(partitioner="spark")), id="spark"),
    pytest.param(lambda: persist_msg_of(_with(headers=(("trace", b"x" * 300), ("k", None)))), id="user-headers"),
    pytest.param(lambda: persist_msg_of(_with(key=None, value=None)), id="null-key-and-value"),
    pytest.param(lambda: persist_msg(_with(timeout_ms=1)), id="timeout-1"),
    pytest.param(lambda: persist_msg(_with(timeout_ms=AUTO_TIMEOUT_MS)), id="adaptive"),
    pytest.param(lambda: persist_msg(_with(max_attempts=1000, attempt=1000)), id="max-attempts-bound"),
    pytest.param(lambda: persist_msg(_with(key_hash_partition=0)), id="khp-0"),
    pytest.param(lambda: persist_msg(_with(topic="a" * 249)), id="topic-longest"),
    pytest.param(lambda: persist_msg(_with(topic="Orders_2.v-1")), id="topic-every-kind-of-character"),
]


@pytest.mark.parametrize("good", VALID)
def test_records_inside_the_rules_domain_are_registered_as_ever(
    fake_kafka: None, good: Callable[[], FakeMessage]  # noqa: F811
) -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    consumer.batches.append([good()])
    consumer.batches.append([acks_msg(0, 0, [S1], [R1])])
    run_steps(acker, 2)
    c = acker.counters()
    assert (c["quarantined"], c["registered"], c["completed"], c["pending"]) == (0, 1, 1, 0)
    assert outcomes(producer) == {S1: b"completed"} and not dlq(producer)


# --------------------------------------------------------------------------- prefix and record disagree

# A prefix inside the domain before a record that says otherwise (no Source writes one: both
# come from the same fields, broker.schemas.persist_prefix_fields). The acker registers it from
# the prefix; when a replay needs its record, the record is the truth - and does not match.
DISAGREEING = [
    pytest.param(lambda: persist_value(_with(attempt=0), attempt=1), b"attempt 1 (the record's: 0)", id="attempt"),
    pytest.param(lambda: persist_value(_with(attempt=6), attempt=5), b"attempt 5 (the record's: 6)", id="attempt-past-max"),
    pytest.param(lambda: persist_value(_with(max_attempts=0), max_attempts=5), b"max_attempts 5 (the record's: 0)",
                 id="max-attempts"),
    pytest.param(lambda: persist_value(_with(partitioner="murmur3"), partitioner=1), b"partitioner 1 (the record's: 0)",
                 id="partitioner"),
    pytest.param(lambda: persist_value(_with(partitioner="spark"), partitioner=1), b"partitioner 1 (the record's: 2)",
                 id="other-partitioner"),
    pytest.param(lambda: persist_value(_with(timeout_ms=0), deadline_ms=T0 + 30_000),
                 b"deadline_ms %d (the record's: %d)" % (T0 + 30_000, T0), id="timeout-0"),
    pytest.param(lambda: persist_value(_with(timeout_ms=-5), deadline_ms=T0 + 30_000), b"deadline_ms", id="timeout-negative"),
    pytest.param(lambda: persist_value(_with(timeout_ms=AUTO_TIMEOUT_MS), flags=0), b"flags 0 (the record's: 1)",
                 id="adaptive-marker-without-flag"),
    pytest.param(lambda: persist_value(_with(), flags=PERSIST_ADAPTIVE), b"flags 1 (the record's: 0)",
                 id="flag-without-adaptive-marker"),
    pytest.param(lambda: persist_value(_with(), deadline_ms=T0 + 10), b"deadline_ms %d (the record's: %d)" % (T0 + 10, T0 + 30_000),
                 id="earlier-deadline"),
    pytest.param(lambda: persist_value(_with(), created_ms=T0 - 1), b"created_ms %d (the record's: %d)" % (T0 - 1, T0),
                 id="created"),
    pytest.param(lambda: persist_value(_with(attempt=0), attempt=1, deadline_ms=T0 + 10), b"deadline_ms %d (the record's: %d), attempt 1 (the record's: 0)" % (T0 + 10, T0 + 30_000), id="two-fields"),
    # cut after its placement (one cut before it is quarantined at registration: OUT_OF_DOMAIN)
    pytest.param(lambda: _with().encode()[:-5], b"undecodable PersistedRecord", id="truncated-record"),
]


@pytest.mark.parametrize(("value", "why"), DISAGREEING)
def test_a_prefix_that_disagrees_with_its_record_is_quarantined_when_its_record_is_needed_never_replayed(
    fake_kafka: None, value: Callable[[], bytes], why: bytes  # noqa: F811
) -> None:
    """Registered from a prefix inside the rule's domain, the value times out; its record
    says other than the prefix (or is no record): it goes to the DLQ byte for byte with the
    reason, counted as quarantined, its srid tombstoned - no replay with either's fields."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    msg = persist_msg_of(_with(), value=value())
    consumer.batches.append([msg, persist_msg(persisted(S2, R2, T0), 1)])
    run_steps(acker)
    assert (acker.counters()["registered"], acker.counters()["quarantined"]) == (2, 0)
    clock.advance(10 * 30_000)
    run_steps(acker)
    c = acker.counters()
    assert (c["timed_out"], c["replayed"], c["quarantined"], c["pending"]) == (2, 1, 1, 0)
    (kept,) = dlq(producer)
    assert (kept.key, kept.value) == (msg.key(), msg.value())
    reason = kept.headers["rb-reason"] or b""
    assert reason.startswith(b"quarantine: persist record of %d (timeout) cannot be replayed: " % S1), reason
    assert why in reason, reason
    replays = [PersistedRecord.decode(p.value) for p in producer.committed if p.topic == NS.persist and p.value]
    assert [r.origin for r in replays] == [S2]
    assert outcomes(producer)[S1] == b"dlq"


_records = st.builds(
    PersistedRecord,
    srid=st.integers(-(2**63), 2**63 - 1), origin=st.integers(-(2**63), 2**63 - 1),
    attempt=st.integers(-(2**31), 2**31 - 1) | st.integers(-1, 7), root_xor=st.integers(-(2**63), 2**63 - 1),
    record_id=st.integers(-(2**63), 2**63 - 1), topic=st.text(max_size=20),
    key_hash_partition=st.integers(-(2**31), 2**31 - 1), key=st.none() | st.binary(max_size=40),
    value=st.none() | st.binary(max_size=300),
    created_ms=st.integers(-(2**63), 2**63 - 1) | st.integers(-(2**62), 2**62),
    partitioner=st.sampled_from(["kafka", "spark", "", "Kafka", "murmur2"]),
    headers=st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=4).map(tuple),
    timeout_ms=st.integers(-(2**31), 2**31 - 1) | st.sampled_from([-1, 0, 1]),
    max_attempts=st.integers(-(2**31), 2**31 - 1) | st.integers(-1, 6),
)


def _inside(record: PersistedRecord) -> bool:
    """The rule's domain, stated on the record's own fields."""
    deadline = record.created_ms + (ADAPTIVE_FALLBACK_MS if record.timeout_ms == AUTO_TIMEOUT_MS else record.timeout_ms)
    return (
        1 <= record.attempt <= record.max_attempts <= 1000
        and (record.timeout_ms > 0 or record.timeout_ms == AUTO_TIMEOUT_MS)
        and record.partitioner in ("kafka", "spark") and deadline < 2**63 - 1
    )


@given(batch=st.lists(st.tuples(_records, st.integers(0, 60), st.booleans()), min_size=1, max_size=40))
@settings(max_examples=300, deadline=None)
def test_the_domain_read_from_the_prefixes_is_the_rule_on_the_records(batch: list[tuple[PersistedRecord, int, bool]]) -> None:
    """A batch of values as their writer makes them, some cut short (they run into their
    neighbours): read from the prefixes at once, each one with a whole prefix is inside the
    domain exactly when its record is, and a reason says why not."""
    values = [r.encode()[:cut] if truncate else r.encode() for r, cut, truncate in batch]
    pre = read_persist_prefixes(values)
    verdicts = domain_errors(pre)
    for (record, _, _), value, why in zip(batch, values, verdicts, strict=True):
        if len(value) >= PERSIST_PREFIX_LEN:
            assert (why is None) == _inside(record), why


@given(batch=st.lists(st.tuples(_records, st.integers(0, 400), st.booleans()), min_size=1, max_size=40))
@settings(max_examples=300, deadline=None)
def test_the_placements_read_at_once_are_the_records_topic_and_key_hash_partition(
    batch: list[tuple[PersistedRecord, int, bool]],
) -> None:
    """The placement of each value of a batch is found with numpy over the batch: a whole
    value's decodes to its record's topic and key_hash_partition; one cut before its end
    never decodes to another (it is quarantined)."""
    values = [r.encode()[:cut] if truncate else r.encode() for r, cut, truncate in batch]
    pre = read_persist_prefixes(values)
    spans = zip(pre.placement_starts.tolist(), pre.placement_ends.tolist(), strict=True)
    for (record, _, _), value, (a, b) in zip(batch, values, spans, strict=True):
        got = decode_placement(value[a:b])
        if value == record.encode():
            assert got == (record.topic, record.key_hash_partition)
        else:
            assert got in (None, (record.topic, record.key_hash_partition))


def test_a_record_whose_replay_topic_is_missing_is_registered(
    fake_kafka: None, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """No replay topic is no reason to quarantine: a record that completes needs none (one that
    fails is dead-lettered then, with the reason: tests/integration/test_missing_replay_topic)."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock, kafka=FakeKafka(default_count=None))
    consumer.batches.append([persist_msg(persisted(S1, R1, T0))])
    consumer.batches.append([acks_msg(0, 0, [S1], [R1])])
    run_steps(acker, 2)
    c = acker.counters()
    assert (c["quarantined"], c["registered"], c["completed"]) == (0, 1, 1)
    assert outcomes(producer) == {S1: b"completed"} and not dlq(producer)


def test_a_quarantined_position_is_logged_and_counted_once_across_a_rewind(
    fake_kafka: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    """Seen in a fuzz run: after one aborted commit ~1 300 quarantined positions were logged
    twice - the rewind reads the inputs again from the committed offsets, and each bad message
    is quarantined again (rightly: the aborted transaction's DLQ record is gone). Its log line
    is not written again, and it is counted and kept in the DLQ once."""
    FailingOnceProducer.made = []
    FailingOnceProducer.error = KafkaError(KafkaError._FAIL, "injected")
    clock = ManualClock(T0)
    acker, consumer, _ = make_acker(clock, kafka=FakeKafka(producers=FailingOnceProducer))
    bad_persist = persist_msg_of(_with(attempt=0))
    bad_acks = FakeMessage(NS.acks, 0, 0, None, b"\x07")
    consumer.batches.append([bad_persist, bad_acks])
    caplog.set_level(logging.INFO, "broker.acker")
    run_steps(acker)  # the commit fails: aborted, state rewound
    FailingOnceProducer.error = None
    consumer.batches.append([bad_persist, bad_acks])  # read again after the rewind
    consumer.batches.append([persist_msg(persisted(S2, R2, T0), 1), FakeMessage(NS.acks, 0, 1, None, b"\x08")])
    run_steps(acker, 3)  # restored in the loop first

    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("quarantined ")]
    where = [line.split(": ", 1)[0] for line in logged]
    assert where == [f"quarantined {NS.persist}[0]@0", f"quarantined {NS.acks}[0]@0", f"quarantined {NS.acks}[0]@1"]
    assert acker.counters()["quarantined"] == 3
    kept = dlq(FailingOnceProducer.made[0])
    assert [p.headers["rb-source"] for p in kept] == [
        f"{NS.persist}/0/0".encode(), f"{NS.acks}/0/0".encode(), f"{NS.acks}/0/1".encode(),
    ]
