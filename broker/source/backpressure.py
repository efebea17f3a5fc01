"""Backpressure of a ``Source`` (``SourceConfig.max_pending``, Storm's max.spout.pending;
docs/design.md §8).

A source record is *pending* from its send until its final outcome: the tombstone on
``ns.persist`` that says ``completed`` or ``dlq`` (broker.completions). A ``replay`` tombstone
is not final - the acker persisted a new attempt (new srid, same origin) and the slot stays
taken by that attempt. So the window counts origins, and follows each of its origins through
its attempts:

1. ``sent(srid, origin)``: a slot is taken (this source's own srid).
2. a persist record of another attempt of a pending origin (``persisted``): its srid is
   followed too.
3. a tombstone of a followed srid (``outcome``): ``completed`` / ``dlq`` free the slot,
   ``replay`` only forgets that srid.
4. a persist record that was never delivered (``not_persisted``) frees its slot: it is not
   pending, nothing will ever complete it.

``PendingWindow`` is the pure accounting; ``PersistFeed`` reads the tombstones it needs:
``ns.persist`` (read_committed) from the offsets it had when this source first sent - records
of an earlier run of the same source are not its concern. ``Backpressure`` is a source's wait
for a slot, over both.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from broker import ids
from broker.errors import BackpressureTimeout, DecodeError
from broker.headers import outcome_of
from broker.kafka_io import retrying
from broker.kafka_port import KafkaPort
from broker.schemas import PersistedRecord
from broker.settings import KafkaSettings
from broker.topics import Namespace

FINAL_OUTCOMES = frozenset({"completed", "dlq"})


class PendingWindow:
    """Origins of this source's records that are pending, and the srids that stand for them."""

    __slots__ = ("_origin_of", "_pending", "counters", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_pending must be at least 1 (got {limit})")
        self.limit = limit
        self._origin_of: dict[int, int] = {}  # srid of a live attempt -> its origin
        self._pending: Counter[int] = Counter()  # origin -> records pending for it
        # completed / dlq: slots freed by that outcome; replayed: attempts superseded (the
        # slot stays); not_persisted: slots freed because the persist record failed;
        # followed: attempts of a pending origin found on ns.persist.
        self.counters: Counter[str] = Counter()

    def __len__(self) -> int:
        return self._pending.total()

    @property
    def full(self) -> bool:
        return len(self) >= self.limit

    def sent(self, srid: int, origin: int) -> None:
        self._origin_of[srid] = origin
        self._pending[origin] += 1

    def persisted(self, srid: int, origin: int) -> None:
        """A persist record seen on ``ns.persist``: follow it if it is an attempt of ours."""
        if origin in self._pending and srid not in self._origin_of:
            self._origin_of[srid] = origin
            self.counters["followed"] += 1

    def outcome(self, srid: int, outcome: str) -> None:
        """A tombstone seen on ``ns.persist``; srids that are not ours are ignored."""
        origin = self._origin_of.pop(srid, None)
        if origin is None:
            return
        if outcome in FINAL_OUTCOMES:
            self._free(origin)
            self.counters[outcome] += 1
        else:
            self.counters["replayed"] += 1

    def not_persisted(self, srid: int) -> None:
        origin = self._origin_of.pop(srid, None)
        if origin is not None:
            self._free(origin)
            self.counters["not_persisted"] += 1

    def _free(self, origin: int) -> None:
        self._pending[origin] -= 1
        if self._pending[origin] <= 0:
            del self._pending[origin]


class PersistFeed:
    """Feeds a ``PendingWindow`` from ``ns.persist``, starting at the end offsets it finds
    when built (read_committed: an aborted transaction's records are never seen)."""

    def __init__(self, kafka: KafkaPort, settings: KafkaSettings, ns: Namespace, partitions: int, window: PendingWindow) -> None:
        self.window = window
        self._consumer = kafka.consumer(settings.consumer_config(
            None, defaults={"group.id": f"{ns.name}.source-backpressure"},
            required={"isolation.level": "read_committed"},
        ))
        assignment = []
        for p in range(partitions):
            watermarks = functools.partial(self._consumer.get_watermark_offsets, TopicPartition(ns.persist, p), timeout=30)
            _, high = retrying(watermarks, f"end offset of {ns.persist}[{p}]")
            assignment.append(TopicPartition(ns.persist, p, high))
        self._consumer.assign(assignment)

    def poll(self, timeout_s: float) -> int:
        msgs = self._consumer.consume(10_000, timeout_s)
        for msg in msgs:
            if (error := msg.error()) is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(error)
            self._add(msg)
        return len(msgs)

    def _add(self, msg: Message) -> None:
        key = msg.key()
        if key is None or len(key) != 8:
            return
        srid = ids.decode_id(key)
        value = msg.value()
        if value is None:
            outcome = outcome_of(msg.headers())
            self.window.outcome(srid, outcome.decode(errors="replace"))
            return
        if not self.window._pending:  # nothing of ours to follow: no need to decode
            return
        try:
            origin = PersistedRecord.decode(value).origin
        except DecodeError:
            return  # the acker quarantines it; it is no attempt of ours to follow
        self.window.persisted(srid, origin)

    def wait(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Poll until ``done()`` or ``timeout_s``; whether ``done()`` holds."""
        deadline = time.monotonic() + timeout_s
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.poll(min(remaining, 0.5))
        return True

    def close(self) -> None:
        self._consumer.close()


class Backpressure:
    """A source's wait for a slot (``SourceConfig.max_pending``): its window, built with the
    feed at its first send, and what waiting cost - the sends that had to wait (``blocked``),
    the seconds they waited (``blocked_s``) and the sends that gave up (``timeouts``)."""

    def __init__(
        self,
        settings: KafkaSettings,
        ns: Namespace,
        limit: int | None,
        timeout_ms: int,
        partitions: Callable[[], int],
        serve: Callable[[], None],
        *,
        kafka: KafkaPort,
    ) -> None:
        """``limit`` None: no limit, ``await_slot`` is not called. ``partitions``: P of the
        namespace, asked at the first send; ``serve``: serves
        the source's delivery reports (raising those that failed) while a send waits."""
        self.settings, self.ns, self.limit, self.timeout_s = settings, ns, limit, timeout_ms / 1000
        self._partitions, self._serve, self._kafka = partitions, serve, kafka
        self.window: PendingWindow | None = None
        self.feed: PersistFeed | None = None
        self.blocked = 0
        self.blocked_s = 0.0
        self.timeouts = 0

    def not_persisted(self, srids: Iterable[int]) -> None:
        """Free the slots of records whose persist record was not delivered (or aborted)."""
        if self.window is not None:
            for srid in srids:
                self.window.not_persisted(srid)

    def await_slot(self, in_transaction: int) -> None:
        """Return once fewer than ``limit`` records of this source are pending; raise
        ``BackpressureTimeout`` (nothing sent) after ``timeout_ms``. ``in_transaction``: the
        pending records of the source's open transaction.

        The feed starts at the end of ``ns.persist`` as found before this source's first
        send. While waiting, delivery reports are served and confirmed data records released:
        the records that hold the slots must reach their tasks to complete."""
        if self.window is None:
            assert self.limit is not None
            self.window = PendingWindow(self.limit)
            self.feed = PersistFeed(self._kafka, self.settings, self.ns, self._partitions(), self.window)
        window, feed, limit = self.window, self.feed, self.window.limit
        assert feed is not None
        feed.poll(0)
        if not window.full:
            return
        # Inside a transaction its own records complete only after the commit: when they
        # fill the window alone, waiting cannot free a slot.
        if len(window) <= in_transaction:
            self.timeouts += 1
            raise BackpressureTimeout(
                f"max_pending={limit} reached by the {len(window)} records of the open "
                "transaction: commit it before sending more",
                limit=limit, pending=len(window), waited_s=0.0,
            )
        started = time.monotonic()
        deadline = started + self.timeout_s
        self.blocked += 1
        try:
            while window.full:
                self._serve()  # a failed persist record frees its slot: this call sends nothing
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.timeouts += 1
                    waited = time.monotonic() - started
                    raise BackpressureTimeout(
                        f"max_pending={limit} reached: {len(window)} records of this source "
                        f"still pending after waiting {waited:.1f}s; nothing of this send was sent",
                        limit=limit, pending=len(window), waited_s=waited,
                    )
                feed.poll(min(remaining, 0.1))
        finally:
            self.blocked_s += time.monotonic() - started

    def close(self) -> None:
        if self.feed is not None:
            self.feed.close()
            self.feed = None
