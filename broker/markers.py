"""Superseded markers as a task sees them (docs/design.md §6).

When the original attempt of a replayed record completes late, the acker writes a marker,
key = the replay's srid, to the compacted ``ns.superseded`` topic (broker.acker.superseding).
A task keeps the markers it has read in a set and skips a replay whose srid is in it: it acks
the record without running the handler, so the replay completes and nothing downstream sees
the record twice.

The reader is a plain consumer (no group: every task reads every partition) on all of
``ns.superseded`` from its start - markers are few (one per slow original) and the topic
keeps them for the replay topics' retention. ``poll`` takes what the client has fetched
without waiting; the task calls it once per batch, and looks a srid up only for a replay
(attempt > 1), so records that are no replays cost one integer comparison.
"""

from __future__ import annotations

import contextlib
import logging
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from broker import ids
from broker.kafka_port import KafkaClients, KafkaPort
from broker.settings import KafkaSettings
from broker.topics import Namespace

log = logging.getLogger(__name__)

MAX_MARKERS = 1_000_000
"""Markers kept in memory (8 B keys in a dict: ~100 B each); the oldest read go first."""


class SupersededMarkers:
    """The replay srids marked superseded in ``ns.superseded``, as far as read."""

    def __init__(
        self, settings: KafkaSettings, ns: Namespace, max_markers: int = MAX_MARKERS, *, group_id: str | None = None,
        kafka: KafkaPort | None = None,
    ) -> None:
        """``kafka``: the reader's port to Kafka (default: the real clients of ``settings``)."""
        kafka = kafka or KafkaClients(settings)
        self.ns = ns
        self.max_markers = max_markers
        self.srids: dict[int, None] = {}  # insertion-ordered: the oldest are evicted first
        self.read = 0
        n = kafka.partition_counts([ns.superseded])[ns.superseded]
        self._consumer: Consumer | None = None
        if n is None:
            log.warning("%s does not exist: superseded replays are processed, not skipped", ns.superseded)
            return
        self._consumer = kafka.consumer(settings.consumer_config(
            # Never joins or commits (the partitions are assigned), but the client still looks
            # up the group's coordinator: a task passes its own group, which its ACLs allow.
            group_id or f"{ns.name}.superseded.reader",
            required={"isolation.level": "read_committed", "enable.auto.commit": False},
            # A marker completes the fetch the broker holds at once (one byte is enough), so
            # the wait costs a marker no latency; it only sets how often an idle reader asks
            # every broker again - each task reads all of ns.superseded.
            defaults={"fetch.wait.max.ms": 500, "fetch.min.bytes": 1},
        ))
        self._consumer.assign([TopicPartition(ns.superseded, p, OFFSET_BEGINNING) for p in range(n)])

    def __contains__(self, srid: int) -> bool:
        return srid in self.srids

    def __len__(self) -> int:
        return len(self.srids)

    def poll(self, timeout_s: float = 0.0) -> int:
        """Take the markers fetched so far (waiting up to ``timeout_s`` for the first one).
        Returns how many were read."""
        if self._consumer is None:
            return 0
        got = 0
        while True:
            try:
                msgs = self._consumer.consume(10_000, timeout_s)
            except (KafkaException, RuntimeError) as exc:
                log.warning("reading %s failed: %s", self.ns.superseded, exc)
                return got
            if not msgs:
                return got
            timeout_s = 0.0
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        log.warning("reading %s: %s", self.ns.superseded, err)
                    continue
                key = msg.key()
                if key is None or len(key) != 8:
                    continue
                srid = ids.decode_id(key)
                if msg.value() is None:
                    self.srids.pop(srid, None)
                    continue
                self.srids[srid] = None
                got += 1
                self.read += 1
            while len(self.srids) > self.max_markers:
                del self.srids[next(iter(self.srids))]

    def wait_for(self, srid: int, timeout_s: float) -> bool:
        """Whether ``srid`` is marked, reading markers for up to ``timeout_s`` until it is."""
        deadline = time.monotonic() + timeout_s
        while srid not in self.srids:
            left = deadline - time.monotonic()
            if left <= 0 or self._consumer is None:
                return False
            self.poll(min(left, 0.05))
        return True

    def close(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(KafkaException, RuntimeError):
                self._consumer.close()
            self._consumer = None
