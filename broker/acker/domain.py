"""The rule's domain: which persist values the acker may register at all.

A record's fate follows from a few of its fields: ``attempt`` against ``max_attempts``
decides replay or dead letter (``broker.acker.replay.decide``), the deadline (created_ms +
timeout_ms) when it times out, ``partitioner`` how the replay is placed. A value outside
their domain would be registered, timed out and replayed as it is - an attempt of -2^31 that
nobody acks would be replayed 2^31 times instead of dead-lettered. So the acker checks them
when it registers the record and quarantines it with the reason (``Ingest.register``).

The acker keeps the value as bytes (decoded only for a replay): the fields are in the value's
fixed prefix (``broker.schemas``), read for a batch at once, so the check is a few numpy
comparisons of its columns. The record after the prefix is the source of truth for a replay:
``PersistedRecord.decode`` refuses a value whose prefix says other than its record, and the
acker quarantines such a value when a replay needs it (``broker.acker.decisions``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from broker.headers import TOPIC_NAME
from broker.partitioning import PARTITIONERS
from broker.schemas import (
    MAX_ATTEMPTS,
    PERSIST_ADAPTIVE,
    PERSIST_PREFIX_LEN,
    PersistPrefixes,
    decode_placement,
)
from broker.topics import replay_topic

# A deadline past 64 bits is written as the largest long (``schemas.persist_deadline``): out.
DEADLINE_PAST_64_BITS = 2**63 - 1


def domain_errors(pre: PersistPrefixes) -> list[str | None]:
    """Per prefix of a batch, why its record is outside the rule's domain (None: inside):
    1 <= attempt <= max_attempts <= ``MAX_ATTEMPTS``, a known partitioner, a deadline after created_ms (a
    timeout_ms > 0, or the adaptive one) that fits a long."""
    inside = (
        (pre.max_attempts >= 1) & (pre.max_attempts <= MAX_ATTEMPTS) & (pre.attempts >= 1) & (pre.attempts <= pre.max_attempts)
        & (pre.partitioners >= 1) & (pre.partitioners <= len(PARTITIONERS))
        & (pre.deadlines_ms > pre.created_ms) & (pre.deadlines_ms < DEADLINE_PAST_64_BITS)
    )
    out: list[str | None] = [None] * len(inside)
    for i in np.flatnonzero(~inside).tolist():
        out[i] = _why(pre, i)
    return out


def _why(pre: PersistPrefixes, i: int) -> str:
    attempt, max_attempts = int(pre.attempts[i]), int(pre.max_attempts[i])
    deadline, created = int(pre.deadlines_ms[i]), int(pre.created_ms[i])
    if max_attempts < 1:
        return f"max_attempts {max_attempts} < 1"
    if max_attempts > MAX_ATTEMPTS:
        return f"max_attempts {max_attempts} > {MAX_ATTEMPTS}"
    if not 1 <= attempt <= max_attempts:
        return f"attempt {attempt} outside 1..max_attempts ({max_attempts})"
    if not 1 <= pre.partitioners[i] <= len(PARTITIONERS):
        return f"unknown partitioner (code {int(pre.partitioners[i])}; known: {', '.join(PARTITIONERS)})"
    if deadline <= created:
        what = "the adaptive timeout" if pre.flags[i] & PERSIST_ADAPTIVE else "timeout_ms <= 0"
        return f"deadline {deadline} is not after created_ms {created} ({what})"
    return "deadline created_ms + timeout_ms is not a 64-bit long"


# A data topic -> the partition count of its replay topic (None: it does not exist).
ReplayPartitions = Callable[[str], "int | None"]


def placement_error(placement: bytes, replay_partitions: ReplayPartitions | None) -> str | None:
    """Why a record with this encoded ``topic`` and ``key_hash_partition`` can never be
    replayed (None: it can). A replay goes to the key-hash partition of the topic's replay
    topic, so the partition must be one of that topic's. A replay topic that does not exist
    is no reason: a record that completes needs none, and one that fails is dead-lettered then
    with that reason (broker.acker.replay.decide) - it may have been created meanwhile."""
    decoded = decode_placement(placement)
    if decoded is None:
        return "persist record ends before its topic and key_hash_partition"
    topic, partition = decoded
    if not TOPIC_NAME.fullmatch(topic):
        return f"topic {topic[:300]!r} is not a Kafka topic name"
    if partition < 0:
        return f"key_hash_partition {partition} < 0"
    count = None if replay_partitions is None else replay_partitions(topic)
    if count is not None and partition >= count:
        return f"key_hash_partition {partition} is not one of the {count} partitions of {replay_topic(topic)}"
    return None


def placements_of(pre: PersistPrefixes, values: list[bytes], rows: np.ndarray) -> list[bytes]:
    """The encoded placement (topic, key_hash_partition) of each of the ``rows`` of a batch."""
    return [
        values[i][a:b]
        for i, a, b in zip(rows.tolist(), pre.placement_starts[rows].tolist(), pre.placement_ends[rows].tolist(),
                           strict=True)
    ]


def placement_errors(
    pre: PersistPrefixes, values: list[bytes], rows: np.ndarray, replay_partitions: ReplayPartitions | None,
    placements: list[bytes] | None = None,
) -> dict[int, str]:
    """Row -> why, for the ``rows`` of a batch whose placement can never be replayed; each
    distinct placement (a batch has few) is judged once. ``placements``: the rows' own
    (``placements_of``), if read already."""
    at = rows.tolist()
    if placements is None:
        placements = placements_of(pre, values, rows)
    verdicts = {p: placement_error(p, replay_partitions) for p in set(placements)}
    if not any(verdicts.values()):
        return {}
    return {i: why for i, p in zip(at, placements, strict=True) if (why := verdicts[p]) is not None}


def _long(b: bytes, i: int) -> tuple[int, int]:
    """The Avro long (zigzag varint) at ``i``, and the position after it."""
    x = b[i]
    if x < 0x80:
        return (x >> 1) ^ -(x & 1), i + 1
    z, shift = x & 0x7F, 7
    while True:
        i += 1
        x = b[i]
        z |= (x & 0x7F) << shift
        if x < 0x80:
            return (z >> 1) ^ -(z & 1), i + 1
        shift += 7


def _skip_long(b: bytes, i: int) -> int:
    """The position after the varint at ``i`` (ids: nothing to decode)."""
    while b[i] >= 0x80:
        i += 1
    return i + 1


def topic_of(value: bytes) -> bytes:
    """The ``topic`` field of a registered persist value (its record read that far; an adaptive
    record's deadline comes from its topic's latency). A value that ends before it: b""."""
    b = value
    try:
        i = _skip_long(b, _skip_long(b, PERSIST_PREFIX_LEN))  # srid, origin
        i = _skip_long(b, _skip_long(b, _skip_long(b, i)))  # attempt, root_xor, record_id
        n, i = _long(b, i)
    except IndexError:
        return b""
    return b[i : i + n]
