"""The expiry gate (broker.acker.lag) against a consumer whose position and watermarks are
scripted - including what librdkafka really does with them: an unknown position after an
assign, and cached watermarks that outlive an unassign/assign."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, TopicPartition

from broker.acker.lag import MAX_SAMPLES, ExpiryGate, _Input
from broker.acker.state import PartitionState, empty_state
from broker.ledger.clock import Ticker
from broker.topics import Namespace

NS = Namespace("lag")
T0 = 1_700_000_000_000
TICKER = Ticker(100, T0)


class ScriptedConsumer:
    def __init__(self) -> None:
        self.cached: dict[tuple[str, int], tuple[int, int]] = {}
        self.fresh: dict[tuple[str, int], tuple[int, int]] = {}
        self.positions: dict[tuple[str, int], int] = {}
        self.queries = 0

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        key = (tp.topic, tp.partition)
        if cached:
            return self.cached.get(key, (OFFSET_INVALID, OFFSET_INVALID))
        self.queries += 1
        return self.fresh[key]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), OFFSET_INVALID))
                for tp in partitions]

    def set(self, lp: int, *, high: int | None = None, position: int | None = None, low: int = 0) -> None:
        for topic in (NS.persist, NS.acks):
            if high is not None:
                self.cached[(topic, lp)] = (low, high)
            if position is not None:
                self.positions[(topic, lp)] = position


def gate_with(consumer: ScriptedConsumer, start: int = OFFSET_BEGINNING, **kw: Any) -> ExpiryGate:
    gate = ExpiryGate(NS, SimpleNamespace(consumer=consumer), log_interval_s=0, **kw)  # type: ignore[arg-type]
    gate.assigned([TopicPartition(t, 0, start) for t in (NS.persist, NS.acks)])
    return gate


def state_with_due_entry(deadline_ms: int) -> PartitionState:
    st = empty_state({})
    st.table.register(np.array([2]), np.array([7]), np.array([0]), TICKER.ticks_of(np.array([deadline_ms])))
    return st


def tick(ms: int) -> int:
    return TICKER.current_tick(ms)


def test_nothing_fetched_yet_counts_as_behind() -> None:
    consumer = ScriptedConsumer()
    gate = gate_with(consumer)
    st = state_with_due_entry(T0 - 1)
    assert gate.ticks({0: st}, TICKER, T0) == {0: None}
    assert (gate.holds, gate.held) == (1, 1)


def test_caught_up_expires_at_the_current_tick() -> None:
    consumer = ScriptedConsumer()
    gate = gate_with(consumer)
    consumer.set(0, high=5, position=5)
    assert gate.ticks({0: state_with_due_entry(T0 - 1)}, TICKER, T0) == {0: tick(T0)}
    assert gate.holds == 0


def test_an_empty_partition_read_from_the_beginning_is_caught_up() -> None:
    """Nothing is ever delivered, so the position stays unknown: the log start stands in."""
    consumer = ScriptedConsumer()
    gate = gate_with(consumer)
    consumer.set(0, high=3, low=3)  # everything before 3 deleted by retention
    assert gate.ticks({0: empty_state({})}, TICKER, T0) == {0: tick(T0)}


def test_a_steady_lag_delays_expiry_by_the_lag_and_no_more() -> None:
    """Under load the position never meets the current high watermark; expiry still runs,
    up to the time of the newest watermark the position has passed."""
    consumer = ScriptedConsumer()
    gate = gate_with(consumer)
    st = state_with_due_entry(T0 + 60_000)  # an entry: its inputs are sampled at every commit
    consumer.set(0, high=10, position=5)
    assert gate.ticks({0: st}, TICKER, T0) == {0: None}
    consumer.set(0, high=20, position=12)  # passed 10, sampled at T0
    assert gate.ticks({0: st}, TICKER, T0 + 100) == {0: tick(T0)}
    consumer.set(0, high=30, position=25)  # passed 20, sampled at T0 + 100
    assert gate.ticks({0: st}, TICKER, T0 + 200) == {0: tick(T0 + 100)}
    consumer.set(0, high=30, position=30)  # caught up
    assert gate.ticks({0: st}, TICKER, T0 + 300) == {0: tick(T0 + 300)}


def test_an_empty_table_is_sampled_once_a_refresh_and_at_every_commit_once_it_has_entries() -> None:
    """Nothing of an empty partition can expire: its inputs are sampled every ``refresh_ms``
    (for their lag), not at every commit - a sample missed only delays its read-up-to time."""
    consumer = ScriptedConsumer()
    gate = gate_with(consumer, refresh_ms=1_000)
    st = empty_state({})
    consumer.set(0, high=10, position=5)
    assert gate.ticks({0: st}, TICKER, T0) == {0: None}  # the first commit samples everything
    assert gate.inputs[(NS.acks, 0)].lag == 5
    consumer.set(0, high=20, position=12)
    assert gate.ticks({0: st}, TICKER, T0 + 100) == {0: None}  # not sampled: as it was
    assert gate.inputs[(NS.acks, 0)].lag == 5
    assert gate.ticks({0: st}, TICKER, T0 + 1_000) == {0: tick(T0)}  # the refresh: passed T0's sample
    assert gate.inputs[(NS.acks, 0)].lag == 8
    consumer.set(0, high=30, position=30)
    st = state_with_due_entry(T0 + 60_000)
    assert gate.ticks({0: st}, TICKER, T0 + 1_100) == {0: tick(T0 + 1_100)}  # with an entry: sampled


def test_both_inputs_must_be_read() -> None:
    consumer = ScriptedConsumer()
    gate = gate_with(consumer)
    consumer.set(0, high=10, position=10)
    consumer.positions[(NS.persist, 0)] = 4  # persist behind, acks caught up
    assert gate.ticks({0: empty_state({})}, TICKER, T0) == {0: None}


def test_slack_counts_a_few_unread_messages_as_read() -> None:
    consumer = ScriptedConsumer()
    consumer.set(0, high=10, position=8)
    assert gate_with(consumer, slack=2).ticks({0: empty_state({})}, TICKER, T0) == {0: tick(T0)}
    assert gate_with(consumer, slack=1).ticks({0: empty_state({})}, TICKER, T0) == {0: None}


def test_a_cached_watermark_left_from_an_earlier_assignment_is_not_trusted() -> None:
    """librdkafka keeps the cached watermarks of a partition across unassign/assign. Given
    back at the other owner's committed offset 50, a stale cached end of 10 would make the
    acker look caught up before it fetched anything."""
    consumer = ScriptedConsumer()
    consumer.set(0, high=10)  # from the earlier assignment
    gate = gate_with(consumer, start=50)
    st = state_with_due_entry(T0 - 1)
    assert gate.ticks({0: st}, TICKER, T0) == {0: None}
    consumer.fresh[(NS.persist, 0)] = consumer.fresh[(NS.acks, 0)] = (0, 80)
    consumer.set(0, high=80, position=60)  # the first fetch: 30 messages behind
    assert gate.ticks({0: st}, TICKER, T0 + 100) == {0: None}
    consumer.set(0, high=80, position=80)
    assert gate.ticks({0: st}, TICKER, T0 + 200) == {0: tick(T0 + 200)}


def test_an_idle_partition_given_back_is_asked_for_its_watermark_when_entries_are_due() -> None:
    """Given back with nothing new, neither position nor cache ever moves: with entries due,
    one real watermark query (rate-limited) settles it."""
    consumer = ScriptedConsumer()
    consumer.set(0, high=50)
    consumer.fresh[(NS.persist, 0)] = consumer.fresh[(NS.acks, 0)] = (0, 50)
    gate = gate_with(consumer, start=50)
    assert gate.ticks({0: empty_state({})}, TICKER, T0) == {0: None}
    assert consumer.queries == 0  # nothing due: no round trip
    st = state_with_due_entry(T0 - 1)
    assert gate.ticks({0: st}, TICKER, T0) == {0: None}  # the fetches get one interval first
    assert gate.ticks({0: st}, TICKER, T0 + 999) == {0: None}
    assert consumer.queries == 0
    assert gate.ticks({0: st}, TICKER, T0 + 1_000) == {0: tick(T0 + 1_000)}
    assert consumer.queries == 2  # persist and acks
    assert gate.ticks({0: st}, TICKER, T0 + 1_100) == {0: tick(T0 + 1_100)}
    assert consumer.queries == 2  # the cache matched: it is trusted from now on


def test_an_unanswered_watermark_query_is_retried_after_the_refresh_interval() -> None:
    consumer = ScriptedConsumer()
    consumer.set(0, high=50)
    consumer.fresh[(NS.persist, 0)] = consumer.fresh[(NS.acks, 0)] = (0, 60)  # cache is stale
    gate = gate_with(consumer, start=50, refresh_ms=1_000)
    st = state_with_due_entry(T0 - 1)
    assert gate.ticks({0: st}, TICKER, T0) == {0: None}
    assert gate.ticks({0: st}, TICKER, T0 + 1_000) == {0: None}  # 10 behind the fresh end
    assert gate.ticks({0: st}, TICKER, T0 + 1_500) == {0: None}
    assert consumer.queries == 2
    gate.ticks({0: st}, TICKER, T0 + 2_000)
    assert consumer.queries == 4


def test_a_rewind_starts_over() -> None:
    consumer = ScriptedConsumer()
    gate = gate_with(consumer)
    consumer.set(0, high=10, position=10)
    assert gate.ticks({0: empty_state({})}, TICKER, T0) == {0: tick(T0)}
    gate.assigned([TopicPartition(t, 0, 4) for t in (NS.persist, NS.acks)])  # sought back to 4
    consumer.positions.clear()  # unknown after a seek, until a message is delivered
    assert gate.ticks({0: empty_state({})}, TICKER, T0 + 100) == {0: None}


def test_samples_are_bounded_and_thinning_only_delays() -> None:
    inp = _Input(0, (OFFSET_INVALID, OFFSET_INVALID), proven=True)
    for i in range(10 * MAX_SAMPLES):
        inp.sample(T0 + i, 10 + i)
    assert len(inp.samples) <= MAX_SAMPLES + 1
    assert inp.samples[-1] == (T0 + 10 * MAX_SAMPLES - 1, 10 * MAX_SAMPLES + 9)
    inp.reach(10 + 5 * MAX_SAMPLES, 0)
    assert inp.read_ms is not None and inp.read_ms <= T0 + 5 * MAX_SAMPLES
    inp.reach(10 * MAX_SAMPLES + 9, 0)
    assert inp.read_ms == T0 + 10 * MAX_SAMPLES - 1 and not inp.samples


def test_a_paused_input_takes_no_samples_and_a_resumed_one_waits_for_a_fetch() -> None:
    """A paused partition is not fetched, so its cached watermark stands still while records
    are appended: a sample of it would claim them read. Resumed, it is unproven until a fetch
    comes back (broker.acker.reading pauses ``ns.acks[i]``)."""
    consumer = ScriptedConsumer()
    gate = gate_with(consumer)
    acks = TopicPartition(NS.acks, 0)
    consumer.set(0, high=10, position=10)
    assert gate.ticks({0: empty_state({})}, TICKER, T0) == {0: tick(T0)}
    gate.paused(acks)
    # persist is fetched and read on; acks are appended (offsets 10..14) but not fetched
    consumer.cached[(NS.persist, 0)] = (0, 20)
    consumer.positions[(NS.persist, 0)] = 20
    assert gate.ticks({0: empty_state({})}, TICKER, T0 + 1_000) == {0: tick(T0)}
    gate.resumed(acks)
    assert gate.ticks({0: empty_state({})}, TICKER, T0 + 2_000) == {0: tick(T0)}  # the cache is the pause's
    consumer.cached[(NS.acks, 0)] = (0, 15)  # the first fetch after the resume came back
    consumer.positions[(NS.acks, 0)] = 15
    assert gate.ticks({0: empty_state({})}, TICKER, T0 + 3_000) == {0: tick(T0 + 3_000)}


def test_a_resumed_input_with_nothing_new_is_proven_by_a_watermark_query() -> None:
    consumer = ScriptedConsumer()
    gate = gate_with(consumer, refresh_ms=500)
    acks = TopicPartition(NS.acks, 0)
    consumer.set(0, high=10, position=10)
    gate.ticks({0: empty_state({})}, TICKER, T0)
    gate.paused(acks)
    gate.resumed(acks)
    consumer.fresh[(NS.acks, 0)] = (0, 10)  # nothing was appended meanwhile
    st = state_with_due_entry(T0 + 100)
    assert gate.ticks({0: st}, TICKER, T0 + 1_000) == {0: tick(T0)}  # one interval to prove itself
    assert gate.ticks({0: st}, TICKER, T0 + 1_600) == {0: tick(T0 + 1_600)}
    assert consumer.queries == 1
