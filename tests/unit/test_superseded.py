"""Superseded replays, with a stepped clock (docs/design.md §6).

1. The ledger table: a replayed timeout is watched with its XOR value; late events that bring
   it to 0 name the replay; a superseded replay completes normally or is settled, never
   handed out for a replay; watches and marks go through the changelog.
2. The real ``Acker`` on a ``ManualClock`` with the in-memory Kafka stand-ins of
   test_acker_timeouts: the records its transactions hold.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from broker import ids
from broker.ledger.clock import ManualClock
from broker.ledger.table import LedgerTable
from broker.schemas import PersistedRecord, XorBatch
from tests.unit.fakes import FakeConsumer, FakeKafka, FakeMessage
from tests.unit.test_acker_timeouts import (
    NS,
    T0,
    acks_msg,
    fake_kafka,  # noqa: F401 - the fixture
    make_acker,
    outcomes,
    persist_msg,
    persisted,
    run_steps,
)

S, S2, REPLAY = 0x1F3A_5C7E_9B2D_4E62, 0x2B7E_1516_28AE_D2A8, 0x0123_4567_89AB_CDE1
ROOT, CHILD = 0x3243_F6A8_885A_308D, 0x1319_8A2E_0370_7344
ORPHAN_TICK = 1_000


def a(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def timed_out_with(table: LedgerTable, tick: int) -> tuple[list[int], list[int]]:
    """Expire at ``tick``: the timed-out srids and their XOR values."""
    out = table.expire(tick).timed_out
    assert out.values is not None
    return out.srids.tolist(), out.values.tolist()


def registered_and_half_acked() -> LedgerTable:
    """S registered (root ROOT, deadline tick 10); the task acked ROOT and emitted CHILD,
    whose ack is still missing: value CHILD."""
    table = LedgerTable()
    table.register(a(S), a(ROOT), a(7), a(10))
    assert not len(table.fold(a(S), a(ROOT ^ CHILD), ORPHAN_TICK))
    return table


# --------------------------------------------------------------------------- level 1


def test_late_events_of_a_watched_timeout_complete_it_and_name_the_replay() -> None:
    table = registered_and_half_acked()
    assert timed_out_with(table, 10) == ([S], [CHILD])
    assert not len(table.watch(a(S), a(CHILD), a(REPLAY), 500))
    entry = table.get(S)
    assert entry is not None and entry.watching and not entry.registered and entry.offset == REPLAY
    assert table.pending() == (0, -1)  # a watch is no pending record; its offset is a srid
    assert not len(table.take_superseded())

    done = table.fold(a(S), a(CHILD), ORPHAN_TICK)  # the late ack of the last record
    assert not len(done)  # not a completion of S: S had left with outcome "replay"
    late = table.take_superseded()
    assert (late.srids.tolist(), late.offsets.tolist()) == ([S], [REPLAY])
    assert S not in table and not len(table.take_superseded())


def test_a_mark_for_a_replay_that_was_replayed_again_supersedes_the_next_one() -> None:
    """A chain: S timed out and was replayed as REPLAY, which timed out too and was replayed
    as REPLAY2 (REPLAY is now a WATCH). A superseded mark for REPLAY is handed on: REPLAY2 is
    superseded in turn - else it could still be dead-lettered after its origin completed
    (seen: a task busy longer than two timeouts, max_attempts 3)."""
    replay2 = 0x0BAD_F00D_1234_5679
    table = LedgerTable()
    table.register(a(REPLAY), a(ROOT), a(8), a(10))
    assert timed_out_with(table, 10) == ([REPLAY], [ROOT])
    assert not len(table.watch(a(REPLAY), a(ROOT), a(replay2), 500))
    assert table.mark_superseded(a(REPLAY), ORPHAN_TICK) == 0
    chained = table.take_superseded()
    assert (chained.srids.tolist(), chained.offsets.tolist()) == ([REPLAY], [replay2])
    assert REPLAY not in table


def test_a_partial_late_event_does_not_supersede_and_the_watch_expires_unnoticed() -> None:
    table = LedgerTable()
    table.register(a(S), a(ROOT), a(7), a(10))
    table.expire(10)
    table.watch(a(S), a(ROOT), a(REPLAY), 500)
    table.fold(a(S), a(ROOT ^ CHILD), ORPHAN_TICK)  # the task's event: CHILD is still open
    assert not len(table.take_superseded())
    expired = table.expire(500)
    assert not len(expired.timed_out) and not len(expired.orphans)  # neither a timeout nor an orphan
    assert table.take_expired_counts() == (1, 0)
    assert len(table) == 0


def test_a_fail_mark_of_the_original_ends_the_watch_without_a_late_completion() -> None:
    table = registered_and_half_acked()
    table.expire(10)
    table.watch(a(S), a(CHILD), a(REPLAY), 500)
    table.mark_failed(a(S), ORPHAN_TICK)
    assert not len(table.take_failed())  # a watch is no record to replay
    table.fold(a(S), a(CHILD), ORPHAN_TICK)
    assert not len(table.take_superseded())


def test_a_second_persist_record_of_a_watched_srid_is_refused() -> None:
    table = registered_and_half_acked()
    table.expire(10)
    table.watch(a(S), a(CHILD), a(REPLAY), 500)
    reg = table.register(a(S), a(ROOT), a(9), a(400))
    assert reg.duplicates.tolist() == [True] and not len(reg.completed)
    table.fold(a(S), a(CHILD), ORPHAN_TICK)
    assert table.take_superseded().srids.tolist() == [S]


def test_a_superseded_replay_completes_when_acked_and_is_settled_when_it_times_out() -> None:
    table = LedgerTable()
    table.register(a(S, S2), a(ROOT, CHILD), a(1, 2), a(10, 10))
    assert table.mark_superseded(a(S, S2), ORPHAN_TICK) == 2
    assert table.fold(a(S), a(ROOT), ORPHAN_TICK).srids.tolist() == [S]  # the task's skip-ack
    expired = table.expire(10)
    assert not len(expired.timed_out)  # S2 is never replayed ...
    assert table.take_settled().srids.tolist() == [S2]  # ... it is settled
    table.register(a(REPLAY), a(ROOT), a(3), a(20))
    table.mark_superseded(a(REPLAY), ORPHAN_TICK)
    table.mark_failed(a(REPLAY), ORPHAN_TICK)
    assert not len(table.take_failed())  # nor dead-lettered after a failure
    assert table.take_settled().srids.tolist() == [REPLAY]


def test_a_mark_before_the_persist_record_waits_for_it_or_expires_as_unknown() -> None:
    table = LedgerTable()
    table.mark_superseded(a(S, S2), 50)  # S2's replay completed before: it never registers
    table.register(a(S), a(ROOT), a(1), a(10))
    entry = table.get(S)
    assert entry is not None and entry.superseded and entry.registered
    table.expire(10)
    assert table.take_settled().srids.tolist() == [S]
    expired = table.expire(50)
    assert expired.orphans.srids.tolist() == [S2]
    assert table.take_expired_counts() == (0, 1)


def test_watches_and_marks_survive_the_changelog() -> None:
    table = registered_and_half_acked()
    table.expire(10)
    table.watch(a(S), a(CHILD), a(REPLAY), 500)
    table.register(a(S2), a(ROOT), a(8), a(30))
    table.mark_superseded(a(S2), ORPHAN_TICK)
    delta = table.take_dirty()
    up = delta.upserts
    restored = LedgerTable()
    restored.restore(up.srids, up.values, up.flags, up.offsets, up.deadlines)
    assert restored.pending() == (1, 8)
    restored.fold(a(S), a(CHILD), ORPHAN_TICK)
    assert restored.take_superseded().offsets.tolist() == [REPLAY]
    restored.expire(30)
    assert restored.take_settled().srids.tolist() == [S2]


# --------------------------------------------------------------------------- level 2


@pytest.fixture
def markers_topic(fake_kafka: None) -> FakeKafka:  # noqa: F811
    """ns.superseded exists with the ledger's partition count; the replay topics with 4."""
    return FakeKafka(counts={NS.superseded: FakeConsumer.partitions})


def test_the_acker_marks_the_replay_of_a_late_original_and_settles_it(markers_topic: FakeKafka) -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock, kafka=markers_topic)
    original = persisted(S, ROOT, created_ms=T0, timeout_ms=1_000)
    lp = ids.ledger_partition(S, FakeConsumer.partitions)
    consumer.batches.append([persist_msg(original), acks_msg(lp, 0, [S], [ROOT ^ CHILD])])
    run_steps(acker)
    clock.advance(1_200)
    run_steps(acker, 2)
    assert outcomes(producer) == {S: b"replay"}
    replay = next(PersistedRecord.decode(p.value) for p in producer.committed if p.topic == NS.persist and p.value)
    assert (replay.origin, replay.attempt) == (S, 2)

    consumer.batches.append([acks_msg(lp, 1, [S], [CHILD])])  # the original completes late
    run_steps(acker, 2)
    marker = [p for p in producer.committed if p.topic == NS.superseded]
    assert [(m.partition, m.key, m.value) for m in marker] == [
        (ids.ledger_partition(replay.srid, FakeConsumer.partitions), ids.encode_id(replay.srid), ids.encode_id(S))
    ]
    # This acker owns the replay's partition too: it marks the replay in the same commit (the
    # changelog carries it), no mark goes through ns.acks (superseding.hand_on).
    assert not [p for p in producer.committed if p.topic == NS.acks]
    c = acker.counters()
    assert (c["superseded"], c["superseded_marks"], c["completed"]) == (1, 1, 0)
    assert outcomes(producer) == {S: b"replay"}  # the original left once, as replayed

    # The replay's persist record is read after the mark, and nobody acks the replay: at its
    # deadline it is settled as completed - not replayed again, not dead-lettered.
    rlp = ids.ledger_partition(replay.srid, FakeConsumer.partitions)
    consumer.batches.append([FakeMessage(NS.persist, rlp, 5, ids.encode_id(replay.srid), replay.encode())])
    run_steps(acker, 2)
    clock.advance(1_200 + replay.timeout_ms)
    run_steps(acker, 2)
    assert outcomes(producer) == {S: b"replay", replay.srid: b"completed"}
    c = acker.counters()
    assert (c["superseded_settled"], c["replayed"], c["dlq"], c["pending"]) == (1, 1, 0, 0)


def test_without_the_markers_topic_the_replay_is_still_marked_for_its_acker(fake_kafka: None, caplog: Any) -> None:  # noqa: F811
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)  # ns.superseded: 4 partitions, not 2
    lp = ids.ledger_partition(S, FakeConsumer.partitions)
    consumer.batches.append([persist_msg(persisted(S, ROOT, created_ms=T0, timeout_ms=1_000))])
    run_steps(acker)
    clock.advance(1_200)
    run_steps(acker, 2)
    consumer.batches.append([acks_msg(lp, 1, [S], [ROOT])])
    run_steps(acker, 2)
    assert not [p for p in producer.committed if p.topic == NS.superseded]
    c = acker.counters()
    assert (c["superseded"], c["superseded_marks"]) == (1, 1)  # marked on its owner: this acker
    assert "tasks cannot skip superseded replays" in caplog.text


def test_a_replay_owned_elsewhere_gets_its_mark_through_the_acks_topic() -> None:
    """``hand_on`` marks the replays this acker owns at once; for one of a partition it does
    not own, ``take`` writes the marker and a mark to ``ns.acks`` of the replay's partition."""
    from broker.acker import superseding
    from broker.acker.payloads import PayloadCache
    from broker.acker.state import empty_state

    mine, theirs = 0x10, 0x21  # replay srids of ledger partitions 0 (owned) and 1 (not owned)
    st = empty_state({})
    st.table.register(a(S, S2), a(ROOT, ROOT), a(1, 2), a(10, 10))
    st.table.register(a(mine), a(CHILD), a(3), a(500))
    st.table.expire(10)
    st.table.watch(a(S, S2), a(ROOT, ROOT), a(mine, theirs), 500)
    st.table.fold(a(S, S2), a(ROOT, ROOT), ORPHAN_TICK)  # both originals complete late
    late = superseding.hand_on({0: st}, 2, ORPHAN_TICK)
    assert sorted((c.original, c.replay) for c in late) == [(S, mine), (S2, theirs)]
    entry = st.table.get(mine)
    assert entry is not None and entry.superseded
    out = superseding.take([(0, st)], late, NS, 2, True, PayloadCache(0))
    assert sorted((o.topic, o.partition, o.key) for _, o in out if o.topic == NS.superseded) == [
        (NS.superseded, 0, ids.encode_id(mine)), (NS.superseded, 1, ids.encode_id(theirs))
    ]
    marks = [(o.partition, XorBatch.decode(o.value).superseded.tolist()) for _, o in out if o.topic == NS.acks]
    assert marks == [(1, [theirs])]


def a_last_attempt_that_timed_out_while_its_original_is_watched(
    clock: ManualClock, kafka: FakeKafka,
) -> tuple[Any, FakeConsumer, Any, PersistedRecord]:
    """S (max 2 attempts) times out and is replayed as its last attempt R, which is registered
    and times out too - before anything of S completes (a task busy with S for two timeouts)."""
    acker, consumer, producer = make_acker(clock, kafka=kafka)
    original = persisted(S, ROOT, created_ms=T0, timeout_ms=1_000, max_attempts=2)
    lp = ids.ledger_partition(S, FakeConsumer.partitions)
    consumer.batches.append([persist_msg(original), acks_msg(lp, 0, [S], [ROOT ^ CHILD])])
    run_steps(acker)
    clock.advance(1_200)
    run_steps(acker, 2)
    replay = next(PersistedRecord.decode(p.value) for p in producer.committed if p.topic == NS.persist and p.value)
    assert replay.attempt == replay.max_attempts == 2
    rlp = ids.ledger_partition(replay.srid, FakeConsumer.partitions)
    consumer.batches.append([FakeMessage(NS.persist, rlp, 5, ids.encode_id(replay.srid), replay.encode())])
    run_steps(acker)
    clock.advance(1_200)
    run_steps(acker, 2)
    return acker, consumer, producer, replay


def test_a_last_attempt_is_not_dead_lettered_while_its_original_may_still_complete(markers_topic: FakeKafka) -> None:
    """The original completes after its last replay timed out: the replay is settled as
    completed - the record was processed - never dead-lettered (seen in CI: a task busy
    with the first attempt for two timeouts, max_attempts 3)."""
    clock = ManualClock(T0)
    acker, consumer, producer, replay = a_last_attempt_that_timed_out_while_its_original_is_watched(clock, markers_topic)
    assert outcomes(producer) == {S: b"replay"}  # the replay's dead letter waits
    assert not [p for p in producer.committed if p.topic == NS.dlq]
    assert acker.counters()["dlq_held"] == 1

    lp = ids.ledger_partition(S, FakeConsumer.partitions)
    consumer.batches.append([acks_msg(lp, 1, [S], [CHILD])])  # the original completes late
    run_steps(acker)
    # Settled at the mark - in the commit that read the completion - not at the end of the hold.
    assert outcomes(producer) == {S: b"replay", replay.srid: b"completed"}
    clock.advance(120_000)
    run_steps(acker, 2)
    assert not [p for p in producer.committed if p.topic == NS.dlq]
    c = acker.counters()
    assert (c["superseded_settled"], c["dlq"], c["pending"]) == (1, 0, 0)


def test_a_held_last_attempt_is_dead_lettered_when_the_watches_end(markers_topic: FakeKafka) -> None:
    """Held for the original's watch and for its own late events: the later of the two."""
    clock = ManualClock(T0)
    acker, _consumer, producer, replay = a_last_attempt_that_timed_out_while_its_original_is_watched(clock, markers_topic)
    held_at = clock.now_ms()
    # the original's watch, and its own from when it timed out (watch_ms: the orphan TTL)
    watch_end = max(replay.history[-1].at_ms, held_at) + 60_000
    clock.advance(watch_end - held_at - 1_000)
    run_steps(acker, 2)
    assert not [p for p in producer.committed if p.topic == NS.dlq]
    clock.advance(2_000)
    run_steps(acker, 2)
    dlq = [p for p in producer.committed if p.topic == NS.dlq]
    assert len(dlq) == 1
    assert outcomes(producer) == {S: b"replay", replay.srid: b"dlq"}
    c = acker.counters()
    assert (c["dlq_held"], c["dlq"], c["unwatched"], c["pending"]) == (1, 1, 1, 0)


def test_a_superseded_mark_settles_a_deferred_entry_at_once() -> None:
    table = LedgerTable()
    table.register(a(REPLAY), a(ROOT), a(7), a(10))
    out = table.expire(11).timed_out
    table.defer(out.srids, out.offsets, 500)
    assert table.mark_superseded(a(REPLAY), ORPHAN_TICK) == 1
    assert table.take_settled().srids.tolist() == [REPLAY]
    assert table.get(REPLAY) is None and not table.deferred_due(1_000)
