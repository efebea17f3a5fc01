"""The acker's commit: everything decided since the last one, in ONE Kafka transaction.

In this order (docs/design.md §5):
1. tombstones to ``ns.persist`` for completed, replayed and dead-lettered srids, each with
   ``rb-outcome`` saying which;
2. replay records (persist + ``<topic>.replay``), DLQ and quarantine records;
3. changelog: upserts for entries that changed and are alive, tombstones for entries that
   left (entries born and gone inside one interval never touch it), and the partition's
   counters;
4. the input offsets (``send_offsets_to_transaction``) of EVERY owned input partition, also
   those where nothing new was read, then the commit. The group coordinator checks these
   offsets against the member's generation: an acker that lost its partitions (it stalled,
   another member took over) has its commit refused, so a zombie writes nothing. A
   transaction without offsets would not be checked, so there is none.
A crash anywhere before the commit aborts all of it: the next owner restores the changelog
and resumes from the committed offsets, so each event is reflected exactly once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from broker import kafka_io
from broker.acker.state import PartitionState
from broker.headers import H_OUTCOME
from broker.ledger.clock import Ticker
from broker.replay import Outgoing
from broker.schemas import COUNTERS_KEY, encode_counters, encode_ledger_entry
from broker.topics import Namespace


@dataclass
class Batch:
    """What one transaction writes."""

    tombstones: list[tuple[int, int, bytes]] = field(default_factory=list)  # lp, srid, outcome
    records: list[Outgoing] = field(default_factory=list)
    changelog: list[tuple[int, bytes, bytes | None]] = field(default_factory=list)  # lp, key, value
    positions: list[TopicPartition] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.tombstones or self.records or self.changelog or self.positions)


def take_changes(states: Iterable[tuple[int, PartitionState]], ticker: Ticker, now_ms: int, batch: Batch) -> None:
    """Move each state's due tombstones and changelog delta (and dirty counters) into ``batch``."""
    for lp, st in states:
        batch.tombstones.extend((lp, srid, outcome) for srid, outcome in st.tombstones)
        st.tombstones = []
        delta = st.table.take_dirty()
        up = delta.upserts
        if len(up):
            # Keys packed once (8-byte big-endian slices); values by the Avro encoder that
            # writes fastavro's bytes without a dict per entry.
            keys = up.srids.astype(">i8").tobytes()
            deadlines = ticker.ms_of_ticks(up.deadlines).tolist()
            for i, (value, flags, offset, deadline) in enumerate(
                zip(up.values.tolist(), up.flags.tolist(), up.offsets.tolist(), deadlines, strict=True)
            ):
                batch.changelog.append(
                    (lp, keys[8 * i : 8 * i + 8], encode_ledger_entry(value, flags, offset, deadline))
                )
        if len(delta.tombstones):
            keys = delta.tombstones.astype(">i8").tobytes()
            batch.changelog.extend((lp, keys[i : i + 8], None) for i in range(0, len(keys), 8))
        if st.counters_dirty:
            batch.changelog.append((lp, COUNTERS_KEY, encode_counters(st.counters, now_ms)))
            st.counters_dirty = False


class Transactions:
    """Writes a ``Batch`` atomically (or, with ``exactly_once`` off, just flushes it)."""

    def __init__(self, ns: Namespace, producer: Producer, consumer: Consumer, *, exactly_once: bool) -> None:
        self.ns = ns
        self.producer = producer
        self.consumer = consumer
        self.exactly_once = exactly_once

    def write(self, batch: Batch) -> None:
        """Raises KafkaException when the transaction failed (the caller aborts)."""
        if not batch.positions:
            # Nothing owned: nothing may be written (and it would not be fenced).
            raise RuntimeError("a transaction must carry the input offsets of the partitions it writes for")
        producer = self.producer
        if self.exactly_once:
            try:
                group = self.consumer.consumer_group_metadata()
            except RuntimeError as exc:  # left the group (closing, or it timed out): no commit
                raise KafkaException(KafkaError(KafkaError._STATE, f"not a group member: {exc}")) from exc
            producer.begin_transaction()
        produce = producer.produce
        persist, ledger = self.ns.persist, self.ns.ledger
        outcome_headers: dict[bytes, list[tuple[str, bytes]]] = {}
        for lp, srid, outcome in batch.tombstones:
            headers = outcome_headers.get(outcome)
            if headers is None:
                headers = outcome_headers[outcome] = [(H_OUTCOME, outcome)]
            key = srid.to_bytes(8, "big", signed=True)
            try:
                produce(persist, key=key, value=None, partition=lp, headers=headers)
            except BufferError:
                kafka_io.produce(producer, persist, key=key, value=None, partition=lp, headers=headers)
        for rec in batch.records:
            kafka_io.produce(
                producer, rec.topic, key=rec.key, value=rec.value, partition=rec.partition, headers=list(rec.headers)
            )
        for lp, key, value in batch.changelog:
            try:
                produce(ledger, key=key, value=value, partition=lp)
            except BufferError:
                kafka_io.produce(producer, ledger, key=key, value=value, partition=lp)
        if self.exactly_once:
            producer.send_offsets_to_transaction(batch.positions, group, 30)
            producer.commit_transaction(60)
        else:
            if producer.flush(60):
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "flush timed out"))
            self.consumer.commit(offsets=batch.positions, asynchronous=False)

    def abort(self) -> None:
        if self.exactly_once:
            with contextlib.suppress(KafkaException):
                self.producer.abort_transaction(30)


def is_fatal(exc: KafkaException) -> bool:
    err = exc.args[0] if exc.args else None
    return bool(err is not None and hasattr(err, "fatal") and err.fatal())


def positions_of(positions: dict[tuple[str, int], int]) -> Sequence[TopicPartition]:
    return [TopicPartition(t, p, o) for (t, p), o in positions.items()]
