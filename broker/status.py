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
- ``outages``: the tasks in an outage of a dependency now (``TaskConfig.outage``), since when -
  by the beats the ackers folded (broker.ledger.outages), as of their last commit: a task whose
  last beat covers now;
- ``dlq``: records the acker ever dead-lettered (``dlq`` + ``quarantined`` +
  ``payload_lost``: every record it writes to ``ns.dlq``), not what retention kept there;
  ``replaybroker dlq list`` reads the topic.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from broker.errors import TopologyError
from broker.kafka_io import kafka_errors, watermarks
from broker.ledger.outages import ClockStops, outages_in
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
    outages: dict[str, int] = {}  # task -> since when (epoch ms)
    for p, record in records.items():
        pending[p] = record.pending
        if record.oldest_pending_ms is not None and (oldest is None or record.oldest_pending_ms < oldest):
            oldest = record.oldest_pending_ms
        for task, since in outages_in(record.counters, now_ms).items():
            outages[task] = min(since, outages.get(task, since))
        for name, value in without_outages(record.counters).items():
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
        "outages": {
            task: {"since_ms": since, "for_s": round((now_ms - since) / 1000, 3)} for task, since in sorted(outages.items())
        },
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
            "outages": f"{where}: the outage beats of tasks (TaskConfig.outage) that cover now",
            "counters": where,
            "messages_read": f"{ns.ledger}, backwards from each partition's end",
        },
    }


def without_outages(counters: dict[str, int]) -> dict[str, int]:
    """A counters record's counters without the state of its stopped clock (not counts)."""
    return ClockStops.from_counters(counters)[1]


#: First window read back from a partition's end; doubled until the key is found. Small: an
#: acker's commit ends with its counters record, so it is mostly among a partition's last few.
FIRST_WINDOW = 32


@kafka_errors("reading the latest records")
def latest_with_key(
    settings: KafkaSettings, topic: str, partitions: int, key: bytes, timeout_s: float = 120.0
) -> tuple[dict[int, bytes], int]:
    """The value of the last non-tombstone message with ``key`` in each partition of
    ``topic``, and how many messages were read to find them.

    Each partition is read backwards from its end offset in growing windows
    (``FIRST_WINDOW``, then doubled) until a window holds the key or the window reaches the
    low watermark: the cost is bounded by how far back the last such message lies, not by
    the length of the partition. Every partition still looking reads its window at once (one
    assignment a round, the watermarks in two requests): at 1 000 partitions a read per
    partition would take a round trip and a poll each."""
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
        marks = watermarks(settings, topic, range(partitions))
        # partition -> (low watermark, end of the window to read next)
        looking = {p: (low, high) for p, (low, high) in marks.items() if high > low}
        window = FIRST_WINDOW
        while looking:
            starts = {p: max(low, end - window) for p, (low, end) in looking.items()}
            last, got = _read_windows(consumer, topic, starts, {p: end for p, (_, end) in looking.items()}, key, deadline)
            read += got
            found.update(last)
            looking = {p: (low, starts[p]) for p, (low, _) in looking.items() if p not in last and starts[p] > low}
            window *= 2
    finally:
        consumer.close()
    return found, read


def _read_windows(
    consumer: Consumer, topic: str, starts: dict[int, int], ends: dict[int, int], key: bytes, deadline: float,
) -> tuple[dict[int, bytes], int]:
    """Read ``[starts[p], ends[p])`` of every partition at once: the last value with ``key``
    in each, and how many messages were read."""
    consumer.assign([TopicPartition(topic, p, start) for p, start in starts.items()])
    last: dict[int, bytes] = {}
    open_ = set(starts)
    read = 0
    while open_:
        if time.monotonic() > deadline:
            raise TopologyError(f"could not read {topic} to its end")
        done: list[int] = []
        for msg in _fetched(consumer):
            p = msg.partition() or 0
            if p not in open_:
                continue
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise TopologyError(f"reading {topic}: {err}")
                done.append(p)
                open_.discard(p)
                continue
            if (msg.offset() or 0) >= ends[p]:
                done.append(p)
                open_.discard(p)
                continue
            read += 1
            if msg.key() == key and msg.value() is not None:
                last[p] = msg.value()
        if done:
            consumer.pause([TopicPartition(topic, p) for p in done])
    # A pause outlives the assignment: a partition paused here and assigned again for the next
    # window would never be fetched.
    consumer.resume([TopicPartition(topic, p) for p in starts])
    consumer.unassign()
    return last, read


def _fetched(consumer: Consumer) -> list[Message]:
    """What is fetched now, or else what comes within 50 ms - as soon as it comes: a batch
    ``consume`` waits out its whole timeout unless the batch fills (at 1 000 partitions a
    read takes a dozen fetch rounds, each would wait it)."""
    msgs = consumer.consume(10_000, 0)
    if msgs:
        return msgs
    first = consumer.poll(0.05)
    return [] if first is None else [first, *consumer.consume(10_000, 0)]
