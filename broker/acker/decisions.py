"""Failure decisions at commit time: which entries failed (timeouts, explicit fail marks),
and what becomes of each - a replay or a dead letter (broker.replay.decide).

Replays are produced in the order their originals were persisted, not the order they leave
the table (docs/design.md §6): ``created_ms``, then the persist offset (exact within a
ledger partition).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

import numpy as np
from confluent_kafka import KafkaException

from broker import ids
from broker.acker.payloads import PayloadCache, PersistFetcher
from broker.acker.state import PartitionState
from broker.errors import DecodeError
from broker.headers import OUTCOME_DLQ
from broker.ledger.clock import Clock, Ticker
from broker.replay import Outgoing, Subject, decide, quarantine_record
from broker.schemas import PersistedRecord
from broker.topics import Namespace, replay_topic

log = logging.getLogger(__name__)

# (created_ms, persist offset, records): one failed srid's outputs, with its sort key.
Decided = tuple[int, int, tuple[Outgoing, ...]]
MISSING_TOPIC_RECHECK_S = 60.0


def collect_failures(states: Iterable[PartitionState], now_ms: int, tick: int, fail_hold_ms: int) -> None:
    """Move every timed-out or explicitly failed entry from its table to ``st.failures``.

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
    ) -> None:
        self.ns = ns
        self.clock = clock
        self.ticker = ticker
        self.cache = cache
        self.fetcher = fetcher
        self._partition_counts = partition_counts
        self._replay_topics: dict[str, tuple[int | None, float]] = {}
        self.partitions = 0  # P, known once the service has checked the topics
        # srid -> why the broker refused its replay for good (broker.acker.refusals): such a
        # srid is dead-lettered instead of being replayed into the same refusal again.
        self.refused: Mapping[Subject, str] = {}

    def decide(self, lp: int, st: PartitionState, decided: list[Decided]) -> None:
        """Decide every failure of ``st``; a payload that cannot be read stays in
        ``st.failures`` for the next commit (a failed record is never dropped)."""
        now_ms = self.clock.now_ms()
        pending = st.failures
        st.failures = []
        for srid, offset, reason in pending:
            payload = self.cache.pop(srid)
            if payload is None:
                try:
                    payload = self.fetcher.fetch_raw(lp, offset, srid)
                    st.count("payload_fetches")
                except (DecodeError, KafkaException) as exc:
                    # Never drop a failed record: try again at the next commit.
                    log.error("cannot read payload of %d (%s); retrying", srid, exc)
                    st.failures.append((srid, offset, reason))
                    continue
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
                continue
            refused = self.refused.get(srid)
            decision = decide(
                self.ns, record, reason, now_ms, self.partitions, self.replay_partitions(record.topic), refused
            )
            st.count(decision.kind if decision.kind == "dlq" else "replayed")
            if refused is not None and decision.kind == "dlq":
                st.count("refused")
            decided.append((record.created_ms, offset, decision.records))
            st.tombstones.append((srid, decision.kind.encode()))

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
