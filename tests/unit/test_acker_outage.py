"""A task's outage stops the timeout clock of what is pending (docs/design.md §6, *Outages*;
broker.ledger.outages): the pure stop, and the real ``Acker`` on a stepped clock over the
in-memory Kafka of tests/unit/log_cluster.py (the harness of test_acker_windows) - a beat
holds back a deadline after the outage began by the whole stop, one before it not at all, a
record created during it from the stop's end; a takeover keeps the stop, and a beat read again
adds nothing twice."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from broker.errors import DecodeError
from broker.ledger.outages import ClockStops, outages_in
from broker.schemas import COUNTERS_KEY, OUTAGE_BEAT_KEY, LedgerCounters, OutageBeat, XorBatch
from broker.status import without_outages
from tests.unit.test_acker_windows import NS, ROOT, T0, World, X

Y = X + 2


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    yield World(monkeypatch)


def beat(world: World, since: int, until: int, task: str = "enrich") -> None:
    world.cluster.append(NS.acks, 0, OUTAGE_BEAT_KEY, OutageBeat(task, since, until).encode())


def at(world: World, ms: int) -> None:
    world.clock.advance(T0 + ms - world.clock.now_ms())
    world.step(3)


# ---------------------------------------------------------------- the pure stop


def test_beats_stop_the_clock_for_the_union_of_what_they_cover() -> None:
    stops = ClockStops()
    assert stops.beat("a", 10_000, 13_000) == (10_000, [], [(10_000, 13_000)])
    assert stops.beat("a", 10_000, 14_000) == (13_000, [], [(13_000, 14_000)])  # the next second
    assert stops.beat("b", 11_000, 13_500) is None  # another task, covered already
    assert stops.beat("a", 10_000, 12_000) is None  # a beat read again
    assert stops.beat("a", 20_000, 22_000) == (20_000, [], [(20_000, 22_000)])  # a new outage: a new stop
    assert stops.stops == [(10_000, 14_000), (20_000, 22_000)] and stops.until_ms == 22_000
    assert stops.in_outage(21_000) == {"a": 20_000} and stops.in_outage(22_000) == {}


def test_a_record_created_during_the_stop_starts_its_timeout_when_the_clock_moves_again() -> None:
    stops = ClockStops()
    stops.beat("a", 10_000, 13_000)
    created = np.array([5_000, 5_000, 10_500, 13_000, 2_000])
    deadlines = np.array([12_000, 9_000, 12_500, 15_000, 11_000])
    # before, due after the start: the whole stop; due before it: nothing; during: from its
    # creation; after: nothing
    assert stops.held_back(created, deadlines).tolist() == [3_000, 0, 2_500, 0, 3_000]
    assert ClockStops().held_back(created, deadlines).tolist() == [0] * 5
    stops.beat("a", 20_000, 21_000)  # a second stop: what the first added counts for it
    assert stops.held_back(np.array([5_000, 5_000, 14_000]), np.array([12_000, 18_000, 19_000])).tolist() == [
        3_000, 4_000, 0]  # 12 -> 15 (not after 20: no more); 18 -> 21 -> 22; created after the first, due before the second


def test_the_stop_travels_in_the_counters_record() -> None:
    stops = ClockStops()
    stops.beat("enrich", 10_000, 13_000)
    counters = {"completed": 4, **stops.as_counters()}
    record = LedgerCounters.decode(LedgerCounters(counters, 1).encode())
    back, rest = ClockStops.from_counters(record.counters)
    assert rest == {"completed": 4}
    assert (back.stops, back.tasks) == ([(10_000, 13_000)], {"enrich": (10_000, 13_000)})
    assert outages_in(record.counters, 12_000) == {"enrich": 10_000}
    assert without_outages(record.counters) == {"completed": 4}
    assert ClockStops().as_counters() == {}


def test_a_beat_that_makes_no_sense_is_refused() -> None:
    for bad in (b"", b"\0" * 15, OutageBeat("t", 5, 4).encode(), OutageBeat("t", 0, 4).encode(),
                b"\0" * 7 + b"\1" + b"\0" * 7 + b"\2" + b"\xff"):
        with pytest.raises(DecodeError):
            OutageBeat.decode(bad)


# ---------------------------------------------------------------- the acker


def test_a_beat_holds_back_a_timeout_by_the_stop(world: World) -> None:
    world.send(X, ROOT, max_attempts=3, timeout_ms=1_000)  # due at T0 + 1 s
    world.step(2)
    beat(world, T0 + 200, T0 + 3_200)  # the clock stands 3 s: due at T0 + 4 s
    at(world, 3_000)
    metric = world.acker.metrics.partitions_registry.get_sample_value
    assert metric("replaybroker_acker_tasks_in_outage", {"partition": "0"}) == 1
    assert metric("replaybroker_acker_outage_stopped_seconds_total", {"partition": "0"}) == 3.0
    at(world, 3_900)
    assert not world.outcomes() and not world.replays()
    at(world, 4_100)
    assert world.outcomes() == {X: "replay"}
    c = world.acker.counters()
    assert (c["outage_beats"], c["outage_stopped_ms"]) == (1, 3_000)


def test_a_deadline_before_the_outage_began_is_not_held_back(world: World) -> None:
    world.send(X, ROOT, max_attempts=3, timeout_ms=1_000)
    world.step(2)
    beat(world, T0 + 1_500, T0 + 4_500)
    at(world, 1_100)
    assert world.outcomes() == {X: "replay"}


def test_a_record_created_during_the_stop_times_out_a_timeout_after_it(world: World) -> None:
    beat(world, T0, T0 + 3_000)
    world.step(2)
    world.clock.advance(1_000)
    world.send(Y, ROOT, max_attempts=3, timeout_ms=1_000)  # created at T0 + 1 s: due at T0 + 4 s
    at(world, 3_900)
    assert not world.outcomes()
    at(world, 4_100)
    assert world.outcomes() == {Y: "replay"}


def test_a_takeover_keeps_the_stop_and_a_beat_read_again_adds_nothing_twice(world: World) -> None:
    world.send(X, ROOT, max_attempts=3, timeout_ms=1_000)
    world.step(2)
    beat(world, T0, T0 + 3_000)  # due at T0 + 4 s, logged with the stop in one transaction
    world.step(3)
    world.acker = world.new_acker()  # kill -9: the next owner restores both
    beat(world, T0, T0 + 3_000)  # the same beat again: nothing new
    beat(world, T0, T0 + 4_000)  # the next one: 1 s more, due at T0 + 5 s
    at(world, 4_900)
    assert not world.outcomes()
    at(world, 5_100)
    assert world.outcomes() == {X: "replay"}
    counters = [LedgerCounters.decode(m.value()).counters for m in world.cluster.records(NS.ledger)
                if m.key() == COUNTERS_KEY and m.value() is not None]
    assert outages_in(counters[-1], T0 + 3_500) == {"enrich": T0}


def test_a_beat_stops_the_clock_at_most_ten_seconds_past_its_timestamp(world: World) -> None:
    world.send(X, ROOT, max_attempts=3, timeout_ms=1_000)
    world.step(2)
    beat(world, T0, T0 + 3_600_000)  # an hour: a task's clock far ahead, or a forged beat
    world.step(2)  # read at T0 (no create timestamps here: the acker's clock when read)
    at(world, 10_900)
    assert not world.outcomes()
    at(world, 11_200)
    assert world.outcomes() == {X: "replay"}


def test_a_bad_beat_is_quarantined(world: World) -> None:
    world.cluster.append(NS.acks, 0, OUTAGE_BEAT_KEY, b"nonsense")
    world.step(2)
    assert world.acker.counters()["quarantined"] == 1


# ---------------------------------------------------------------- issue 57: where inputs meet


def test_the_stops_are_the_union_whatever_order_the_beats_arrive_in() -> None:
    """A's beat covers 10-13 s, then B's (its earlier beats late or lost) 5-14 s: the union is
    5-14 s, and what B adds is what A's left uncovered on both sides."""
    stops = ClockStops()
    assert stops.beat("a", 10_000, 13_000) == (10_000, [], [(10_000, 13_000)])
    assert stops.beat("b", 5_000, 14_000) == (5_000, [(10_000, 13_000)], [(5_000, 14_000)])
    assert stops.stops == [(5_000, 14_000)]
    stops.beat("c", 20_000, 22_000)
    stops.beat("d", 16_000, 18_000)  # before the last: kept in order
    assert stops.stops == [(5_000, 14_000), (16_000, 18_000), (20_000, 22_000)]


def test_a_deadline_moves_by_the_union_of_the_stops(world: World) -> None:
    world.send(X, ROOT, max_attempts=3, timeout_ms=12_000)  # due at T0 + 12 s
    world.step(2)
    at(world, 10_500)
    beat(world, T0 + 10_000, T0 + 13_000, task="a")  # X: 15 s
    world.step(2)
    beat(world, T0 + 5_000, T0 + 14_000, task="b")  # the union 5-14 s: X at 12 + 9 = 21 s
    world.step(2)
    at(world, 20_900)
    assert not world.outcomes()
    at(world, 21_100)
    assert world.outcomes() == {X: "replay"}


def test_a_touch_and_a_beat_read_in_one_poll_act_as_in_two(world: World) -> None:
    """A task in an outage touches what it holds, then beats: the touch moves X to 2 s, the
    stop from 0.5 s to 3.5 s then to 5 s - whether one poll reads both or not."""
    world.send(X, ROOT, max_attempts=3, timeout_ms=1_000)
    world.step(2)
    world.clock.advance(500)
    empty = np.array([], np.int64)
    touch = XorBatch(0, empty, empty, empty, touched=np.array([X]), touched_deadlines=np.array([T0 + 2_000]))
    world.cluster.append(NS.acks, 0, None, touch.encode())
    beat(world, T0 + 500, T0 + 3_500)
    world.step(3)  # one poll reads both
    at(world, 4_900)
    assert not world.outcomes()
    at(world, 5_100)
    assert world.outcomes() == {X: "replay"}


def test_a_beats_start_is_bounded_like_its_end(world: World) -> None:
    """A beat "since an hour ago" stops the clock from 10 s before its timestamp at most."""
    world.send(X, ROOT, max_attempts=3, timeout_ms=1_000)
    world.step(2)
    beat(world, T0 - 3_600_000, T0 + 3_000)  # read at T0: the stop is T0 - 10 s to T0 + 3 s
    world.step(2)
    at(world, 13_900)
    assert not world.outcomes()
    at(world, 14_100)
    assert world.outcomes() == {X: "replay"}
