"""Failure decisions at commit time: which entries failed (timeouts, explicit fail marks),
and what becomes of each - a replay or a dead letter (broker.acker.replay.decide). Each follows a
row of the fate table (broker.acker.fate, docs/design.md §6), picked by name: ``REPLAYED``,
``HELD``, ``DEAD_LETTERED``, ``DEFERRED``, ``LOST`` or ``QUARANTINED``.

Replays are produced in the order their originals were persisted, not the order they leave
the table (docs/design.md §6): ``created_ms``, then the persist offset (exact within a
ledger partition).

A replay needs the record's payload: from the cache, else read from ``ns.persist``. A payload
that cannot be read must not hold up anything else - the rest of the commit, other entries,
other partitions - nor be dropped: its entry goes back into its table, deferred (durable in
the changelog, see broker.ledger.table), and is read again with exponential back-off. After
``payload_tries`` failed reads, or at once when the record is provably gone, the record is
dead-lettered without its value (``payload lost: ...``, key = the srid) and its srid leaves
with outcome ``dlq``.

Payloads are read in bulk (``PersistFetcher.fetch_many``: one sequential pass per ledger
partition), at most ``max_fetches_per_commit`` per commit, shared among the partitions in
proportion to what each needs: after a restart with tens of thousands of timeouts (an empty
cache) one commit must still stay short. What a commit does not read is deferred too, due at
the next commit, and decided in persist order: a partition's failures leave as a prefix in
offset order, and nothing newer than the newest record read in a partition that stopped
short is decided, so replays keep their originals' order across commits as well.
"""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from broker import ids
from broker.acker import fate
from broker.acker.config import AckerConfig
from broker.acker.fate import Outcome, Reason, Row
from broker.acker.payloads import PayloadCache, PersistFetcher, Unreadable
from broker.acker.replay import Outgoing, Subject, decide, lost_payload_record, quarantine_record
from broker.acker.replay_topics import ReplayTopics, Unknown
from broker.acker.state import Ended, PartitionState, Turn, Watch
from broker.errors import DecodeError
from broker.ledger.adaptive import AdaptiveTimeouts
from broker.ledger.clock import Clock, Ticker
from broker.schemas import PersistedRecord
from broker.topics import Namespace

log = logging.getLogger(__name__)

# A replay whose topic's metadata has not answered yet is decided again this much later.
METADATA_RETRY_MS = 500
EVERY_TICK = 2**62  # later than any deferred entry's tick
# What the counters call a decision's outcome.
_COUNTED = {Outcome.REPLAY: "replayed", Outcome.DLQ: "dlq"}


class Decided(NamedTuple):
    """One failed srid's outputs, with the order they are produced in: ``(created_ms, offset)``
    of its persist record (0 first: a dead letter without a record to order by)."""

    created_ms: int
    offset: int
    lp: int  # its ledger partition
    records: tuple[Outgoing, ...]


class _Wait(NamedTuple):
    """A failure put back into its table (DEFERRED or HELD) until ``tick``."""

    srid: int
    offset: int
    failed: bool
    tick: int


@dataclass(frozen=True)
class _Ready:
    """A failure whose payload is at hand and decoded, not decided yet."""

    lp: int
    srid: int
    offset: int
    reason: Reason
    payload: bytes
    record: PersistedRecord
    fetched: bool  # read from ns.persist (not the cache)


@dataclass
class _Commit:
    """One ``Decider.decide``: its clock, the lag gate's ticks, and what it has decided so far."""

    now_ms: int
    now_tick: int
    ticks: Mapping[int, int | None]
    decided: list[Decided]
    waits: defaultdict[int, list[_Wait]] = field(default_factory=lambda: defaultdict(list))
    ready: list[_Ready] = field(default_factory=list)
    horizon: int | None = None  # created_ms past which nothing is decided in this commit

    def wait(self, lp: int, failure: Ended | _Ready, tick: int) -> None:
        self.waits[lp].append(_Wait(failure.srid, failure.offset, failure.reason is Reason.FAILED, tick))

    def read_up_to(self, created_ms: int) -> None:
        """A partition stopped short after its record created at ``created_ms``: what other
        partitions hold newer than that waits too."""
        self.horizon = created_ms if self.horizon is None else min(self.horizon, created_ms)


def collect_failures(
    states: Mapping[int, PartitionState], now_ms: int, expiry_ticks: Mapping[int, int | None], fail_hold_ms: int,
    adaptive: AdaptiveTimeouts | None = None,
) -> None:
    """Move every timed-out or explicitly failed entry from its table to ``st.failures``.

    Timeouts: the entries of partition ``lp`` due at ``expiry_ticks[lp]`` - the current tick
    once the acker has read that partition's inputs, an earlier one (None: nothing) while it
    is behind on them (broker.acker.lag). A deadline is on the source's clock, judged on the
    acker's: the assumptions about the two clocks are in broker.ledger.clock.

    Fail marks are released in windows: once the oldest held mark (over all ledger
    partitions) is ``fail_hold_ms`` old, every held mark is decided in this commit, so the
    marks of one task batch - spread over ledger partitions - are decided together. They are
    facts, not the absence of an ack: the lag does not hold them back (a last attempt's dead
    letter still waits for its windows, judged at the gate's tick: ``Decider._dlq_hold``).

    A timed-out auto entry is a latency sample for ``adaptive`` (censored: at least its
    timeout): when a slow-down outruns the estimate, the timeouts themselves raise it
    (broker.ledger.adaptive: only while they are more than the odd dropped record).
    """
    oldest = min((ms for st in states.values() for ms, _ in st.recent_fails), default=None)
    release = oldest is None or now_ms - oldest >= fail_hold_ms
    for lp, st in states.items():
        tick = expiry_ticks.get(lp)
        if tick is not None:
            expired = st.table.expire(tick)
            st.count("orphans", len(expired.orphans))
            st.count("timed_out", len(expired.timed_out))
            unwatched, unknown_marks = st.table.take_expired_counts()
            st.count("unwatched", unwatched)
            st.count("superseded_unknown", unknown_marks)
            if expired.timed_out.values is not None and len(expired.timed_out):
                st.expired_values.update(
                    zip(expired.timed_out.srids.tolist(), expired.timed_out.values.tolist(), strict=True)
                )
            if adaptive is not None and len(st.auto_runs):
                adaptive.observe_offsets(st.auto_runs, expired.timed_out.offsets, now_ms, timed_out=True)
            for srid, offset in zip(expired.timed_out.srids.tolist(), expired.timed_out.offsets.tolist(), strict=True):
                st.failures.append(Ended(srid, offset, Reason.TIMEOUT))
                st.timed_out_at[srid] = now_ms
        if release:
            st.recent_fails.clear()
        hold = np.concatenate([f for _, f in st.recent_fails]) if st.recent_fails else None
        failed = st.table.take_failed(hold)
        st.count("failed", len(failed))
        rejected = st.rejections
        for srid, offset in zip(failed.srids.tolist(), failed.offsets.tolist(), strict=True):
            st.failures.append(Ended(srid, offset, Reason.REJECTED if srid in rejected else Reason.FAILED))
        if rejected and len(failed):  # the failures by class: the rest of them are transient
            st.count("failed_rejected", sum(s in rejected for s in failed.srids.tolist()))


def _key_of(r: _Ready) -> tuple[tuple[str, bytes], tuple[int, int]]:
    """The key whose order ``r`` keeps - (data topic, record key); a record without a key has
    no order to keep with others - and its place in it: (``created_ms``, persist offset)."""
    record = r.record
    key = (record.topic, record.key if record.key is not None else ids.encode_id(r.srid))
    return key, (record.created_ms, r.offset)


def _decoded(srid: int, payload: bytes, now_ms: int) -> PersistedRecord:
    """The persist record of ``srid`` in ``payload``, if it can be replayed (DecodeError: not)."""
    record = PersistedRecord.decode(payload)
    if record.srid != srid:
        raise DecodeError(f"persist record holds srid {record.srid}, not {srid}")
    # A replay's deadline (in its value's prefix) is now + timeout_ms, 8 bytes: a value
    # registered from its prefix may hold a timeout_ms too large for one.
    if not -(2**63) <= now_ms + record.timeout_ms < 2**63:
        raise DecodeError(f"timeout_ms {record.timeout_ms} gives a replay no 64-bit deadline")
    return record


class Decider:
    """Turns failed srids into replay or DLQ records (payload from the cache or ns.persist)."""

    def __init__(
        self,
        ns: Namespace,
        clock: Clock,
        ticker: Ticker,
        cache: PayloadCache,
        fetcher: PersistFetcher,
        partition_counts: Callable[[list[str]], Mapping[str, int | None]],
        config: AckerConfig | None = None,
    ) -> None:
        self.ns = ns
        self.clock = clock
        self.ticker = ticker
        self.cache = cache
        self.fetcher = fetcher
        self.config = config or AckerConfig()
        # Replay topics' partition counts, looked up beside the loop (broker.acker.replay_topics).
        self.topics = ReplayTopics(partition_counts)
        # data topic -> the next free turn (epoch ms) under the replay rate
        self._next_turn: dict[str, float] = {}
        self.partitions = 0  # P, known once the service has checked the topics
        # srid -> why the broker refused its replay for good (broker.acker.refusals): such a
        # srid is dead-lettered instead of being replayed into the same refusal again.
        self.refused: Mapping[Subject, str] = {}

    def decide(
        self, states: Mapping[int, PartitionState], decided: list[Decided], ticks: Mapping[int, int | None],
    ) -> None:
        """Decide the failures of every state (``st.failures``, and the deferred ones due at
        ``ticks[lp]``, taken from the tables here) into ``decided`` and ``st.tombstones``.

        ``ticks`` are the lag gate's (broker.acker.lag), per ledger partition: a deferred
        decision - a held dead letter above all - is taken only once the acker has read that
        partition's inputs as far as its tick, so an event that could still complete the
        entry is folded first (None: nothing is due yet).

        Afterwards every ``st.failures`` is empty: what is not decided now - payloads that
        could not be read, what is beyond this commit's reads - is deferred in its table
        (see the module doc), never left for the commit to wait on. In order:

        1. take each partition's failures and its due deferred ones, in persist order;
        2. read the payloads not cached, up to each partition's quota and the fetch timeout;
           a payload lost or undecodable is dead-lettered there and then;
        3. follow the table's row for each failure at hand (``_fate``): replay, dead letter,
           hold, or defer what is newer than a record another partition could not read yet;
        4. put what waits back into the tables, and watch what was replayed.
        """
        now_ms = self.clock.now_ms()
        for st in states.values():
            st.let_go_turns()
        # Deferred entries are taken only as far as this commit may read (mostly their
        # payloads are not cached): what is left waits untouched in the table, so a backlog
        # costs no changelog writes while it waits.
        due = {lp: self._due(st, ticks.get(lp)) for lp, st in states.items()}
        need = {
            lp: due[lp] + sum(f.srid not in self.cache for f in st.failures)
            for lp, st in states.items() if due[lp] or st.failures
        }
        if not need:
            return
        quotas = self._quotas(need)
        c = _Commit(now_ms, self.ticker.current_tick(now_ms), ticks, decided)
        taken = {lp: self._take(states[lp], due[lp], ticks.get(lp), quotas[lp]) for lp in need}
        deadline = time.monotonic() + self.config.payload_fetch_timeout_ms / 1000
        for lp, (failures, boundary) in taken.items():
            quota = quotas[lp] if time.monotonic() < deadline else 0
            self._read(c, lp, states[lp], failures, boundary, quota, deadline)
        # In the order the records were sent (their source's created_ms never goes back): the
        # turns of a key's waiting replays are handed out in it (``_turn``).
        for r in sorted(c.ready, key=lambda r: (r.record.created_ms, r.offset)):
            self._settle(c, states[r.lp], r)
        for lp, waits in c.waits.items():
            if waits:
                self._defer(states[lp], waits)
        self._watch(states, now_ms)

    @staticmethod
    def _due(st: PartitionState, tick: int | None) -> int:
        """How many of the partition's deferred entries this commit takes: those due at the
        lag gate's ``tick``; all of them in a state taken over (``turns_unknown``), to learn
        the keys its turns hold back."""
        if st.turns_unknown:
            every = st.table.deferred_due(EVERY_TICK)
            st.turns_unknown = every > 0  # nothing deferred: nothing to learn
            return every
        return 0 if tick is None else st.table.deferred_due(tick or 0)

    def _take(self, st: PartitionState, due: int, tick: int | None, quota: int) -> tuple[list[Ended], int | None]:
        """The partition's failures and its deferred ones due at ``tick`` (at most ``quota``),
        in persist order; and the offset of the first due one left waiting (None: none). In a
        state taken over, every deferred one: what is not read now waits for the next commit
        behind the ones read (``_read``), in persist order."""
        failures, st.failures = st.failures, []
        boundary = None
        relearn, st.turns_unknown = st.turns_unknown, False
        if due:
            again = st.table.take_deferred(EVERY_TICK, None) if relearn else st.table.take_deferred(tick or 0, quota)
            for removed, reason in ((again.timed_out, Reason.TIMEOUT), (again.failed, Reason.FAILED)):
                srids = removed.srids.tolist()
                failures.extend(
                    Ended(srid, offset, Reason.REJECTED if srid in st.rejections else reason)
                    for srid, offset in zip(srids, removed.offsets.tolist(), strict=True)
                )
            if again.timed_out.values is not None:  # kept while it waited: on to a watch
                st.expired_values.update(zip(again.timed_out.srids.tolist(), again.timed_out.values.tolist(), strict=True))
            if again.next_offset >= 0:
                boundary = again.next_offset
        if st.turnless:
            # A deferred entry without a turn here (its key not known, or held back by the
            # reading order) that is not taken now: what was persisted after it waits behind it.
            taken = {f.srid for f in failures}
            unread = [offset for srid, offset in st.turnless.items() if srid not in taken]
            if unread:
                boundary = min(unread) if boundary is None else min(boundary, min(unread))
        failures.sort(key=lambda f: f.offset)
        return failures, boundary

    def _read(
        self, c: _Commit, lp: int, st: PartitionState, failures: list[Ended], boundary: int | None, quota: int,
        deadline: float,
    ) -> None:
        """Read the payloads of partition ``lp``'s failures, oldest first, into ``c.ready``.
        The failures from the first read over ``quota`` on - and any newer than a due one left
        waiting (``boundary``) - wait for the next commit (not a try: nothing was read)."""
        cut, reads = self._plan_reads(failures, boundary, quota)
        got = self.fetcher.fetch_many(lp, reads, deadline) if reads else {}
        mine: list[_Ready] = []
        unreadable: list[str] = []
        for failure in failures[:cut]:
            st.turnless.pop(failure.srid, None)  # read, or not readable (its key is not known)
            ready = self._payload(c, lp, st, failure, got, unreadable)
            if ready is not None:
                mine.append(ready)
        if unreadable:  # one line per partition, not per record: they fail together
            log.warning("%d payloads not readable from %s[%d] now (%s); read again with back-off",
                        len(unreadable), self.ns.persist, lp, unreadable[0])
        if cut < len(failures) or boundary is not None:
            for failure in failures[cut:]:
                c.wait(lp, failure, c.now_tick)  # fate.DEFERRED: over this commit's reads
                if failure.srid not in st.replay_turns:  # its key is not known here: no turn
                    st.turnless[failure.srid] = failure.offset
            if mine:
                # What waits here was persisted after the last record read here: a record
                # of another partition newer than that one waits too.
                c.read_up_to(mine[-1].record.created_ms)
        c.ready.extend(mine)

    def _plan_reads(self, failures: list[Ended], boundary: int | None, quota: int) -> tuple[int, dict[int, int]]:
        """How many of ``failures`` this commit takes, and the reads they need (offset -> srid)."""
        reads: dict[int, int] = {}
        for i, (srid, offset, _) in enumerate(failures):
            if boundary is not None and offset > boundary:
                return i, reads
            if srid not in self.cache:
                if len(reads) == quota:
                    return i, reads
                reads[offset] = srid
        return len(failures), reads

    def _payload(
        self, c: _Commit, lp: int, st: PartitionState, failure: Ended, got: Mapping[int, bytes | Unreadable],
        unreadable: list[str],
    ) -> _Ready | None:
        """``failure`` with its payload at hand and decoded; or None, its fate decided without
        one: dead-lettered (lost, undecodable) or deferred (not readable now)."""
        payload = self.cache.pop(failure.srid)
        fetched = payload is None
        if payload is None:
            result = got[failure.offset]
            if isinstance(result, Unreadable):
                if result.gone:
                    self._lost(c, lp, st, failure, result.reason)
                else:
                    unreadable.append(result.reason)
                    self._unreadable(c, lp, st, failure, result.reason)
                return None
            payload = result
        try:
            record = _decoded(failure.srid, payload, c.now_ms)
        except DecodeError as exc:
            st.count("payload_fetches", int(fetched))
            self._quarantine(c, lp, st, failure, payload, exc)
            return None
        return _Ready(lp, failure.srid, failure.offset, failure.reason, payload, record, fetched)

    def _fate(self, c: _Commit, st: PartitionState, r: _Ready) -> tuple[Row, int]:
        """The row of the fate table (broker.acker.fate) that ``r`` follows now, and the tick it
        waits until when it waits (DEFERRED, HELD)."""
        if c.horizon is not None and r.record.created_ms > c.horizon:
            if r.record.attempt < r.record.max_attempts and r.reason is not Reason.REJECTED:
                st.turnless[r.srid] = r.offset  # without a turn: its key's later ones wait
            return fate.DEFERRED, c.now_tick  # newer than a record not read yet
        timed_out_ms = st.timed_out_at.setdefault(r.srid, c.now_ms) if r.reason is Reason.TIMEOUT else None
        last = r.record.attempt >= r.record.max_attempts or r.reason is Reason.REJECTED
        hold = self._dlq_hold(r.record, timed_out_ms, c.ticks.get(r.lp), last)
        if hold is not None:
            return fate.HELD, hold
        if not last:
            turn = self._turn(st, r, c.now_ms)
            if turn is None and isinstance(self.topics.partitions(r.record.topic), Unknown):
                turn = self._metadata_turn(st, r, c.now_ms)
            if turn is not None:
                return fate.WAITS, self.ticker.tick_of(int(turn))
            return fate.REPLAYED, c.now_tick
        return fate.DEAD_LETTERED, c.now_tick  # held until every window ended, or none was open

    def _turn(self, st: PartitionState, r: _Ready, now_ms: int) -> float | None:
        """When ``r`` may be replayed, if later than now (None: now): one function of what is
        kept of it, so that a re-decision, the live acker and a new owner give the same turn.
        Once its own wait has passed (``_waits_until``) and in its place under its topic's
        replay rate (``replay_rate_per_s``, a second's worth at once). A key (data topic,
        record key) keeps its order: a turn is never before those of its key's records
        sent before it (``created_ms``, persist offset) that still wait, and one whose turn has
        come still waits while they wait (the gate brings them back a little after their
        turns) - they go first, in their order; a later record of its key never holds it. A
        turn given stands while its own wait is the same; a wait that changed since (a fail
        mark's retry-after for a record waiting its back-off) takes a new turn."""
        until = self._waits_until(st, r, now_ms)
        waiting = st.replay_turns.get(r.srid)
        if waiting is not None:
            if waiting.until == until:
                # An earlier record of its key may wait longer than it did when this turn was
                # given (its metadata had not answered, a new owner gave it a turn again).
                earlier = st.earlier_turn(waiting.key, waiting.sent)
                if earlier is None and waiting.turn <= now_ms:
                    st.end_turn(r.srid)
                    return None
                if earlier is None or earlier <= waiting.turn:
                    return max(waiting.turn, now_ms)
                st.end_turn(r.srid)
                st.wait_turn(r.srid, waiting._replace(turn=earlier))
                return max(earlier, float(now_ms))
            st.end_turn(r.srid)
        record, rate = r.record, self.config.replay_rate_per_s
        if until is None and rate is None and not st.replays_waiting:
            return None  # nothing of its own to wait for, and no record waits before it
        turn = float(now_ms if until is None else max(now_ms, until))
        backed_off = turn  # when its own wait ends (now: it has none left)
        if rate is not None:
            gap = 1_000.0 / rate
            slot = max(self._next_turn.get(record.topic, 0.0), now_ms - 1_000.0 + gap)
            self._next_turn[record.topic] = slot + gap
            turn = max(turn, slot)
        key, sent = _key_of(r)
        earlier = st.earlier_turn(key, sent)
        if turn <= now_ms and earlier is None:
            return None
        turn = max(turn, earlier or 0.0)
        # Why it waits, for the metrics: its back-off (which decides its turn), or its turn under
        # the rate or behind its key's earlier ones (due, but held back).
        backing_off = backed_off > now_ms and backed_off >= turn
        st.wait_turn(r.srid, Turn(turn, key, backing_off, until, sent))
        st.count("replays_backed_off" if backing_off else "replays_waited")
        return max(turn, now_ms)

    def _metadata_turn(self, st: PartitionState, r: _Ready, now_ms: int) -> float:
        """The turn of ``r``, due now but whose replay topic's metadata has not answered yet
        (broker.acker.replay_topics: the loop never waits for it): ``METADATA_RETRY_MS`` later,
        asked again then. A turn like the others, so that its key's later records wait behind
        it, in their order, instead of going first once the answer is in."""
        key, sent = _key_of(r)
        turn = max(float(now_ms + METADATA_RETRY_MS), st.earlier_turn(key, sent) or 0.0)
        st.wait_turn(r.srid, Turn(turn, key, False, self._waits_until(st, r, now_ms), sent))
        st.count("replays_waited")
        return turn

    @staticmethod
    def _waits_until(st: PartitionState, r: _Ready, now_ms: int) -> int | None:
        """When ``r``'s own wait ends (None: it has none): the time its task asked for with its
        fail mark (``ctx.fail(retry_after_ms=...)``, durable), else ``retry`` of its record
        from when it timed out (durable while it waits) or failed, a jitter drawn from its
        srid."""
        if r.reason is Reason.FAILED and r.srid in st.retry_at:
            return st.retry_at[r.srid]
        record = r.record
        if record.retry is None:
            return None
        ended = st.timed_out_at.get(r.srid)  # a timeout failed explicitly since: it ended then
        if ended is None:
            ended = st.failed_at.setdefault(r.srid, now_ms)
        return ended + record.retry.delay_ms(record.attempt, random.Random(r.srid))

    def _settle(self, c: _Commit, st: PartitionState, r: _Ready) -> None:
        """Do what ``r``'s row says. Its fetch counts now unless it is put off for the order
        of this commit's reads (DEFERRED, counted when it is decided): a payload that waits its
        turn does so in the cache, and comes from there when it is decided again."""
        row, tick = self._fate(c, st, r)
        st.count("payload_fetches", int(r.fetched and row is not fate.DEFERRED))
        if row in (fate.WAITS, fate.DEFERRED, fate.HELD):
            self.cache.put(r.srid, r.payload)
            st.count("dlq_held", int(row is fate.HELD))
            c.wait(r.lp, r, tick)
            return
        self._decide_record(c, st, r)  # REPLAYED or DEAD_LETTERED: broker.acker.replay.decide

    @staticmethod
    def _defer(st: PartitionState, waits: list[_Wait]) -> None:
        """Put these failures back into the table until their ticks; a timeout with the value
        it expired with, so that its late events can still complete it (broker.ledger.table:
        "Deferred decisions"). One whose value is not known is deferred as failed: a value
        that is not its tree's must never complete it."""
        srids, offsets, failed, ticks = zip(*waits, strict=True)
        values = [None if f else st.expired_values.pop(s, None) for s, f in zip(srids, failed, strict=True)]
        unknown = [not f and v is None for f, v in zip(failed, values, strict=True)]
        if any(unknown):
            log.warning("%d timed-out records deferred without their XOR value: decided as failed", sum(unknown))
        st.table.defer(
            np.array(srids, np.int64), np.array(offsets, np.int64), np.array(ticks, np.int64),
            np.array([f or u for f, u in zip(failed, unknown, strict=True)], bool),
            np.array([v or 0 for v in values], np.int64),
        )

    def _watch(self, states: Mapping[int, PartitionState], now_ms: int) -> None:
        """Watch the attempts replayed in this commit (LedgerTable.watch), up to
        ``max_watches`` per partition; what is over it is counted in ``watch_skipped``."""
        cfg = self.config
        watch_ms = cfg.watch_for_ms
        for st in states.values():
            st.expired_values.clear()  # what is left was decided (a deferred one took its value along)
            st.forget_decided()
            if not st.watches:
                continue
            watches, st.watches = st.watches, []
            room = 0 if watch_ms <= 0 else max(0, cfg.max_watches - st.table.watching())
            st.count("watch_skipped", max(0, len(watches) - room) if watch_ms > 0 else 0)
            watches = watches[:room]
            if watches:
                srids, values, replays, failed = zip(*watches, strict=True)
                st.table.watch(np.array(srids, np.int64), np.array(values, np.int64), np.array(replays, np.int64),
                               self.ticker.tick_of(now_ms + watch_ms), np.array(failed, bool))

    def _dlq_hold(
        self, record: PersistedRecord, timed_out_ms: int | None, read_tick: int | None, last: bool,
    ) -> int | None:
        """The tick until which the dead letter of ``record`` waits, or None: not held.

        The rule (docs/design.md §6): a record is dead-lettered only when none of its attempts
        can still complete. An attempt that timed out can, for ``watch_ms`` after its timeout:

        - this one, if it timed out (at ``timed_out_ms``: kept in its changelog entry while
          it waits, so a new owner continues the window): its entry waits DEFERRED with its
          value, so its late events complete it (``LedgerTable.fold``, counted
          ``completed_late``);
        - every earlier one that timed out (``history``): it is watched, and its late
          completion sends a superseded mark down the chain of replays - through failed
          attempts too - that settles this one (``LedgerTable.mark_superseded``).

        The hold is the latest of those windows. A window has ended only once the acker has
        read its partition's inputs past its end - ``read_tick``, the lag gate's tick
        (broker.acker.lag; None: not known yet) - not once the clock has passed it: a failure
        read late must not be dead-lettered ahead of a completion written inside the window
        and not read yet. The gate takes the held entry at that tick (``decide``'s ``ticks``),
        after the late completions read by then have been applied
        (broker.acker.superseding.hand_on). An explicitly failed attempt cannot complete, so
        it adds no window of its own. ``last``: the record's last attempt, or a rejected one."""
        if not last:
            return None
        ends = [h.at_ms for h in record.history if h.reason == Reason.TIMEOUT]
        if timed_out_ms is not None:
            ends.append(timed_out_ms)
        return self._held_until(ends, read_tick)

    def _held_until(self, ends: list[int], read_tick: int | None) -> int | None:
        """The tick the last of the windows opened at ``ends`` ends, if the partition is not
        read past it yet (``read_tick``), else None."""
        watch_ms = self.config.watch_for_ms
        if watch_ms <= 0 or not ends:
            return None
        tick = self.ticker.tick_of(max(ends) + watch_ms)
        return tick if read_tick is None or tick > read_tick else None

    def _quotas(self, need: Mapping[int, int]) -> dict[int, int]:
        """Payload reads per partition in this commit: all that are needed when they fit in
        ``max_fetches_per_commit``, else shares of it in proportion to the need (at least
        one each), so that every partition's oldest failures move on."""
        budget, total = self.config.max_fetches_per_commit, sum(need.values())
        if total <= budget:
            return dict(need)
        return {lp: min(n, max(1, budget * n // total)) for lp, n in need.items()}

    def _quarantine(
        self, c: _Commit, lp: int, st: PartitionState, failure: Ended, payload: bytes, exc: DecodeError,
    ) -> None:
        """``fate.QUARANTINED``: registered from its prefix, but the value is no replayable
        PersistedRecord. Keep it in the DLQ byte for byte and let the srid go."""
        srid, offset, reason = failure
        st.decided(srid)
        why = f"persist record of {srid} ({reason.value}) cannot be replayed: {exc}"
        st.count("quarantined")
        log.warning("quarantined %s[%d]@%d: %s", self.ns.persist, lp, offset, why)
        q = quarantine_record(self.ns, self.ns.persist, lp, offset, ids.encode_id(srid), payload, why)
        c.decided.append(Decided(0, offset, lp, (q,)))
        st.tombstones.append(((srid,), fate.QUARANTINED.tombstone))

    def _decide_record(self, c: _Commit, st: PartitionState, r: _Ready) -> None:
        """A replay (watched) or a dead letter: ``broker.acker.replay.decide``."""
        record = r.record
        refused = self.refused.get(r.srid)
        count = self.topics.partitions(record.topic)  # known for a replay (``_settle``); a dead letter needs none
        decision = decide(
            self.ns, record, r.reason, c.now_ms, self.partitions, -1 if isinstance(count, Unknown) else count,
            refused, st.rejections.get(r.srid),
        )
        st.count(_COUNTED[decision.outcome])
        if decision.outcome is Outcome.DLQ:
            st.count_ended("dlq", (record.attempt,))
        if refused is not None and decision.outcome is Outcome.DLQ:
            st.count("refused")
        c.decided.append(Decided(record.created_ms, r.offset, r.lp, decision.records))
        st.tombstones.append(((r.srid,), decision.outcome.header))
        value = st.decided(r.srid)
        if decision.new_srid is None:
            return
        # Every replayed attempt is watched, a failed one too: it cannot complete itself, but
        # a superseded mark that reaches it is handed on to its replay (the chain).
        if r.reason is not Reason.TIMEOUT:
            st.watches.append(Watch(r.srid, 0, decision.new_srid, True))
        elif value is None:
            st.count("watch_skipped")  # its decision was put off without its value
        else:
            st.watches.append(Watch(r.srid, value, decision.new_srid, False))

    def _unreadable(self, c: _Commit, lp: int, st: PartitionState, failure: Ended, detail: str) -> None:
        """A read that failed and may succeed later: ``fate.DEFERRED`` with back-off, or after
        ``payload_tries`` reads ``fate.LOST``."""
        tries = st.payload_tries.get(failure.srid, 0) + 1
        if tries >= self.config.payload_tries:
            self._lost(c, lp, st, failure, f"unreadable after {tries} tries: {detail}")
            return
        st.payload_tries[failure.srid] = tries
        st.count("payload_retries")
        delay_ms = min(self.config.payload_retry_max_ms, self.config.payload_retry_ms << (tries - 1))
        c.wait(lp, failure, self.ticker.tick_of(c.now_ms + delay_ms))  # fate.DEFERRED

    def _lost(self, c: _Commit, lp: int, st: PartitionState, failure: Ended, detail: str) -> None:
        """``fate.LOST``: a failed record whose payload cannot be had is held like a last
        attempt, then dead-lettered with what is known of it (``fate.DEAD_LETTERED``). Its
        history went with the payload, but every earlier attempt ended before this one was
        sent: the windows that can still complete the record end by this one's end (its
        timeout, durable, or its failure's decision) + ``watch_ms``."""
        srid, offset, reason = failure
        if reason is Reason.TIMEOUT:
            ended = st.timed_out_at.setdefault(srid, c.now_ms)
        else:
            ended = st.failed_at.setdefault(srid, c.now_ms)
        hold = self._held_until([ended], c.ticks.get(lp))
        if hold is not None:
            st.count("dlq_held")
            c.wait(lp, failure, hold)  # fate.LOST: held
            return
        st.decided(srid)
        why = f"persist record of {srid} ({reason.value}): {detail}"
        st.count("payload_lost")
        log.error("dead-lettered %s[%d]@%d without its value: %s", self.ns.persist, lp, offset, why)
        c.decided.append(Decided(0, offset, lp, (lost_payload_record(self.ns, lp, offset, srid, why),)))
        st.tombstones.append(((srid,), fate.DEAD_LETTERED.tombstone))

    def forget(self, name: str) -> None:
        """Look replay topic ``name`` up again at its next use: the broker called it unknown."""
        self.topics.forget(name)

    def replay_partitions(self, topic: str) -> int | None:
        """Partition count of ``<topic>.replay`` if known now (None: missing, or not known
        yet), for a check at registration that the decision makes again: never waits for the
        cluster's metadata."""
        return self.topics.known(topic)
