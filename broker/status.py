"""``replaybroker status``: what the ledger holds, read from Kafka itself, in O(partitions).

Everything comes from the acker's ``__counters__`` record of each ledger partition in
``ns.ledger`` - written in the same transactions as the decisions it counts and the table it
describes - read backwards from each partition's end (``latest_with_key``): one record per
partition, however long ``ns.persist``, ``ns.ledger`` and ``ns.dlq`` are.

- ``pending`` / ``oldest_pending_age_s``: the registered entries of each partition and the
  oldest one's registration time, as of the acker's last commit that changed them
  (``counters_age_s`` says how long ago that was at most). A record persisted but not yet
  read by an acker is not in it; a partition whose record predates these fields counts as
  unknown (``pending_unknown_partitions``) until its acker decides something there;
- ``completed``, ``replayed``, ``timed_out``, ``failed``, ``orphans``, ``quarantined`` ...:
  the per-partition counters, summed;
- ``dlq``: records the acker ever dead-lettered (``dlq`` + ``quarantined`` +
  ``payload_lost``: every record it writes to ``ns.dlq``), not what retention kept there;
  ``replaybroker dlq list`` reads the topic.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from broker.errors import TopologyError
from broker.kafka_io import kafka_errors
from broker.schemas import COUNTERS_KEY, LedgerCounters
from broker.settings import KafkaSettings
from broker.topics import Namespace, check

#: The counters whose records go to ``ns.dlq``.
DEAD_LETTERED = ("dlq", "quarantined", "payload_lost")


@kafka_errors("reading the status")
def status(settings: KafkaSettings, namespace: str) -> dict[str, Any]:
    ns = Namespace(namespace)
    P = check(settings, ns)
    now_ms = int(time.time() * 1000)
    raw, read = latest_with_key(settings, ns.ledger, P, COUNTERS_KEY)
    records = {p: LedgerCounters.decode(value) for p, value in raw.items()}
    pending: list[int | None] = [0] * P  # a partition without a record: no acker decided anything yet
    counters: dict[str, int] = {}
    oldest: int | None = None
    for p, record in records.items():
        pending[p] = record.pending
        if record.oldest_pending_ms is not None and (oldest is None or record.oldest_pending_ms < oldest):
            oldest = record.oldest_pending_ms
        for name, value in record.counters.items():
            counters[name] = counters.get(name, 0) + value
    unknown = [p for p, n in enumerate(pending) if n is None]
    updated = min((r.updated_ms for r in records.values()), default=None)
    where = f"acker counters in {ns.ledger} (key __counters__)"
    return {
        "namespace": namespace,
        "ledger_partitions": P,
        "pending": sum(n for n in pending if n is not None),
        "pending_per_partition": pending,
        "pending_unknown_partitions": unknown,
        "oldest_pending_age_s": None if oldest is None else round((now_ms - oldest) / 1000, 3),
        "completed": counters.get("completed", 0),
        "replayed": counters.get("replayed", 0),
        "superseded": counters.get("superseded", 0),
        "dlq": sum(counters.get(name, 0) for name in DEAD_LETTERED),
        "counters": counters,
        "counters_age_s": None if updated is None else round((now_ms - updated) / 1000, 3),
        "messages_read": read,
        "sources": {
            "pending": f"{where}: registered entries at the acker's last commit",
            "oldest_pending_age_s": f"{where}: registration time of the oldest entry",
            "completed": where,
            "replayed": where,
            "superseded": where,
            "dlq": f"{where}: " + " + ".join(DEAD_LETTERED),
            "counters": where,
            "messages_read": f"{ns.ledger}, backwards from each partition's end",
        },
    }


#: First window read back from a partition's end; doubled until the key is found.
FIRST_WINDOW = 256


@kafka_errors("reading the latest records")
def latest_with_key(
    settings: KafkaSettings, topic: str, partitions: int, key: bytes, timeout_s: float = 120.0
) -> tuple[dict[int, bytes], int]:
    """The value of the last non-tombstone message with ``key`` in each partition of
    ``topic``, and how many messages were read to find them.

    Each partition is read backwards from its end offset in growing windows
    (``FIRST_WINDOW``, then doubled) until a window holds the key or the window reaches the
    low watermark: the cost is bounded by how far back the last such message lies, not by
    the length of the partition."""
    consumer = Consumer(
        settings.consumer_config(
            None,
            defaults={"group.id": "replaybroker.read", "enable.partition.eof": True, "fetch.wait.max.ms": 10},
            # A counters record of an aborted (or open) transaction never counts.
            required={"isolation.level": "read_committed"},
        )
    )
    found: dict[int, bytes] = {}
    read = 0
    deadline = time.monotonic() + timeout_s
    try:
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            end, window = high, FIRST_WINDOW
            while end > low and p not in found:
                start = max(low, end - window)
                consumer.assign([TopicPartition(topic, p, start)])
                last: bytes | None = None
                done = False
                while not done:
                    if time.monotonic() > deadline:
                        raise TopologyError(f"could not read {topic} to its end")
                    for msg in consumer.consume(1_000, 0.05):
                        err = msg.error()
                        if err is not None:
                            if err.code() == KafkaError._PARTITION_EOF:
                                done = True
                                break
                            raise TopologyError(f"reading {topic}: {err}")
                        offset = msg.offset() or 0
                        if offset >= end:
                            done = True
                            break
                        read += 1
                        if msg.key() == key and msg.value() is not None:
                            last = msg.value()
                if last is not None:
                    found[p] = last
                end, window = start, window * 2
    finally:
        consumer.close()
    return found, read
