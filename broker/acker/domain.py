"""The rule's domain: which persist values the acker may register at all.

A record's fate follows from a few fields of its persist value: ``attempt`` against
``max_attempts`` decides replay or dead letter (``broker.replay.decide``), ``timeout_ms``
gives a replay's deadline, ``partitioner`` names how the replay is placed. A value outside
their domain would be registered, timed out and replayed as it is - an attempt of -2^31 that
nobody acks would be replayed 2^31 times instead of dead-lettered. So the acker checks them
when it registers the record and quarantines it with the reason (``Ingest.register``).

The acker keeps the value as bytes (decoded only for a replay), so the check reads just the
fields it needs, skipping the rest by their lengths: one pass of Python over the varints, no
dict, no dataclass (``domain_error``; its cost is in docs/benchmarks.md).
"""

from __future__ import annotations

from broker.headers import AUTO_TIMEOUT_MS
from broker.partitioning import PARTITIONERS

_KNOWN_PARTITIONERS = frozenset(name.encode() for name in PARTITIONERS)


class _Truncated(Exception):
    """The value ends inside a field."""


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
        if shift > 63:
            raise _Truncated("a varint longer than 10 bytes")


def _skip_long(b: bytes, i: int) -> int:
    """The position after the varint at ``i`` (srids and ids: 10 bytes, nothing to decode)."""
    while b[i] >= 0x80:
        i += 1
    return i + 1


def _skip_bytes(b: bytes, i: int) -> int:
    n, i = _long(b, i)
    if n < 0 or i + n > len(b):
        raise _Truncated(f"a length of {n}")
    return i + n


def _skip_optional(b: bytes, i: int) -> int:
    """An Avro ``["null", "bytes"]`` union."""
    branch, i = _long(b, i)
    if branch == 0:
        return i
    if branch != 1:
        raise _Truncated(f"union branch {branch}")
    return _skip_bytes(b, i)


def _skip_headers(b: bytes, i: int) -> int:
    """The position after the ``headers`` array at ``i``: blocks of (count, items); a
    negative count is followed by the block's size in bytes."""
    while True:
        count, i = _long(b, i)
        if count == 0:
            return i
        if count < 0:
            i = _skip_bytes(b, i)
            continue
        for _ in range(count):
            i = _skip_optional(b, _skip_bytes(b, i))


def domain_error(value: bytes, deadline_ms: int, auto: bool) -> str | None:
    """Why the persist ``value`` (registered with ``deadline_ms``; ``auto``: it has the
    ``rb-timeout: auto`` header) is outside the rule's domain, or None when it is inside:
    1 <= attempt <= max_attempts, timeout_ms > 0 (or the adaptive marker with the header),
    a known partitioner, a deadline after created_ms. A value that ends inside one of these
    fields (or before them) is out too."""
    try:
        b = value
        i = _skip_long(b, _skip_long(b, 0))  # srid (checked against the key by the caller), origin
        attempt, i = _long(b, i)
        i = _skip_long(b, _skip_long(b, i))  # root_xor, record_id
        i = _skip_bytes(b, i)  # topic
        i = _skip_long(b, i)  # key_hash_partition
        n, i = _long(b, i)
        partitioner = b[i : i + n]
        i = _skip_optional(b, _skip_optional(b, i + n))  # key, value
        i = _skip_headers(b, i)
        created_ms, i = _long(b, i)
        timeout_ms, i = _long(b, i)
        max_attempts, i = _long(b, i)
    except (IndexError, _Truncated) as exc:
        return f"persist value is not a PersistedRecord ({exc or 'it ends inside a field'})"
    if max_attempts < 1:
        return f"max_attempts {max_attempts} < 1"
    if not 1 <= attempt <= max_attempts:
        return f"attempt {attempt} outside 1..max_attempts ({max_attempts})"
    if timeout_ms <= 0 and not (auto and timeout_ms == AUTO_TIMEOUT_MS):
        return f"timeout_ms {timeout_ms} <= 0" + (" (-1 is adaptive only with rb-timeout: auto)" if timeout_ms == -1 else "")
    if partitioner not in _KNOWN_PARTITIONERS:
        return f"unknown partitioner {partitioner.decode(errors='replace')!r}"
    if deadline_ms <= created_ms:
        return f"deadline {deadline_ms} is not after created_ms {created_ms}"
    return None
