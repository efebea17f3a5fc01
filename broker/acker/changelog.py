"""Restoring ledger partitions from their changelog ``ns.ledger[i]``, and standby tailing.

A partition's table is the last value per key of its changelog: ``LedgerEntry`` upserts,
tombstones for entries that left, and the ``__counters__`` record. Reading it from offset
``o`` onto a state that already reflects everything before ``o`` gives the same table as a
full read, because the last record of each key wins. Standby states are kept for partitions
this instance does not own, with the next changelog offset to read, so getting one of them
is a catch-up read instead of a restore (docs/design.md §5).

That holds only while the suffix still holds every record written after the state's offset.
Compaction drops a tombstone ``delete.retention.ms`` after it cleaned it (the entry's
earlier upserts went at the first cleaning), and retention or DeleteRecords move the log
start: a suffix read after either misses that the entry left, and a completed entry comes
back from the kept state, to be timed out and replayed. So a kept state is reused only when

- its offset is at or after the partition's log start (low watermark), and
- nothing was written after its offset, or everything after its offset was written less
  than ``delete.retention.ms`` (of ``ns.ledger``, read once at start) ago, less a margin for
  the read itself and for clock differences. "Written after" is bounded by the time the
  state was frozen (a revoked partition), began a read from the beginning (a new standby),
  or the create time of the last record it read (a standby tailing);

otherwise the partition is restored from the beginning.

The restorer reads for many jobs at once (``read_for`` adds a partition to its assignment,
``pump`` hands each job the records of its own partition): a restore of 1 000 small
partitions is a few fetches, not a thousand round trips, and their watermarks come in one
batch (``marks_of``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from broker import kafka_io
from broker.acker.state import PartitionState
from broker.kafka_errors import Meaning, means
from broker.ledger.adaptive import AutoRegistrations
from broker.ledger.clock import Clock, SystemClock, Ticker
from broker.ledger.entries import FAILED
from broker.ledger.outages import ClockStops
from broker.ranges import counted
from broker.schemas import COUNTERS_KEY, LedgerCounters, LedgerEntry
from broker.topics import Namespace

log = logging.getLogger(__name__)

MIN_REUSE_MARGIN_MS = 60_000
"""At least this much of ``delete.retention.ms`` is kept back when judging a kept state."""


def reuse_limit_ms(retention_ms: int | None) -> int | None:
    """How long after it was last known complete a kept state may be reused: the tombstone
    retention less a margin (a tenth, at least a minute) for the suffix read and for clock
    differences between this host and the brokers. None: unknown, never on age alone."""
    if retention_ms is None:
        return None
    return retention_ms - max(MIN_REUSE_MARGIN_MS, retention_ms // 10)


class Reader(Protocol):
    """A job the restorer reads for (a ``RestoreJob``, or broker.acker.unlogged's)."""

    reading: bool
    done: bool


# The records (and end-of-partition events) of a reader's partition, in log order.
Chunk = Callable[[list[Message]], None]
# (topic, partitions) -> partition -> (low, high) watermark, in one batch.
Marks = Callable[[str, list[int]], dict[int, tuple[int, int]]]

# At most this many partitions are read at once; the others wait their turn.
MAX_READING = 256
# Watermarks of more partitions than this come in one admin batch; fewer are asked on the
# restorer, one round trip each (no admin client to connect inside an assignment callback).
BATCH_MARKS_FROM = 16


@dataclass
class RestoreJob:
    """A partition being restored from ``start`` (or caught up from a kept ``state``)."""

    lp: int
    state: PartitionState | None
    start: int
    low: int
    high: int
    reused: bool
    read: int = 0
    reading: bool = False  # the restorer is assigned to it
    done: bool = False
    began: float = field(default_factory=time.monotonic)


class ChangelogReader:
    """Reads ``ns.ledger`` partitions: full restores, catch-ups, and standby tails."""

    def __init__(
        self,
        ns: Namespace,
        ticker: Ticker,
        new_state: Callable[[], PartitionState],
        restorer: Consumer,
        standby_consumer: Consumer | None,
        clock: Clock | None = None,
        marks: Marks | None = None,
    ) -> None:
        self.ns = ns
        self.ticker = ticker
        # An empty state counting into the instance's totals (broker.acker.owned), for a
        # partition restored from the beginning.
        self.new_state = new_state
        self.clock = clock or SystemClock()
        # delete.retention.ms of ns.ledger, set by the service at start (None: unknown).
        self.tombstone_retention_ms: int | None = None
        self._restorer = restorer
        self._standby_consumer = standby_consumer
        # Partitions not owned: lp -> (state, next changelog offset). Warm states of revoked
        # partitions, and with a standby consumer every other partition, tailed as it changes.
        self.standby: dict[int, tuple[PartitionState, int]] = {}
        # lp -> ms: every changelog record after the standby state's offset was written after
        # this time (freeze, start of a read from the beginning, last record read).
        self.fresh_ms: dict[int, int] = {}
        self._caught_up: set[int] = set()  # standby partitions logged as caught up once
        self._marks = marks
        # (topic, partition) the restorer is assigned -> the job it reads for, its handler
        self._reading: dict[tuple[str, int], tuple[Reader, Chunk]] = {}
        self._reader_keys: dict[int, tuple[str, int]] = {}  # id(job) -> its partition

    def watermarks(self, lp: int, topic: str | None = None) -> tuple[int, int]:
        """Low and high watermark of partition ``lp`` of ``topic`` (default: the changelog)."""
        topic = topic or self.ns.ledger
        tp = TopicPartition(topic, lp)

        def query() -> tuple[int, int]:
            try:
                return self._restorer.get_watermark_offsets(tp, timeout=30)
            except KafkaException as exc:
                if means(exc, Meaning.STALE_METADATA):
                    # The partition is missing from this client's metadata (it can stay so for
                    # long after a node of the cluster crashed), or its leader moved (as it does
                    # while many partitions are created on a busy node): ask for the topic's
                    # metadata, so the next try knows the partition and its leader.
                    with contextlib.suppress(KafkaException):
                        self._restorer.list_topics(topic, timeout=5)
                raise

        # Called in the assignment callback: a leader moving must not kill the acker.
        low, high = kafka_io.retrying(query, f"watermarks of {topic}[{lp}]")
        return int(low), int(high)

    def marks_of(self, lps: Iterable[int], topic: str | None = None) -> dict[int, tuple[int, int]]:
        """The watermarks of many partitions in one batch (``watermarks`` asks one partition per
        round trip, too slow for a thousand partitions on a loaded cluster); what the batch
        could not give is asked one by one."""
        topic = topic or self.ns.ledger
        lps = sorted(set(lps))
        got: dict[int, tuple[int, int]] = {}
        if self._marks is not None and len(lps) > BATCH_MARKS_FROM:
            try:
                got = self._marks(topic, lps)
            except KafkaException as exc:
                log.warning("the watermarks of %d partitions of %s in one batch failed (%s); asking one by one",
                            len(lps), topic, exc)
        return {lp: got[lp] if lp in got else self.watermarks(lp, topic) for lp in lps}

    def end(self, lp: int) -> int:
        return self.watermarks(lp)[1]

    def take(self, lp: int) -> tuple[PartitionState, int, bool]:
        """Partition ``lp`` restored: from its standby state when there is one and it is safe
        to reuse (a catch-up read), else from the beginning. Returns the state, the records
        read, and whether the standby state was reused."""
        job = self.begin(lp)
        while not self.advance(job, budget_s=None):
            pass
        assert job.state is not None
        return job.state, job.read, job.reused

    def begin(self, lp: int, marks: tuple[int, int] | None = None) -> RestoreJob:
        """A restore of ``lp`` to be run by ``advance`` (or ``start`` and ``pump``), from its
        standby state when there is one and it is safe to reuse, else from the beginning.
        ``marks``: its changelog's watermarks, when just asked (``marks_of``)."""
        standby = self.standby.pop(lp, None)
        fresh_ms = self.fresh_ms.pop(lp, None)
        low, high = marks if marks is not None else self.watermarks(lp)
        if standby is not None:
            st, start = standby
            why = self.unsafe(start, fresh_ms, low, high)
            if why is None:
                return RestoreJob(lp, st, start, low, high, reused=True)
            log.info("ledger partition %d: kept state at offset %d not reused (%s); restoring it", lp, start, why)
        return RestoreJob(lp, None, OFFSET_BEGINNING, low, high, reused=False)

    def start(self, job: RestoreJob) -> None:
        """Begin reading ``job``'s changelog (the restorer adds its partition); an empty
        suffix is done at once."""
        if job.done or job.reading:
            return
        if job.state is None:
            job.state = self.new_state()
        if job.high <= max(job.low, job.start):
            job.done = True
            return
        # From the start again if the read was cancelled meanwhile: re-applying records in
        # log order leaves the same table.
        self.read_for(job, TopicPartition(self.ns.ledger, job.lp, job.start), lambda msgs: self._restored(job, msgs))

    def advance(self, job: RestoreJob, budget_s: float | None) -> bool:
        """Read and apply ``job``'s changelog for about ``budget_s`` (None: to its end).
        Records are applied chunk by chunk, in log order - the last record of a key wins
        either way. True once the job reached the end it saw when it began."""
        self.start(job)
        return self.drive(job, budget_s)

    def drive(self, job: Reader, budget_s: float | None) -> bool:
        """Pump the restorer (every job it reads for) until ``job`` is done or about
        ``budget_s`` passed (None: until done)."""
        deadline = None if budget_s is None else time.monotonic() + budget_s
        while not job.done:
            # consume() waits out its whole timeout unless 10 000 messages arrive: a long
            # one would cost every restored partition a second, however small.
            self.pump(0.05)
            if deadline is not None and time.monotonic() >= deadline:
                break
        return job.done

    def _restored(self, job: RestoreJob, msgs: list[Message]) -> None:
        assert job.state is not None
        latest: dict[bytes, bytes | None] = {}
        eof = False
        for msg in msgs:
            err = msg.error()
            if err is None:
                latest[msg.key() or b""] = msg.value()
                job.read += 1
            elif err.code() == KafkaError._PARTITION_EOF:
                eof = True
            else:
                raise KafkaException(err)
        self.apply(job.state, latest)
        if eof:
            job.done = True
            self.cancel(job)

    @property
    def restorer(self) -> Consumer:
        return self._restorer

    @property
    def reading(self) -> int:
        """How many partitions the restorer reads at once now."""
        return len(self._reading)

    def read_for(self, job: Reader, tp: TopicPartition, chunk: Chunk) -> None:
        """The restorer reads ``tp`` for ``job`` beside whatever else it reads: ``pump``
        hands ``chunk`` the partition's records."""
        if job.reading:
            return
        key = (tp.topic, tp.partition)
        if key in self._reading:  # another job of the same partition: it starts again later
            self.cancel(self._reading[key][0])
        self._restorer.incremental_assign([tp])
        self._reading[key] = (job, chunk)
        self._reader_keys[id(job)] = key
        job.reading = True

    def pump(self, timeout_s: float) -> None:
        """One fetch of the restorer: each job gets its partition's records, in log order."""
        if not self._reading:
            return
        chunks: dict[tuple[str, int], list[Message]] = defaultdict(list)
        for msg in self._restorer.consume(10_000, timeout_s):
            chunks[(msg.topic() or "", msg.partition() or 0)].append(msg)
        for key, msgs in chunks.items():
            reader = self._reading.get(key)
            if reader is None:
                continue  # fetched before its job was done or cancelled
            job, chunk = reader
            try:
                chunk(msgs)
            except BaseException:
                self.cancel(job)
                raise

    def cancel(self, job: Reader) -> None:
        """Stop reading for ``job`` (revoked while restoring, or done)."""
        if not job.reading:
            return
        job.reading = False
        key = self._reader_keys.pop(id(job), None)
        if key is None or self._reading.get(key, (None,))[0] is not job:
            return
        del self._reading[key]
        with contextlib.suppress(KafkaException, RuntimeError):
            self._restorer.incremental_unassign([TopicPartition(*key)])

    def unsafe(self, start: int, fresh_ms: int | None, low: int, high: int) -> str | None:
        """Why a state reflecting the changelog up to ``start`` cannot be caught up by a
        suffix read (None: it can)."""
        if start == OFFSET_BEGINNING:
            return None  # nothing read yet: the "suffix" is the whole log
        if start < low:
            return f"the changelog now starts at offset {low}: records after the state are gone"
        if start > high:
            return f"the changelog now ends at offset {high}, before the state"
        if start == high:
            return None  # nothing written since: no tombstone to miss
        limit = reuse_limit_ms(self.tombstone_retention_ms)
        if limit is None:
            return "delete.retention.ms of the changelog is unknown"
        if fresh_ms is None:
            return "its age is unknown"
        age = self.clock.now_ms() - fresh_ms
        if age >= limit:
            return (
                f"{age / 1000:.0f}s old: compaction may have dropped tombstones written since "
                f"(delete.retention.ms={self.tombstone_retention_ms}, reused up to {limit / 1000:.0f}s)"
            )
        return None

    def keep_warm(self, states: dict[int, PartitionState]) -> None:
        """Keep the states of revoked partitions, each equal to its changelog up to its end
        once the entries the changelog leaves out are dropped (another owner may complete
        them without a changelog tombstone; a restore reads them back from ``ns.persist``)."""
        if not states:
            return
        # Taken before the ends are asked: whatever lies past an end was written after it.
        now = self.clock.now_ms()
        ends = self.marks_of(states)
        for lp, st in states.items():
            st.table.drop_unlogged()
            self.fresh_ms[lp] = now
            self.standby[lp] = (st, ends[lp][1])

    def load(
        self, lp: int, st: PartitionState | None, start: int, watermarks: tuple[int, int] | None = None
    ) -> tuple[PartitionState, int]:
        """Read ``ns.ledger[lp]`` from ``start`` to its end onto ``st`` (a fresh state when
        None). The last record of each key wins, so re-reading records a state already
        reflects is harmless. Returns the state and the number of records read."""
        low, high = watermarks if watermarks is not None else self.watermarks(lp)
        job = RestoreJob(lp, st, start, low, high, reused=False)
        while not self.advance(job, budget_s=None):
            pass
        assert job.state is not None
        return job.state, job.read

    def apply(self, st: PartitionState, latest: dict[bytes, bytes | None]) -> None:
        """Apply changelog records (the last per key) to a table: upserts and tombstones."""
        raw_counters = latest.pop(COUNTERS_KEY, None)
        if raw_counters:
            record = LedgerCounters.decode(raw_counters)
            # The stopped clock travels with the counters (broker.ledger.outages).
            st.stops, st.counters = ClockStops.from_counters(record.counters)
            # Written with the last change of the table (every change of its pending entries
            # is counted): the restored table's figures. The oldest entry's time is the one
            # registration time known (None in an older record: computed when needed).
            st.pending = record.pending
            st.oldest_pending_offset, st.oldest_pending_ms = record.oldest_pending_offset, record.oldest_pending_ms
            st.registrations.reset(record.oldest_pending_offset, record.oldest_pending_ms)
            st.floor = record.restore_floor  # where ns.persist holds what this changelog leaves out
        elif latest:
            st.pending = None  # entries after the last counters record: unknown until computed
        if latest:
            # Entries another owner registered: no registration times of ours cover them.
            st.auto_runs = AutoRegistrations()
        gone = [k for k, v in latest.items() if v is None and len(k) == 8]
        if gone:
            srids = np.frombuffer(b"".join(gone), dtype=">i8").astype(np.int64)
            st.table.remove(srids)
            for srid in srids.tolist():
                st.timed_out_at.pop(srid, None)
                st.rejections.pop(srid, None)
                st.retry_at.pop(srid, None)
        live = [(k, v) for k, v in latest.items() if v is not None and len(k) == 8]
        if live:
            entries = [LedgerEntry.decode(v) for _, v in live]
            srids = np.frombuffer(b"".join(k for k, _ in live), dtype=">i8").astype(np.int64)
            # A deferred timeout's windows run from when it timed out, a failed one's back-off
            # from when it ended, as its first owner saw it (broker.acker.decisions): a new
            # owner continues them.
            for srid, e in zip(srids.tolist(), entries, strict=True):
                failed = e.flags & FAILED
                if e.timed_out_ms >= 0 and not failed:
                    st.timed_out_at[srid] = e.timed_out_ms
                elif st.timed_out_at:
                    st.timed_out_at.pop(srid, None)
                if e.timed_out_ms >= 0 and failed:
                    st.failed_at[srid] = e.timed_out_ms
                elif st.failed_at:
                    st.failed_at.pop(srid, None)
                if e.rejection:
                    st.rejections[srid] = e.rejection
                elif st.rejections:
                    st.rejections.pop(srid, None)
                if e.retry_at_ms >= 0:
                    st.retry_at[srid] = e.retry_at_ms
                elif st.retry_at:
                    st.retry_at.pop(srid, None)
            st.table.restore(
                srids,
                np.array([e.value for e in entries], dtype=np.int64),
                np.array([e.flags for e in entries], dtype=np.int64),
                np.array([e.persist_offset for e in entries], dtype=np.int64),
                self.ticker.ticks_of(np.array([e.deadline_ms for e in entries], dtype=np.int64)),
            )

    # ------------------------------------------------------------------ standby

    def assign_standby(self, partitions: int, owned: Iterable[int]) -> None:
        """With a standby consumer, tail the changelog of every partition not ``owned``."""
        if self._standby_consumer is None:
            return
        owned = set(owned)
        for lp in range(partitions):
            if lp not in owned and lp not in self.standby:
                self.standby[lp] = (self.new_state(), OFFSET_BEGINNING)
                self.fresh_ms[lp] = self.clock.now_ms()  # a read from the beginning starts
        self._standby_consumer.assign(
            [TopicPartition(self.ns.ledger, lp, offset) for lp, (_, offset) in self.standby.items()]
        )

    def poll_standby(self) -> None:
        if self._standby_consumer is None or not self.standby:
            return
        self._caught_up &= self.standby.keys()  # owned since: logged again when it is standby again
        latest: dict[int, dict[bytes, bytes | None]] = defaultdict(dict)
        for msg in self._standby_consumer.consume(10_000, 0):
            if msg.error() is None and msg.partition() in self.standby:
                latest[msg.partition()][msg.key() or b""] = msg.value()
                st, _ = self.standby[msg.partition()]
                self.standby[msg.partition()] = (st, msg.offset() + 1)
                # Whatever follows this record was written after it was created.
                kind, ts = msg.timestamp()
                if kind != TIMESTAMP_NOT_AVAILABLE:
                    self.fresh_ms[msg.partition()] = max(self.fresh_ms.get(msg.partition(), ts), ts)
        for lp, records in latest.items():
            self.apply(self.standby[lp][0], records)
        self._note_caught_up()

    def _note_caught_up(self) -> None:
        """Log the standby partitions read to their ends since the last call (each once while
        it stays standby), in one line. The consumer's position, not the last record read,
        says how far: the changelog ends with a transaction's commit marker, which takes an
        offset and is never delivered; a partition with nothing to read has no position and
        counts once its cached watermarks meet."""
        assert self._standby_consumer is not None
        waiting = [TopicPartition(self.ns.ledger, lp) for lp in sorted(self.standby.keys() - self._caught_up)]
        if not waiting:
            return
        caught: list[int] = []
        for tp in self._standby_consumer.position(waiting):
            low, high = self._standby_consumer.get_watermark_offsets(tp, cached=True)
            if high is None or high < 0:
                continue  # not fetched yet
            at = tp.offset if tp.offset >= 0 else self.standby[tp.partition][1]
            if at >= high or low == high:
                caught.append(tp.partition)
        if caught:
            self._caught_up.update(caught)
            log.info("standby of ledger partitions %s caught up", counted(caught))

    def close(self) -> None:
        self._restorer.close()
        if self._standby_consumer is not None:
            self._standby_consumer.close()
