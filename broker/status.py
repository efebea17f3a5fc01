"""``replaybroker status``: what the ledger holds, read from Kafka itself.

Sources, so every figure can be checked by hand:
- ``pending`` / ``oldest_pending_age_s``: live (not tombstoned) records of ``ns.persist`` per
  partition, and their ``created_ms`` - the records the broker still guarantees;
- ``completed``, ``replayed``, ``timed_out``, ``failed``, ``orphans``, ``quarantined`` ...:
  the acker's per-partition counters in ``ns.ledger`` (key ``__counters__``), committed in
  the same transactions as the decisions they count;
- ``dlq``: messages in ``ns.dlq``, counted by reading it (offsets would also count the
  transaction markers); records and quarantined input.
"""

from __future__ import annotations

import time
from typing import Any

from broker.errors import DecodeError
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
    for msg in read_to_end(settings, ns.ledger, P):
        if msg.key() == COUNTERS_KEY and msg.value() is not None:
            per_partition_counters[msg.partition()] = decode_counters(msg.value())[0]
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
