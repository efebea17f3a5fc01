"""The changelog holds what ``ns.persist`` does not (docs/design.md §5): an entry whose
persist record is all of it is left out of ``ns.ledger``, and every restore - a takeover by a
new instance, a rewind after an aborted commit - registers it again from ``ns.persist``, read
from the restore floor of the counters record to the end of the log.

The real ``Acker`` on the in-memory Kafka of tests/unit/log_cluster.py, on a stepped clock.
Ground truth is what was written to the logs: persist tombstones and their outcomes, replays
(new attempts' persist records), changelog records - never the acker's beliefs. A floor one
offset too high (a wrong ``restore_floor``) must make the restore scenarios fail.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import broker.acker.commit
import broker.acker.service
from broker import ids
from broker.acker import Acker, AckerConfig
from broker.headers import AUTO_TIMEOUT_MS, outcome_of
from broker.ledger.clock import ManualClock
from broker.schemas import COUNTERS_KEY, LedgerCounters, PersistedRecord, XorBatch
from broker.settings import KafkaSettings
from broker.topics import Namespace
from tests.unit.fakes import WHOLE_RESTORE
from tests.unit.log_cluster import Cluster

NS = Namespace("unlogged")
T0 = 1_700_000_000_000
TIMEOUT_MS = 1_000
_NONE = np.array([], np.int64)


class World:
    """One ledger partition, the records a source sent to it, the acks tasks wrote, and the
    acker serving it (replaced by a new instance on a takeover)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, **config: Any) -> None:
        self.cluster = Cluster(partitions=1, max_batch=100)
        self.clock = ManualClock(T0)
        self.config = AckerConfig(**{
            "commit_interval_ms": 0, "instance_id": "unit", "stats_interval_ms": 10**12, "fail_hold_ms": 0,
            "orphan_ttl_ms": 60_000, **WHOLE_RESTORE, **config,
        })
        self.acker = self.new_acker()
        self.roots: dict[int, int] = {}
        self._seq = itertools.count(1)

    def new_acker(self) -> Acker:
        self.cluster.kill()  # the instance before, if any, is gone (kill -9)
        return Acker(KafkaSettings("unit:9092"), NS, self.config, clock=self.clock, kafka=self.cluster)

    def send(self, n: int, timeout_ms: int = TIMEOUT_MS) -> list[int]:
        """``n`` source records with ``timeout_ms`` (``AUTO_TIMEOUT_MS``: adaptive)."""
        srids = []
        for _ in range(n):
            k = next(self._seq)
            srid, root = 1000 + k, 5000 + k
            record = PersistedRecord(
                srid=srid, origin=srid, attempt=1, root_xor=root, record_id=root, topic="orders",
                key_hash_partition=0, key=b"k%d" % k, value=b"v%d" % k, created_ms=self.clock.now_ms(),
                timeout_ms=timeout_ms, max_attempts=3,
            )
            self.cluster.append(NS.persist, 0, ids.encode_id(srid), record.encode())
            self.roots[srid] = root
            srids.append(srid)
        return srids

    def ack(self, srids: list[int]) -> None:
        """The trees of ``srids`` complete."""
        self.event(srids, [self.roots[s] for s in srids])

    def event(self, srids: list[int], xors: list[int]) -> None:
        batch = XorBatch(0, np.array(srids, np.int64), np.array(xors, np.int64), _NONE)
        self.cluster.append(NS.acks, 0, None, batch.encode())

    def run(self, polls: int = 3) -> None:
        count = itertools.count(1)
        self.acker.run(until=lambda _: next(count) >= polls)  # n polls (each commits), then a commit

    def drain(self) -> None:
        """Everything read and every deadline far past: each record has its fate."""
        for _ in range(3):
            self.clock.advance(10 * TIMEOUT_MS)
            self.run(4)

    # -- what the logs hold

    def outcomes(self) -> dict[int, list[str]]:
        """srid -> the outcomes of its persist tombstones, in log order."""
        out: dict[int, list[str]] = defaultdict(list)
        for msg in self.cluster.logs[(NS.persist, 0)]:
            if msg is not None and msg.value() is None:
                out[ids.decode_id(msg.key() or b"")].append(outcome_of(msg.headers()).decode())
        return dict(out)

    def replays(self) -> dict[int, int]:
        """srid -> how many new attempts were persisted for it."""
        out: dict[int, int] = defaultdict(int)
        for msg in self.cluster.logs[(NS.persist, 0)]:
            value = msg.value()
            if value is not None:
                record = PersistedRecord.decode(value)
                if record.history:
                    out[record.history[-1].srid] += 1
        return dict(out)

    def entry_records(self, srids: list[int]) -> list[tuple[int, bool]]:
        """The changelog records of ``srids``: (srid, is a tombstone), in log order."""
        keys = {ids.encode_id(s): s for s in srids}
        return [(keys[m.key()], m.value() is None) for m in self.cluster.logs[(NS.ledger, 0)] if m.key() in keys]

    def floors(self) -> list[int | None]:
        return [LedgerCounters.decode(m.value()).restore_floor
                for m in self.cluster.logs[(NS.ledger, 0)] if m.key() == COUNTERS_KEY]


def fates(world: World, done: list[int], timed_out: list[int]) -> list[str]:
    """Where the logs differ from: each of ``done`` completed once and never replayed, each of
    ``timed_out`` replayed once (its attempt tombstoned ``replay`` once)."""
    outcomes, replays = world.outcomes(), world.replays()
    problems = [f"{s}: {outcomes.get(s)} {replays.get(s, 0)} replays" for s in done
                if outcomes.get(s) != ["completed"] or replays.get(s, 0)]
    problems += [f"{s}: {outcomes.get(s)} {replays.get(s, 0)} replays" for s in timed_out
                 if outcomes.get(s) != ["replay"] or replays.get(s, 0) != 1]
    return problems


# --------------------------------------------------------------------------- scenarios

def takeover_after_a_commit(world: World) -> list[str]:
    """Four entries with no event yet are committed; the acker is killed; the new owner gets
    the acks of two and the clock of the other two."""
    srids = world.send(4)
    world.run()
    assert world.entry_records(srids) == []  # left out of the changelog
    world.acker = world.new_acker()  # kill -9: a new instance takes over
    world.ack(srids[:2])
    world.run()
    world.drain()
    return fates(world, done=srids[:2], timed_out=srids[2:])


def takeover_after_completions_past_the_committed_offset(world: World) -> list[str]:
    """Two of four unlogged entries complete (persist tombstones, written after the persist
    offset the transaction commits) and the acker is killed at once: the new owner must read
    ``ns.persist`` to its end, not to the committed offset, to know they left."""
    srids = world.send(4)
    world.run()
    world.ack(srids[1:3])
    world.run(1)  # one poll: the completions are committed, their tombstones not read back
    assert world.outcomes() == {srids[1]: ["completed"], srids[2]: ["completed"]}
    assert world.entry_records(srids) == []
    world.acker = world.new_acker()
    world.drain()
    return fates(world, done=srids[1:3], timed_out=[srids[0], srids[3]])


def rewind_after_an_aborted_commit(world: World) -> list[str]:
    """The commit folding an ack is aborted: the acker rewinds to its changelog, which holds
    none of the entries, and to the committed offsets."""
    srids = world.send(4)
    world.run()
    world.ack(srids[:1])
    world.cluster.fail_commits = 1
    world.run(4)
    world.drain()
    return fates(world, done=srids[:1], timed_out=srids[1:])


SCENARIOS: list[Callable[[World], list[str]]] = [
    takeover_after_a_commit, takeover_after_completions_past_the_committed_offset, rewind_after_an_aborted_commit,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_a_restore_gets_the_unlogged_entries_back_from_persist(
    monkeypatch: pytest.MonkeyPatch, scenario: Callable[[World], list[str]]
) -> None:
    assert scenario(World(monkeypatch)) == []


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_a_floor_one_offset_too_high_loses_entries(
    monkeypatch: pytest.MonkeyPatch, scenario: Callable[[World], list[str]]
) -> None:
    """The scenarios can fail: with the floor one past the oldest unlogged entry, that
    entry is never registered again."""
    right = broker.acker.commit.restore_floor
    monkeypatch.setattr(broker.acker.commit, "restore_floor", lambda st, position: right(st, position) + 1)
    assert scenario(World(monkeypatch)) != []


# --------------------------------------------------------------------------- the saving

def test_entries_registered_and_completed_in_the_next_interval_never_touch_the_changelog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(monkeypatch)
    srids = world.send(4)
    world.run()
    world.ack(srids)
    world.run()
    assert world.outcomes() == {s: ["completed"] for s in srids}
    assert world.entry_records(srids) == []  # no upsert, no tombstone: counters only
    assert world.floors()[-1] == world.cluster.high(NS.persist, 0) - 4  # nothing left out: the committed offset


def test_an_entry_changed_or_left_out_too_long_is_logged_and_the_floor_moves_past_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(monkeypatch, unlogged_ms=TIMEOUT_MS // 2)  # logged before they time out
    changed, quiet, young = world.send(3)
    child = 77
    world.event([changed], [world.roots[changed] ^ child])  # its persist record is not all of it now
    world.run(1)
    assert world.entry_records([changed, quiet, young]) == [(changed, False)]
    assert world.floors()[-1] == 1  # the quiet one's offset
    world.event([changed], [child])  # the tree completes
    world.clock.advance(world.config.unlogged_ms - 1)
    world.run(10)
    assert world.entry_records([changed, quiet, young]) == [(changed, False), (changed, True)]
    world.clock.advance(1)
    world.run(1)  # registered unlogged_ms ago: logged now, and the floor moves on
    assert world.entry_records([quiet, young]) == [(quiet, False), (young, False)]
    assert world.floors()[-1] == world.cluster.high(NS.persist, 0)  # none left out: the committed offset
    world.ack([quiet, young])
    world.run()
    assert world.entry_records([quiet, young])[2:] == [(quiet, True), (young, True)]


# --------------------------------------------------------------------------- the rule's edges

ADAPTIVE = {"adaptive_initial_ms": 60_000, "adaptive_floor_ms": 1_000, "adaptive_min_samples": 100}


def learn_the_floor(world: World) -> None:
    """100 quick completions: the estimate of ``orders`` falls to its 1 s floor."""
    quick = world.send(100, AUTO_TIMEOUT_MS)
    world.run(1)
    world.clock.advance(10)
    world.ack(quick)
    world.run(1)
    assert world.acker.adaptive.timeout_ms(0, world.clock.now_ms()) == 1_000


def test_a_rewind_gives_an_adaptive_entry_back_the_deadline_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """An auto entry's deadline is the acker's, not its persist record's: the persist record
    is not all of it, so a rewind must not give it a new (shorter) one from the estimate."""
    world = World(monkeypatch, **ADAPTIVE)
    (x,) = world.send(1, AUTO_TIMEOUT_MS)
    world.run(1)  # X registered while the estimate is cold: T0 + 60 s
    learn_the_floor(world)
    (y,) = world.send(1)
    world.ack([y])
    world.cluster.fail_commits = 1  # the commit of Y's completion fails: the partition is rewound
    world.run(2)
    world.clock.advance(2_100)
    world.run()
    assert world.outcomes().get(x) is None  # not replayed 2.1 s after registration: its deadline is T0 + 60 s
    world.clock.advance(60_000 - 2_100 - 10)
    world.run()
    assert world.outcomes().get(x) == ["replay"]


def test_a_takeover_by_an_acker_with_a_warm_estimate_keeps_an_adaptive_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch, **ADAPTIVE)
    (x,) = world.send(1, AUTO_TIMEOUT_MS)
    world.run(1)  # X: T0 + 60 s, from the cold estimate
    world.acker = world.new_acker()  # kill -9; the new owner learned a 10 ms latency elsewhere
    tid = world.acker.adaptive.topic_id(b"orders")
    world.acker.adaptive.observe(np.full(100, tid, np.int32), np.full(100, 10), world.clock.now_ms())
    assert world.acker.adaptive.timeout_ms(tid, world.clock.now_ms()) == 1_000
    world.run(1)
    world.clock.advance(2_100)
    world.run()
    assert world.outcomes().get(x) is None
    world.clock.advance(60_000)
    world.run()
    assert world.outcomes().get(x) == ["replay"]


def test_early_commits_do_not_keep_an_entry_out_of_the_changelog_for_ever(monkeypatch: pytest.MonkeyPatch) -> None:
    """Completions trickle in, one every 60 ms, so every commit is early (``Acker._commit_due``
    on the acker's clock); a slow tree X is still logged within its bound, so the restore floor
    moves past it and deleting the first records of ``ns.persist`` loses nothing."""
    world = World(monkeypatch, commit_interval_ms=100)
    world.acker = world.new_acker()
    clock = SimpleNamespace(monotonic=lambda: world.clock.now_ms() / 1000, perf_counter=time.perf_counter)
    monkeypatch.setattr(broker.acker.service, "time", clock)
    (x,) = world.send(1, timeout_ms=60_000)
    world.run(1)
    commits = world.acker.commits
    for _ in range(100):  # 6 s
        world.clock.advance(60)
        quick = world.send(1)
        world.ack(quick)
        world.acker.step()  # reads them: 60 ms since the last commit, no interval commit
        world.acker.step()  # waits for input with a completion waiting: an early commit
    assert world.acker.commits - commits == 100
    world.cluster.delete_records(NS.persist, 0, 50)  # a retention policy on ns.persist
    world.acker = world.new_acker()  # kill -9: a new owner restores the partition
    world.run(1)
    world.ack([x])
    world.run()
    world.drain()
    assert world.outcomes().get(x) == ["completed"]


@pytest.mark.parametrize("restore", ["rewind", "takeover"])
def test_a_restore_logs_the_entries_it_reads_back_in_its_first_commit(monkeypatch: pytest.MonkeyPatch, restore: str) -> None:
    """How long an entry has been left out of the changelog is known only to the state that
    left it out: the restored one logs the entries it reads back from ``ns.persist`` at once,
    well before ``unlogged_ms`` of its own clock, so a record committed past and deleted after
    the bound is never lost, however many commits failed in between (§6, *Durable*)."""
    world = World(monkeypatch)
    srids = world.send(3)
    world.run()
    assert world.entry_records(srids) == []
    world.ack(srids[:1])
    if restore == "rewind":
        world.cluster.fail_commits = 1  # the commit of the completion fails: the partition is rewound
    else:
        world.acker = world.new_acker()  # kill -9: a new owner restores the partition
    world.run()
    assert world.outcomes() == {srids[0]: ["completed"]}
    assert world.entry_records(srids[1:]) == [(s, False) for s in srids[1:]]
    assert world.floors()[-1] == len(srids)  # none left out: the committed offset
