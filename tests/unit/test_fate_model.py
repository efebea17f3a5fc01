"""The fate rule against its model (docs/design.md §6): hypothesis drives the real ``Acker`` -
table, decisions, lag gate, changelog, transactions - on a stepped clock over an in-memory
Kafka (tests/unit/log_cluster.py), and ``FateModel`` beside it, through random
interleavings: records sent with 1-3 attempts, trees completed in time, late or too late,
fail marks, drops, clock steps, backlogs on any input partition, failed commits (abort and
rewind), and takeovers by a new instance from the changelog and the committed offsets.

Ground truth is what the acker committed to the logs (tombstones and their outcomes, replays)
and what the world wrote; never the acker's own counters. After every step no tombstone may
break the rule; after draining (the clock far past every window, the backlog read) every
record has the fate the model gives it: nothing lost, nothing completed twice, nothing
dead-lettered while an attempt could still complete.

``REPLAYBROKER_MODEL_EXAMPLES`` sets the number of examples (CI: the default below).
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker import ids
from broker.acker import Acker, AckerConfig
from broker.headers import outcome_of
from broker.ledger.clock import ManualClock
from broker.ledger.reference import FateModel, ModelAttempt
from broker.schemas import PersistedRecord, XorBatch
from broker.settings import KafkaSettings
from broker.topics import Namespace
from tests.unit.log_cluster import Cluster

NS = Namespace("model")
T0 = 1_700_000_000_000
WATCH_MS = 20_000
# What a task does with an attempt: complete its tree in time, fail it, drop it, or complete
# it late - at once after the deadline, inside the window whatever the acker's lag (< W/2),
# or past it.
DELAYS = {"late_now": 0, "late_quarter": WATCH_MS // 4, "late_edge": WATCH_MS // 2 - 100, "late_past": 2 * WATCH_MS}
MOVES = ("ack", "fail", "drop", "touch", *DELAYS)
_NONE = np.array([], np.int64)


class FateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.monkeypatch = pytest.MonkeyPatch()
        # Ids from a seeded generator: the same rules give the same run (hypothesis replays
        # and shrinks runs), the replays' srids included.
        rng = random.Random(7)
        self.monkeypatch.setattr(ids, "new_id", lambda: rng.getrandbits(63) or 1)
        self.clock = ManualClock(T0)
        self.cluster = Cluster()
        self.cluster.install(self.monkeypatch)
        self.model = FateModel(WATCH_MS)
        self.config = AckerConfig()
        self.acker: Acker | None = None
        self.scanned: dict[int, int] = {}  # ledger partition -> persist records looked at
        self.roots: dict[int, int] = {}  # srid -> the record id its tree completes with
        self.scripts: dict[int, tuple[str, str, str]] = {}  # origin -> the move of each attempt
        self.planned: list[tuple[int, int, str]] = []  # (ms, srid, ack / fail / touch): the tasks' doings
        self.created: dict[int, int] = {}  # srid -> created_ms
        self.bad: dict[tuple[int, int], int] = {}  # (ledger partition, offset) -> srid of a bad value
        self.sent = 0

    # ------------------------------------------------------------------ set-up

    @initialize(
        cache=st.sampled_from([0, 20_000]),
        fetches=st.sampled_from([1, 2, 2_000]),
        fail_hold_ms=st.sampled_from([0, 150]),
        # How long an entry with nothing but its persist record stays out of the changelog:
        # logged at once, the default, or never for its age (every restore reads ns.persist).
        unlogged_ms=st.sampled_from([0, 1_000, 10**9]),
    )
    def start(self, cache: int, fetches: int, fail_hold_ms: int, unlogged_ms: int) -> None:
        self.config = AckerConfig(
            commit_interval_ms=0, instance_id="model", stats_interval_ms=10**12, orphan_ttl_ms=60_000,
            watch_ms=WATCH_MS, fail_hold_ms=fail_hold_ms, replay_cache_entries=cache,
            max_fetches_per_commit=fetches, payload_retry_ms=200, payload_retry_max_ms=1_000,
            unlogged_ms=unlogged_ms,
        )
        self.acker = self._new_acker()

    def _new_acker(self) -> Acker:
        return Acker(KafkaSettings("model:9092"), NS, self.config, clock=self.clock)

    def teardown(self) -> None:
        try:
            if self.acker is not None and not self.model.violations():
                self._drain()
        finally:
            self.monkeypatch.undo()

    # ------------------------------------------------------------------ the world

    @rule(
        n=st.integers(1, 4), max_attempts=st.integers(1, 3), timeout_ms=st.sampled_from([1_000, 3_000]),
        script=st.tuples(*[st.sampled_from(MOVES)] * 3),
    )
    def send(self, n: int, max_attempts: int, timeout_ms: int, script: tuple[str, str, str]) -> None:
        """A source sends ``n`` records at once (their deadlines fall due together); the
        tasks will handle attempt k of each as ``script[k - 1]`` says."""
        for _ in range(n):
            self.sent += 1
            srid, root = ids.new_id(), ids.new_id()
            record = PersistedRecord(
                srid=srid, origin=srid, attempt=1, root_xor=root, record_id=root, topic="orders",
                key_hash_partition=self.sent % 4, key=b"k%d" % (self.sent % 5), value=b"v%d" % self.sent,
                created_ms=self.clock.now_ms(), timeout_ms=timeout_ms, max_attempts=max_attempts,
            )
            self.scripts[srid] = script
            lp = ids.ledger_partition(srid, self.cluster.partitions)
            self.cluster.append(NS.persist, lp, ids.encode_id(srid), record.encode())

    @rule(field=st.sampled_from(["attempt", "max_attempts", "timeout_ms", "partitioner"]))
    def send_bad(self, field: str) -> None:
        """A persist value outside the rule's domain: quarantined at registration (in the
        DLQ once), never registered, replayed or tombstoned."""
        srid, root = ids.new_id(), ids.new_id()
        bad = {"attempt": {"attempt": 0}, "max_attempts": {"max_attempts": 0}, "timeout_ms": {"timeout_ms": 0},
               "partitioner": {"partitioner": "nope"}}[field]
        fields = dict(srid=srid, origin=srid, attempt=1, root_xor=root, record_id=root, topic="orders",
                      key_hash_partition=0, key=b"bad", value=b"bad", created_ms=self.clock.now_ms(),
                      timeout_ms=1_000, max_attempts=2)
        record = PersistedRecord(**{**fields, **bad})  # type: ignore[arg-type]
        lp = ids.ledger_partition(srid, self.cluster.partitions)
        self.bad[(lp, self.cluster.append(NS.persist, lp, ids.encode_id(srid), record.encode()))] = srid

    def _plan(self, a: ModelAttempt, created_ms: int, timeout_ms: int) -> None:
        """Schedule what the tasks do with a new attempt (its record's script)."""
        move = self.scripts[a.origin][a.number - 1]
        if move == "ack":  # in time
            self.planned.append((created_ms + timeout_ms // 2, a.srid, "ack"))
        elif move == "fail":
            self.planned.append((created_ms + 10, a.srid, "fail"))
        elif move.startswith("late"):  # a slow task: after the deadline
            self.planned.append((a.deadline_ms + DELAYS[move], a.srid, "ack"))
        elif move == "touch":  # a long task: extends the deadline, completes after the first
            self.planned.append((created_ms + timeout_ms // 2, a.srid, "touch"))
            self.planned.append((created_ms + 2 * timeout_ms, a.srid, "ack"))

    @rule(ms=st.sampled_from([50, 300, 1_000, 3_000, 8_000, 25_000]))
    def advance(self, ms: int) -> None:
        """Time passes; what the tasks do meanwhile is written at its time (read later)."""
        end = self.clock.now_ms() + ms
        self.planned.sort()
        while self.planned and self.planned[0][0] <= end:
            at, srid, what = self.planned.pop(0)
            self.clock.advance(max(0, at - self.clock.now_ms()))
            a = self.model.attempts[srid]
            lp = ids.ledger_partition(srid, self.cluster.partitions)
            if what == "ack":
                a.acked_ms = self.clock.now_ms()
                batch = XorBatch(lp, np.array([srid], np.int64), np.array([self.roots[srid]], np.int64), _NONE)
            elif what == "touch":
                # The model keeps the first deadline: whether the acker has read the touch when
                # that deadline passes depends on its backlogs (a touch read before the srid's
                # persist record is kept, design §6), so a replay after it is right either way;
                # the fate is not.
                touched = a.deadline_ms + 2 * (a.deadline_ms - self.created[srid])
                batch = XorBatch(lp, _NONE, _NONE, _NONE, touched=np.array([srid], np.int64),
                                 touched_deadlines=np.array([touched], np.int64))
            else:
                a.failed_ms = self.clock.now_ms()
                batch = XorBatch(lp, _NONE, _NONE, np.array([srid], np.int64))
            self.cluster.append(NS.acks, lp, None, batch.encode())
        self.clock.advance(end - self.clock.now_ms())

    @rule(lp=st.integers(0, 1), n=st.integers(5, 40))
    def backlog(self, lp: int, n: int) -> None:
        """Events of other trees pile up on one input partition: the acker reads them a few
        at a time (they end as orphans)."""
        for _ in range(n):
            other = ids.new_id() & ~1 | lp or 2
            batch = XorBatch(lp, np.array([other], np.int64), np.array([other ^ 3], np.int64), np.array([], np.int64))
            self.cluster.append(NS.acks, lp, None, batch.encode())

    # ------------------------------------------------------------------ the acker

    @precondition(lambda self: self.acker is not None)
    @rule(n=st.integers(1, 6))
    def step(self, n: int) -> None:
        assert self.acker is not None
        count = itertools.count(1)
        self.acker.run(until=lambda _: next(count) >= n)  # the service loop: n polls, then a commit

    @precondition(lambda self: self.acker is not None)
    @rule()
    def commit_fails(self) -> None:
        """The next commit is refused: the acker aborts and rewinds to its changelog."""
        self.cluster.fail_commits += 1

    @precondition(lambda self: self.acker is not None)
    @rule()
    def takeover(self) -> None:
        """kill -9 and a new instance: whatever was not committed is gone."""
        self.acker = self._new_acker()

    # ------------------------------------------------------------------ checks

    @invariant()
    def follows_the_rule(self) -> None:
        self._scan()
        problems = self.model.violations()
        assert not problems, problems

    def _scan(self) -> None:
        """What the acker committed: new attempts (replays) and tombstones."""
        for lp in range(self.cluster.partitions):
            log = self.cluster.logs[(NS.persist, lp)]
            for msg in log[self.scanned.get(lp, 0):]:
                srid = ids.decode_id(msg.key() or b"")
                value = msg.value()
                if (lp, msg.offset()) in self.bad:
                    continue
                if value is not None:
                    r = PersistedRecord.decode(value)
                    self.roots[r.srid] = r.root_xor
                    self.created[r.srid] = r.created_ms
                    for h in r.history:
                        self.model.attempts[h.srid].reason = h.reason
                    a = self.model.attempt(r.srid, r.origin, r.attempt, r.max_attempts, r.created_ms + r.timeout_ms)
                    self._plan(a, r.created_ms, r.timeout_ms)
                    continue
                outcome = outcome_of(msg.headers())
                a = self.model.attempts[srid]
                assert a.outcome is None, f"srid {srid} tombstoned twice ({a.outcome}, then {outcome!r})"
                a.outcome = outcome.decode()
            self.scanned[lp] = len(log)

    def _drain(self) -> None:
        """Run the world's late completions, then the clock far past every window, reading
        everything: every record must then have its fate."""
        assert self.acker is not None
        for _ in range(40):
            self.advance(5_000)
            self.step(6)
            self._scan()
        self.clock.advance(2 * WATCH_MS + 120_000)
        for _ in range(20):
            self.step(6)
            self.advance(1_000)
        self._scan()
        assert not self.model.violations(), self.model.violations()
        quarantined = [dict(m.headers() or ()).get("rb-source") for m in self.cluster.records(NS.dlq)
                       if (dict(m.headers() or ()).get("rb-reason") or b"").startswith(b"quarantine")]
        assert sorted(quarantined) == sorted(f"{NS.persist}/{lp}/{o}".encode() for lp, o in self.bad), quarantined
        for origin, attempts in self.model.origins.items():
            ends = sorted(a.outcome for a in attempts if a.outcome in ("completed", "dlq"))
            assert len(ends) == 1, f"origin {origin}: {[(a.number, a.outcome) for a in attempts]}"
            expected = self.model.expected(origin)
            assert expected in (None, ends[0]), (
                f"origin {origin} ended {ends[0]}, the rule says {expected}: "
                f"{[(a.number, a.deadline_ms - T0, a.acked_ms and a.acked_ms - T0, a.failed_ms, a.outcome) for a in attempts]}"
            )
            assert all(a.outcome is not None for a in attempts), f"origin {origin} has attempts left pending"


EXAMPLES = int(os.environ.get("REPLAYBROKER_MODEL_EXAMPLES", "60"))
TestFateRule = FateMachine.TestCase
TestFateRule.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_a_fail_mark_read_after_the_window_waits_for_the_completion_behind_it() -> None:
    """A run hypothesis found (kept: its database is not): records of max 2 attempts whose
    first attempt completes late inside its window (``late_edge``) and whose last fails. The
    acker sleeps through the window; then it reads the fail mark first, the late completion
    behind a backlog. The window's end counts at the read-up-to tick, so the completion
    settles the last attempt instead of a dead letter."""
    machine = FateMachine()

    def then(rule: Callable[..., None], **kwargs: Any) -> None:
        rule(**kwargs)
        machine.follows_the_rule()

    then(machine.start, cache=0, fetches=1, unlogged_ms=0, fail_hold_ms=150)
    for _ in range(2):
        for _ in range(5):
            then(machine.advance, ms=50)
        then(machine.step, n=1)
    for _ in range(4):
        then(machine.advance, ms=50)
    then(machine.send, max_attempts=2, n=3, script=("late_edge", "fail", "ack"), timeout_ms=1_000)
    then(machine.send, max_attempts=1, n=1, script=("ack", "ack", "ack"), timeout_ms=1_000)
    then(machine.advance, ms=8_000)
    then(machine.step, n=4)
    then(machine.step, n=1)
    then(machine.advance, ms=50)
    then(machine.send, max_attempts=3, n=2, script=("ack", "ack", "ack"), timeout_ms=1_000)
    then(machine.advance, ms=50)
    then(machine.step, n=3)
    then(machine.send, max_attempts=1, n=4, script=("ack", "ack", "ack"), timeout_ms=1_000)
    then(machine.advance, ms=25_000)
    then(machine.advance, ms=50)
    machine.teardown()  # drains: every record has the fate the model gives it


def test_a_late_completion_among_failed_commits_settles_the_last_attempt() -> None:
    """A run hypothesis found (kept: its database is not): records of 3 attempts - failed, late
    inside its window, failed - on a ledger partition behind a backlog, through many failed
    commits. Attempt 2"s tree completed inside its window; the last attempt must not be
    dead-lettered."""
    machine = FateMachine()

    def then(rule: Callable[..., None], **kwargs: Any) -> None:
        rule(**kwargs)
        machine.follows_the_rule()

    then(machine.start, cache=0, fetches=1, fail_hold_ms=0, unlogged_ms=0)
    then(machine.backlog, lp=1, n=20)
    then(machine.send, max_attempts=3, n=4, script=("fail", "late_edge", "fail"), timeout_ms=1_000)
    then(machine.advance, ms=50)
    then(machine.commit_fails)
    then(machine.step, n=2)
    then(machine.step, n=4)
    then(machine.send, max_attempts=3, n=1, script=("ack", "ack", "ack"), timeout_ms=1_000)
    then(machine.step, n=1)
    then(machine.step, n=5)
    then(machine.advance, ms=8_000)
    then(machine.step, n=1)
    then(machine.backlog, lp=1, n=5)
    then(machine.send, max_attempts=3, n=1, script=("ack", "ack", "ack"), timeout_ms=1_000)
    then(machine.commit_fails)
    then(machine.commit_fails)
    then(machine.advance, ms=25_000)
    then(machine.step, n=1)
    then(machine.step, n=2)
    then(machine.commit_fails)
    then(machine.commit_fails)
    then(machine.commit_fails)
    then(machine.send, max_attempts=1, n=2, script=("ack", "ack", "ack"), timeout_ms=1_000)
    then(machine.step, n=2)
    then(machine.step, n=2)
    machine.teardown()  # drains: every record has the fate the model gives it
