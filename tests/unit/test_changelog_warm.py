"""Warm and standby states (broker.acker.changelog) against an in-memory compacted ledger.

A warm state reflects ``ns.ledger[i]`` up to the offset it was frozen at; getting the
partition back reads only the suffix. That is only right while the suffix still holds every
tombstone written after the freeze: compaction drops tombstones ``delete.retention.ms`` after
cleaning them, and retention or DeleteRecords can move the log start past the freeze. Then a
completed entry comes back from the warm state and is timed out and replayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    TIMESTAMP_CREATE_TIME,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from broker import ids
from broker.acker.changelog import ChangelogReader
from broker.acker.owned import OwnedPartitions
from broker.ledger.clock import ManualClock, Ticker
from broker.schemas import encode_ledger_entry
from broker.topics import Namespace

NS = Namespace("warm")
T0 = 1_700_000_000_000
HOUR = 3_600_000
X, Y, Z = 2, 4, 6  # srids


@dataclass
class Rec:
    offset: int
    key: bytes
    value: bytes | None
    ts: int


class Msg:
    def __init__(self, rec: Rec) -> None:
        self.rec = rec

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return NS.ledger

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self.rec.offset

    def key(self) -> bytes:
        return self.rec.key

    def value(self) -> bytes | None:
        return self.rec.value

    def timestamp(self) -> tuple[int, int]:
        return (TIMESTAMP_CREATE_TIME, self.rec.ts)


class Eof:
    def error(self) -> KafkaError:
        return KafkaError(KafkaError._PARTITION_EOF)

    def topic(self) -> str:
        return NS.ledger

    def partition(self) -> int:
        return 0


class Ledger:
    """``ns.ledger[0]``: offsets, a log start, compaction as Kafka does it (records vanish,
    offsets stay)."""

    def __init__(self) -> None:
        self.records: list[Rec] = []
        self.low = 0
        self.high = 0

    def put(self, srid: int, ts: int, *, tombstone: bool = False) -> None:
        value = None if tombstone else encode_ledger_entry(srid + 1, 1, 0, T0 + HOUR)
        self.records.append(Rec(self.high, ids.encode_id(srid), value, ts))
        self.high += 1

    def compact_away(self, srid: int) -> None:
        """The cleaner dropped every record of ``srid`` - the tombstone too, its
        delete.retention.ms having passed."""
        self.records = [r for r in self.records if r.key != ids.encode_id(srid)]

    def delete_records_before(self, offset: int) -> None:
        self.records = [r for r in self.records if r.offset >= offset]
        self.low = offset


class LedgerConsumer:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.at: int | None = None
        self.queries = 0

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, OFFSET_INVALID if self.at is None else self.at) for tp in tps]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        self.queries += not cached
        return (self.ledger.low, self.ledger.high)

    def assign(self, tps: list[TopicPartition]) -> None:
        (tp,) = tps
        self.at = self.ledger.low if tp.offset == OFFSET_BEGINNING else max(tp.offset, self.ledger.low)

    incremental_assign = assign

    def unassign(self) -> None:
        self.at = None

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        self.at = None

    def consume(self, *_: Any) -> list[Any]:
        if self.at is None:
            return []
        out: list[Any] = [Msg(r) for r in self.ledger.records if r.offset >= self.at]
        self.at = self.ledger.high
        return [*out, Eof()]

    def close(self) -> None:
        pass


def changelog_over(ledger: Ledger, clock: ManualClock, retention_ms: int | None = HOUR) -> ChangelogReader:
    changelog = ChangelogReader(NS, Ticker(100, T0), OwnedPartitions().new_state, LedgerConsumer(ledger), None)  # type: ignore[arg-type]
    changelog.clock = clock  # the acker's clock
    changelog.tombstone_retention_ms = retention_ms  # ns.ledger's delete.retention.ms, read at start
    return changelog


def revoked_with_x_and_y(clock: ManualClock) -> tuple[Ledger, ChangelogReader]:
    """This acker owned partition 0 holding X and Y, and lost it (its state kept warm)."""
    ledger = Ledger()
    ledger.put(X, T0)
    ledger.put(Y, T0)
    changelog = changelog_over(ledger, clock)
    st, _, _ = changelog.take(0)
    assert X in st.table and Y in st.table
    changelog.keep_warm({0: st})
    return ledger, changelog


def test_a_warm_state_older_than_the_tombstone_retention_is_not_reused() -> None:
    clock = ManualClock(T0)
    ledger, changelog = revoked_with_x_and_y(clock)
    # Another owner completes X (tombstone) and registers Z; two hours later the cleaner has
    # removed X's tombstone: the suffix no longer says that X left.
    clock.advance(60_000)
    ledger.put(X, clock.now_ms(), tombstone=True)
    ledger.put(Z, clock.now_ms())
    clock.advance(2 * HOUR)
    ledger.compact_away(X)
    st, _, reused = changelog.take(0)
    assert X not in st.table, "a completed entry came back from a warm state older than delete.retention.ms"
    assert Y in st.table and Z in st.table and not reused


def test_a_warm_state_whose_suffix_starts_before_the_log_start_is_not_reused() -> None:
    clock = ManualClock(T0)
    ledger, changelog = revoked_with_x_and_y(clock)
    ledger.put(X, clock.now_ms(), tombstone=True)  # offset 2
    ledger.put(Z, clock.now_ms())  # offset 3
    ledger.delete_records_before(3)  # the suffix from 2 is gone, tombstone of X with it
    clock.advance(60_000)  # young
    st, _, reused = changelog.take(0)
    assert X not in st.table and Z in st.table and not reused


def test_a_young_warm_state_is_reused_and_only_the_suffix_is_read() -> None:
    clock = ManualClock(T0)
    ledger, changelog = revoked_with_x_and_y(clock)
    clock.advance(60_000)
    ledger.put(X, clock.now_ms(), tombstone=True)
    ledger.put(Z, clock.now_ms())
    clock.advance(10 * 60_000)
    st, read, reused = changelog.take(0)
    assert reused and read == 2
    assert X not in st.table and Y in st.table and Z in st.table


def test_an_old_warm_state_with_nothing_written_since_is_reused() -> None:
    """Nothing after the freeze: there is no tombstone to miss, however long ago it was."""
    clock = ManualClock(T0)
    _, changelog = revoked_with_x_and_y(clock)
    clock.advance(30 * 24 * HOUR)
    st, read, reused = changelog.take(0)
    assert reused and read == 0 and X in st.table and Y in st.table


def test_without_a_known_retention_only_an_unchanged_warm_state_is_reused() -> None:
    clock = ManualClock(T0)
    ledger, changelog = revoked_with_x_and_y(clock)
    changelog.tombstone_retention_ms = None  # describe_configs failed at start
    ledger.put(Z, clock.now_ms())
    st, read, reused = changelog.take(0)
    assert not reused and read == 3  # a full restore: X, Y, Z
    assert all(srid in st.table for srid in (X, Y, Z))


def test_a_standby_tailing_the_changelog_stays_reusable() -> None:
    """A standby state is as fresh as the last record it read, not as its freeze."""
    clock = ManualClock(T0)
    ledger = Ledger()
    ledger.put(X, T0)
    tail = LedgerConsumer(ledger)
    changelog = ChangelogReader(NS, Ticker(100, T0), OwnedPartitions().new_state, LedgerConsumer(ledger), tail)  # type: ignore[arg-type]
    changelog.clock = clock
    changelog.tombstone_retention_ms = HOUR
    changelog.assign_standby(1, owned=[])
    for _ in range(5):  # 5 hours of traffic, tailed as it comes
        clock.advance(HOUR)
        ledger.put(Y, clock.now_ms())
        changelog.poll_standby()
    clock.advance(60_000)
    ledger.put(X, clock.now_ms(), tombstone=True)  # not tailed yet
    st, read, reused = changelog.take(0)
    assert reused and read == 1 and X not in st.table and Y in st.table


class _MetadataLost:
    """A restorer whose metadata lost the ledger partition until it asks for the topic."""

    def __init__(self) -> None:
        self.known = False
        self.asked: list[str] = []

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        if not self.known:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        return 0, 7

    def list_topics(self, topic: str, timeout: float) -> None:
        self.asked.append(topic)
        self.known = True


def test_a_partition_missing_from_the_restorers_metadata_is_looked_up_again_not_retried_blind() -> None:
    restorer = _MetadataLost()
    changelog = ChangelogReader(NS, Ticker(100, T0), OwnedPartitions().new_state, restorer, None)  # type: ignore[arg-type]
    assert changelog.watermarks(2) == (0, 7)
    assert restorer.asked == [NS.ledger]


def test_a_warm_state_is_kept_without_the_entries_its_changelog_leaves_out() -> None:
    """Another owner may complete an entry the changelog leaves out without a changelog
    tombstone: a kept state must not bring it back (a restore reads it from ns.persist)."""
    clock = ManualClock(T0)
    ledger = Ledger()
    ledger.put(X, T0)
    changelog = changelog_over(ledger, clock)
    st, _, _ = changelog.take(0)
    st.table.register(np.array([Z]), np.array([7]), np.array([3]), np.array([100], np.int32))  # unlogged
    st.table.take_dirty()
    assert Z in st.table
    changelog.keep_warm({0: st})
    st, _, reused = changelog.take(0)
    assert reused and X in st.table and Z not in st.table
