"""``replaybroker status``: what the ledger holds, read from Kafka itself.

Sources, so every figure can be checked by hand:
- ``pending`` / ``oldest_pending_age_s``: live (not tombstoned) records of ``ns.persist`` per
  partition, and their ``created_ms`` - the records the broker still guarantees;
- ``completed``, ``replayed``, ``timed_out``, ``failed``, ``orphans``, ``quarantined`` ...:
  the acker's per-partition counters in ``ns.ledger`` (key ``__counters__``), committed in
  the same transactions as the decisions they count, read backwards from each partition's end
  (``latest_with_key``) rather than from its start;
- ``dlq``: messages in ``ns.dlq``, counted by reading it (offsets would also count the
  transaction markers); records and quarantined input.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from broker.errors import DecodeError, TopologyError
from broker.kafka_io import read_to_end
from broker.schemas import COUNTERS_KEY, PersistedRecord, decode_counters
from broker.settings import KafkaSettings
from broker.topics import Namespace, check


def status(settings: KafkaSettings, namespace: str) -> dict[str, Any]:
    ns = Namespace(namespace)
    P = check(settings, ns)
    now_ms = int(time.time() * 1000)
    live: dict[bytes, tuple[int, int | None]] = {}
    for msg in read_to_end(settings, ns.persist, P):
        if msg.value() is None:
            live.pop(msg.key(), None)
            continue
        try:
            created: int | None = PersistedRecord.decode(msg.value()).created_ms
        except DecodeError:
            created = None
        live[msg.key()] = (msg.partition(), created)
    pending = [0] * P
    oldest: int | None = None
    for partition, created in live.values():
        pending[partition] += 1
        if created is not None and (oldest is None or created < oldest):
            oldest = created
    counters: dict[str, int] = {}
    per_partition_counters: dict[int, dict[str, int]] = {}
    for partition, raw in latest_with_key(settings, ns.ledger, P, COUNTERS_KEY)[0].items():
        per_partition_counters[partition] = decode_counters(raw)[0]
    for values in per_partition_counters.values():
        for name, value in values.items():
            counters[name] = counters.get(name, 0) + value
    return {
        "namespace": namespace,
        "ledger_partitions": P,
        "pending": sum(pending),
        "pending_per_partition": pending,
        "oldest_pending_age_s": None if oldest is None else round((now_ms - oldest) / 1000, 3),
        "completed": counters.get("completed", 0),
        "replayed": counters.get("replayed", 0),
        "dlq": len(read_to_end(settings, ns.dlq, 1)),  # offsets overcount: txn markers
        "counters": counters,
        "sources": {
            "pending": f"live records of {ns.persist}",
            "oldest_pending_age_s": f"created_ms of live records of {ns.persist}",
            "completed": f"acker counters in {ns.ledger} (key __counters__)",
            "replayed": f"acker counters in {ns.ledger} (key __counters__)",
            "counters": f"acker counters in {ns.ledger} (key __counters__)",
            "dlq": f"messages in {ns.dlq}",
        },
    }


#: First window read back from a partition's end; doubled until the key is found.
FIRST_WINDOW = 256


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
