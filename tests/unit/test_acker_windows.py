"""The windows of the fate rule at their edges (docs/design.md §6): the real ``Acker`` on a
stepped clock over the in-memory Kafka of tests/unit/log_cluster.py, which hands the acker's
own outputs (its replays' persist records, its superseded marks) back to it as input and
lets a new instance take over from the changelog and the committed offsets.

Ground truth is what the acker wrote to the logs: persist tombstones with their
``rb-outcome``, ``ns.dlq`` records, ``ns.superseded`` markers - never its counters.

1. A dead letter at the edge of a window: X (max 2 attempts) times out and is replayed as Z,
   X is watched; Z fails explicitly and its dead letter is held to the end of X's watch. X's
   tree completes just before that end, and the acker reads the completion only after it (one
   slow poll, or a backlog on ``ns.acks``). The completion wins: Z is settled as completed, in
   the same commit as its marker, and nothing is dead-lettered.
2. A takeover continues a held window: a last attempt times out and its dead letter is held
   for ``watch_ms``; a new instance takes over meanwhile. The dead letter comes at the end of
   the window the first owner opened, not one window later.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest

from broker import ids
from broker.acker import Acker, AckerConfig
from broker.headers import outcome_of
from broker.ledger.clock import ManualClock
from broker.schemas import PersistedRecord, XorBatch
from broker.settings import KafkaSettings
from broker.topics import Namespace
from tests.unit.fakes import WHOLE_RESTORE
from tests.unit.log_cluster import Cluster

NS = Namespace("windows")
T0 = 1_700_000_000_000
WATCH_MS = 20_000
X, ROOT, CHILD = 0x1F3A_5C7E_9B2D_4E62, 0x3243_F6A8_885A_308D, 0x1319_8A2E_0370_7344
_NONE = np.array([], np.int64)


class World:
    """One ledger partition (P=1: every srid, the replays' too, lives in it), a stepped clock,
    and the acker instance that owns the partition now."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.cluster = Cluster(partitions=1)
        self.clock = ManualClock(T0)
        self.config = AckerConfig(
            commit_interval_ms=0, instance_id="windows", stats_interval_ms=10**12, orphan_ttl_ms=60_000,
            watch_ms=WATCH_MS, fail_hold_ms=0, **WHOLE_RESTORE,
        )
        self.acker = self.new_acker()

    def new_acker(self) -> Acker:
        """kill -9 and a new instance: it restores from the changelog and the committed offsets."""
        self.cluster.kill()
        return Acker(KafkaSettings("windows:9092"), NS, self.config, clock=self.clock, kafka=self.cluster)

    def step(self, n: int = 1) -> None:
        count = itertools.count(1)
        self.acker.run(until=lambda _: next(count) >= n)

    def send(self, srid: int, root: int, *, max_attempts: int, timeout_ms: int = 1_000) -> None:
        record = PersistedRecord(
            srid=srid, origin=srid, attempt=1, root_xor=root, record_id=root, topic="orders",
            key_hash_partition=3, key=b"customer-7", value=b"order 1", created_ms=self.clock.now_ms(),
            timeout_ms=timeout_ms, max_attempts=max_attempts,
        )
        self.cluster.append(NS.persist, 0, ids.encode_id(srid), record.encode())

    def ack(self, srid: int, xor: int) -> None:
        self.cluster.append(NS.acks, 0, None, XorBatch(0, np.array([srid]), np.array([xor]), _NONE).encode())

    def fail(self, srid: int) -> None:
        self.cluster.append(NS.acks, 0, None, XorBatch(0, _NONE, _NONE, np.array([srid])).encode())

    def replays(self) -> list[PersistedRecord]:
        return [PersistedRecord.decode(m.value()) for m in self.cluster.records(NS.persist)
                if m.value() is not None and PersistedRecord.decode(m.value()).attempt > 1]

    def outcomes(self) -> dict[int, str]:
        """srid -> the outcome of its persist tombstone."""
        return {ids.decode_id(m.key() or b""): outcome_of(m.headers()).decode()
                for m in self.cluster.records(NS.persist) if m.value() is None}

    def dead_letters(self) -> list[int]:
        """The origins of the records in ``ns.dlq``."""
        return [ids.decode_id(dict(m.headers() or ()).get("rb-origin") or b"") for m in self.cluster.records(NS.dlq)]

    def markers(self) -> dict[int, int]:
        """replay srid -> original srid, from ``ns.superseded``."""
        return {ids.decode_id(m.key() or b""): ids.decode_id(m.value() or b"")
                for m in self.cluster.records(NS.superseded)}


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    yield World(monkeypatch)


@pytest.mark.parametrize("backlog", [0, 10], ids=["slow-poll", "acks-backlog"])
@pytest.mark.parametrize("lead_ms", [50, 2_000])
def test_a_completion_read_after_the_window_ends_wins_over_the_held_dead_letter(
    world: World, lead_ms: int, backlog: int
) -> None:
    world.send(X, ROOT, max_attempts=2)
    world.ack(X, ROOT ^ CHILD)  # the task worked on the root and emitted CHILD: not acked yet
    world.step(2)
    world.clock.advance(1_200)
    world.step(2)  # X timed out: replayed as Z, X watched until at_ms + watch_ms
    (z,) = world.replays()
    assert world.outcomes() == {X: "replay"}
    watch_end = z.history[-1].at_ms + WATCH_MS

    world.step(2)  # Z's persist record read
    world.fail(z.srid)  # the last attempt fails: its dead letter is held to X's watch end
    world.step(2)
    assert world.outcomes() == {X: "replay"} and not world.dead_letters()

    world.clock.advance(watch_end - lead_ms - world.clock.now_ms())
    for other in range(backlog):  # events of other trees, written before X's completion
        world.ack(2 * 10**6 + other, 7)
    world.ack(X, CHILD)  # X's tree completes inside its window
    world.clock.advance(lead_ms + 150)  # ... and the acker reads it only after the window's end
    world.step(backlog // world.cluster.max_batch + 3)

    assert world.markers() == {z.srid: X}
    assert not world.dead_letters(), "Z dead-lettered though X completed inside its window"
    assert world.outcomes() == {X: "replay", z.srid: "completed"}

    world.clock.advance(3 * WATCH_MS)  # nothing else happens, ever
    world.step(3)
    assert not world.dead_letters() and world.outcomes() == {X: "replay", z.srid: "completed"}
def test_a_takeover_continues_a_held_window_instead_of_restarting_it(world: World) -> None:
    s = 0x2B7E_1516_28AE_D2A8
    world.send(s, ROOT, max_attempts=1)
    world.step(2)
    world.clock.advance(1_200)
    world.step(2)  # timed out, the last attempt: its dead letter is held for watch_ms
    timed_out_ms = world.clock.now_ms()
    assert not world.outcomes() and not world.dead_letters()

    world.clock.advance(5_000)
    world.acker = world.new_acker()  # the first owner is gone; the next one restores
    world.step(3)
    assert not world.outcomes() and not world.dead_letters()

    window_end = timed_out_ms + WATCH_MS
    world.clock.advance(window_end - 500 - world.clock.now_ms())
    world.step(3)
    assert not world.dead_letters(), "dead-lettered before its window ended"
    world.clock.advance(1_000)  # past the window's end (and its tick)
    world.step(3)
    assert world.dead_letters() == [s], "the new owner restarted the window"
    assert world.outcomes() == {s: "dlq"}


def test_a_failed_last_attempt_read_after_the_window_ends_waits_for_what_was_written_before(world: World) -> None:
    """The same chain, but Z's fail mark too is read only after X's window has ended, and
    X's completion (written inside the window) lies behind a backlog after it. The window's
    end counts at the read-up-to tick, not the clock's: Z is held until the acker has read
    that far, and X's completion settles it."""
    world.send(X, ROOT, max_attempts=2)
    world.ack(X, ROOT ^ CHILD)
    world.step(2)
    world.clock.advance(1_200)
    world.step(2)
    (z,) = world.replays()
    watch_end = z.history[-1].at_ms + WATCH_MS
    world.step(2)  # Z's persist record read

    world.clock.advance(watch_end - 3_000 - world.clock.now_ms())
    world.fail(z.srid)  # the last attempt fails inside the window ...
    for other in range(10):
        world.ack(2 * 10**6 + other, 7)
    world.clock.advance(2_950)
    world.ack(X, CHILD)  # ... X's tree completes 50 ms before its end ...
    world.clock.advance(200)  # ... and the acker reads all of it after the end, a few at a time
    world.step(10 // world.cluster.max_batch + 3)

    assert not world.dead_letters(), "Z dead-lettered before the acker had read up to the window's end"
    assert world.markers() == {z.srid: X}
    assert world.outcomes() == {X: "replay", z.srid: "completed"}
