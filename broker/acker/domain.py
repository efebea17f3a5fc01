"""The rule's domain: which persist values the acker may register at all.

A record's fate follows from a few of its fields: ``attempt`` against ``max_attempts``
decides replay or dead letter (``broker.replay.decide``), the deadline (created_ms +
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

import numpy as np

from broker.partitioning import PARTITIONERS
from broker.schemas import PERSIST_ADAPTIVE, PERSIST_PREFIX_LEN, PersistPrefixes

# A deadline past 64 bits is written as the largest long (``schemas.persist_deadline``): out.
DEADLINE_PAST_64_BITS = 2**63 - 1


def domain_errors(pre: PersistPrefixes) -> list[str | None]:
    """Per prefix of a batch, why its record is outside the rule's domain (None: inside):
    1 <= attempt <= max_attempts, a known partitioner, a deadline after created_ms (a
    timeout_ms > 0, or the adaptive one) that fits a long."""
    inside = (
        (pre.max_attempts >= 1) & (pre.attempts >= 1) & (pre.attempts <= pre.max_attempts)
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
    if not 1 <= attempt <= max_attempts:
        return f"attempt {attempt} outside 1..max_attempts ({max_attempts})"
    if not 1 <= pre.partitioners[i] <= len(PARTITIONERS):
        return f"unknown partitioner (code {int(pre.partitioners[i])}; known: {', '.join(PARTITIONERS)})"
    if deadline <= created:
        what = "the adaptive timeout" if pre.flags[i] & PERSIST_ADAPTIVE else "timeout_ms <= 0"
        return f"deadline {deadline} is not after created_ms {created} ({what})"
    return "deadline created_ms + timeout_ms is not a 64-bit long"


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
