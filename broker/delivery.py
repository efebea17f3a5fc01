"""What happens to records that fail to deliver: the bookkeeping of ``Source`` and ``Task``
that is not their main loop (docs/design.md §8).

``PendingData`` holds a non-transactional Source's data records until their persist records
are confirmed, and collects every persist record that failed (``SendFailure``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

from confluent_kafka import KafkaError, Message, Producer

from broker.schemas import PersistedRecord


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


# A data record waiting for its persist record: [topic, key, value, partition, headers, confirmed]
_CONFIRMED = 5


class PendingData:
    """Data records waiting for their persist records, in send order, and the persist records
    reported failed.

    ``on_persist`` is the persist records' delivery callback: it only marks (a confirmed
    record) or drops (a failed one: its data record is never produced); ``release`` produces,
    outside the callback, the confirmed data records in send order - the first unconfirmed
    one holds back those after it (per-key order, across ledger partitions)."""

    __slots__ = ("_entries", "failures", "on_persist")

    def __init__(self) -> None:
        # srid (8 bytes) -> data record waiting for its persist record, in send order.
        self._entries: OrderedDict[bytes, list[Any]] = OrderedDict()
        self.failures: list[SendFailure] = []
        self.on_persist = _persist_callback(self._entries, self.failures)

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, srid_b: bytes, topic: str, key: bytes | None, value: bytes | None, partition: int,
            headers: list[tuple[str, bytes | None]]) -> None:
        self._entries[srid_b] = [topic, key, value, partition, headers, False]

    def release(self, producer: Producer) -> None:
        """Produce the data records whose persist records are confirmed, in send order."""
        pending = self._entries
        produce = producer.produce
        while pending:
            srid_b = next(iter(pending))
            entry = pending[srid_b]
            if not entry[_CONFIRMED]:
                return
            try:
                produce(entry[0], key=entry[1], value=entry[2], partition=entry[3], headers=entry[4])
            except BufferError:
                return  # the queue is full: the next send, poll or flush releases it
            del pending[srid_b]

    def take_failures(self) -> list[SendFailure]:
        failures = list(self.failures)
        self.failures.clear()
        return failures


def _persist_callback(
    pending: OrderedDict[bytes, list[Any]], failures: list[SendFailure]
) -> Callable[[KafkaError | None, Message], None]:
    # A closure over the containers, not a bound method: the producer must not hold the
    # Source (a reference cycle would keep its Kafka clients alive until garbage collection).
    def on_persist(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            entry = pending.get(msg.key())
            if entry is not None:
                entry[_CONFIRMED] = True
        else:
            pending.pop(msg.key(), None)  # its data record is never produced
            failures.append(SendFailure.of(msg.value(), err))

    return on_persist
