"""The rule's domain: which persist values the acker may register at all.

A record's fate follows from a few fields of its persist value: ``attempt`` against
``max_attempts`` decides replay or dead letter (``broker.replay.decide``), ``timeout_ms``
gives a replay's deadline, ``partitioner`` names how the replay is placed. A value outside
their domain would be registered, timed out and replayed as it is - an attempt of -2^31 that
nobody acks would be replayed 2^31 times instead of dead-lettered. So the acker checks them
when it registers the record and quarantines it with the reason (``Ingest.register``).

The acker keeps the value as bytes (decoded only for a replay), so the check reads just the
fields it needs of the record after the value's prefix (``broker.schemas``), skipping the rest by their lengths, without a dict or a dataclass: a batch
at once with numpy (``domain_errors``), a record alone in Python (``domain_error``, which
also says why; a few times cheaper than fastavro's full decode, and the batch several times
cheaper again per record).
"""

from __future__ import annotations

import numpy as np

from broker.headers import AUTO_TIMEOUT_MS
from broker.partitioning import PARTITIONERS
from broker.schemas import PERSIST_PREFIX_LEN

_KNOWN_PARTITIONERS = frozenset(name.encode() for name in PARTITIONERS)
# A deadline past 64 bits is written as the largest long (``schemas.persist_deadline``): out.
DEADLINE_PAST_64_BITS = 2**63 - 1


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
    """Why the persist ``value`` (registered with ``deadline_ms``; ``auto``: its prefix marks
    the timeout adaptive) is outside the rule's domain, or None when it is inside:
    1 <= attempt <= max_attempts, timeout_ms > 0 (or the adaptive marker with the flag),
    a known partitioner, a deadline after created_ms that fits a long. A value that ends inside one of these
    fields (or before them) is out too."""
    try:
        b = value
        i = _skip_long(b, _skip_long(b, PERSIST_PREFIX_LEN))  # srid (checked by the caller), origin
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
        return f"timeout_ms {timeout_ms} <= 0" + (" (-1 is adaptive only with the adaptive flag)" if timeout_ms == -1 else "")
    if partitioner not in _KNOWN_PARTITIONERS:
        return f"unknown partitioner {partitioner.decode(errors='replace')!r}"
    if deadline_ms <= created_ms:
        return f"deadline {deadline_ms} is not after created_ms {created_ms}"
    if deadline_ms >= DEADLINE_PAST_64_BITS:
        return "deadline created_ms + timeout_ms is not a 64-bit long"
    return None


# --------------------------------------------------------------------------- a batch at once
#
# ``domain_error`` costs a few microseconds of Python per record - about as much as
# registering it. A batch is read with numpy instead: field by field for all its values at
# once, a varint from the 8 bytes at its position read as one word, so the cost per record
# falls with the batch size. What it does not find inside the domain is read again by
# ``domain_error``, which says why.

_ONE, _TWO, _FOUR = np.uint64(1), np.uint64(2), np.uint64(4)
_HIGH_BITS = np.uint64(0x8080_8080_8080_8080)
_SEVEN_BITS = np.uint64(0x7F7F_7F7F_7F7F_7F7F)
_S16 = np.uint64(0x007F_007F_007F_007F), np.uint64(0x7F00_7F00_7F00_7F00)
_S32 = np.uint64(0x0000_3FFF_0000_3FFF), np.uint64(0x3FFF_0000_3FFF_0000)
_S64 = np.uint64(0x0000_0000_0FFF_FFFF), np.uint64(0x0FFF_FFFF_0000_0000)
BATCH_FROM = 16
"""Smaller batches are checked record by record (numpy's fixed cost per call is larger)."""


_Rows = slice | np.ndarray
_ALL = slice(None)


class _Reader:
    """The values of a batch, joined, and per value whether it is still readable."""

    def __init__(self, values: list[bytes]) -> None:
        lengths = np.fromiter((len(v) for v in values), np.int64, len(values))
        self.ends = np.cumsum(lengths)
        self.total = int(self.ends[-1])
        raw = b"".join(values) + bytes(16)
        self.buf = np.frombuffer(raw, np.uint8)
        # At every position, the 8 bytes from there as one little-endian word.
        self.words = np.ndarray((self.total + 1,), "<u8", raw, strides=(1,))
        self.ok = np.ones(len(values), bool)
        # Where each varint ends: at the first byte below 0x80 from its start on.
        self.stops = np.flatnonzero(self.buf < 0x80)

    def past(self, pos: np.ndarray) -> np.ndarray:
        """The positions after the longs at ``pos``, not decoded (the ids)."""
        after = self.stops[np.searchsorted(self.stops, np.minimum(pos, self.total))] + 1
        self.ok &= (pos < self.total) & (after - pos <= 10)
        return after

    def long(self, pos: np.ndarray, rows: _Rows = _ALL) -> tuple[np.ndarray, np.ndarray]:
        """The Avro longs at ``pos`` (of the values ``rows``), and the positions after them.
        A long of more than 8 bytes (a created_ms before 1970 or past 2248, an absurd count)
        is not read here: its value goes the slow way."""
        u = self.words[np.minimum(pos, self.total)]  # the 8 bytes from pos, little-endian
        stop = ~u & _HIGH_BITS  # the high bit of each byte that ends a varint
        low = stop & (~stop + _ONE)  # the first one's
        self.ok[rows] &= (pos < self.total) & (low != 0)
        n = ((np.log2(low | _ONE).astype(np.int64) + 1) >> 3)  # bytes up to the first stop
        z = u & ((low << _ONE) - _ONE) & _SEVEN_BITS
        z = (z & _S16[0]) | ((z & _S16[1]) >> _ONE)  # 7-bit groups closed up: 14 per 16 bits,
        z = (z & _S32[0]) | ((z & _S32[1]) >> _TWO)  # 28 per 32,
        z = (z & _S64[0]) | ((z & _S64[1]) >> _FOUR)  # 56 per 64
        return (z >> _ONE).astype(np.int64) ^ -(z & _ONE).astype(np.int64), pos + n

    def skip(self, pos: np.ndarray, n: np.ndarray, rows: _Rows = _ALL) -> np.ndarray:
        """``pos`` moved past ``n`` bytes (a length read from the value)."""
        self.ok[rows] &= (n >= 0) & (n <= self.total)
        return np.minimum(pos + np.clip(n, 0, self.total), self.total)

    def optional(self, pos: np.ndarray, rows: _Rows = _ALL) -> np.ndarray:
        """Past an Avro ``["null", "bytes"]`` union."""
        branch, after = self.long(pos, rows)
        self.ok[rows] &= (branch == 0) | (branch == 1)
        n, past = self.long(after, rows)  # (after a null: the next field, a varint too)
        return np.where(branch == 1, self.skip(past, np.where(branch == 1, n, 0), rows), after)

    def equals(self, pos: np.ndarray, n: np.ndarray, text: bytes) -> np.ndarray:
        same = n == len(text)
        if len(text):
            same &= (self.buf[np.minimum(pos, self.total)[:, None] + np.arange(len(text))] == np.frombuffer(text, np.uint8)).all(axis=1)
        return same


def domain_errors(values: list[bytes], deadline_ms: np.ndarray, auto: list[bool]) -> list[str | None]:
    """``domain_error`` of each value of a batch (None: inside the domain)."""
    if len(values) < BATCH_FROM:
        return [domain_error(v, d, a) for v, d, a in zip(values, deadline_ms.tolist(), auto, strict=True)]
    r = _Reader(values)
    p = np.concatenate(([0], r.ends[:-1])) + PERSIST_PREFIX_LEN
    p = r.past(r.past(p))  # srid, origin
    attempt, p = r.long(p)
    p = r.past(r.past(p))  # root_xor, record_id
    n, p = r.long(p)
    p = r.past(r.skip(p, n))  # topic, key_hash_partition
    n, p = r.long(p)
    known = np.zeros(len(values), bool)
    for name in _KNOWN_PARTITIONERS:
        known |= r.equals(p, n, name)
    p = r.optional(r.optional(r.skip(p, n)))  # partitioner, key, value
    count, p = r.long(p)  # headers: one block, or none (a negative count goes the slow way)
    r.ok &= count >= 0
    left = np.flatnonzero(r.ok & (count > 0))
    while left.size:
        q = p[left]
        n, q = r.long(q, left)
        q = r.optional(r.skip(q, n, left), left)
        count[left] -= 1
        done = count[left] == 0
        if done.any():  # the next block's count (0: the end)
            more, after = r.long(q[done], left[done])
            r.ok[left[done]] &= more >= 0
            q[done], count[left[done]] = after, more
        p[left] = q
        left = left[r.ok[left] & (count[left] > 0)]
    created_ms, p = r.long(p)
    timeout_ms, p = r.long(p)
    max_attempts, p = r.long(p)
    inside = (
        r.ok & (p <= r.ends) & known & (max_attempts >= 1) & (attempt >= 1) & (attempt <= max_attempts)
        & (deadline_ms > created_ms) & (deadline_ms < DEADLINE_PAST_64_BITS) & ((timeout_ms > 0) | (np.asarray(auto, bool) & (timeout_ms == AUTO_TIMEOUT_MS)))
    )
    out: list[str | None] = [None] * len(values)
    for i in np.flatnonzero(~inside).tolist():
        out[i] = domain_error(values[i], int(deadline_ms[i]), auto[i])
    return out


def topic_of(value: bytes) -> bytes:
    """The ``topic`` field of a persist value inside the domain (its record read that far)."""
    b = value
    i = _skip_long(b, _skip_long(b, PERSIST_PREFIX_LEN))  # srid, origin
    i = _skip_long(b, _skip_long(b, _skip_long(b, i)))  # attempt, root_xor, record_id
    n, i = _long(b, i)
    return b[i : i + n]
