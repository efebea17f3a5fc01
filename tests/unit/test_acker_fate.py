"""A record's fate at the seams between holds, deferrals, watches and the lag gate
(docs/design.md §6, "The fate rule"), with the real ``Acker`` on a stepped clock and the
in-memory Kafka stand-ins. Each test is a sequence that once ended in a false dead letter:

1. a held dead letter decided on the clock while its completing ack was still unread behind a
   backlog;
2. a last attempt put off by the payload quota losing its own hold;
3. an explicitly failed middle attempt breaking the chain of superseded marks;
4. (order, not fate) a lagging ledger partition letting a later record of a key be replayed first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from broker import ids
from broker.ledger.clock import ManualClock
from broker.schemas import PersistedRecord, XorBatch
from tests.unit.fakes import WHOLE_RESTORE, FakeConsumer, FakeKafka, FakeMessage, FakeProducer
from tests.unit.test_acker_payloads import (
    PersistLog,
    persist,
    persist_log,  # noqa: F401 - the fixture
    srids_of,
)
from tests.unit.test_acker_payloads import make_acker as make_uncached_acker
from tests.unit.test_acker_timeouts import (
    NS,
    T0,
    a_held_last_attempt,
    acks_msg,
    fake_kafka,  # noqa: F401 - the fixture
    make_acker,
    outcomes,
    persist_msg,
    persisted,
    run_steps,
)

S1, R1 = 0x1F3A_5C7E_9B2D_4E62, 0x3243_F6A8_885A_308D
ROOT, CHILD = 0x3243_F6A8_885A_308D, 0x1319_8A2E_0370_7344
WATCH_MS = 60_000  # the default watch: the orphan TTL of make_acker


def replays(producer: FakeProducer) -> list[PersistedRecord]:
    return [PersistedRecord.decode(p.value) for p in producer.committed if p.topic == NS.persist and p.value]


def test_a_held_dead_letter_waits_for_the_backlog_that_holds_its_completing_ack(fake_kafka: None) -> None:  # noqa: F811
    """Sequence 1: the last attempt S1 (3 of 3) timed out and its dead letter is held for
    watch_ms. Within the hold its completing ack is appended, behind a backlog on its ledger
    partition. The hold ends while the backlog is still being read: the dead letter must wait
    until the acker has read that far - the ack completes the record."""
    clock = ManualClock(T0)
    acker, consumer, producer = a_held_last_attempt(clock)
    lp = ids.ledger_partition(S1, FakeConsumer.partitions)
    others = [s for s in (int(x) * 2 + lp for x in range(10**6, 10**6 + 40)) if s != S1]
    for i, srid in enumerate(others):  # a backlog: one batch per poll
        consumer.batches.append([acks_msg(lp, 1 + i, [srid], [srid ^ 7])])
    consumer.batches.append([acks_msg(lp, 1 + len(others), [S1], [R1])])
    clock.advance(WATCH_MS + 100)  # the hold is over by the clock
    run_steps(acker, len(others) + 3)
    assert outcomes(producer) == {S1: b"completed"}
    assert not [p for p in producer.committed if p.topic == NS.dlq]
    assert acker.counters()["completed_late"] == 1


def test_a_last_attempt_put_off_by_the_payload_quota_keeps_its_own_hold(persist_log: PersistLog) -> None:  # noqa: F811
    """Sequence 2: two last attempts (max_attempts 1) time out in one commit; the quota reads
    one payload per commit, so one is held and the other is put off. Coming back from being
    put off it is a last attempt that timed out like the first: its dead letter is held too,
    and when both trees complete 5 s later, both complete."""
    acker, consumer, producer = make_uncached_acker(persist_log, max_fetches_per_commit=1)
    a, b = srids_of(0, 2)
    records = [persisted(s, s ^ 0x5555, T0, max_attempts=1, timeout_ms=1_000, value=b"order %d" % i)
               for i, s in enumerate((a, b))]
    persist(persist_log, consumer, [(r, i) for i, r in enumerate(records)])
    run_steps(acker)
    persist_log.clock.advance(1_100)
    run_steps(acker, 3)
    assert acker.counters()["timed_out"] == 2 and not outcomes(producer)
    persist_log.clock.advance(5_000)
    consumer.batches.append([acks_msg(0, 0, [a, b], [a ^ 0x5555, b ^ 0x5555])])
    run_steps(acker, 2)
    assert outcomes(producer) == {a: b"completed", b: b"completed"}
    assert not [p for p in producer.committed if p.topic == NS.dlq]


def test_an_explicitly_failed_middle_attempt_hands_the_superseded_mark_on(fake_kafka: None, monkeypatch: Any) -> None:  # noqa: F811
    """Sequence 3: S times out and is replayed as R (S watched); R is failed explicitly and
    replayed as R2, the last attempt; S's tree completes within its watch. The mark for R must
    reach R2 through R (failures and timeouts keep a chain alike), and R2 - failed too - is
    settled as completed, not dead-lettered (its earlier attempt S was still watched)."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock, kafka=FakeKafka(counts={NS.superseded: FakeConsumer.partitions}))
    s_lp = ids.ledger_partition(S1, FakeConsumer.partitions)
    original = persisted(S1, ROOT, created_ms=T0, timeout_ms=1_000, max_attempts=3)
    consumer.batches.append([persist_msg(original), acks_msg(s_lp, 0, [S1], [ROOT ^ CHILD])])
    run_steps(acker)
    clock.advance(1_200)
    run_steps(acker, 2)
    (r,) = replays(producer)
    offsets = {s_lp: 1, 1 - s_lp: 1}

    def deliver(topic: str, lp: int, value: bytes | None, key: bytes | None = None) -> None:
        consumer.batches.append([FakeMessage(topic, lp, offsets[lp], key, value)])
        offsets[lp] += 1

    def fail(srid: int) -> None:
        lp = ids.ledger_partition(srid, FakeConsumer.partitions)
        consumer.batches.append([acks_msg(lp, offsets[lp], [], [], failed=[srid])])
        offsets[lp] += 1

    r_lp = ids.ledger_partition(r.srid, FakeConsumer.partitions)
    deliver(NS.persist, r_lp, r.encode(), ids.encode_id(r.srid))
    fail(r.srid)
    run_steps(acker, 3)
    r2 = next(x for x in replays(producer) if x.attempt == 3)
    assert [h.reason for h in r2.history] == ["timeout", "failed"]
    r2_lp = ids.ledger_partition(r2.srid, FakeConsumer.partitions)
    deliver(NS.persist, r2_lp, r2.encode(), ids.encode_id(r2.srid))
    run_steps(acker, 2)

    consumer.batches.append([acks_msg(s_lp, offsets[s_lp], [S1], [CHILD])])  # S completes late
    offsets[s_lp] += 1
    run_steps(acker, 2)
    fail(r2.srid)  # the last attempt fails too
    for _ in range(4):  # the marks the acker writes reach the owners of R, then R2
        marks = [p for p in producer.committed if p.topic == NS.acks]
        for m in marks[len(getattr(deliver, "seen", [])):]:
            deliver(NS.acks, m.partition, m.value)
        deliver.seen = marks  # type: ignore[attr-defined]
        run_steps(acker, 2)
    clock.advance(2 * WATCH_MS)
    run_steps(acker, 3)
    assert not [p for p in producer.committed if p.topic == NS.dlq]
    assert outcomes(producer)[r2.srid] == b"completed"
    assert acker.counters()["superseded_settled"] == 1
    assert np.all(np.array([acker.counters()["dlq"], acker.counters()["pending"]]) == 0)


def test_a_failed_commit_rewinds_only_the_partitions_it_touched(monkeypatch: Any) -> None:
    """Ledger partition 1 has a pending entry; a commit that touched only partition 0 fails:
    partition 0 is restored from its changelog in the loop (its inputs paused meanwhile,
    then read again), partition 1 keeps its table as it is - no reload."""
    from broker.acker import Acker, AckerConfig
    from broker.settings import KafkaSettings
    from tests.unit.log_cluster import Cluster

    cluster = Cluster()
    clock = ManualClock(T0)
    config = AckerConfig(commit_interval_ms=0, instance_id="unit", stats_interval_ms=10**12, fail_hold_ms=0,
                         **WHOLE_RESTORE)
    acker = Acker(KafkaSettings("fake:9092"), NS, config, clock=clock, kafka=cluster)
    s0, s1 = 0x1000_0000_0000_0002, 0x1000_0000_0000_0003  # ledger partitions 0 and 1
    for s in (s0, s1):
        cluster.append(NS.persist, s % 2, ids.encode_id(s), persisted(s, s ^ 5, T0).encode())
    run_steps(acker, 3)
    kept = acker.states[1]
    assert acker.counters()["pending"] == 2
    cluster.fail_commits = 1
    cluster.append(NS.acks, 0, None, XorBatch(0, np.array([s0]), np.array([s0 ^ 5]), np.array([], np.int64)).encode())
    run_steps(acker)  # the completion of s0 is aborted
    assert 0 not in acker.states and acker.states[1] is kept
    run_steps(acker, 3)  # partition 0 restored, its ack read again
    assert acker.states[1] is kept and acker.counters()["completed"] == 1
    tombstones = [m for m in cluster.records(NS.persist) if m.value() is None]
    assert [ids.decode_id(m.key() or b"") for m in tombstones] == [s0]


def test_a_fail_mark_wins_over_the_clock() -> None:
    """A registered entry marked FAILED and past its deadline - its mark held by
    fail_hold_ms, or restored by a new owner after a takeover that took longer than the
    timeout - is a failure, not a timeout (issue 30, item 7: ~450 explicit failures per chaos
    run became timeouts across takeovers)."""
    from broker.ledger.table import LedgerTable

    table = LedgerTable()
    table.register(np.array([S1]), np.array([R1]), np.array([0]), np.array([10]))
    table.mark_failed(np.array([S1]), 1_000)
    assert len(table.expire(11).timed_out) == 0
    assert table.take_failed().srids.tolist() == [S1]


def test_a_lagging_partition_holds_back_its_own_timeouts_only_and_keeps_a_keys_order(fake_kafka: None) -> None:  # noqa: F811
    """Two records of one key, ``a`` then ``b`` 5 ms later, live in one ledger partition (every
    attempt of a key's records does); ``c``, another key's, in another. All are dropped. When
    their deadlines pass, the key's partition is behind on a backlog of acks and ``c``'s is
    caught up: ``c`` is replayed at once, ``a`` and ``b`` once their partition is read that
    far - ``a`` first."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    a, b = [s for s in range(10**6, 10**6 + 10) if ids.ledger_partition(s, FakeConsumer.partitions) == 0][:2]
    c = next(s for s in range(10**6, 10**6 + 10) if ids.ledger_partition(s, FakeConsumer.partitions) == 1)
    consumer.batches.append([
        persist_msg(persisted(a, a ^ 0x77, created_ms=T0, timeout_ms=1_000, max_attempts=3), offset=0),
        persist_msg(persisted(b, b ^ 0x77, created_ms=T0 + 5, timeout_ms=1_000, max_attempts=3), offset=1),
    ])
    consumer.batches.append([persist_msg(persisted(c, c ^ 0x77, created_ms=T0 + 5, timeout_ms=1_000, max_attempts=3))])
    run_steps(acker, 2)
    others = [s for s in range(2 * 10**6, 2 * 10**6 + 400) if ids.ledger_partition(s, FakeConsumer.partitions) == 0]
    for i, srid in enumerate(others[:30]):  # a backlog on the key's partition: one batch per poll
        consumer.batches.append([acks_msg(0, i, [srid], [srid ^ 7])])
    clock.advance(1_200)  # every deadline passed
    run_steps(acker, 40)
    order = [r.origin for r in replays(producer)]
    assert order == [c, a, b], "a lagging partition held back another's timeouts, or b went out before a"
