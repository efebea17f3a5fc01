"""The pending figures of a ledger partition - registered entries, the oldest one's persist
offset and registration time - as the acker publishes them in its ``__counters__`` records
and its metrics (the fake Kafka of test_acker_timeouts; the real one in
tests/integration/test_metrics.py)."""

from __future__ import annotations

import numpy as np
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.acker.state import RegistrationTimes
from broker.ledger.clock import ManualClock
from broker.ledger.table import LedgerTable
from broker.schemas import COUNTERS_KEY, LedgerCounters
from tests.unit.fakes import FakeProducer
from tests.unit.test_acker_timeouts import (
    NS,
    R1,
    R2,
    S1,
    S2,
    T0,
    acks_msg,
    fake_kafka,
    make_acker,
    persist_msg,
    persisted,
    run_steps,
)

__all__ = ["fake_kafka"]  # the fixture, used by name


def test_registration_times_give_the_batch_of_an_offset_never_a_later_time() -> None:
    times = RegistrationTimes()
    assert times.time_of(0) is None
    times.note(10, 1_000)  # a batch of offsets 10..19
    times.note(20, 2_000)
    times.note(20, 9_999)  # read again after a rewind: the first sample stands
    assert times.time_of(9) is None  # older than anything noted
    assert times.time_of(15) == 1_000
    assert times.time_of(25) == 2_000
    assert len(times) == 1  # the oldest pending entry only moves forward: older samples go
    times.reset(30, 3_000)
    assert times.time_of(40) == 3_000 and len(times) == 1
    times.reset(None, None)
    assert len(times) == 0


def test_table_pending_counts_registered_entries_only() -> None:
    table = LedgerTable()
    assert table.pending() == (0, -1)
    table.fold(np.array([5, 7]), np.array([1, 2]), orphan_deadline=100)  # events first: not records yet
    assert table.pending() == (0, -1)
    table.register(np.array([7, 9]), np.array([3, 4]), np.array([42, 40]), np.array([100, 100]))
    assert table.pending() == (2, 40)
    table.fold(np.array([9]), np.array([4]), orphan_deadline=100)  # 9 completes
    assert table.pending() == (1, 42)


def _counters_records(producer: FakeProducer) -> list[LedgerCounters]:
    return [LedgerCounters.decode(p.value) for p in producer.committed
            if p.topic == NS.ledger and p.key == COUNTERS_KEY and p.value is not None]


def test_counters_records_carry_the_pending_figures_of_their_partition(fake_kafka: None) -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    consumer.batches.append([persist_msg(persisted(S1, R1, T0))])  # persist[0]@0, registered at T0
    run_steps(acker)
    clock.advance(500)
    consumer.batches.append([persist_msg(persisted(S2, R2, T0 + 500), 1)])  # @1, at T0 + 500
    run_steps(acker)
    last = _counters_records(producer)[-1]
    assert (last.pending, last.oldest_pending_offset, last.oldest_pending_ms) == (2, 0, T0)
    clock.advance(500)
    consumer.batches.append([acks_msg(0, 0, [S1], [R1])])  # S1 completes: S2 is the oldest
    run_steps(acker)
    last = _counters_records(producer)[-1]
    assert (last.pending, last.oldest_pending_offset, last.oldest_pending_ms) == (1, 1, T0 + 500)
    assert last.counters["completed"] == 1

    metrics = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(generate_latest(acker.metrics.partitions_registry).decode())
        for s in f.samples
    }
    assert metrics[("replaybroker_acker_pending_entries", (("partition", "0"),))] == 1
    assert metrics[("replaybroker_acker_oldest_pending_age_seconds", (("partition", "0"),))] == 0.5
    assert metrics[("replaybroker_acker_decisions_total", (("decision", "completed"), ("partition", "0")))] == 1
    assert metrics[("replaybroker_acker_folded_events_total", (("partition", "0"),))] == 1
    assert metrics[("replaybroker_acker_pending_entries", (("partition", "1"),))] == 0
    assert metrics[("replaybroker_acker_commit_duration_seconds_count", ())] >= 3
    totals = {  # the default view: this acker's totals, the worst partitions by name
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(generate_latest(acker.metrics.registry).decode())
        for s in f.samples
    }
    assert totals[("replaybroker_acker_pending_entries", ())] == 1
    assert totals[("replaybroker_acker_oldest_pending_age_seconds", ())] == 0.5
    assert totals[("replaybroker_acker_decisions_total", (("decision", "completed"),))] == 1
    assert totals[("replaybroker_acker_worst_pending_entries", (("partition", "0"),))] == 1


def test_a_restored_partition_keeps_the_pending_figures_of_its_changelog(fake_kafka: None) -> None:
    """A new owner reads the oldest entry's registration time back from the counters record
    (it is not in the entries), and publishes it again with its own next decision."""
    clock = ManualClock(T0)
    first, consumer, producer = make_acker(clock, unlogged_ms=0)  # every entry in the changelog
    consumer.batches.append([persist_msg(persisted(S1, R1, T0)), persist_msg(persisted(S2, R2, T0), 1)])
    run_steps(first)
    latest: dict[bytes, bytes | None] = {}
    for p in producer.committed:
        if p.topic == NS.ledger and p.partition == 0:
            latest[p.key or b""] = p.value
    clock.advance(2_000)
    second, _, _ = make_acker(clock)
    st = second.changelog.new_state()
    second.changelog.apply(st, dict(latest))
    assert (st.pending, st.oldest_pending_offset, st.oldest_pending_ms) == (2, 0, T0)
    st.table.fold(np.array([S1]), np.array([R1]), orphan_deadline=10**6)  # S1 completes
    st.count("completed")
    st.summarize()
    assert (st.pending, st.oldest_pending_offset, st.oldest_pending_ms) == (1, 1, T0)  # the only time known
