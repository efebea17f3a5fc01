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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

import numpy as np
from confluent_kafka import KafkaException

from broker import ids
from broker.acker.config import AckerConfig
from broker.acker.payloads import PayloadCache, PayloadGone, PersistFetcher
from broker.acker.state import PartitionState
from broker.errors import DecodeError
from broker.headers import OUTCOME_DLQ
from broker.ledger.clock import Clock, Ticker
from broker.replay import Outgoing, decide, lost_payload_record, quarantine_record
from broker.schemas import PersistedRecord
from broker.topics import Namespace, replay_topic

log = logging.getLogger(__name__)

# (created_ms, persist offset, records): one failed srid's outputs, with its sort key.
Decided = tuple[int, int, tuple[Outgoing, ...]]
MISSING_TOPIC_RECHECK_S = 60.0


def collect_failures(states: Iterable[PartitionState], now_ms: int, tick: int, fail_hold_ms: int) -> None:
    """Move every timed-out or explicitly failed entry from its table to ``st.failures``,
    and every deferred one whose time has come (counted once, when it first failed).

    Fail marks are released in windows: once the oldest held mark (over all ledger
    partitions) is ``fail_hold_ms`` old, every held mark is decided in this commit, so the
    marks of one task batch - spread over ledger partitions - are decided together.
    """
    states = list(states)
    oldest = min((ms for st in states for ms, _ in st.recent_fails), default=None)
    release = oldest is None or now_ms - oldest >= fail_hold_ms
    for st in states:
        expired = st.table.expire(tick)
        st.count("orphans", len(expired.orphans))
        st.count("timed_out", len(expired.timed_out))
        for srid, offset in zip(expired.timed_out.srids.tolist(), expired.timed_out.offsets.tolist(), strict=True):
            st.failures.append((srid, offset, "timeout"))
        if release:
            st.recent_fails.clear()
        hold = np.concatenate([f for _, f in st.recent_fails]) if st.recent_fails else None
        failed = st.table.take_failed(hold)
        st.count("failed", len(failed))
        for srid, offset in zip(failed.srids.tolist(), failed.offsets.tolist(), strict=True):
            st.failures.append((srid, offset, "failed"))
        again = st.table.take_deferred(tick)
        for removed, reason in ((again.timed_out, "timeout"), (again.failed, "failed")):
            for srid, offset in zip(removed.srids.tolist(), removed.offsets.tolist(), strict=True):
                st.failures.append((srid, offset, reason))


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

    def decide(self, states: Mapping[int, PartitionState], decided: list[Decided]) -> None:
        """Decide every failure of every state into ``decided`` (and ``st.tombstones``).

        Afterwards every ``st.failures`` is empty: a failure whose payload could not be read
        is deferred in its table (see the module doc), never left for the commit to wait on.
        """
        now_ms = self.clock.now_ms()
        for lp, st in states.items():
            pending = st.failures
            st.failures = []
            waits: list[tuple[int, int, bool, int]] = []  # srid, offset, failed, deadline tick
            for srid, offset, reason in pending:
                payload = self.cache.pop(srid)
                if payload is None:
                    try:
                        payload = self.fetcher.fetch_raw(lp, offset, srid)
                        st.count("payload_fetches")
                    except PayloadGone as exc:
                        self._lost(lp, st, srid, offset, reason, str(exc), decided)
                        continue
                    except (DecodeError, KafkaException) as exc:
                        self._unreadable(lp, st, (srid, offset, reason), str(exc), now_ms, decided, waits)
                        continue
                st.payload_tries.pop(srid, None)
                self._decide_one(lp, st, srid, offset, reason, payload, now_ms, decided)
            if waits:
                srids, offsets, failed, deadlines = zip(*waits, strict=True)
                st.table.defer(np.array(srids, np.int64), np.array(offsets, np.int64),
                               np.array(deadlines, np.int64), np.array(failed, bool))

    def _decide_one(
        self, lp: int, st: PartitionState, srid: int, offset: int, reason: str, payload: bytes, now_ms: int,
        decided: list[Decided],
    ) -> None:
        try:
            record = PersistedRecord.decode(payload)
            if record.srid != srid:
                raise DecodeError(f"persist record holds srid {record.srid}, not {srid}")
        except DecodeError as exc:
            # Registered from its headers, but the value is no PersistedRecord: it cannot
            # be replayed. Keep it in the DLQ byte for byte and let the srid go.
            why = f"persist record of {srid} ({reason}) cannot be replayed: {exc}"
            st.count("quarantined")
            log.warning("quarantined %s[%d]@%d: %s", self.ns.persist, lp, offset, why)
            q = quarantine_record(self.ns, self.ns.persist, lp, offset, ids.encode_id(srid), payload, why)
            decided.append((0, offset, (q,)))
            st.tombstones.append((srid, OUTCOME_DLQ))
            return
        decision = decide(
            self.ns, record, reason, now_ms, self.partitions, self.replay_partitions(record.topic)
        )
        st.count(decision.kind if decision.kind == "dlq" else "replayed")
        decided.append((record.created_ms, offset, decision.records))
        st.tombstones.append((srid, decision.kind.encode()))

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
        log.warning("cannot read the payload of %d at %s[%d]@%d (%s); try %d again in %d ms",
                    srid, self.ns.persist, lp, offset, detail, tries + 1, delay_ms)
        waits.append((srid, offset, reason == "failed", self.ticker.tick_of(now_ms + delay_ms)))

    def _lost(
        self, lp: int, st: PartitionState, srid: int, offset: int, reason: str, detail: str, decided: list[Decided]
    ) -> None:
        """Dead-letter a failed record whose payload cannot be had: what is known of it."""
        st.payload_tries.pop(srid, None)
        why = f"persist record of {srid} ({reason}): {detail}"
        st.count("payload_lost")
        log.error("dead-lettered %s[%d]@%d without its value: %s", self.ns.persist, lp, offset, why)
        decided.append((0, offset, (lost_payload_record(self.ns, lp, offset, srid, why),)))
        st.tombstones.append((srid, OUTCOME_DLQ))

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
