"""The acker's commit: everything decided since the last one, in ONE Kafka transaction.

In this order (docs/design.md §5):
1. tombstones to ``ns.persist`` for completed, replayed and dead-lettered srids; a replayed
   or dead-lettered one with ``rb-outcome`` saying which, a completion without a header
   (``broker.headers.outcome_of``; a header costs the produce a few microseconds);
2. replay records (persist + ``<topic>.replay``), DLQ and quarantine records (and dead
   letters of records whose payload was lost), each with a delivery callback: what the
   broker refuses for good is remembered (broker.acker.refusals) and decided differently
   after the rewind; a record to a topic or partition that does not exist (any more) is
   refused before it is produced - it would fail every attempt;
3. changelog: upserts for entries that changed and are alive - failures whose decision was
   deferred (payload not readable yet, or a held dead letter) included, so they wait durably,
   a timeout with the time it timed out - tombstones for
   entries that left (entries born and gone inside one interval never touch it), and the
   partition's counters with its pending figures (count, oldest offset and registration
   time), so ``replaybroker status`` reads one record per partition, and its restore floor.
   The changelog holds what ``ns.persist`` does not: an entry whose persist record is all of
   it (registered with the record's deadline, nothing else yet) is left out for at most
   ``AckerConfig.unlogged_ms`` of the acker's clock, and needs no tombstone when it leaves
   unlogged; a restore reads it back from ``ns.persist`` from the floor (broker.acker.unlogged);
4. the input offsets (``send_offsets_to_transaction``) of the owned input partitions that
   moved since the last commit and of those it writes for (all of them when that is none),
   then the commit. The group coordinator checks these offsets against the member's
   generation: an acker that lost its partitions (it stalled, another member took over) has
   its commit refused, so a zombie writes nothing. A transaction without offsets would not be
   checked, so there is none.
A crash anywhere before the commit aborts all of it: the next owner restores the changelog
and resumes from the committed offsets, so each event is reflected exactly once.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import TypeVar

import numpy as np
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from broker import kafka_io
from broker.acker.live import LiveClients
from broker.acker.refusals import Refusals
from broker.acker.replay import Outgoing
from broker.acker.replay_topics import ReplayTopics, Unknown
from broker.acker.state import PartitionState
from broker.headers import H_OUTCOME, OUTCOME_COMPLETED
from broker.kafka_errors import Meaning, means
from broker.ledger.clock import Ticker
from broker.ledger.entries import DEFERRED, FAILED, Entries
from broker.schemas import COUNTERS_KEY, LedgerCounters, encode_ledger_entries
from broker.topics import Namespace

T = TypeVar("T")


@dataclass
class Batch:
    """What one transaction writes."""

    tombstones: list[tuple[int, list[bytes], bytes]] = field(default_factory=list)  # lp, srid keys, outcome
    records: list[Outgoing] = field(default_factory=list)
    # lp, keys, their values (None: tombstones for all of them)
    changelog: list[tuple[int, list[bytes], list[bytes] | None]] = field(default_factory=list)
    positions: list[TopicPartition] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.tombstones or self.records or self.changelog or self.positions)


def take_changes(
    states: Iterable[tuple[int, PartitionState]], ticker: Ticker, now_ms: int, batch: Batch,
    positions: Mapping[tuple[str, int], int], persist: str, unlogged_ms: int,
) -> None:
    """Move each state's due tombstones and changelog delta (and dirty counters) into
    ``batch``; ``positions`` are the input positions the transaction commits (``persist``:
    the persist topic's name), ``unlogged_ms`` how long (on the clock of ``now_ms``) an
    entry may stay unlogged."""
    for lp, st in states:
        # Where the committed persist input resumes (none known: 0, a floor never too high).
        position = positions.get((persist, lp), 0)
        st.log_old_entries(now_ms, position, unlogged_ms)
        for srids, outcome in st.tombstones:
            batch.tombstones.append((lp, _keys(srids), outcome))
        st.tombstones = []
        delta = st.table.take_dirty()
        up = delta.upserts
        changed = bool(len(up) or len(delta.tombstones))
        if len(up):
            # Values encoded column-wise (numpy varints: fastavro's bytes without a dict or
            # big-int arithmetic per entry).
            values = encode_ledger_entries(
                up.values, up.flags, up.offsets, ticker.ms_of_ticks(up.deadlines), timed_out_column(st, up),
                rows_of(st.rejections, up), rows_of(st.retry_at, up),
            )
            batch.changelog.append((lp, _keys(up.srids), values))
        if len(delta.tombstones):
            batch.changelog.append((lp, _keys(delta.tombstones), None))
        # The pending figures change only with a registration or a decision, which are
        # counted: they are computed (one scan of the table) when the counters go out - with
        # every change of the partition's changelog, and so with its restore floor.
        if st.counters_dirty or changed:
            st.summarize()
            st.floor = restore_floor(st, position)
            record = LedgerCounters(
                {**st.counters, **st.stops.as_counters()}, now_ms, st.pending, st.oldest_pending_offset, st.oldest_pending_ms, st.floor
            )
            batch.changelog.append((lp, [COUNTERS_KEY], [record.encode()]))
            st.counters_dirty = False


def timed_out_column(st: PartitionState, up: Entries) -> np.ndarray | None:
    """When each deferred timeout among ``up`` timed out, and when each failed one ended (it
    timed out before, or its fail mark was folded) - -1 for every other entry; None: there is
    none. Its changelog record carries it, so that a new owner continues the windows and the
    back-off that run from it (docs/design.md §6) instead of starting them again."""
    if not st.timed_out_at and not st.failed_at:
        return None
    ended = np.flatnonzero((up.flags & (DEFERRED | FAILED)) != 0)
    if not ended.size:
        return None
    column = np.full(len(up), -1, np.int64)
    timed_out, failed = st.timed_out_at.get, st.failed_at.get
    for i, srid, flags in zip(ended.tolist(), up.srids[ended].tolist(), up.flags[ended].tolist(), strict=True):
        at = timed_out(srid, -1)
        if flags & FAILED and at < 0:
            at = failed(srid, -1)
        column[i] = at
    return column


def rows_of(kept: Mapping[int, T], up: Entries) -> dict[int, T] | None:
    """Row -> what ``kept`` holds for the entries among ``up`` (None: there is none): a
    rejection's why, a retry time. Their changelog records carry it, so a new owner decides
    them as this one would: dead-letters them with the why, replays them at that time."""
    if not kept:
        return None
    rows = {i: kept[s] for i, s in enumerate(up.srids.tolist()) if s in kept}
    return rows or None


def restore_floor(st: PartitionState, position: int) -> int:
    """Where a restore of this partition starts reading ``ns.persist``, written with the
    counters in the transaction that commits the persist input at ``position``
    (docs/design.md §5): the smallest persist offset of a live entry the changelog leaves
    out, else ``position``.

    Never too high: right after ``take_dirty`` every entry left out of the changelog is in
    the table unlogged (a DIRTY one was just logged), so the minimum over them is at or below
    each of them; every one was registered from an offset below ``position``. A record
    carrying an older floor stays safe until the next one: the floor only moves up - the
    entries left out later were registered at or after ``position``, or again by a restore
    from at or after the floor it read."""
    floor = st.table.unlogged_floor()
    return position if floor < 0 else min(floor, position)


def _keys(srids: np.ndarray | Sequence[int]) -> list[bytes]:
    """The 8-byte big-endian keys of ``srids``, packed at once."""
    packed = np.asarray(srids, dtype=">i8").tobytes()
    return [packed[i : i + 8] for i in range(0, len(packed), 8)]


class Transactions:
    """Writes a ``Batch`` atomically (or, with ``exactly_once`` off, just flushes it)."""

    def __init__(self, ns: Namespace, live: LiveClients, refusals: Refusals, *, exactly_once: bool) -> None:
        self.ns = ns
        self.live = live  # the producer and consumer as they are now: either may be replaced
        self.refusals = refusals
        self.exactly_once = exactly_once
        # When the transaction that is open now (or that failed and was not aborted yet) was
        # begun, on this process's monotonic clock; None when none is open.
        self.open_since: float | None = None
        # The producer is blocked in a call left behind (``left_behind_ms``): not used again.
        self.stuck = False
        # The replay topics' partition counts, asked again at every commit (``_partition_counts``).
        self.output_counts = ReplayTopics(self._look_up, max_age_s=0.0)

    def outlived(self, timeout_ms: int) -> bool:
        """Whether the open transaction is older than ``transaction.timeout.ms``: then its
        coordinator may have aborted it itself, which bumps the producer's epoch - a fencing
        error after that comes from the coordinator, not from a newer instance (the
        coordinator times a transaction from its first partition, later than our begin)."""
        return self.open_since is not None and time.monotonic() - self.open_since >= timeout_ms / 1000

    def write(self, batch: Batch) -> None:
        """Raises KafkaException when the transaction failed (the caller aborts)."""
        if not batch.positions:
            # Nothing owned: nothing may be written (and it would not be fenced).
            raise RuntimeError("a transaction must carry the input offsets of the partitions it writes for")
        producer, refusals = self.producer, self.refusals
        refused_before = len(refusals.noted)
        counts = self._partition_counts(batch.records)
        if self.exactly_once:
            try:
                group = self.consumer.consumer_group_metadata()
            except RuntimeError as exc:  # left the group (closing, or it timed out): no commit
                raise KafkaException(KafkaError(KafkaError._STATE, f"not a group member: {exc}")) from exc
            if self.open_since is None:
                self.open_since = time.monotonic()
            producer.begin_transaction()
        produce = producer.produce
        persist, ledger = self.ns.persist, self.ns.ledger
        for lp, keys, outcome in batch.tombstones:
            headers = None if outcome == OUTCOME_COMPLETED else [(H_OUTCOME, outcome)]
            for key in keys:
                try:
                    produce(persist, None, key, lp, None, None, 0, headers)  # kafka_io.PRODUCE_ARGS
                except BufferError:
                    kafka_io.produce(producer, persist, key=key, value=None, partition=lp, headers=headers)
        alone_now: object = None  # the suspect subject being produced alone
        for rec in batch.records:
            count = counts.get(rec.topic, -1)
            if count is None or 0 <= count <= rec.partition:
                # Never produce it: adding its partition to the transaction fails every time,
                # and when nothing else was added yet even the abort fails, fatally
                # (INVALID_TXN_STATE). Refused here, it is dead-lettered after the rewind.
                where = "does not exist" if count is None else f"has {count} partitions, not {rec.partition + 1}"
                err = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"Unknown topic or partition ({rec.topic} {where})")
                if not refusals.refuse(rec, err, alone=True):
                    raise KafkaException(err)
                continue
            alone = rec.subject is not None and rec.subject in refusals.alone
            if (alone and rec.subject != alone_now) or (not alone and alone_now is not None):
                producer.flush(30)  # everything before it is delivered: a suspect travels alone
                alone_now = rec.subject if alone else None
            self._produce_output(rec, alone)
        if alone_now is not None:
            producer.flush(30)
        for lp, keys, values in batch.changelog:
            for key, value in zip(keys, values or repeat(None, len(keys)), strict=True):
                try:
                    produce(ledger, value, key, lp)
                except BufferError:
                    kafka_io.produce(producer, ledger, key=key, value=value, partition=lp)
        if len(refusals.noted) > refused_before:
            producer.flush(30)  # the verdicts on the rest too, for the next attempt
            raise KafkaException(KafkaError(KafkaError._FAIL, "outputs refused for good: " + "; ".join(refusals.noted)))
        if self.exactly_once:
            timeout_s = self.live.configs.config.offsets_timeout_ms / 1000
            self._within(timeout_s, "send_offsets_to_transaction", functools.partial(
                producer.send_offsets_to_transaction, batch.positions, group, timeout_s))
            producer.commit_transaction(60)
            self.open_since = None
        else:
            if producer.flush(60):
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "flush timed out"))
            self.consumer.commit(offsets=batch.positions, asynchronous=False)

    def _produce_output(self, rec: Outgoing, alone: bool) -> None:
        on_delivery = None if rec.subject is None else functools.partial(self.refusals.delivered, rec, alone)
        try:
            kafka_io.produce(
                self.producer, rec.topic, key=rec.key, value=rec.value, partition=rec.partition,
                headers=list(rec.headers) or None, on_delivery=on_delivery,
            )
        except KafkaException as exc:
            # Refused before it was queued (e.g. larger than message.max.bytes): this record's
            # own verdict. Anything else (the transaction failed already) ends the attempt.
            if not self.refusals.refuse(rec, exc.args[0], alone=True):
                raise

    def _partition_counts(self, records: list[Outgoing]) -> dict[str, int | None]:
        """Partition counts of the topics outside the namespace that ``records`` go to (the
        replay topics), asked again at every commit: one may have been deleted or shrunk since
        the decision looked it up. Asked beside the loop (broker.acker.replay_topics), never
        waited for longer than ``ANSWER_WAIT_S``: until the answer is in, the count answered
        before stands, and a topic never answered for is not checked (its decision was)."""
        counts: dict[str, int | None] = {}
        for name in {rec.topic for rec in records} - {self.ns.persist, self.ns.dlq, self.ns.acks, self.ns.superseded}:
            count = self.output_counts.count(name)
            if not isinstance(count, Unknown):
                counts[name] = count
        return counts

    def _look_up(self, names: list[str]) -> dict[str, int | None]:
        """The partition counts of ``names`` from the producer's metadata (on a look-up's thread)."""
        counts: dict[str, int | None] = {}
        for name in names:
            meta = self.producer.list_topics(topic=name, timeout=10).topics.get(name)
            counts[name] = None if meta is None or meta.error is not None else len(meta.partitions)
        return counts

    def _within(self, timeout_s: float, what: str, call: Callable[[], object]) -> None:
        """``call()`` on a thread of its own, waited for ``timeout_s`` + ``left_behind_ms``; if
        it has not returned by then it is left behind, and so is the producer (``stuck``). The
        request of ``send_offsets_to_transaction`` to the group coordinator ignores its timeout
        (librdkafka #5456): an acker cut off from the cluster can stay blocked in it past the
        heal, for good; the commit then fails as cut off (broker.acker.recovery: a new
        producer)."""
        done = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            try:
                call()
            except Exception as exc:  # noqa: BLE001 - raised again by the caller's thread
                failed.append(exc)
            finally:
                done.set()

        threading.Thread(target=run, name=f"acker-{what}", daemon=True).start()
        waited_s = timeout_s + self.live.configs.config.left_behind_ms / 1000
        if not done.wait(waited_s):
            self.stuck = True
            raise KafkaException(KafkaError(
                KafkaError._TIMED_OUT,
                f"{what} did not return in {waited_s:.0f}s (librdkafka #5456): its producer is left behind",
            ))
        if failed:
            raise failed[0]

    def abort(self) -> None:
        if self.stuck:
            return  # its abort would wait behind the call left behind; the next producer aborts it
        if self.exactly_once:
            with contextlib.suppress(KafkaException):
                self.producer.abort_transaction(30)
                self.open_since = None

    @property
    def producer(self) -> Producer:
        return self.live.producer

    @property
    def consumer(self) -> Consumer:
        return self.live.consumer

    def new_producer(self) -> None:
        """The producer was replaced: its ``init_transactions`` aborted whatever the old one
        left open."""
        self.open_since = None
        self.stuck = False


def is_fenced(exc: KafkaException) -> bool:
    """A newer producer with our transactional id exists: we must stop writing."""
    return means(exc, Meaning.PRODUCER_FENCED)


def is_cut_off(exc: KafkaException) -> bool:
    """The transaction's requests did not get through in time: its coordinators or the
    cluster were out of reach (broker.acker.recovery replaces the producer)."""
    return means(exc, Meaning.CUT_OFF)


def positions_of(positions: dict[tuple[str, int], int]) -> Sequence[TopicPartition]:
    return [TopicPartition(t, p, o) for (t, p), o in positions.items()]
