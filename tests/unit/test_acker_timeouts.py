"""Timeouts with a stepped clock - nothing sleeps.

Two levels:
1. the ledger table + ``Ticker`` + ``ManualClock`` driven exactly as the acker drives them
   (deadline = ``ticks_of(created_ms + timeout_ms)`` at registration,
   ``expire(current_tick(now))`` at every commit);
2. the real ``Acker`` on a ``ManualClock`` with in-memory stand-ins for the Kafka clients:
   its decisions (timeout, replay, DLQ, completion) and the records its transaction holds.
"""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

import numpy as np
import orjson
import pytest
from confluent_kafka import (
    KafkaError,
    KafkaException,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import ids
from broker.acker import Acker, AckerConfig
from broker.errors import ReplayBrokerError
from broker.headers import Tracking, outcome_of
from broker.ledger.clock import ManualClock, Ticker
from broker.ledger.table import LedgerTable
from broker.schemas import (
    PERSIST_PREFIX,
    PERSIST_PREFIX_LEN,
    PersistedRecord,
    XorBatch,
    read_persist_prefixes,
)
from broker.settings import KafkaSettings
from broker.topics import Namespace
from tests.unit.fakes import (
    WHOLE_RESTORE,
    FakeConsumer,
    FakeKafka,
    FakeMessage,
    FakeProducer,
    reset_fakes,
)

T0 = 1_700_000_000_000  # a wall-clock-like start, ms
S1, S2 = 0x1F3A_5C7E_9B2D_4E62, 0x2B7E_1516_28AE_D2A8  # srids of ledger partition 0 (mod 2)
R1, R2 = 0x3243_F6A8_885A_308D, 0x1319_8A2E_0370_7344  # record ids


# --------------------------------------------------------------------------- level 1


def _first_expiry(table: LedgerTable, ticker: Ticker, clock: ManualClock, step_ms: int, limit_ms: int) -> int | None:
    """Step the clock like the acker's commit loop; return the time the entry timed out."""
    end = clock.now_ms() + limit_ms
    while clock.now_ms() < end:
        clock.advance(step_ms)
        expired = table.expire(ticker.current_tick(clock.now_ms()))
        if len(expired.timed_out):
            return clock.now_ms()
    return None


@settings(max_examples=200, deadline=None)
@given(
    created_offset=st.integers(-5_000, 5_000),
    timeout_ms=st.integers(1, 120_000),
    tick_ms=st.sampled_from([1, 7, 100, 250, 1_000]),
    step_ms=st.integers(1, 400),
)
def test_timeout_never_early_and_at_most_one_tick_and_one_step_late(
    created_offset: int, timeout_ms: int, tick_ms: int, step_ms: int
) -> None:
    clock = ManualClock(T0)
    ticker = Ticker.starting_at(clock, tick_ms)
    created = T0 + created_offset  # the source's clock, a little off the acker's
    deadline_ms = created + timeout_ms
    table = LedgerTable()
    table.register(
        np.array([S1]), np.array([R1]), np.array([0]), ticker.ticks_of(np.array([deadline_ms]))
    )
    # Jump close to the deadline (nothing may expire on the way), then step finely.
    near = deadline_ms - 3 * (tick_ms + step_ms)
    if near > clock.now_ms():
        clock.advance(near - clock.now_ms())
        assert len(table.expire(ticker.current_tick(clock.now_ms())).timed_out) == 0
    at = _first_expiry(table, ticker, clock, step_ms, 10 * (tick_ms + step_ms) + 5_000)
    assert at is not None
    if deadline_ms <= T0:
        assert at == T0 + step_ms  # already due when registered: the first commit takes it
    else:
        assert deadline_ms <= at < deadline_ms + tick_ms + step_ms
    assert len(table) == 0


def test_acked_entry_completes_and_never_times_out() -> None:
    clock = ManualClock(T0)
    ticker = Ticker.starting_at(clock)
    table = LedgerTable()
    table.register(np.array([S1]), np.array([R1]), np.array([0]), ticker.ticks_of(np.array([T0 + 1_000])))
    done = table.fold(np.array([S1]), np.array([R1]), ticker.tick_of(T0 + 60_000))
    assert done.srids.tolist() == [S1]
    clock.advance(10_000)
    expired = table.expire(ticker.current_tick(clock.now_ms()))
    assert len(expired.timed_out) == len(expired.orphans) == 0


def test_explicit_failure_is_taken_at_once_without_waiting_for_the_deadline() -> None:
    clock = ManualClock(T0)
    ticker = Ticker.starting_at(clock)
    table = LedgerTable()
    table.register(np.array([S1, S2]), np.array([R1, R2]), np.array([0, 1]), ticker.ticks_of(np.array([T0 + 30_000] * 2)))
    table.mark_failed(np.array([S2]), ticker.tick_of(T0 + 60_000))
    assert table.take_failed().srids.tolist() == [S2]
    assert len(table.expire(ticker.current_tick(clock.now_ms())).timed_out) == 0
    clock.advance(30_000)
    assert table.expire(ticker.current_tick(clock.now_ms())).timed_out.srids.tolist() == [S1]


def test_unregistered_events_expire_as_orphans_not_timeouts() -> None:
    clock = ManualClock(T0)
    ticker = Ticker.starting_at(clock)
    table = LedgerTable()
    table.fold(np.array([S1]), np.array([R1]), ticker.tick_of(T0 + 60_000))  # orphan TTL 60 s
    clock.advance(59_900)
    assert len(table.expire(ticker.current_tick(clock.now_ms())).orphans) == 0
    clock.advance(100)
    expired = table.expire(ticker.current_tick(clock.now_ms()))
    assert expired.orphans.srids.tolist() == [S1] and len(expired.timed_out) == 0


@pytest.mark.parametrize("restored_after_ms", [0, 1, 99, 12_345, 29_999])
def test_deadline_survives_the_changelog_into_another_process(restored_after_ms: int) -> None:
    """The changelog carries ms; the restoring process has its own ticker epoch. The
    restored entry still never expires early (and at most a tick late)."""
    clock = ManualClock(T0)
    ticker = Ticker.starting_at(clock)
    deadline_ms = T0 + 30_000 + 37
    tick = ticker.ticks_of(np.array([deadline_ms]))
    logged_ms = int(ticker.ms_of_ticks(tick)[0])  # what the acker writes to ns.ledger
    assert logged_ms >= deadline_ms

    clock2 = ManualClock(T0 + restored_after_ms)  # the next owner, started later
    ticker2 = Ticker.starting_at(clock2)
    table = LedgerTable()
    table.restore(
        np.array([S1]), np.array([R1]), np.array([1], dtype=np.uint8), np.array([0]),
        ticker2.ticks_of(np.array([logged_ms])),
    )
    at = _first_expiry(table, ticker2, clock2, 10, 60_000)
    assert at is not None and deadline_ms <= at < deadline_ms + 100 + 10


@given(
    start=st.integers(0, 10**6), restored_after_ms=st.integers(0, 10**5),
    d1=st.integers(1, 10**6), gap=st.integers(0, 500),
)
def test_deadlines_keep_their_order_across_owners(start: int, restored_after_ms: int, d1: int, gap: int) -> None:
    """One entry's deadline went through the changelog (the old owner's tick, as ms), the
    other is registered by the new owner from its persist record: the earlier deadline never
    becomes the later tick, or a key's records that time out together would replay out of
    the order they were sent in."""
    old = Ticker.starting_at(ManualClock(T0 + start))
    new = Ticker.starting_at(ManualClock(T0 + start + restored_after_ms))
    first, second = T0 + start + d1, T0 + start + d1 + gap
    logged_ms = int(old.ms_of_ticks(old.ticks_of(np.array([first])))[0])
    assert new.tick_of(logged_ms) <= new.tick_of(second)
    assert new.tick_of(logged_ms) == new.tick_of(first)  # the same tick, not one later


# --------------------------------------------------------------------------- level 2


@pytest.fixture
def fake_kafka() -> None:
    """The scripted fakes, without the consumers of a previous test; the ackers of a test
    restore within their first slice (``make_acker``: ``WHOLE_RESTORE``)."""
    reset_fakes()


NS = Namespace("unit")


def make_acker(
    clock: ManualClock, fail_hold_ms: int = 0, unlogged_ms: int = 1_000, *, kafka: FakeKafka | None = None,
    **config_fields: Any,
) -> tuple[Acker, FakeConsumer, FakeProducer]:
    """``config_fields``: other fields of its ``AckerConfig`` (e.g. shorter timings)."""
    config = AckerConfig(**{
        "commit_interval_ms": 0, "instance_id": "unit", "stats_interval_ms": 10**12, "orphan_ttl_ms": 60_000,
        "fail_hold_ms": fail_hold_ms, "unlogged_ms": unlogged_ms, **WHOLE_RESTORE, **config_fields,
    })
    acker = Acker(KafkaSettings("fake:9092"), NS, config, clock=clock, kafka=kafka or FakeKafka())
    consumer = FakeConsumer.last
    assert consumer is not None
    producer = acker.live.producer
    assert isinstance(producer, FakeProducer)
    return acker, consumer, producer


def run_steps(acker: Acker, n: int = 1) -> None:
    """``n`` loop iterations of the real service loop (each one commits: interval 0)."""
    count = itertools.count(1)
    acker.run(until=lambda _: next(count) >= n)


def persisted(srid: int, record_id: int, created_ms: int, *, attempt: int = 1, max_attempts: int = 5,
              timeout_ms: int = 30_000, value: bytes = b"order 1") -> PersistedRecord:
    return PersistedRecord(
        srid=srid, origin=srid, attempt=attempt, root_xor=record_id, record_id=record_id,
        topic="orders", key_hash_partition=3, key=b"customer-7", value=value,
        created_ms=created_ms, timeout_ms=timeout_ms, max_attempts=max_attempts,
    )


def persist_msg(record: PersistedRecord, offset: int = 0) -> FakeMessage:
    lp = ids.ledger_partition(record.srid, FakeConsumer.partitions)
    return FakeMessage(NS.persist, lp, offset, ids.encode_id(record.srid), record.encode())


def acks_msg(lp: int, offset: int, srids: list[int], xors: list[int], failed: tuple[int, ...] | list[int] = ()) -> FakeMessage:
    batch = XorBatch(lp, np.array(srids, np.int64), np.array(xors, np.int64), np.array(failed, np.int64), "unit")
    return FakeMessage(NS.acks, lp, offset, None, batch.encode())


def outcomes(producer: FakeProducer) -> dict[int, bytes | None]:
    return {
        ids.decode_id(p.key or b""): outcome_of(list(p.headers.items()))
        for p in producer.committed if p.topic == NS.persist and p.value is None
    }


def test_acker_times_out_exactly_at_the_deadline_of_the_stepped_clock(fake_kafka: None) -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    consumer.batches.append([persist_msg(persisted(S1, R1, created_ms=T0 + 5))])
    run_steps(acker)
    assert acker.counters()["registered"] == 1 and acker.counters()["pending"] == 1

    clock.advance(30_004)  # 1 ms before created + timeout
    run_steps(acker, 3)
    assert acker.counters()["timed_out"] == 0 and not outcomes(producer)

    clock.advance(1)  # the deadline itself; rounded up to the next 100 ms tick, never early
    run_steps(acker, 3)
    assert acker.counters()["timed_out"] == 0 and not outcomes(producer)

    clock.advance(95)  # the tick the deadline was rounded up to
    run_steps(acker)
    c = acker.counters()
    assert (c["timed_out"], c["failed"], c["replayed"], c["pending"]) == (1, 0, 1, 0)
    assert outcomes(producer) == {S1: b"replay"}

    (replay,) = [p for p in producer.committed if p.topic == "orders.replay"]
    assert (replay.partition, replay.key, replay.value) == (3, b"customer-7", b"order 1")
    t = Tracking.from_headers(list(replay.headers.items()))
    assert t is not None and (t.origin, t.attempt) == (S1, 2) and t.srid != S1
    (again,) = [
        PersistedRecord.decode(p.value) for p in producer.committed if p.topic == NS.persist and p.value is not None
    ]
    assert (again.srid, again.origin, again.attempt, again.key_hash_partition) == (t.srid, S1, 2, 3)
    assert again.created_ms == clock.now_ms()  # the next deadline counts from the replay
    assert [(f.srid, f.attempt, f.reason) for f in again.history] == [(S1, 1, "timeout")]


def test_acker_completes_acked_records_and_they_never_time_out(fake_kafka: None) -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    consumer.batches.append([persist_msg(persisted(S1, R1, T0)), persist_msg(persisted(S2, R2, T0), 1)])
    consumer.batches.append([acks_msg(0, 0, [S1], [R1])])
    run_steps(acker, 2)
    assert outcomes(producer) == {S1: b"completed"}
    clock.advance(31_000)
    run_steps(acker)
    assert outcomes(producer) == {S1: b"completed", S2: b"replay"}
    tombstones = {ids.decode_id(p.key or b""): p.headers for p in producer.committed
                  if p.topic == NS.persist and p.value is None}
    assert tombstones == {S1: {}, S2: {"rb-outcome": b"replay"}}  # a completion carries no header
    c = acker.counters()
    assert (c["completed"], c["timed_out"], c["replayed"]) == (1, 1, 1)


def test_acker_replays_an_explicit_failure_without_any_clock_step(fake_kafka: None) -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    consumer.batches.append([persist_msg(persisted(S1, R1, T0))])
    consumer.batches.append([acks_msg(0, 0, [], [], failed=[S1])])
    run_steps(acker, 2)
    c = acker.counters()
    assert (c["failed"], c["timed_out"], c["replayed"]) == (1, 0, 1)
    assert outcomes(producer) == {S1: b"replay"}
    assert [p.partition for p in producer.committed if p.topic == "orders.replay"] == [3]


def test_explicit_failures_are_held_until_the_window_closes(fake_kafka: None) -> None:
    """Fail marks wait fail_hold_ms (stepped clock) and are then decided together."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock, fail_hold_ms=150)
    consumer.batches.append([persist_msg(persisted(S1, R1, T0)), persist_msg(persisted(S2, R2, T0), 1)])
    consumer.batches.append([acks_msg(0, 0, [], [], failed=[S1])])
    run_steps(acker, 2)
    assert outcomes(producer) == {}  # held: the window is open
    clock.advance(100)
    consumer.batches.append([acks_msg(0, 1, [], [], failed=[S2])])
    run_steps(acker)
    assert outcomes(producer) == {}
    clock.advance(50)  # the first mark is 150 ms old: both are decided now, together
    run_steps(acker)
    assert outcomes(producer) == {S1: b"replay", S2: b"replay"}
    assert acker.counters()["failed"] == 2


def a_held_last_attempt(clock: ManualClock) -> tuple[Acker, FakeConsumer, FakeProducer]:
    """S1 on its last attempt (3 of 3) times out. Its dead letter waits watch_ms (default: the
    orphan TTL, 60 s) for late events of its own tree."""
    acker, consumer, producer = make_acker(clock)
    record = persisted(S1, R1, T0, attempt=3, max_attempts=3, timeout_ms=1_000)
    consumer.batches.append([persist_msg(record)])
    run_steps(acker)
    clock.advance(1_000)
    run_steps(acker)
    assert outcomes(producer) == {} and acker.counters()["dlq_held"] == 1
    return acker, consumer, producer


def test_acker_dead_letters_after_max_attempts_with_the_history(fake_kafka: None) -> None:
    clock = ManualClock(T0)
    acker, _consumer, producer = a_held_last_attempt(clock)
    clock.advance(60_000)
    run_steps(acker)
    assert outcomes(producer) == {S1: b"dlq"}
    (dead,) = [p for p in producer.committed if p.topic == NS.dlq]
    assert (dead.key, dead.value) == (b"customer-7", b"order 1")
    assert dead.headers["rb-reason"] == b"timeout" and dead.headers["rb-attempts"] == b"3"
    assert dead.headers["rb-key-hash-partition"] == b"3" and dead.headers["rb-topic"] == b"orders"
    assert orjson.loads(dead.headers["rb-history"] or b"") == [
        {"srid": S1, "attempt": 3, "reason": "timeout", "at_ms": T0 + 61_000}
    ]
    assert not [p for p in producer.committed if p.topic == "orders.replay"]
    assert acker.counters()["dlq"] == 1


def test_a_held_last_attempt_completes_with_its_late_event_also_after_a_restore(fake_kafka: None) -> None:
    """The last attempt times out and its dead letter is held; its entry, written to the
    changelog with its value, is restored by the next owner as a timeout that
    still completes - not as a failure."""
    clock = ManualClock(T0)
    acker, consumer, producer = a_held_last_attempt(clock)
    latest = {p.key: p.value for p in producer.committed if p.topic == NS.ledger}
    assert latest[ids.encode_id(S1)] is not None
    restored = acker.changelog.new_state()
    acker.changelog.apply(restored, dict(latest))
    entry = restored.table.get(S1)
    assert entry is not None and entry.deferred and not entry.failed and entry.value == R1
    # The late event completes it, in the restored table as in the live one.
    assert restored.table.fold(np.array([S1]), np.array([R1]), 10**6).srids.tolist() == [S1]
    lp = ids.ledger_partition(S1, FakeConsumer.partitions)
    consumer.batches.append([acks_msg(lp, 0, [S1], [R1])])
    run_steps(acker)
    assert outcomes(producer) == {S1: b"completed"}
    clock.advance(120_000)
    run_steps(acker, 2)
    assert not [p for p in producer.committed if p.topic == NS.dlq]
    c = acker.counters()
    assert (c["completed"], c["completed_late"], c["dlq"], c["pending"]) == (1, 1, 0, 0)


def test_acker_drops_orphans_after_the_orphan_ttl_without_replaying(fake_kafka: None) -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    consumer.batches.append([acks_msg(0, 0, [S1], [R1])])  # an event, never a persist record
    run_steps(acker)
    clock.advance(59_900)
    run_steps(acker)
    assert acker.counters()["orphans"] == 0
    clock.advance(200)
    run_steps(acker)
    c = acker.counters()
    assert (c["orphans"], c["timed_out"], c["replayed"], c["pending"]) == (1, 0, 0, 0)
    assert not outcomes(producer)


def test_replays_decided_in_one_commit_leave_in_persist_order(fake_kafka: None) -> None:
    """Failures come out of the table in srid order; the replays must not (key order)."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    srids = [int(s) * 2 for s in np.random.default_rng(7).integers(1, 2**61, 40)]  # ledger partition 0
    # created 4 per millisecond: ties in created_ms are ordered by the persist offset
    records = [persisted(s, s + 1, T0 + i // 4, value=b"order %d" % i) for i, s in enumerate(srids)]
    consumer.batches.append([persist_msg(r, i) for i, r in enumerate(records)])
    consumer.batches.append([acks_msg(0, 0, [], [], failed=srids[::-1])])
    run_steps(acker, 2)
    replayed = [p.value for p in producer.committed if p.topic == "orders.replay"]
    assert replayed == [r.value for r in records]


# --------------------------------------------------------------------------- registration from the prefix


def persist_value(record: PersistedRecord, **prefix: int) -> bytes:
    """``record``'s persist value, fields of its prefix (``PERSIST_PREFIX``'s names) set apart
    from what the record says (bad input the acker must quarantine)."""
    value = record.encode()
    row = np.frombuffer(value, PERSIST_PREFIX, 1).copy()
    for name, field in prefix.items():
        row[name] = field
    return row.tobytes() + value[PERSIST_PREFIX_LEN:]


def persist_msg_of(record: PersistedRecord, offset: int = 0, *, value: bytes | None = None,
                   key: bytes | None = None, partition: int | None = None) -> FakeMessage:
    """``persist_msg`` with its value, key or partition set apart from the record's."""
    lp = ids.ledger_partition(record.srid, FakeConsumer.partitions) if partition is None else partition
    return FakeMessage(
        NS.persist, lp, offset, ids.encode_id(record.srid) if key is None else key,
        record.encode() if value is None else value,
    )


def test_acker_registers_from_the_prefix_and_replays_from_the_cached_bytes(fake_kafka: None) -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    consumer.batches.append([persist_msg_of(persisted(S1, R1, T0)), persist_msg(persisted(S2, R2, T0), 1)])
    consumer.batches.append([acks_msg(0, 0, [S2], [R2])])
    run_steps(acker, 2)
    c = acker.counters()
    assert (c["registered"], c["completed"], c["pending"], c["quarantined"]) == (2, 1, 1, 0)
    clock.advance(30_100)
    run_steps(acker)
    assert outcomes(producer) == {S2: b"completed", S1: b"replay"}
    (again,) = [p for p in producer.committed if p.topic == NS.persist and p.value is not None]
    record = PersistedRecord.decode(again.value)
    # the replay's persist value has its prefix too: root = its record id, new deadline
    prefix = read_persist_prefixes([again.value or b""])
    assert int(prefix.roots[0]) == record.root_xor == record.record_id and not again.headers
    assert int(prefix.deadlines_ms[0]) == clock.now_ms() + 30_000


def test_acker_refuses_a_duplicate_root_registered_from_the_prefix(fake_kafka: None) -> None:
    clock = ManualClock(T0)
    acker, consumer, _ = make_acker(clock)
    msg = persist_msg_of(persisted(S1, R1, T0))
    consumer.batches.append([msg, persist_msg_of(persisted(S1, R1, T0), 1)])
    run_steps(acker)
    c = acker.counters()
    assert (c["registered"], c["duplicate_roots"], c["pending"]) == (1, 1, 1)


def test_acker_quarantines_bad_persist_records(fake_kafka: None) -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    good = persisted(S1, R1, T0)
    garbage = ids.encode_id(S1)  # shorter than a prefix
    misrouted = persisted(S1 + 1, R1, T0)  # partition 1, sent to 0
    consumer.batches.append([
        persist_msg_of(good, 0, value=garbage),
        persist_msg_of(misrouted, 1, partition=0),
        persist_msg_of(persisted(0, R1, T0), 2, partition=0),
        persist_msg_of(good, 3, key=ids.encode_id(S2)),  # value of another srid
        # a prefix of S1 before the record of another srid
        persist_msg_of(good, 4, value=persist_value(good)[:PERSIST_PREFIX_LEN] + persisted(S2, R1, T0).encode()[PERSIST_PREFIX_LEN:]),
        persist_msg_of(good, 5, value=persist_value(good, flags=0x80)),
    ])
    run_steps(acker)
    c = acker.counters()
    assert (c["quarantined"], c["registered"], c["pending"]) == (6, 0, 0)
    dlq = [p for p in producer.committed if p.topic == NS.dlq]
    assert [(p.headers["rb-reason"] or b"").decode().removeprefix("quarantine: ") for p in dlq] == [
        "persist value shorter than its 42-byte prefix",
        f"srid {S1 + 1} does not belong to ledger partition 0",
        "srid 0 does not belong to ledger partition 0",
        "persist key and the srid of its value's prefix differ",
        "persist record does not start with its prefix's srid",
        "unknown persist flags 0x80",
    ]


def test_a_value_undecodable_at_replay_goes_to_the_dlq_not_a_retry_loop(fake_kafka: None) -> None:
    """Registration reads only the value's prefix (the fields the rule decides by,
    broker.acker.domain): the record is decoded when a replay needs it."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    record = persisted(S1, R1, T0)
    broken = record.encode()[:-1] + b"\x02"  # a history of one failure that is not there
    consumer.batches.append([persist_msg_of(record, 7, value=broken)])
    consumer.batches.append([acks_msg(0, 0, [], [], failed=[S1])])
    run_steps(acker, 2)
    c = acker.counters()
    assert (c["registered"], c["failed"], c["quarantined"], c["replayed"], c["pending"]) == (1, 1, 1, 0, 0)
    assert outcomes(producer) == {S1: b"dlq"}
    (dead,) = [p for p in producer.committed if p.topic == NS.dlq]
    assert (dead.key, dead.value) == (ids.encode_id(S1), broken)
    assert (dead.headers["rb-reason"] or b"").startswith(b"quarantine: persist record of")
    assert dead.headers["rb-source"] == f"{NS.persist}/0/7".encode()


class FailingOnceProducer(FakeProducer):
    """Fails the first commit with ``error``; every producer built after it works."""

    made: ClassVar[list[FailingOnceProducer]] = []
    error: ClassVar[KafkaError | None] = None

    def __init__(self, conf: dict[str, Any]) -> None:
        super().__init__(conf)
        FailingOnceProducer.made.append(self)

    def commit_transaction(self, *_: Any) -> None:
        if len(FailingOnceProducer.made) == 1 and FailingOnceProducer.error is not None:
            raise KafkaException(FailingOnceProducer.error)
        super().commit_transaction()

    def abort_transaction(self, *_: Any) -> None:
        self.pending = []


@pytest.mark.parametrize(
    ("code", "stops"),
    [(KafkaError.INVALID_TXN_STATE, False), (KafkaError.PRODUCER_FENCED, True), (KafkaError._FENCED, True)],
)
def test_a_fatal_producer_error_gets_a_new_producer_and_only_fencing_stops_the_acker(
    fake_kafka: None, monkeypatch: pytest.MonkeyPatch, code: int, stops: bool
) -> None:
    """Seen in a chaos run: INVALID_TXN_STATE after an abort killed the acker. Only a newer
    producer with our transactional id (fencing) may stop it."""
    FailingOnceProducer.made = []
    FailingOnceProducer.error = KafkaError(code, "injected", fatal=True)
    monkeypatch.setattr(FakeConsumer, "seek", lambda *_a, **_k: None, raising=False)
    clock = ManualClock(T0)
    acker, consumer, _ = make_acker(clock, kafka=FakeKafka(producers=FailingOnceProducer))
    consumer.batches.append([persist_msg(persisted(S1, R1, T0))])
    if stops:
        with pytest.raises(ReplayBrokerError, match="fenced"):
            run_steps(acker)
        assert len(FailingOnceProducer.made) == 1
        return
    run_steps(acker)  # the first commit fails fatally: a new producer, state rewound
    assert len(FailingOnceProducer.made) == 2
    consumer.batches.append([persist_msg(persisted(S2, R2, T0), 1), acks_msg(0, 0, [S2], [R2])])
    run_steps(acker, 2)
    assert outcomes(FailingOnceProducer.made[1]) == {S2: b"completed"}


def test_an_aborted_commit_takes_its_counts_back_with_its_state(
    fake_kafka: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rewind after an aborted commit reads the inputs again: what the aborted
    transaction counted must not be counted twice (seen with a replay the broker refused)."""
    FailingOnceProducer.made = []
    FailingOnceProducer.error = KafkaError(KafkaError._FAIL, "injected")
    monkeypatch.setattr(FakeConsumer, "seek", lambda *_a, **_k: None, raising=False)
    clock = ManualClock(T0)
    acker, consumer, _ = make_acker(clock, kafka=FakeKafka(producers=FailingOnceProducer))
    consumer.batches.append([persist_msg(persisted(S1, R1, T0)), FakeMessage(NS.acks, 0, 0, None, b"\x07")])
    run_steps(acker)  # the commit fails: aborted, state rewound
    c = acker.counters()
    assert (c["registered"], c["quarantined"], c["pending"]) == (0, 0, 0)
    FailingOnceProducer.error = None
    consumer.batches.append([persist_msg(persisted(S1, R1, T0)), FakeMessage(NS.acks, 0, 0, None, b"\x07")])
    run_steps(acker, 2)  # restored in the loop, then read again and committed
    c = acker.counters()
    assert (c["registered"], c["quarantined"], c["pending"]) == (1, 1, 1)


# --------------------------------------------------------------------------- backlog: lag gates expiry


def test_acker_back_after_an_outage_folds_the_unread_acks_before_anything_times_out(fake_kafka: None) -> None:
    """While no acker ran, S1 and S2 were persisted and S1's tree completed: its ack sits in
    ns.acks. The acker comes back two timeouts later. Reading persist before acks, it must
    not time S1 out (a false timeout spends an attempt); S2, whose ack never came, times out
    once the backlog is read."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    clock.advance(60_000)  # the outage: both deadlines (T0 + 30 s) are long past
    consumer.batches.append([persist_msg(persisted(S1, R1, T0)), persist_msg(persisted(S2, R2, T0), 1)])
    consumer.batches.append([acks_msg(0, 0, [], [])])  # backlog of ns.acks[0] ...
    consumer.batches.append([acks_msg(0, 1, [S1], [R1])])  # ... with S1's completing ack last
    run_steps(acker)
    assert acker.counters()["timed_out"] == 0 and not outcomes(producer)
    clock.advance(1_000)
    run_steps(acker)
    assert acker.counters()["timed_out"] == 0 and not outcomes(producer)
    assert acker.counters()["expiry_holds"] >= 2
    run_steps(acker)  # the backlog is read: S1 completes, and only now does S2 time out
    c = acker.counters()
    assert outcomes(producer) == {S1: b"completed", S2: b"replay"}
    assert (c["completed"], c["timed_out"], c["replayed"], c["pending"]) == (1, 1, 1, 0)


def test_fail_marks_are_decided_while_expiry_waits_for_the_backlog(fake_kafka: None) -> None:
    """Only timeouts wait for the backlog: an explicit failure is a fact, decided at once."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    clock.advance(60_000)
    consumer.batches.append([persist_msg(persisted(S1, R1, T0)), persist_msg(persisted(S2, R2, T0), 1)])
    consumer.batches.append([acks_msg(0, 0, [], [], failed=[S2])])
    consumer.batches.append([acks_msg(0, 1, [S1], [R1])])
    run_steps(acker, 2)
    assert outcomes(producer) == {S2: b"replay"}
    assert acker.counters()["timed_out"] == 0
    run_steps(acker)
    assert outcomes(producer) == {S2: b"replay", S1: b"completed"}
    assert acker.counters()["timed_out"] == 0



# --------------------------------------------------------------------------- transient errors


@pytest.mark.parametrize(
    ("group", "call", "times"),
    [("restore", "get watermark offsets", 2), ("acker", "get committed offsets", 1),
     ("acker", "get watermark offsets", 1)],
    ids=["changelog-watermarks", "committed-offsets", "start-offsets"],
)
def test_transient_errors_of_offset_and_watermark_lookups_are_retried_not_fatal(
    fake_kafka: None, group: str, call: str, times: int
) -> None:
    """Seen in CI: NOT_LEADER_FOR_PARTITION from get_watermark_offsets in the assignment
    callback (a leader moving under load) killed the acker thread. It is retried, as are the
    committed-offset lookups there."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    failing = FakeConsumer.by_group[f"{NS.name}.acker" + ("" if group == "acker" else f".{group}")]
    failing.failing[call] = times
    consumer.batches.append([persist_msg(persisted(S1, R1, T0))])
    consumer.batches.append([acks_msg(0, 0, [S1], [R1])])
    # A restore retried past its slice of the assignment callback finishes in the loop, a
    # step or two later.
    run_steps(acker, 4)
    assert failing.failing[call] == 0
    if group == "restore":  # the restorer's metadata was asked for again after each error
        assert failing.metadata_asked == times
    assert outcomes(producer) == {S1: b"completed"}
