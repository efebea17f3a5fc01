"""What happens to records that fail to deliver: the bookkeeping of ``Source`` and ``Task``
that is not their main loop (docs/design.md §8).

``PendingData`` holds a non-transactional Source's data records until their persist records
are confirmed, and collects every persist record that failed (``SendFailure``).

``Outputs`` is a Task's producer of children, sink outputs and events: it remembers what
failed to deliver, sends only that again - a bounded number of rounds, with back-off - and
returns what stays undeliverable; ``failed_srids`` names the source records to fail for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, NamedTuple

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from broker import kafka_io
from broker.headers import Tracking
from broker.kafka_errors import Meaning, means
from broker.schemas import PersistedRecord, XorBatch


class SendFailure(NamedTuple):
    """A source record whose persist record was not delivered. Nothing of it is out: its data
    record is produced only once the persist record is confirmed. Send it again with
    ``send(f.topic, f.key, f.value, f.persisted.headers)`` (a redriven record: ``resend`` with
    the ``origin``, ``key_hash_partition`` and ``history`` of ``f.persisted``)."""

    srid: int
    topic: str
    key: bytes | None
    value: bytes | None
    error: KafkaError
    persisted: PersistedRecord

    @classmethod
    def of(cls, persist_value: bytes, error: KafkaError) -> SendFailure:
        # Decoded only on failure: the persist record holds all a resend needs, so nothing
        # per record is kept for the (rare) failure path.
        record = PersistedRecord.decode(persist_value)
        return cls(record.srid, record.topic, record.key, record.value, error, record)


ENTRY_FIELDS = 6
"""``PendingData`` holds its data records flat, ``ENTRY_FIELDS`` items each: srid key, topic,
key, value, partition and headers - the list to produce or, for a record whose only header is
its tracking header, that ``(H_TRACKING, ids)`` pair. A tuple or a list per record would be an
object for the garbage collector to count and traverse while the record waits; the flat list
and such a pair are not (the collector untracks a tuple of str and bytes)."""
# Persist records go out in epochs, alternating between two producers: an epoch's data
# records are released once its producer holds nothing undelivered - a question asked without
# blocking (``len``), while the next epoch is sent with the other producer. An epoch lasts the
# producer's linger.ms (EPOCH_S by default): one produce request per partition and epoch, as
# one producer would send - shorter epochs would multiply the requests (the broker's CPU
# follows requests). When an epoch is still undecided while the next one grew to MAX_EPOCH
# records, a send waits for it.
EPOCH_S = 0.01
MAX_EPOCH = 20_000
_FLUSH_S = 1.0  # one such wait's bound: a broker that is away does not block a send longer


class PendingData:
    """Data records waiting for their persist records, in send order, and the persist records
    reported failed.

    Delivery is accounted per batch, not per record: persist records report only failures
    (``on_persist``, ``delivery.report.only.error``) - no Python call per record delivered.
    The records sent in one epoch (``epoch_s``) share a producer that nothing else writes to
    meanwhile, so once it holds nothing undelivered (``len(producer) == 0`` with its reports
    served) each of their persist records is confirmed or was reported failed: ``settle``
    then produces their data records, in send order, leaving out those whose persist record
    failed. ``producer`` is the producer of the open epoch (persist records go there)."""

    __slots__ = (
        "_closed", "_failed", "_open", "_other", "epoch_s", "failures", "floor_ms", "on_persist", "producer", "since",
        "wall_clock",
    )

    def __init__(self, producer: Producer, other: Producer | None = None, epoch_s: float | None = None, *,
                 wall_clock: Callable[[], float] = time.time) -> None:
        """``other``: the second producer epochs alternate with (a transactional source has
        none: its records never wait here); ``epoch_s``: an epoch's length (``EPOCH_S``);
        ``wall_clock``: the time records are created at (``created_ms``), in seconds."""
        self.epoch_s = EPOCH_S if epoch_s is None else epoch_s
        self.wall_clock = wall_clock
        self.producer = producer
        self._other = producer if other is None else other  # (a Producer is falsy when empty)
        self._open: list[Any] = []  # sent with ``producer`` (ENTRY_FIELDS items a record)
        self._closed: list[Any] = []  # sent with ``_other``: released once it is drained
        self._failed: set[bytes] = set()  # srid keys of the failed persist records waiting
        self.failures: list[SendFailure] = []
        self.on_persist = _persist_callback(self._failed, self.failures)
        self.since = 0.0  # when the open epoch's first record was added (monotonic)
        self.floor_ms = 0  # the least created_ms of the next record sent (``created_ms``)

    def created_ms(self) -> int:
        """The ``created_ms`` of a record sent now (wall clock), kept in send order: never less
        than the last one's, and greater than every record's persisted with the other
        producer. Within one producer a partition keeps its records in send order, so the
        persist records of one ledger partition are in send order by ``(created_ms, persist
        offset)`` - the order the acker decides a key's failures in (docs/design.md §6)."""
        ms = int(self.wall_clock() * 1000)
        if ms < self.floor_ms:
            ms = self.floor_ms
        self.floor_ms = ms
        return ms

    def __len__(self) -> int:
        return (len(self._open) + len(self._closed)) // ENTRY_FIELDS

    def use(self, producer: Producer) -> None:
        """A transactional source's new producer (after an abort)."""
        self.producer = self._other = producer

    def add(self, srid_b: bytes, topic: str, key: bytes | None, value: bytes | None, partition: int,
            headers: list[Any] | tuple[str, bytes]) -> None:
        """``headers``: the data record's, or its tracking header alone (``ENTRY_FIELDS``)."""
        if not self._open:
            self.since = time.monotonic()
        self._open += (srid_b, topic, key, value, partition, headers)

    def extend(self, entries: list[Any]) -> None:
        """Records as ``add`` takes them, one after the other in one flat list."""
        if entries and not self._open:
            self.since = time.monotonic()
        self._open += entries

    def _release(self, entries: list[Any]) -> bool:
        """Produce ``entries`` (all decided) with the open epoch's producer; False when the
        queue is full (the rest stays for the next call)."""
        failed = self._failed
        produce = self.producer.produce
        fields = iter(entries)
        records = zip(fields, fields, fields, fields, fields, fields, strict=True)  # ENTRY_FIELDS
        for i, (srid_b, topic, key, value, partition, headers) in enumerate(records):
            if failed and srid_b in failed:
                continue  # its data record is never produced
            try:
                produce(topic, value, key, partition, None, None, 0,  # kafka_io.PRODUCE_ARGS
                        headers if type(headers) is list else [headers])
            except BufferError:
                del entries[: i * ENTRY_FIELDS]
                return False
        entries.clear()
        return True

    def settle(self) -> None:
        """Release the closed epoch once its producer is drained; close the open one when due."""
        if self._closed:
            other = self._other
            other.poll(0)  # serves its failure reports: they count in len() until served
            if len(other):
                if len(self._open) < MAX_EPOCH * ENTRY_FIELDS:
                    return
                other.flush(_FLUSH_S)
                if len(other):
                    return
            if not self._release(self._closed):
                return
        if self._open and time.monotonic() - self.since >= self.epoch_s:
            self._closed, self._open = self._open, []
            self.producer, self._other = self._other, self.producer
            self.floor_ms += 1
        if not self._open and not self._closed:
            self._failed.clear()

    def drain(self, timeout: float) -> int:
        """Wait (up to ``timeout`` s) until every persist record is decided and every data
        record whose persist record was confirmed is delivered; returns the records still
        undelivered."""
        deadline = time.monotonic() + timeout
        while True:
            for producer in {id(p): p for p in (self.producer, self._other)}.values():
                producer.flush(max(0.0, deadline - time.monotonic()))
            undecided = len(self.producer) + (len(self._other) if self._other is not self.producer else 0)
            if not undecided and self._release(self._closed) and self._release(self._open):
                self._failed.clear()
                self.producer.flush(max(0.0, deadline - time.monotonic()))
                undecided = len(self.producer)
            if (not undecided and not self) or time.monotonic() >= deadline:
                return undecided

    def take_failures(self) -> list[SendFailure]:
        failures = list(self.failures)
        self.failures.clear()
        return failures


def _persist_callback(
    failed: set[bytes], failures: list[SendFailure]
) -> Callable[[KafkaError | None, Message], None]:
    # Called for failed persist records only (delivery.report.only.error). A closure over
    # the containers, not a bound method: the producer must not hold the Source (a
    # reference cycle would keep its Kafka clients alive until garbage collection).
    def on_persist(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failed.add(msg.key())
            failures.append(SendFailure.of(msg.value(), err))

    return on_persist


# --------------------------------------------------------------------------- Task outputs


class Failed(NamedTuple):
    """An output that failed to deliver: the error, its topic and its produce arguments; and
    the srid of its input when the output does not carry it (a sink output has only
    ``rb-origin``)."""

    error: KafkaError
    topic: str
    kwargs: dict[str, Any]
    srid: int | None = None


class Outputs:
    """A Task's producer and the outputs of it that failed to deliver (``failed``)."""

    def __init__(self, producer: Producer, retries: int, backoff_s: float) -> None:
        self.producer = producer
        self.retries = retries
        self.backoff_s = backoff_s
        self.failed: list[Failed] = []

    def _on_delivery(
        self, topic: str, kwargs: dict[str, Any], srid: int | None, err: KafkaError | None, _msg: Message
    ) -> None:
        if err is not None:
            self.failed.append(Failed(err, topic, kwargs, srid))

    def produce(self, topic: str, srid: int | None = None, **kwargs: Any) -> None:
        """``srid``: the input's, for an output whose headers do not carry it."""
        # The callback carries the produce arguments: a delivery report has no headers (the
        # srid of a child, needed to resend it or to fail its source record). It replaces
        # the bound method passed per record before: no extra object per record.
        on_delivery = partial(self._on_delivery, topic, kwargs, srid)
        kafka_io.produce(self.producer, topic, on_delivery=on_delivery, **kwargs)

    def take_failed(self) -> list[Failed]:
        failed, self.failed = self.failed, []
        return failed

    def _resend(self, failed: Failed) -> Failed | None:
        """Produce a failed output again, as it was; returns it when refused at once."""
        try:
            self.produce(failed.topic, failed.srid, **failed.kwargs)
        except KafkaException as exc:  # e.g. a topic librdkafka now knows is missing
            return failed._replace(error=exc.args[0])
        return None

    def redeliver(self) -> list[Failed]:
        """Send the failed outputs again, up to ``retries`` rounds with exponential back-off;
        returns those that still failed or cannot succeed."""
        failed = self.take_failed()
        lost: list[Failed] = []
        for attempt in range(self.retries):
            again: list[Failed] = []
            for f in failed:
                (lost if means(f.error, Meaning.UNDELIVERABLE) else again).append(f)
            failed = []
            if not again:
                break
            time.sleep(self.backoff_s * 2**attempt)
            for f in again:
                if not means(f.error, Meaning.TOO_LARGE):
                    continue
                # Alone in its produce request: refused again only if it is itself too large.
                if (refused := self._resend(f)) is not None:
                    lost.append(refused)
                    continue
                self.producer.flush()
                for f2 in self.take_failed():
                    (lost if means(f2.error, Meaning.TOO_LARGE) else failed).append(f2)
            for f in again:
                if not means(f.error, Meaning.TOO_LARGE) and (refused := self._resend(f)) is not None:
                    lost.append(refused)
            self.producer.flush()
            failed += self.take_failed()
        return lost + failed


def failed_srids(lost: Iterable[Failed], acks_topic: str) -> tuple[set[int], int]:
    """The source records to fail for outputs that cannot be delivered - a sink output names
    its input's srid, a child carries it in its headers, an event batch its srids - and how
    many untracked outputs have none (nothing to replay)."""
    srids: set[int] = set()
    dropped = 0
    for f in lost:
        if f.srid is not None:
            srids.add(f.srid)
        elif f.topic == acks_topic:
            batch = XorBatch.decode(f.kwargs["value"])
            srids.update(batch.srids.tolist())
            srids.update(batch.failed.tolist())
        elif (tracking := Tracking.from_headers(f.kwargs.get("headers"))) is not None:
            srids.add(tracking.srid)
        else:
            dropped += 1
    return srids, dropped
