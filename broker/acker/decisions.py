"""Failure decisions at commit time: which entries failed (timeouts, explicit fail marks),
and what becomes of each - a replay or a dead letter (broker.replay.decide).

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
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from broker import ids
from broker.acker.config import AckerConfig
from broker.acker.payloads import PayloadCache, PersistFetcher, Unreadable
from broker.acker.state import PartitionState
from broker.errors import DecodeError
from broker.headers import OUTCOME_DLQ
from broker.ledger.adaptive import AdaptiveTimeouts
from broker.ledger.clock import Clock, Ticker
from broker.replay import Outgoing, Subject, decide, lost_payload_record, quarantine_record
from broker.schemas import PersistedRecord
from broker.topics import Namespace, replay_topic

log = logging.getLogger(__name__)

# (created_ms, persist offset, ledger partition, records): one failed srid's outputs, sort key first.
Decided = tuple[int, int, int, tuple[Outgoing, ...]]
MISSING_TOPIC_RECHECK_S = 60.0


@dataclass(frozen=True)
class _Ready:
    """A failure whose payload is at hand and decoded, not decided yet."""

    lp: int
    srid: int
    offset: int
    reason: str
    payload: bytes
    record: PersistedRecord
    fetched: bool  # read from ns.persist (not the cache)


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
                st.failures.append((srid, offset, "timeout"))
                st.timed_out_at[srid] = now_ms
        if release:
            st.recent_fails.clear()
        hold = np.concatenate([f for _, f in st.recent_fails]) if st.recent_fails else None
        failed = st.table.take_failed(hold)
        st.count("failed", len(failed))
        for srid, offset in zip(failed.srids.tolist(), failed.offsets.tolist(), strict=True):
            st.failures.append((srid, offset, "failed"))


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
        self._partition_counts = partition_counts
        self._replay_topics: dict[str, tuple[int | None, float]] = {}
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
        (see the module doc), never left for the commit to wait on.
        """
        now_ms = self.clock.now_ms()
        now_tick = self.ticker.current_tick(now_ms)
        # Deferred entries are taken only as far as this commit may read (mostly their
        # payloads are not cached): what is left waits untouched in the table, so a backlog
        # costs no changelog writes while it waits.
        due = {lp: 0 if ticks.get(lp) is None else st.table.deferred_due(ticks[lp] or 0) for lp, st in states.items()}
        need = {
            lp: due[lp] + sum(f[0] not in self.cache for f in st.failures)
            for lp, st in states.items() if due[lp] or st.failures
        }
        if not need:
            return
        quotas = self._quotas(need)
        pending: dict[int, list[tuple[int, int, str]]] = {}
        boundary: dict[int, int] = {}  # lp -> smallest offset of a due failure left waiting
        for lp in need:
            st = states[lp]
            failures, st.failures = st.failures, []
            if due[lp]:
                again = st.table.take_deferred(ticks[lp] or 0, quotas[lp])
                for removed, reason in ((again.timed_out, "timeout"), (again.failed, "failed")):
                    srids = removed.srids.tolist()
                    failures.extend(
                        (srid, offset, reason) for srid, offset in zip(srids, removed.offsets.tolist(), strict=True)
                    )
                if again.timed_out.values is not None:  # kept while it waited: on to a watch
                    st.expired_values.update(
                        zip(again.timed_out.srids.tolist(), again.timed_out.values.tolist(), strict=True)
                    )
                if again.next_offset >= 0:
                    boundary[lp] = again.next_offset
            pending[lp] = sorted(failures, key=lambda f: f[1])
        deadline = time.monotonic() + self.config.payload_fetch_timeout_ms / 1000
        waits: dict[int, list[tuple[int, int, bool, int]]] = defaultdict(list)  # srid, offset, failed, tick
        ready: list[_Ready] = []
        horizon: int | None = None  # created_ms past which nothing is decided in this commit
        for lp, failures in pending.items():
            st = states[lp]
            # The reads of this partition, oldest first; the failures from the first read
            # over the quota on - and any newer than a due one left waiting - wait for the
            # next commit (not a try: nothing was read).
            quota = quotas[lp] if time.monotonic() < deadline else 0
            reads: dict[int, int] = {}  # offset -> srid
            cut, left = len(failures), boundary.get(lp)
            for i, (srid, offset, _) in enumerate(failures):
                if left is not None and offset > left:
                    cut = i
                    break
                if srid not in self.cache:
                    if len(reads) == quota:
                        cut = i
                        break
                    reads[offset] = srid
            got = self.fetcher.fetch_many(lp, reads, deadline) if reads else {}
            mine: list[_Ready] = []
            unreadable: list[str] = []
            for srid, offset, reason in failures[:cut]:
                payload = self.cache.pop(srid)
                if payload is None:
                    result = got[offset]
                    if isinstance(result, Unreadable):
                        if result.gone:
                            self._lost(lp, st, srid, offset, reason, result.reason, decided)
                        else:
                            unreadable.append(result.reason)
                            self._unreadable(lp, st, (srid, offset, reason), result.reason, now_ms, decided, waits[lp])
                        continue
                    payload, fetched = result, True
                else:
                    fetched = False
                try:
                    record = PersistedRecord.decode(payload)
                    if record.srid != srid:
                        raise DecodeError(f"persist record holds srid {record.srid}, not {srid}")
                    # A replay's deadline (in its value's prefix) is now + timeout_ms, 8 bytes:
                    # a value registered from its prefix may hold a timeout_ms too large for one.
                    if not -(2**63) <= now_ms + record.timeout_ms < 2**63:
                        raise DecodeError(f"timeout_ms {record.timeout_ms} gives a replay no 64-bit deadline")
                except DecodeError as exc:
                    st.count("payload_fetches", int(fetched))
                    self._quarantine(lp, st, srid, offset, reason, payload, exc, decided)
                    continue
                mine.append(_Ready(lp, srid, offset, reason, payload, record, fetched))
            if unreadable:  # one line per partition, not per record: they fail together
                log.warning("%d payloads not readable from %s[%d] now (%s); read again with back-off",
                            len(unreadable), self.ns.persist, lp, unreadable[0])
            if cut < len(failures) or lp in boundary:
                waits[lp].extend((srid, offset, reason == "failed", now_tick) for srid, offset, reason in failures[cut:])
                if mine:
                    # What waits here was persisted after the last record read here: a
                    # record of another partition newer than that one waits too.
                    newest = mine[-1].record.created_ms
                    horizon = newest if horizon is None else min(horizon, newest)
            ready.extend(mine)
        for r in ready:
            st = states[r.lp]
            if horizon is not None and r.record.created_ms > horizon:
                self.cache.put(r.srid, r.payload)
                waits[r.lp].append((r.srid, r.offset, r.reason == "failed", now_tick))
                continue
            st.count("payload_fetches", int(r.fetched))
            timed_out_ms = st.timed_out_at.setdefault(r.srid, now_ms) if r.reason == "timeout" else None
            hold = self._dlq_hold(r.record, timed_out_ms, ticks.get(r.lp))
            if hold is not None:
                self.cache.put(r.srid, r.payload)
                st.count("dlq_held")
                waits[r.lp].append((r.srid, r.offset, r.reason == "failed", hold))
                continue
            self._decide_record(st, r, now_ms, decided)
        for lp, w in waits.items():
            if w:
                self._defer(states[lp], w)
        self._watch(states, now_ms)

    @staticmethod
    def _defer(st: PartitionState, waits: list[tuple[int, int, bool, int]]) -> None:
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

    def _dlq_hold(self, record: PersistedRecord, timed_out_ms: int | None, read_tick: int | None) -> int | None:
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
        it adds no window of its own."""
        if record.attempt < record.max_attempts:
            return None
        watch_ms = self.config.watch_for_ms
        if watch_ms <= 0:
            return None
        ends = [h.at_ms for h in record.history if h.reason == "timeout"]
        if timed_out_ms is not None:
            ends.append(timed_out_ms)
        if not ends:
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
        self, lp: int, st: PartitionState, srid: int, offset: int, reason: str, payload: bytes, exc: DecodeError,
        decided: list[Decided],
    ) -> None:
        # Registered from its prefix, but the value is no PersistedRecord: it cannot
        # be replayed. Keep it in the DLQ byte for byte and let the srid go.
        st.decided(srid)
        why = f"persist record of {srid} ({reason}) cannot be replayed: {exc}"
        st.count("quarantined")
        log.warning("quarantined %s[%d]@%d: %s", self.ns.persist, lp, offset, why)
        q = quarantine_record(self.ns, self.ns.persist, lp, offset, ids.encode_id(srid), payload, why)
        decided.append((0, offset, lp, (q,)))
        st.tombstones.append(((srid,), OUTCOME_DLQ))

    def _decide_record(self, st: PartitionState, r: _Ready, now_ms: int, decided: list[Decided]) -> None:
        record = r.record
        refused = self.refused.get(r.srid)
        decision = decide(
            self.ns, record, r.reason, now_ms, self.partitions, self.replay_partitions(record.topic), refused
        )
        st.count(decision.kind if decision.kind == "dlq" else "replayed")
        if refused is not None and decision.kind == "dlq":
            st.count("refused")
        decided.append((record.created_ms, r.offset, r.lp, decision.records))
        st.tombstones.append(((r.srid,), decision.kind.encode()))
        value = st.decided(r.srid)
        if decision.new_srid is None:
            return
        # Every replayed attempt is watched, a failed one too: it cannot complete itself, but
        # a superseded mark that reaches it is handed on to its replay (the chain).
        if r.reason == "failed":
            st.watches.append((r.srid, 0, decision.new_srid, True))
        elif value is None:
            st.count("watch_skipped")  # its decision was put off without its value
        else:
            st.watches.append((r.srid, value, decision.new_srid, False))

    def _unreadable(
        self, lp: int, st: PartitionState, failure: tuple[int, int, str], detail: str, now_ms: int,
        decided: list[Decided], waits: list[tuple[int, int, bool, int]],
    ) -> None:
        """A read that failed and may succeed later: defer with back-off, or give up."""
        srid, offset, reason = failure
        tries = st.payload_tries.get(srid, 0) + 1
        if tries >= self.config.payload_tries:
            self._lost(lp, st, srid, offset, reason, f"unreadable after {tries} tries: {detail}", decided)
            return
        st.payload_tries[srid] = tries
        st.count("payload_retries")
        delay_ms = min(self.config.payload_retry_max_ms, self.config.payload_retry_ms << (tries - 1))
        waits.append((srid, offset, reason == "failed", self.ticker.tick_of(now_ms + delay_ms)))

    def _lost(
        self, lp: int, st: PartitionState, srid: int, offset: int, reason: str, detail: str, decided: list[Decided]
    ) -> None:
        """Dead-letter a failed record whose payload cannot be had: what is known of it."""
        st.decided(srid)
        why = f"persist record of {srid} ({reason}): {detail}"
        st.count("payload_lost")
        log.error("dead-lettered %s[%d]@%d without its value: %s", self.ns.persist, lp, offset, why)
        decided.append((0, offset, lp, (lost_payload_record(self.ns, lp, offset, srid, why),)))
        st.tombstones.append(((srid,), OUTCOME_DLQ))

    def forget(self, name: str) -> None:
        """Look replay topic ``name`` up again at its next use: the broker called it unknown."""
        self._replay_topics.pop(name, None)

    def replay_partitions(self, topic: str) -> int | None:
        """Partition count of ``<topic>.replay`` (None when missing), cached; a missing one is
        looked up again after a minute."""
        name = replay_topic(topic)
        cached = self._replay_topics.get(name)
        if cached is not None and (cached[0] is not None or time.monotonic() - cached[1] < MISSING_TOPIC_RECHECK_S):
            return cached[0]
        count = self._partition_counts([name])[name]
        if count is None:
            log.error("replay topic %s does not exist: its records go to the DLQ", name)
        self._replay_topics[name] = (count, time.monotonic())
        return count
