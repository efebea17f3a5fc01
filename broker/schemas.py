"""Avro codecs for the three record types; ``schemas/*.avsc`` is the single source of truth.

Each schema is parsed once at import. Encoding is schemaless Avro (no container header): the
topic says which schema a value has. Decoding errors are ``DecodeError`` so services can
quarantine the message instead of dying.

Each record type grew by appending groups of fields; a record is written in the shortest
layout (the first groups) that holds it. A value says its layout (``Layouts``): an XorBatch,
LedgerEntry or LedgerCounters by a two-byte tag before it, a persist value by a flag of its
prefix (``PERSIST_BACKOFF``). A value must end exactly where its layout does, so a record cut
short is refused - never read as a shorter layout. A value without a tag is an older writer's
(before the tags): its layout is how many groups its bytes hold.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, NamedTuple

import fastavro
import numpy as np
from numpy.lib.stride_tricks import as_strided

from broker.errors import ConfigurationError, DecodeError
from broker.headers import ADAPTIVE_FALLBACK_MS, AUTO_TIMEOUT_MS
from broker.partitioning import PARTITIONERS
from broker.retry import RetryPolicy

_LE_I64 = np.dtype("<i8")


def _schema_json(name: str) -> dict[str, Any]:
    text = resources.files("schemas").joinpath(f"{name}.avsc").read_text()
    return dict(json.loads(text))


def _encode(schema: Any, datum: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, datum)
    return buf.getvalue()


def _layout_tag(kind: int, layout: int) -> bytes:
    """The tag before a value of record type ``kind`` in ``layout``: ``0x80 | kind << 4 |
    layout, 0x00`` - a varint whose last byte is zero, which no Avro writer makes (varints are
    minimal), so it never begins an untagged value: those begin with a varint (an int, a long
    or a map's block count)."""
    return bytes((0x80 | kind << 4 | layout, 0))


class Layouts:
    """A record type's layouts: its field groups in the order they were appended (layout k
    holds the first k), each layout's schema and tag. ``read`` takes the layout from the tag,
    or from the bytes themselves for an untagged value: the groups they hold, read one after
    another while bytes are left."""

    def __init__(self, kind: int | None, schema: dict[str, Any], groups: tuple[tuple[str, ...], ...]) -> None:
        fields = {f["name"]: f for f in schema["fields"]}
        assert [n for g in groups for n in g] == list(fields), "the groups are the schema's fields, in order"
        self.what = schema["name"]
        self.groups = tuple(
            fastavro.parse_schema({**schema, "name": f"{self.what}Group{i}", "fields": [fields[n] for n in g]})
            for i, g in enumerate(groups)
        )
        self.schemas = tuple(
            fastavro.parse_schema({**schema, "fields": [fields[n] for g in groups[:k] for n in g]})
            for k in range(1, len(groups) + 1)
        )
        # No kind: a type whose layout its value says elsewhere (a persist value's flags).
        self.tags = () if kind is None else tuple(_layout_tag(kind, k) for k in range(1, len(groups) + 1))
        self._by_tag = {tag: k for k, tag in enumerate(self.tags, 1)}

    def encode(self, layout: int, datum: dict[str, Any]) -> bytes:
        return self.tags[layout - 1] + _encode(self.schemas[layout - 1], datum)

    def read(self, data: bytes | None, start: int = 0, layout: int | None = None) -> tuple[dict[str, Any], int]:
        """The record from ``data[start:]`` and its layout (1 for the first): ``layout`` if
        given (untagged), else the tag's, else (no tag) as many groups as the bytes hold."""
        if not data or len(data) <= start:
            raise DecodeError(f"empty {self.what}")
        if layout is None and self.tags and data[start] >= 0x80 and data[start + 1 : start + 2] == b"\x00":
            layout = self._by_tag.get(data[start : start + 2])
            if layout is None:
                raise DecodeError(f"{self.what} has an unknown layout tag {data[start:start + 2].hex()}")
            start += 2
        buf = io.BytesIO(data)
        buf.seek(start)
        if layout is not None:
            datum = self._read(buf, self.schemas[layout - 1], f"undecodable {self.what}")
        else:
            datum, layout = self._read(buf, self.groups[0], f"undecodable {self.what}"), 1
            while buf.tell() < len(data) and layout < len(self.groups):
                left = len(data) - buf.tell()
                datum.update(self._read(buf, self.groups[layout], f"{self.what} has {left} trailing bytes, not its next fields"))
                layout += 1
        if buf.tell() != len(data):
            raise DecodeError(f"{self.what} has {len(data) - buf.tell()} trailing bytes (wrong schema?)")
        return datum, layout

    def _read(self, buf: io.BytesIO, schema: Any, error: str) -> dict[str, Any]:
        try:
            datum = fastavro.schemaless_reader(buf, schema, None)
        except Exception as exc:
            raise DecodeError(f"{error}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(datum, dict):
            raise DecodeError(f"{self.what} is not a record")
        return datum


# Each type's groups of fields, in the order they were appended, and its layouts' schemas
# (without the tag; the last one is schemas/*.avsc's). A record is written in the shortest
# layout that holds it.
_TOUCH_FIELDS = ("touched", "touched_deadlines")
_SUPERSEDED_FIELDS = ("superseded",)
_REJECTED_FIELDS = ("rejected", "rejected_reasons")
_RETRY_AFTER_FIELDS = ("retry_after_ms",)
XOR_BATCH_LAYOUTS = Layouts(1, _schema_json("xor_batch"), (
    ("ledger_partition", "srids", "xors", "failed", "producer"), _TOUCH_FIELDS, _SUPERSEDED_FIELDS, _REJECTED_FIELDS,
    _RETRY_AFTER_FIELDS,
))
XOR_BATCH, XOR_BATCH_WITH_TOUCHES, XOR_BATCH_WITH_SUPERSEDED, XOR_BATCH_WITH_REJECTED, XOR_BATCH_FULL = (
    XOR_BATCH_LAYOUTS.schemas
)
# A deferred timeout's or a failed entry's holds ``timed_out_ms``, a rejected one's its ``rejection``, one
# that waits for the replay its task asked for ``retry_at_ms``; every other entry none of them.
LEDGER_ENTRY_LAYOUTS = Layouts(2, _schema_json("ledger_entry"), (
    ("value", "flags", "persist_offset", "deadline_ms"), ("timed_out_ms",), ("rejection",), ("retry_at_ms",),
))
LEDGER_ENTRY_V1, LEDGER_ENTRY, LEDGER_ENTRY_WITH_REJECTION, LEDGER_ENTRY_FULL = LEDGER_ENTRY_LAYOUTS.schemas
# The ledger entry's tags by layout, for the hand-written encoders.
_ENTRY_TAG, _TIMED_OUT_TAG, _REJECTION_TAG, _RETRY_AT_TAG = LEDGER_ENTRY_LAYOUTS.tags
# The pending figures and the restore floor (broker.acker.state), appended in that order.
_PENDING_FIELDS = ("pending", "oldest_pending_offset", "oldest_pending_ms")
LEDGER_COUNTERS_LAYOUTS = Layouts(3, _schema_json("ledger_counters"), (
    ("counters", "updated_ms"), _PENDING_FIELDS, ("restore_floor",),
))
LEDGER_COUNTERS_V1, LEDGER_COUNTERS_V2, LEDGER_COUNTERS = LEDGER_COUNTERS_LAYOUTS.schemas
# A persist record without a back-off, and with its ``retry``: its value's prefix says which
# (``PERSIST_BACKOFF``), no tag.
_PERSISTED_RECORD_JSON = _schema_json("persisted_record")
PERSISTED_RECORD_LAYOUTS = Layouts(None, _PERSISTED_RECORD_JSON, (
    tuple(f["name"] for f in _PERSISTED_RECORD_JSON["fields"] if f["name"] != "retry"), ("retry",),
))
PERSISTED_RECORD, PERSISTED_RECORD_FULL = PERSISTED_RECORD_LAYOUTS.schemas


# --------------------------------------------------------------------------- fast Avro encoders
#
# The hot paths (Source.send, the acker's changelog) encode one small record at a time, where
# fastavro's generic writer spends most of its time building and walking a dict. These
# hand-written encoders produce the SAME bytes as ``fastavro.schemaless_writer`` (tested with
# hypothesis in tests/unit/test_fast_codecs.py); decoding stays with fastavro.
#
# Avro ``int``/``long``: zigzag, then a little-endian base-128 varint. ``bytes``/``string``:
# the length as a long, then the bytes. A union: the branch index as a long, then the value.
# An array: one block ``count, items...`` then the 0 terminator (just 0 when empty).

def _lanes(bits: int, width: int) -> int:
    """A mask of the low ``bits`` of every ``width``-bit lane of a 192-bit int."""
    return sum(((1 << bits) - 1) << i for i in range(0, 192, width))


# Spreading 7-bit groups into bytes in three halving steps (56 -> 28 -> 14 -> 7 bits per lane)
# instead of a 10-round Python loop per 64-bit id.
_M56 = (1 << 56) - 1
_L28, _H28 = _lanes(28, 64), _lanes(56, 64) & ~_lanes(28, 64)
_L14, _H14 = _lanes(14, 32), _lanes(28, 32) & ~_lanes(14, 32)
_L7, _H7 = _lanes(7, 16), _lanes(14, 16) & ~_lanes(7, 16)
_CONTINUE = (0, *(sum(0x80 << (8 * i) for i in range(nb - 1)) for nb in range(1, 11)))


def _varint(z: int) -> bytes:
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


# One- and two-byte varints (|n| < 8192: lengths, attempts, flags, partitions) from a table.
_SMALL = tuple(_varint(z) for z in range(1 << 14))


def avro_long(n: int) -> bytes:
    """Zigzag varint of a signed 64-bit int, as Avro writes ``int`` and ``long``."""
    z = (n << 1) ^ (n >> 63)
    if z < 0x4000:
        return _SMALL[z]
    nb = (z.bit_length() + 6) // 7
    x = (z & _M56) | ((z >> 56) << 64)
    x = (x & _L28) | ((x & _H28) << 4)
    x = (x & _L14) | ((x & _H14) << 2)
    x = (x & _L7) | ((x & _H7) << 1)
    return (x | _CONTINUE[nb]).to_bytes(nb, "little")


# Thresholds of the zigzag value at which a varint needs one more byte: 2^7, 2^14, ... 2^63.
_VARINT_STEPS = np.array([1 << (7 * i) for i in range(1, 10)], dtype=np.uint64)
_SEVEN_BITS = np.arange(0, 70, 7, dtype=np.uint64)
# By a varint's length: which of its ten bytes it uses, and their continuation bits.
_USED = np.arange(10) < np.arange(11)[:, None]
_CONTINUED = ((np.arange(10) < np.arange(11)[:, None] - 1) * 0x80).astype(np.uint8)


def _varint_groups(n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Avro long varints of an int64 array: ten bytes per value (continuation bits set,
    the unused tail zero) and how many of them each uses."""
    with np.errstate(over="ignore"):
        z = ((n << 1) ^ (n >> 63)).view(np.uint64)
    groups = ((z[:, None] >> _SEVEN_BITS) & np.uint64(0x7F)).astype(np.uint8)
    lengths = np.searchsorted(_VARINT_STEPS, z, side="right") + 1
    groups |= _CONTINUED[lengths]
    return groups, lengths


def avro_rows(*columns: np.ndarray, tag: bytes = b"") -> list[bytes]:
    """Per row, ``tag`` (two bytes or none) then the ``avro_long`` of each column one after
    the other: records whose fields are all longs, encoded at once (one slice per record, no
    join)."""
    if tag:  # a column of zeros first, whose one-byte varints become the tag
        columns = (np.zeros(len(columns[0]), np.int64), *columns)
    table = np.stack([np.asarray(c, dtype=np.int64) for c in columns], axis=1)
    if table.shape[0] == 0:
        return []
    groups, lengths = _varint_groups(table.ravel())
    if tag:
        groups.reshape(table.shape[0], -1, 10)[:, 0, :2] = np.frombuffer(tag, np.uint8)
        lengths.reshape(table.shape)[:, 0] = 2
    buf = groups[_USED[lengths]].tobytes()  # row by row, field by field
    ends = np.cumsum(lengths.reshape(table.shape).sum(axis=1)).tolist()
    return [buf[i:j] for i, j in zip([0, *ends[:-1]], ends, strict=True)]


_STRINGS: dict[str, bytes] = {}


def avro_string(s: str) -> bytes:
    """Topic and partitioner names repeat: their encodings are cached (bounded)."""
    enc = _STRINGS.get(s)
    if enc is None:
        raw = s.encode()
        enc = avro_long(len(raw)) + raw
        if len(_STRINGS) < 1024:
            _STRINGS[s] = enc
    return enc


_NULL = b"\x00"  # union branch 0: null
_BRANCH_1 = b"\x02"  # union branch 1 (zigzag of 1)
_EMPTY_ARRAY = b"\x00"


def _optional_bytes(b: bytes | None) -> bytes:
    return _NULL if b is None else _BRANCH_1 + avro_long(len(b)) + b


def encode_persisted(
    srid: int,
    origin: int,
    attempt: int,
    root_xor: int,
    record_id: int,
    topic: str,
    key_hash_partition: int,
    partitioner: str,
    key: bytes | None,
    value: bytes | None,
    headers: tuple[tuple[str, bytes | None], ...] | list[tuple[str, bytes | None]],
    created_ms: int,
    timeout_ms: int,
    max_attempts: int,
    history: tuple[Failure, ...] = (),
    retry: RetryPolicy | None = None,
) -> bytes:
    """A persist value - its prefix and the ``PersistedRecord`` (bytes as fastavro's) -
    without building the dataclass."""
    srid_b, root_b = avro_long(srid), avro_long(root_xor)
    parts = [
        _id_key(srid), _id_key(root_xor),
        persist_prefix_fields(created_ms, timeout_ms, attempt, max_attempts, partitioner, retry is not None),
        srid_b, srid_b if origin == srid else avro_long(origin), avro_long(attempt), root_b,
        root_b if record_id == root_xor else avro_long(record_id),
        avro_string(topic), avro_long(key_hash_partition), avro_string(partitioner),
        _optional_bytes(key), _optional_bytes(value), avro_headers(headers),
        avro_long(created_ms), avro_long(timeout_ms), avro_long(max_attempts),
    ]
    if history:
        parts.append(avro_long(len(history)))
        for f in history:
            parts.append(avro_long(f.srid))
            parts.append(avro_long(f.attempt))
            raw = f.reason.encode()
            parts.append(avro_long(len(raw)))
            parts.append(raw)
            parts.append(avro_long(f.at_ms))
    parts.append(_EMPTY_ARRAY)
    if retry is not None:
        parts.append(avro_retry(retry))
    return b"".join(parts)


def avro_retry(retry: RetryPolicy) -> bytes:
    """A ``PersistedRecord``'s ``retry`` field, present (the record's last bytes)."""
    return (_BRANCH_1 + avro_long(retry.initial_ms) + struct.pack("<d", float(retry.multiplier))
            + avro_long(retry.max_ms) + struct.pack("<d", float(retry.jitter)))


def avro_placement(topic: str, key_hash_partition: int, partitioner: str) -> bytes:
    """The ``topic``, ``key_hash_partition`` and ``partitioner`` fields of a
    ``PersistedRecord``, encoded (a source caches them per topic and partition)."""
    return avro_string(topic) + avro_long(key_hash_partition) + avro_string(partitioner)


_SMALL_LEN = len(_SMALL) >> 1  # lengths below this are one table lookup
# A present key's or value's union branch and length, for the lengths below _SMALL_LEN.
_PRESENT_LEN = tuple(_BRANCH_1 + _SMALL[n << 1] for n in range(_SMALL_LEN))


def avro_headers(headers: tuple[tuple[str, bytes | None], ...] | list[tuple[str, bytes | None]]) -> bytes:
    """A ``PersistedRecord``'s ``headers`` array, terminator included."""
    if not headers:
        return _EMPTY_ARRAY
    parts = [avro_long(len(headers))]
    for k, v in headers:
        parts.append(avro_string(k))
        parts.append(_optional_bytes(v))
    parts.append(_EMPTY_ARRAY)
    return b"".join(parts)


def first_attempt_ids(srids: np.ndarray, record_ids: np.ndarray) -> list[bytes]:
    """Per pair, the first Avro fields of a first attempt - srid, origin (= srid), attempt 1,
    root_xor and record_id (= the record id) - for ids drawn in bulk (numpy). ``avro_rows`` of
    the five columns, with each id's varint computed once, not twice."""
    n = len(srids)
    if n == 0:
        return []
    groups, lengths = _varint_groups(np.stack([srids, record_ids], axis=1).astype(np.int64).ravel())
    groups, lengths = groups.reshape(n, 2, 10), lengths.reshape(n, 2)
    used = _USED[lengths]
    row = np.empty((n, 41), np.uint8)  # srid, srid, attempt 1, record id, record id: 10 + 10 + 1 + 10 + 10
    keep = np.empty((n, 41), bool)
    row[:, 0:10] = row[:, 10:20] = groups[:, 0]
    row[:, 21:31] = row[:, 31:41] = groups[:, 1]
    row[:, 20] = 2  # avro_long(1)
    keep[:, 0:10] = keep[:, 10:20] = used[:, 0]
    keep[:, 21:31] = keep[:, 31:41] = used[:, 1]
    keep[:, 20] = True
    buf = row[keep].tobytes()
    ends = np.cumsum(2 * lengths.sum(axis=1) + 1).tolist()
    return [buf[i:j] for i, j in zip([0, *ends[:-1]], ends, strict=True)]


class FirstAttempts(NamedTuple):
    """What every first attempt of a batch (one created_ms, timeout, max_attempts and
    partitioner) shares: its prefix after the two ids, and the record's last fields encoded -
    created_ms, timeout_ms, max_attempts and the empty history."""

    prefix_fields: bytes
    tail: bytes

    @classmethod
    def of(cls, created_ms: int, timeout_ms: int, max_attempts: int, partitioner: str,
           retry: RetryPolicy | None = None) -> FirstAttempts:
        return cls(
            persist_prefix_fields(created_ms, timeout_ms, 1, max_attempts, partitioner, retry is not None),
            avro_long(created_ms) + avro_long(timeout_ms) + avro_long(max_attempts) + _EMPTY_ARRAY
            + (b"" if retry is None else avro_retry(retry)),
        )


def encode_first_persisted(
    ids_key: bytes, ids_avro: bytes, placement: bytes, key: bytes | None, value: bytes | None,
    headers_avro: bytes, shared: FirstAttempts,
) -> bytes:
    """``encode_persisted`` of a first attempt as a ``Source`` makes it - origin = srid,
    attempt 1, root_xor = record_id, no history - from parts encoded already: the two ids as
    8-byte keys (``ids_key``, 16 bytes) and as Avro (``first_attempt_ids``), ``avro_placement``,
    ``avro_headers`` and the batch's ``FirstAttempts``. The same bytes, with one join."""
    if key is None:
        key_len, key = _NULL, b""
    else:
        n = len(key)
        key_len = _PRESENT_LEN[n] if n < _SMALL_LEN else _BRANCH_1 + avro_long(n)
    if value is None:
        value_len, value = _NULL, b""
    else:
        n = len(value)
        value_len = _PRESENT_LEN[n] if n < _SMALL_LEN else _BRANCH_1 + avro_long(n)
    prefix_fields, tail = shared
    return b"".join((ids_key, prefix_fields, ids_avro, placement, key_len, key, value_len, value, headers_avro, tail))


def encode_ledger_entries(values: np.ndarray, flags: np.ndarray, persist_offsets: np.ndarray,
                          deadlines_ms: np.ndarray, timed_out_ms: np.ndarray | None = None,
                          rejections: Mapping[int, str] | None = None,
                          retry_at_ms: Mapping[int, int] | None = None) -> list[bytes]:
    """``encode_ledger_entry`` of whole columns (numpy varints, one slice per entry); the
    few entries with a ``timed_out_ms`` >= 0 get it appended, the few with a rejection (row
    -> why) or a retry time (row -> epoch ms) the fields up to it (the ones before as
    defaults). A rejected entry is never replayed: its retry time is left out."""
    rows = avro_rows(values, flags, persist_offsets, deadlines_ms, tag=_ENTRY_TAG)
    timed: set[int] = set()
    if timed_out_ms is not None:
        timed = set(np.flatnonzero(np.asarray(timed_out_ms) >= 0).tolist())
        for i in timed:
            rows[i] = _TIMED_OUT_TAG + rows[i][2:] + avro_long(int(timed_out_ms[i]))
    rejections, retry_at_ms = rejections or {}, retry_at_ms or {}
    for i in sorted(rejections.keys() | retry_at_ms.keys()):
        row = rows[i][2:] if i in timed else rows[i][2:] + avro_long(-1)
        if i in retry_at_ms and i not in rejections:
            rows[i] = _RETRY_AT_TAG + row + avro_string("") + avro_long(retry_at_ms[i])
        else:
            rows[i] = _REJECTION_TAG + row + avro_string(rejections[i])
    return rows


def encode_ledger_entry(value: int, flags: int, persist_offset: int, deadline_ms: int, timed_out_ms: int = -1,
                        rejection: str = "", retry_at_ms: int = -1) -> bytes:
    """A ``LedgerEntry`` value (its tag, then the bytes fastavro writes), without the dataclass."""
    out = avro_long(value) + avro_long(flags) + avro_long(persist_offset) + avro_long(deadline_ms)
    if retry_at_ms >= 0 and not rejection:
        return _RETRY_AT_TAG + out + avro_long(timed_out_ms) + avro_string(rejection) + avro_long(retry_at_ms)
    if rejection:
        return _REJECTION_TAG + out + avro_long(timed_out_ms) + avro_string(rejection)
    return _ENTRY_TAG + out if timed_out_ms < 0 else _TIMED_OUT_TAG + out + avro_long(timed_out_ms)


# --------------------------------------------------------------------------- persist values
#
# A persist value is a fixed prefix, then the ``PersistedRecord`` in Avro:
#
#   srid (8 bytes) | root_xor (8) | deadline_ms (8) | created_ms (8) | attempt (4) |
#   max_attempts (4) | flags (1) | partitioner (1) | PersistedRecord (Avro)
#
# Big-endian two's complement integers, the srid equal to the record's key. The prefix is what
# the acker registers an srid by and checks the rule's domain on (broker.acker.domain): it
# reads a whole batch of them with numpy (``read_persist_prefixes``), with no header and
# without decoding the body; every other reader decodes the record (``PersistedRecord.decode``),
# which refuses a value whose prefix says other than its record. deadline_ms is created_ms +
# timeout_ms; with ``PERSIST_ADAPTIVE`` set (timeout_ms = ``AUTO_TIMEOUT_MS``) the acker gives
# the deadline from its latency estimate of the record's topic (docs/design.md §6) and
# deadline_ms is created_ms + ``ADAPTIVE_FALLBACK_MS``, a fallback (timeout_ms itself is not in
# the prefix: the deadline after created_ms and the flag say what the rule needs of it). ``partitioner`` is the
# name's place in ``broker.partitioning.PARTITIONERS`` from 1 (0: none of them). Every writer
# makes the prefix with ``persist_prefix_fields`` (all of it but the two ids).

PERSIST_PREFIX = np.dtype([
    ("srid", ">i8"), ("root_xor", ">i8"), ("deadline_ms", ">i8"), ("created_ms", ">i8"),
    ("attempt", ">i4"), ("max_attempts", ">i4"), ("flags", "u1"), ("partitioner", "u1"),
])
PERSIST_PREFIX_LEN = PERSIST_PREFIX.itemsize  # 42
_PREFIX_FIELDS = struct.Struct(">qqiiBB")  # the prefix after the two ids
PERSIST_ADAPTIVE = 1  # flags: the record's timeout is adaptive (timeout_ms = AUTO_TIMEOUT_MS)
# flags: the record ends with its ``retry`` (its layout; set by every writer since the flag
# exists). Without it the record is a shorter layout, or an older writer's of either.
PERSIST_BACKOFF = 2
PERSIST_FLAGS = PERSIST_ADAPTIVE | PERSIST_BACKOFF  # every flag: a larger byte is no persist value's
_FLAGS_AT = 8 * 4 + 4 * 2  # after the four longs, attempt and max_attempts
# The most attempts a record may have (SQS's maxReceiveCount has the same bound): a source
# refuses more, the acker quarantines a persist record with more (broker.acker.domain).
MAX_ATTEMPTS = 1000
_PARTITIONER_CODES = {name: code for code, name in enumerate(PARTITIONERS, 1)}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _id_key(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


def persist_deadline(created_ms: int, timeout_ms: int) -> int:
    """A persist record's deadline_ms: created_ms + timeout_ms (an adaptive one: +
    ``ADAPTIVE_FALLBACK_MS``), held to a 64-bit long (two longs' sum need not be one; the
    acker refuses a deadline held at the largest long, broker.acker.domain)."""
    deadline = created_ms + (ADAPTIVE_FALLBACK_MS if timeout_ms == AUTO_TIMEOUT_MS else timeout_ms)
    return min(max(deadline, _INT64_MIN), _INT64_MAX)


def persist_prefix_fields(created_ms: int, timeout_ms: int, attempt: int, max_attempts: int, partitioner: str,
                          backoff: bool = False) -> bytes:
    """The persist value's prefix after its two ids, from the record's fields (``backoff``:
    it has a ``retry``): the same for every first attempt of a batch (a source makes it once
    per batch)."""
    flags = (PERSIST_ADAPTIVE if timeout_ms == AUTO_TIMEOUT_MS else 0) | (PERSIST_BACKOFF if backoff else 0)
    try:
        return _PREFIX_FIELDS.pack(
            persist_deadline(created_ms, timeout_ms), created_ms, attempt, max_attempts, flags,
            _PARTITIONER_CODES.get(partitioner, 0),
        )
    except struct.error as exc:
        raise ValueError(f"a persist prefix holds 64-bit created_ms, 32-bit attempt and max_attempts: {exc}") from exc


@dataclass(frozen=True)
class PersistPrefixes:
    """The prefixes of a batch of persist values, column by column (int64; ``flags`` and
    ``partitioners`` uint8); a value too short to hold one (``short``) has zeros there.
    ``body_srid_ok``: the record's first Avro field is the prefix's srid."""

    srids: np.ndarray
    roots: np.ndarray
    deadlines_ms: np.ndarray
    created_ms: np.ndarray
    attempts: np.ndarray
    max_attempts: np.ndarray
    flags: np.ndarray
    partitioners: np.ndarray
    short: np.ndarray
    body_srid_ok: np.ndarray
    # Where the record's ``topic`` and ``key_hash_partition`` fields (its placement) start and
    # end in each value; a value that ends before its placement has end > its length.
    placement_starts: np.ndarray
    placement_ends: np.ndarray


def decode_placement(placement: bytes) -> tuple[str, int] | None:
    """The topic and key-hash partition of an encoded placement (None: not one)."""
    try:
        n, i = _avro_long_at(placement, 0)
        topic = placement[i : i + n].decode()
        khp, end = _avro_long_at(placement, i + n)
    except (IndexError, UnicodeDecodeError):
        return None
    return (topic, khp) if n >= 0 and end == len(placement) else None


def _avro_long_at(b: bytes, i: int) -> tuple[int, int]:
    """The Avro long (zigzag varint, at most 10 bytes) at ``i``, and the position after it."""
    z, shift = 0, 0
    while True:
        x = b[i]
        z |= (x & 0x7F) << shift
        i += 1
        if x < 0x80:
            return (z >> 1) ^ -(z & 1), i
        shift += 7
        if shift >= 70:
            raise IndexError("varint longer than 10 bytes")


# From the record's start: srid, origin, attempt, root_xor, record_id (five varints, at most
# 45 bytes with attempt an int) and the topic's length (2 bytes up to 8 191): one window
# of 64 bytes, a bit each in one uint64.
_PLACEMENT_WINDOW = 64
_WINDOW = np.arange(_PLACEMENT_WINDOW)
_KHP_WINDOW = np.arange(10)
_VARINTS_BEFORE_TOPIC = 5


def _end_bits(window: np.ndarray) -> np.ndarray:
    """Per row (at most 64 bytes), a bit per byte that ends a varint (no continuation bit)."""
    packed = np.packbits(window < 0x80, axis=1, bitorder="little")
    if packed.shape[1] < 8:
        wide = np.zeros((packed.shape[0], 8), np.uint8)
        wide[:, : packed.shape[1]] = packed
        packed = wide
    return packed.view("<u8")[:, 0]


def _lowest_bit(x: np.ndarray) -> np.ndarray:
    """The position of each value's lowest set bit (64 for none): the log2 of that bit
    alone, exact in a float64 for every power of two."""
    low = x & (~x + np.uint64(1))
    return np.where(low == 0, 64, np.log2(np.maximum(low, np.uint64(1)).astype(np.float64)).astype(np.int64))


def read_persist_prefixes(values: list[bytes]) -> PersistPrefixes:
    """The prefixes of ``values`` at once: the values joined, the prefix and the first
    Avro field of each gathered by index (numpy; no Python per value but its length)."""
    n = len(values)
    lengths = np.fromiter(map(len, values), np.int64, n)
    starts = np.cumsum(lengths) - lengths
    width = PERSIST_PREFIX_LEN + 10  # the prefix and the body's first field, at most 10 bytes
    # padded for the windows of the prefix's and the placement's reads (``_placement_spans``)
    buf = np.frombuffer(b"".join(values) + bytes(width + _PLACEMENT_WINDOW + 10), np.uint8)
    short = lengths < PERSIST_PREFIX_LEN
    at = np.where(short, buf.size - width, starts)  # a short value reads the zero padding
    # Every window of ``width`` bytes of the buffer (a view, no copy), of which the rows at
    # ``at`` are gathered: one copy of ``width`` bytes per value, no index per byte (far
    # cheaper than indexing byte by byte).
    heads = as_strided(buf, shape=(buf.size - width + 1, width), strides=(1, 1), writeable=False)[at]
    rows = heads[:, :PERSIST_PREFIX_LEN].copy().view(PERSIST_PREFIX)[:, 0]
    srids = rows["srid"].astype(np.int64)
    # The body's srid: its Avro varint (at most 10 bytes) compared with the prefix's.
    groups, used = _varint_groups(srids)
    body = heads[:, PERSIST_PREFIX_LEN:]
    same = ((body == groups) | (np.arange(10) >= used[:, None])).all(axis=1)
    p_starts, p_ends = _placement_spans(buf, starts, lengths)
    return PersistPrefixes(
        srids, rows["root_xor"].astype(np.int64), rows["deadline_ms"].astype(np.int64),
        rows["created_ms"].astype(np.int64), rows["attempt"].astype(np.int64),
        rows["max_attempts"].astype(np.int64), rows["flags"], rows["partitioner"], short,
        same & (lengths >= PERSIST_PREFIX_LEN + used), p_starts, p_ends,
    )


def _placement_spans(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each value's placement (``topic``, ``key_hash_partition``) starts and ends in
    it, for the joined values ``buf`` padded by at least 74 bytes (numpy over the batch: two
    windows per value, no Python per value). A value that ends before it gets an end past
    its length."""
    n = starts.size
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows = np.arange(n)
    body = starts + PERSIST_PREFIX_LEN
    first = buf[np.minimum(body, buf.size - _PLACEMENT_WINDOW)[:, None] + _WINDOW]
    bits = _end_bits(first)
    for _ in range(_VARINTS_BEFORE_TOPIC - 1):  # drop the first four ends: the fifth is lowest
        bits &= bits - np.uint64(1)
    topic_at = _lowest_bit(bits) + 1
    at = np.minimum(topic_at, _PLACEMENT_WINDOW - 2)
    b0 = first[rows, at].astype(np.int64)
    b1 = first[rows, at + 1].astype(np.int64)
    two = b0 >= 0x80
    zig = np.where(two, (b0 & 0x7F) | (b1 << 7), b0)
    topic_len = zig >> 1
    name_at = at + 1 + two
    # A name longer than a topic's is read too (the check says what is wrong with it); a
    # length of three bytes or below zero is not one.
    past = (topic_at > _PLACEMENT_WINDOW - 2) | (two & (b1 >= 0x80)) | ((zig & 1) == 1)
    khp_at = np.where(past, 0, body + name_at + topic_len)
    khp = buf[np.minimum(khp_at, buf.size - 10)[:, None] + _KHP_WINDOW]
    khp_len = _lowest_bit(_end_bits(khp)) + 1
    p_start = topic_at + PERSIST_PREFIX_LEN
    p_end = np.where(past | (khp_len > 10), lengths + 1, khp_at - starts + khp_len)
    return p_start, p_end


# --------------------------------------------------------------------------- PersistedRecord


@dataclass(frozen=True)
class Failure:
    srid: int
    attempt: int
    reason: str
    at_ms: int


@dataclass(frozen=True)
class PersistedRecord:
    srid: int
    origin: int
    attempt: int
    root_xor: int
    record_id: int
    topic: str
    key_hash_partition: int
    key: bytes | None
    value: bytes | None
    created_ms: int
    partitioner: str = "kafka"
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timeout_ms: int = 30_000
    max_attempts: int = 5
    history: tuple[Failure, ...] = field(default=())
    retry: RetryPolicy | None = None  # the back-off between attempts (None: at once)

    def encode(self) -> bytes:
        return encode_persisted(
            self.srid, self.origin, self.attempt, self.root_xor, self.record_id, self.topic,
            self.key_hash_partition, self.partitioner, self.key, self.value, self.headers,
            self.created_ms, self.timeout_ms, self.max_attempts, self.history, self.retry,
        )

    def prefix(self) -> bytes:
        """The persist value's prefix (the fields the acker registers the srid by)."""
        return self._prefix(self.retry is not None)

    def _prefix(self, backoff: bool) -> bytes:
        return _id_key(self.srid) + _id_key(self.root_xor) + persist_prefix_fields(
            self.created_ms, self.timeout_ms, self.attempt, self.max_attempts, self.partitioner, backoff)

    @classmethod
    def decode(cls, data: bytes | None) -> PersistedRecord:
        """A persist value's record; its prefix must say what the record says (the acker
        registered it and checked the rule's domain on the prefix alone), its flags its layout."""
        if not data:
            raise DecodeError("empty PersistedRecord")
        if len(data) <= PERSIST_PREFIX_LEN:
            raise DecodeError(f"persist value shorter than its {PERSIST_PREFIX_LEN}-byte prefix and a record")
        backoff = bool(data[_FLAGS_AT] & PERSIST_BACKOFF)
        # Flagged: the record with its retry. Not: without (or an older writer's, either).
        try:
            d, layout = PERSISTED_RECORD_LAYOUTS.read(data, PERSIST_PREFIX_LEN, 2 if backoff else None)
        except DecodeError as exc:
            if not backoff:
                raise
            raise DecodeError(f"persist prefix and PersistedRecord differ: flags {data[_FLAGS_AT]:#04x} say the "
                              f"record ends with its retry, and it does not read so ({exc})") from None
        retry = d.get("retry")
        if layout == 2 and retry is None:  # never written as null: the shorter layout leaves it out
            raise DecodeError("PersistedRecord has trailing bytes: a null retry (a record without one leaves it out)")
        try:
            record = cls(
                srid=d["srid"],
                origin=d["origin"],
                attempt=d["attempt"],
                root_xor=d["root_xor"],
                record_id=d["record_id"],
                topic=d["topic"],
                key_hash_partition=d["key_hash_partition"],
                partitioner=d["partitioner"],
                key=d["key"],
                value=d["value"],
                headers=tuple((h["key"], h["value"]) for h in d["headers"]),
                created_ms=d["created_ms"],
                timeout_ms=d["timeout_ms"],
                max_attempts=d["max_attempts"],
                history=tuple(Failure(**f) for f in d["history"]),
                retry=None if retry is None else RetryPolicy(
                    int(retry["initial_ms"]), float(retry["multiplier"]), int(retry["max_ms"]), float(retry["jitter"])
                ),
            )
        except (KeyError, TypeError) as exc:
            raise DecodeError(f"PersistedRecord is missing {exc}") from exc
        except ConfigurationError as exc:
            raise DecodeError(f"PersistedRecord has a retry policy that makes no sense: {exc}") from exc
        try:
            expected = record._prefix(backoff)
        except ValueError as exc:
            raise DecodeError(str(exc)) from exc
        if data[:PERSIST_PREFIX_LEN] != expected:
            got = np.frombuffer(data, PERSIST_PREFIX, 1)[0]
            want = np.frombuffer(expected, PERSIST_PREFIX, 1)[0]
            differ = [
                f"{name} {got[name]} (the record's: {want[name]})"
                for name in PERSIST_PREFIX.names or () if got[name] != want[name]
            ]
            raise DecodeError(f"persist prefix and PersistedRecord differ: {', '.join(differ)}")
        return record


# --------------------------------------------------------------------------- XorBatch


def _no_ids() -> np.ndarray:
    return np.empty(0, np.int64)


#: Key of an outage beat in ``ns.acks`` (every other message there has none).
OUTAGE_BEAT_KEY = b"rb-outage"
_BEAT = struct.Struct(">qq")


@dataclass(frozen=True)
class OutageBeat:
    """A task in an outage (``TaskConfig.outage``) to one ledger partition: in an outage since
    ``since_ms``, the clock of what it holds stopped up to ``until_ms`` (its clock, epoch ms;
    broker.ledger.outages). In ``ns.acks[i]`` with key ``OUTAGE_BEAT_KEY``: the two times
    (8 B big-endian each), then the task's name (UTF-8)."""

    task: str
    since_ms: int
    until_ms: int

    def encode(self) -> bytes:
        return _BEAT.pack(self.since_ms, self.until_ms) + self.task.encode()

    @classmethod
    def decode(cls, data: bytes | None) -> OutageBeat:
        if data is None or len(data) < _BEAT.size:
            raise DecodeError(f"outage beat shorter than {_BEAT.size} bytes")
        since, until = _BEAT.unpack_from(data)
        try:
            task = data[_BEAT.size:].decode()
        except UnicodeDecodeError as exc:
            raise DecodeError(f"outage beat's task name is not UTF-8: {exc}") from None
        if since <= 0 or until < since:
            raise DecodeError(f"outage beat since {since} until {until}")
        return cls(task, since, until)


@dataclass(frozen=True)
class XorBatch:
    """Events of one ledger partition. ``srids``/``xors``/``failed`` are int64 arrays;
    ``touched`` / ``touched_deadlines`` (int64, epoch ms) the deadline extensions (``ctx.touch``);
    ``superseded`` the replay srids the acker marks as superseded (docs/design.md §6);
    ``rejected`` the srids the task rejected (``ctx.reject``), ``rejected_reasons`` why;
    ``retry_after_ms`` aligned with ``failed`` (or empty: none has one), the delay the task
    asked for before each one's replay (``ctx.fail(retry_after_ms=...)``; -1: the back-off's)."""

    ledger_partition: int
    srids: np.ndarray
    xors: np.ndarray
    failed: np.ndarray
    producer: str = ""
    touched: np.ndarray = field(default_factory=_no_ids)
    touched_deadlines: np.ndarray = field(default_factory=_no_ids)
    superseded: np.ndarray = field(default_factory=_no_ids)
    rejected: np.ndarray = field(default_factory=_no_ids)
    rejected_reasons: tuple[str, ...] = ()
    retry_after_ms: np.ndarray = field(default_factory=_no_ids)

    def encode(self) -> bytes:
        if len(self.srids) != len(self.xors):
            raise ValueError("srids and xors differ in length")
        if len(self.touched) != len(self.touched_deadlines):
            raise ValueError("touched and touched_deadlines differ in length")
        if len(self.rejected) != len(self.rejected_reasons):
            raise ValueError("rejected and rejected_reasons differ in length")
        retry_after = len(self.retry_after_ms)
        if retry_after and retry_after != len(self.failed):
            raise ValueError("retry_after_ms and failed differ in length")
        datum = {
            "ledger_partition": self.ledger_partition,
            "srids": np.ascontiguousarray(self.srids, dtype=_LE_I64).tobytes(),
            "xors": np.ascontiguousarray(self.xors, dtype=_LE_I64).tobytes(),
            "failed": np.ascontiguousarray(self.failed, dtype=_LE_I64).tobytes(),
            "producer": self.producer,
        }
        later = len(self.rejected) or retry_after  # the fields after ``superseded``
        if not len(self.touched) and not len(self.superseded) and not later:
            return XOR_BATCH_LAYOUTS.encode(1, datum)
        datum["touched"] = np.ascontiguousarray(self.touched, dtype=_LE_I64).tobytes()
        datum["touched_deadlines"] = np.ascontiguousarray(self.touched_deadlines, dtype=_LE_I64).tobytes()
        if not len(self.superseded) and not later:
            return XOR_BATCH_LAYOUTS.encode(2, datum)
        datum["superseded"] = np.ascontiguousarray(self.superseded, dtype=_LE_I64).tobytes()
        if not later:
            return XOR_BATCH_LAYOUTS.encode(3, datum)
        datum["rejected"] = np.ascontiguousarray(self.rejected, dtype=_LE_I64).tobytes()
        datum["rejected_reasons"] = list(self.rejected_reasons)
        if not retry_after:
            return XOR_BATCH_LAYOUTS.encode(4, datum)
        datum["retry_after_ms"] = np.ascontiguousarray(self.retry_after_ms, dtype=_LE_I64).tobytes()
        return XOR_BATCH_LAYOUTS.encode(5, datum)

    @classmethod
    def decode(cls, data: bytes | None) -> XorBatch:
        d, _ = XOR_BATCH_LAYOUTS.read(data)
        srids, xors, failed = d["srids"], d["xors"], d["failed"]
        touched, deadlines = d.get("touched", b""), d.get("touched_deadlines", b"")
        superseded, rejected = d.get("superseded", b""), d.get("rejected", b"")
        reasons = tuple(d.get("rejected_reasons", ()))
        retry_after = d.get("retry_after_ms", b"")
        if len(retry_after) not in (0, len(failed)):
            raise DecodeError(f"XorBatch retry-afters are malformed ({len(retry_after)} bytes, {len(failed)} of fail marks)")
        if len(superseded) % 8:
            raise DecodeError(f"XorBatch superseded array is malformed ({len(superseded)} bytes)")
        if len(rejected) % 8 or len(rejected) // 8 != len(reasons):
            raise DecodeError(f"XorBatch rejections are malformed ({len(rejected)} bytes, {len(reasons)} reasons)")
        if len(srids) != len(xors) or len(srids) % 8 or len(failed) % 8:
            raise DecodeError(
                f"XorBatch arrays are malformed ({len(srids)}, {len(xors)}, {len(failed)} bytes)"
            )
        if len(touched) != len(deadlines) or len(touched) % 8:
            raise DecodeError(f"XorBatch touches are malformed ({len(touched)}, {len(deadlines)} bytes)")
        return cls(
            ledger_partition=d["ledger_partition"],
            srids=np.frombuffer(srids, dtype=_LE_I64).astype(np.int64, copy=False),
            xors=np.frombuffer(xors, dtype=_LE_I64).astype(np.int64, copy=False),
            failed=np.frombuffer(failed, dtype=_LE_I64).astype(np.int64, copy=False),
            producer=d["producer"],
            touched=np.frombuffer(touched, dtype=_LE_I64).astype(np.int64, copy=False),
            touched_deadlines=np.frombuffer(deadlines, dtype=_LE_I64).astype(np.int64, copy=False),
            superseded=np.frombuffer(superseded, dtype=_LE_I64).astype(np.int64, copy=False),
            rejected=np.frombuffer(rejected, dtype=_LE_I64).astype(np.int64, copy=False),
            rejected_reasons=reasons,
            retry_after_ms=np.frombuffer(retry_after, dtype=_LE_I64).astype(np.int64, copy=False),
        )


# --------------------------------------------------------------------------- LedgerEntry


@dataclass(frozen=True)
class LedgerEntry:
    """One srid's changelog record. ``timed_out_ms`` (-1: none) is kept only for a deferred
    timeout - when it timed out, so that a new owner continues its window (docs/design.md
    §6) - and for a failed one - when it ended (its fail mark folded, or it timed out before),
    so that a new owner continues its back-off - and written only then: every other entry has
    the shorter encoding."""

    value: int
    flags: int
    persist_offset: int
    deadline_ms: int
    timed_out_ms: int = -1
    rejection: str = ""  # a rejected attempt's: why (docs/design.md §6)
    retry_at_ms: int = -1  # a failed attempt's replay not before this, as its task asked (-1: none)

    def encode(self) -> bytes:
        return encode_ledger_entry(
            self.value, self.flags, self.persist_offset, self.deadline_ms, self.timed_out_ms, self.rejection,
            self.retry_at_ms,
        )

    @classmethod
    def decode(cls, data: bytes | None) -> LedgerEntry:
        d, layout = LEDGER_ENTRY_LAYOUTS.read(data)
        # What the writer leaves out is never written: a layout holds its last field for a
        # value other than its default.
        if layout == 3 and not d["rejection"]:
            raise DecodeError("LedgerEntry has trailing bytes: an empty rejection")
        if layout == 4 and (d["retry_at_ms"] < 0 or d["rejection"]):
            raise DecodeError("LedgerEntry has trailing bytes: a retry_at_ms that is negative or after a rejection")
        return cls(d["value"], d["flags"], d["persist_offset"], d["deadline_ms"], d.get("timed_out_ms", -1),
                   d.get("rejection", ""), d.get("retry_at_ms", -1))


# --------------------------------------------------------------------------- LedgerCounters

COUNTERS_KEY = b"__counters__"


@dataclass(frozen=True)
class LedgerCounters:
    """One ledger partition's ``__counters__`` record: its cumulative decision counters and,
    when the writer knew them, its pending entries as of the same transaction - so
    ``replaybroker status`` reads one record per partition instead of all of ``ns.persist`` -
    and its restore floor (docs/design.md §5).

    ``pending`` is None in records written before the field existed; ``oldest_pending_offset``
    and ``oldest_pending_ms`` are None also when nothing was pending. ``restore_floor`` is
    None in records written before it existed, whose writer left nothing out of the
    changelog."""

    counters: dict[str, int]
    updated_ms: int
    pending: int | None = None
    oldest_pending_offset: int | None = None
    oldest_pending_ms: int | None = None
    restore_floor: int | None = None

    def encode(self) -> bytes:
        datum: dict[str, Any] = {"counters": self.counters, "updated_ms": self.updated_ms}
        if self.pending is None and self.restore_floor is None:
            return LEDGER_COUNTERS_LAYOUTS.encode(1, datum)  # nothing to add: the first layout
        datum.update(
            pending=self.pending,
            oldest_pending_offset=self.oldest_pending_offset,
            oldest_pending_ms=self.oldest_pending_ms,
        )
        if self.restore_floor is None:
            return LEDGER_COUNTERS_LAYOUTS.encode(2, datum)
        return LEDGER_COUNTERS_LAYOUTS.encode(3, {**datum, "restore_floor": self.restore_floor})

    @classmethod
    def decode(cls, data: bytes | None) -> LedgerCounters:
        d, _ = LEDGER_COUNTERS_LAYOUTS.read(data)
        return cls(
            dict(d["counters"]), int(d["updated_ms"]),
            d.get("pending"), d.get("oldest_pending_offset"), d.get("oldest_pending_ms"), d.get("restore_floor"),
        )


def encode_counters(
    counters: dict[str, int],
    updated_ms: int,
    pending: int | None = None,
    oldest_pending_offset: int | None = None,
    oldest_pending_ms: int | None = None,
) -> bytes:
    return LedgerCounters(counters, updated_ms, pending, oldest_pending_offset, oldest_pending_ms).encode()


def decode_counters(data: bytes | None) -> tuple[dict[str, int], int]:
    """The counters and ``updated_ms`` of a record of either encoding (``LedgerCounters.decode``
    has the pending fields too)."""
    record = LedgerCounters.decode(data)
    return record.counters, record.updated_ms
