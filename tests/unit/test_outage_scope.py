"""An outage holds the records behind its task, not the namespace's (docs/design.md §6,
*Outages*; broker.ledger.outages, issue #57): a beat names the source topics its task reads
(``rb-scope``), the acker holds the entries of those topics and the entries whose topic it
does not know, and lets the others' clocks run. The pure core (``ClockStops`` per scope,
``EntryTopics``, the header, the task's scope), the old beats and counters records, and the
real ``Acker`` on a stepped clock over the in-memory Kafka (the harness of test_acker_windows)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

import numpy as np
import pytest

from broker import ids
from broker.headers import H_SCOPE, scope_header, scope_of
from broker.ledger.outages import ANY, FLOOR_KEY, OTHER, ClockStops, EntryTopics
from broker.schemas import (
    COUNTERS_KEY,
    OUTAGE_BEAT_KEY,
    LedgerCounters,
    OutageBeat,
    PersistedRecord,
)
from broker.task.outage import beat_scope
from tests.unit.fixtures.codec_fixtures import FIXTURES
from tests.unit.test_acker_windows import NS, ROOT, T0, World, X

Y = X + 2


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    yield World(monkeypatch)


def send(world: World, srid: int, topic: str, timeout_ms: int = 1_000) -> None:
    record = PersistedRecord(
        srid=srid, origin=srid, attempt=1, root_xor=ROOT, record_id=ROOT, topic=topic, key_hash_partition=3,
        key=b"k", value=b"v", created_ms=world.clock.now_ms(), timeout_ms=timeout_ms, max_attempts=3,
    )
    world.cluster.append(NS.persist, 0, ids.encode_id(srid), record.encode())


def beat(world: World, since: int, until: int, scope: tuple[str, ...] | None, task: str = "enrich") -> None:
    headers = None if scope is None else [scope_header(scope)]
    world.cluster.append(NS.acks, 0, OUTAGE_BEAT_KEY, OutageBeat(task, since, until).encode(), headers)


def fates(world: World) -> dict[int, str]:
    """The outcomes of X and Y (not of their replays)."""
    return {s: o for s, o in world.outcomes().items() if s in (X, Y)}


def at(world: World, ms: int) -> None:
    world.clock.advance(T0 + ms - world.clock.now_ms())
    world.step(3)


# ---------------------------------------------------------------- the pure core


def test_a_scoped_beat_stops_the_clock_of_its_topics_and_of_the_unknown_only() -> None:
    stops = ClockStops()
    changes = stops.cover("a", 10_000, 13_000, scope=frozenset({"orders"}))
    assert changes == {ANY: (10_000, [], [(10_000, 13_000)]), "orders": (10_000, [], [(10_000, 13_000)])}
    assert stops.stops == [] and stops.scoped == {"orders": [(10_000, 13_000)]}
    assert (stops.union("orders"), stops.union(OTHER), stops.union(ANY)) == ([(10_000, 13_000)], [], [(10_000, 13_000)])
    assert [stops.holder(t) for t in ("orders", "payments", None)] == ["orders", OTHER, ANY]
    created, due = np.array([9_000, 9_000, 9_000]), np.array([12_000, 12_000, 12_000])
    assert stops.held_back(created, due, ["orders", "payments", None]).tolist() == [3_000, 0, 3_000]
    assert stops.held_back(created, due).tolist() == [3_000] * 3  # topics not known: every stop


def test_each_class_moves_by_the_union_of_the_scopes_that_cover_it() -> None:
    """Task A (scoped to orders) covers 10-13 s, then task B (no scope: a later hop) 5-14 s:
    orders and the unknown held 5-14 s, B adding what A left uncovered; the other topics 5-14 s,
    all of it B's."""
    stops = ClockStops()
    stops.cover("a", 10_000, 13_000, scope=frozenset({"orders"}))
    changes = stops.cover("b", 5_000, 14_000)
    assert changes == {
        ANY: (5_000, [(10_000, 13_000)], [(5_000, 14_000)]),
        "orders": (5_000, [(10_000, 13_000)], [(5_000, 14_000)]),
        OTHER: (5_000, [], [(5_000, 14_000)]),
    }
    # A scoped beat of another topic: only its class and the unknown; covered already for both.
    assert stops.cover("c", 6_000, 9_000, scope=frozenset({"payments"})) == {}
    assert stops.cover("c", 6_000, 15_000, scope=frozenset({"payments"})) == {
        ANY: (14_000, [], [(14_000, 15_000)]), "payments": (14_000, [], [(14_000, 15_000)])}
    assert stops.union("orders") == [(5_000, 14_000)] and stops.union("payments") == [(5_000, 15_000)]


def test_the_scoped_stops_travel_in_the_counters_record_and_an_old_record_reads_as_unscoped() -> None:
    stops = ClockStops()
    stops.cover("enrich", 10_000, 13_000, scope=frozenset({"orders", "pay.ments-2"}))
    stops.cover("score", 20_000, 21_000)
    record = LedgerCounters.decode(LedgerCounters({"completed": 2, **stops.as_counters()}, 1).encode())
    back, rest = ClockStops.from_counters(record.counters)
    assert rest == {"completed": 2}
    assert (back.stops, back.scoped, back.tasks) == (stops.stops, stops.scoped, stops.tasks)
    # A record written before the scopes: its stops are for every entry, as they were.
    old = {"completed": 1, "outage.stop:10000": 13_000, FLOOR_KEY: 5_000,
           "outage.since_ms:enrich": 10_000, "outage.until_ms:enrich": 13_000}
    back, rest = ClockStops.from_counters(old)
    assert (back.stops, back.scoped, back.floor_ms, back.tasks, rest) == (
        [(10_000, 13_000)], {}, 5_000, {"enrich": (10_000, 13_000)}, {"completed": 1})
    assert back.union("orders") == back.union(ANY) == [(10_000, 13_000)]


def _from_counters_before_scopes(counters: Mapping[str, int]) -> tuple[list[tuple[int, int]], dict[str, int]]:
    """``ClockStops.from_counters`` of 42223ea (before the scopes), its stops and the rest: how an
    older acker reads a counters record this one writes."""
    rest = {k: v for k, v in counters.items() if not k.startswith("outage.")}
    stops = sorted((int(k[len("outage.stop:"):]), v) for k, v in counters.items() if k.startswith("outage.stop:"))
    return stops, rest


def test_an_older_acker_reads_a_record_with_scoped_stops_without_them() -> None:
    stops = ClockStops()
    stops.cover("enrich", 10_000, 13_000, scope=frozenset({"orders"}))
    stops.cover("score", 20_000, 21_000)
    assert _from_counters_before_scopes({"completed": 2, **stops.as_counters()}) == ([(20_000, 21_000)], {"completed": 2})


def test_an_old_beat_holds_every_entry_and_a_new_one_reads_the_same_to_an_old_acker() -> None:
    old = next(c for c in json.loads(FIXTURES.read_text())["fixtures"] if c["name"] == "outage_beat")
    value = bytes.fromhex(old["hex"])
    assert scope_of(None) is None and scope_of([("rb-t", b"x")]) is None  # no rb-scope: every entry
    # The scope is a header: a scoped beat's value is the old layout, which an older acker
    # (that ignores the header) reads as a beat for every entry - holding more, never less.
    assert OutageBeat("task-é", 1_700_000_000_000, 1_700_000_005_000).encode() == value
    assert scope_header(("orders", "audit", "orders")) == (H_SCOPE, b"audit,orders")
    assert scope_of([scope_header(("orders", "audit"))]) == frozenset({"orders", "audit"})
    for bad in (b"", b"orders,", b"a b", b",".join([b"t%d" % i for i in range(65)])):
        with pytest.raises(ValueError, match="rb-scope"):
            scope_of([(H_SCOPE, bad)])


def test_a_task_names_the_source_topics_it_reads_and_none_at_a_later_hop() -> None:
    assert beat_scope(["orders", "orders.replay"]) == ("orders",)
    assert beat_scope(["orders.replay"]) == ("orders",)  # replays of orders' records
    assert beat_scope(["b", "b.replay", "a", "a.replay"]) == ("a", "b")
    assert beat_scope(["enriched"]) is None  # a later hop: behind it, records of any source topic
    assert beat_scope(["orders", "orders.replay", "enriched"]) is None


def test_entry_topics_are_runs_of_persist_offsets() -> None:
    topics = EntryTopics()
    a, b = topics.id_of("a"), topics.id_of("b")
    assert topics.lookup(np.array([0, 5])).tolist() == [-1, -1]
    topics.note(np.array([10, 11, 13, 14]), np.array([a, a, b, b], np.int32))
    topics.note(np.array([15, 16]), np.array([b, a], np.int32))
    topics.note(np.array([12]), np.array([b], np.int32))  # read again (a rewind): known already
    assert topics.lookup(np.array([9, 10, 12, 13, 15, 16, 99])).tolist() == [-1, a, a, b, b, a, a]
    assert len(topics) == 3
    # A read of some records only (a restore's): the offsets between them are not known.
    topics.note(np.array([20, 22]), np.array([b, b], np.int32), gaps=True)
    assert topics.lookup(np.array([17, 20, 21, 22, 23])).tolist() == [a, b, -1, b, -1]
    topics.drop_below(14)
    assert topics.lookup(np.array([10, 14, 16])).tolist() == [-1, b, a]
    held = topics.holds(OTHER, {"b": []})
    assert held(np.array([14, 16, 21])).tolist() == [False, True, False]
    assert topics.holds(ANY, {})(np.array([14, 21])).tolist() == [False, True]
    assert topics.holds("c", {})(np.array([14, 16, 21])).tolist() == [False, False, False]


# ---------------------------------------------------------------- the acker


def test_a_scoped_beat_holds_its_topics_records_and_lets_the_others_time_out(world: World) -> None:
    send(world, X, "orders")
    send(world, Y, "payments")  # another pipeline's, dropped: due at T0 + 1 s as ever
    world.step(2)
    beat(world, T0, T0 + 3_000, ("orders",))
    at(world, 1_200)
    assert fates(world) == {Y: "replay"}
    at(world, 3_900)
    assert fates(world) == {Y: "replay"}
    at(world, 4_200)
    assert fates(world) == {X: "replay", Y: "replay"}
    c = world.acker.counters()
    assert (c["outage_beats"], c["outage_scoped_beats"], c["outage_held"], c["outage_stopped_ms"]) == (1, 1, 1, 3_000)


def test_a_beat_without_a_scope_holds_every_record_as_before(world: World) -> None:
    send(world, X, "orders")
    send(world, Y, "payments")
    world.step(2)
    beat(world, T0, T0 + 3_000, None)
    at(world, 3_900)
    assert not fates(world)
    at(world, 4_200)
    assert fates(world) == {X: "replay", Y: "replay"}
    assert world.acker.counters()["outage_held"] == 2


def test_a_record_created_in_a_scoped_stop_of_another_topic_is_not_held_back(world: World) -> None:
    beat(world, T0, T0 + 3_000, ("orders",))
    world.step(2)
    world.clock.advance(1_000)
    send(world, X, "orders")  # created in the stop: due a timeout after its end, T0 + 4 s
    send(world, Y, "payments")  # due at T0 + 2 s
    at(world, 2_200)
    assert fates(world) == {Y: "replay"}
    at(world, 4_200)
    assert fates(world) == {X: "replay", Y: "replay"}


def test_an_entry_a_new_owner_restored_is_of_an_unknown_topic_and_held_by_every_beat(world: World) -> None:
    send(world, Y, "payments", timeout_ms=2_000)
    world.step(2)
    beat(world, T0, T0 + 1_000, None)  # moves its deadline to T0 + 3 s: logged
    world.step(3)
    world.acker = world.new_acker()  # kill -9: Y comes back from the changelog, its topic unknown
    beat(world, T0 + 1_000, T0 + 4_000, ("orders",))
    at(world, 5_900)
    assert not fates(world)
    at(world, 6_200)
    assert fates(world) == {Y: "replay"}


def test_a_bad_scope_is_quarantined(world: World) -> None:
    world.cluster.append(NS.acks, 0, OUTAGE_BEAT_KEY, OutageBeat("t", T0, T0 + 1_000).encode(), [(H_SCOPE, b"a b")])
    world.step(2)
    assert world.acker.counters()["quarantined"] == 1
    counters = [LedgerCounters.decode(m.value()).counters for m in world.cluster.records(NS.ledger)
                if m.key() == COUNTERS_KEY and m.value() is not None]
    assert not any(k.startswith("outage.") for k in counters[-1])
