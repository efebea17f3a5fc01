"""Payloads for replays: a cache of the newest persist values, and a reader of persist records
by offset for the rest, which tells a record that cannot be read now from one that is gone."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from confluent_kafka import Consumer, TopicPartition

from broker import ids
from broker.errors import DecodeError
from broker.schemas import PersistedRecord
from broker.topics import Namespace


class PayloadCache:
    """Bounded srid -> persist value cache of the newest registrations (LRU by insertion).

    A replay usually happens within the timeout of its registration, so most payloads are
    still here; the rest are fetched from ``ns.persist`` at the stored offset. Values are
    kept as the raw ``PersistedRecord`` bytes: most records complete and are never replayed,
    so they are decoded only when a replay needs them.
    """

    def __init__(self, max_entries: int = 20_000) -> None:
        self.max_entries = max_entries
        self._items: OrderedDict[int, bytes] = OrderedDict()

    def put(self, srid: int, payload: bytes) -> None:
        if self.max_entries <= 0:
            return
        self._items[srid] = payload
        if len(self._items) > self.max_entries:
            self._items.popitem(last=False)

    def pop(self, srid: int) -> bytes | None:
        return self._items.pop(srid, None)

    def discard_many(self, srids: Sequence[int]) -> None:
        items = self._items
        if items:
            for srid in srids:
                items.pop(srid, None)

    def __len__(self) -> int:
        return len(self._items)


class PayloadGone(DecodeError):
    """The persist record is provably not in ``ns.persist`` any more: reading again cannot
    help (below the log start offset, compacted away, or its offset holds something else)."""


class PersistFetcher:
    """Reads single persist records by offset (read_committed, no group)."""

    def __init__(self, ns: Namespace, consumer: Consumer) -> None:
        self.ns = ns
        self._consumer = consumer

    def fetch(self, partition: int, offset: int, srid: int, timeout_s: float = 10.0) -> PersistedRecord:
        return PersistedRecord.decode(self.fetch_raw(partition, offset, srid, timeout_s))

    def fetch_raw(self, partition: int, offset: int, srid: int, timeout_s: float = 10.0) -> bytes:
        """The persist value of ``srid`` at ``partition@offset``, undecoded.

        Raises ``PayloadGone`` when the record is provably gone, ``DecodeError`` or
        ``KafkaException`` when it could not be read now (try again later).
        """
        tp = TopicPartition(self.ns.persist, partition)
        low, _ = self._consumer.get_watermark_offsets(tp, timeout=timeout_s)
        if offset < low:
            raise PayloadGone(f"persist {partition}@{offset} is below the log start offset {low}")
        self._consumer.assign([TopicPartition(self.ns.persist, partition, offset)])
        try:
            msg = self._consumer.poll(timeout_s)
        finally:
            self._consumer.unassign()
        if msg is None or msg.error():
            raise DecodeError(f"persist record of {srid} not readable at {partition}@{offset}: {msg and msg.error()}")
        # The offset was read read_committed when the srid registered, so it held a committed
        # record: a read that starts there and returns a later one has read past a gap that
        # compaction made (transaction markers never sit at a record's offset).
        if msg.offset() > offset:
            raise PayloadGone(f"persist {partition}@{offset} was compacted away (next record at {msg.offset()})")
        if msg.offset() != offset:
            raise DecodeError(f"persist {partition}@{offset}: read {msg.offset()} instead")
        if msg.key() != ids.encode_id(srid):
            raise PayloadGone(f"persist {partition}@{offset} does not hold srid {srid}")
        value = msg.value()
        if value is None:
            raise PayloadGone(f"persist {partition}@{offset} is a tombstone, not the record of {srid}")
        return bytes(value)

    def close(self) -> None:
        self._consumer.close()
