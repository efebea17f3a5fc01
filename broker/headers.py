"""Every ``rb-*`` header the broker writes or reads, with its encoding, in one place.

Ids are 8-byte big-endian two's complement; counts are ASCII integers. Persist records carry
no header: what the acker registers them by (srid, root_xor, deadline, an adaptive flag) is
the fixed prefix of their value (``broker.schemas``); their tombstones carry ``rb-outcome``
only when the srid did not complete.

| header | on | value |
|---|---|---|
| ``rb-t`` | data records | the tracking, packed (``Tracking.pack``): srid of this attempt (8) + record id (8), then - only when the origin is not the srid or the attempt is not the first - the origin, srid of the first attempt (8), then - only when the attempt is not the first - the attempt number (4, unsigned, 1 to 2**31 - 1): 16, 24 or 28 bytes |
| ``rb-origin`` | sink outputs, DLQ records | srid of the first attempt |
| ``rb-path`` | data records below the root | emit indices from the root: ``0.2`` is the third child of the source record (``0``, which carries no header), ``0.2.0`` its first grandchild |
| ``rb-timeout`` | DLQ records of records with an adaptive timeout | ``auto``: a redrive keeps it adaptive (docs/design.md §6) |
| ``rb-topic`` | DLQ records | the data topic |
| ``rb-outcome`` | persist tombstones of srids that did not complete | why the srid left: ``replay``, ``dlq`` (none: it completed, ``outcome_of``) |
| ``rb-reason`` | DLQ records | why it was dead-lettered (``quarantine: ...`` for bad input) |
| ``rb-attempts``, ``rb-topic``, ``rb-key-hash-partition``, ``rb-partitioner``, ``rb-history`` | DLQ records | what a redrive needs |
| ``rb-source`` | quarantined input | ``topic/partition/offset`` it was read from |
| ``rb-input`` | bridged source records (persist and data) | ``topic/partition/offset`` of the input record |
| ``rb-input-ts`` | bridged source records | the input record's timestamp, ms (ASCII) |
| ``rb-scope`` | outage beats | the source topics whose records wait behind the task, comma-separated (none: every record, ``scope_of``) |
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from typing import NamedTuple

# --- tracking: on every data record under the guarantee (docs/design.md §3). One header:
# librdkafka's cost of a produce grows with each header, so the srid, record
# id, origin and attempt travel packed in ``rb-t`` (the table above; ``Tracking``).
H_TRACKING = "rb-t"
# The origin alone: on sink outputs (with rb-path, their output identity) and DLQ records.
H_ORIGIN = "rb-origin"
# The record's output identity within its tree: with the origin, the same on every attempt
# (a replay re-runs the tree from the root, whose path is always ROOT_PATH) and different for
# siblings - what a sink after a fan-out deduplicates on. Ids cannot serve: they are fresh on
# every attempt.
H_PATH = "rb-path"
ROOT_PATH = "0"
# The broker's to set: a caller's headers never carry them into a record (``user_headers``).
TRACKING_HEADERS = frozenset({H_TRACKING, H_ORIGIN, H_PATH})

# --- an adaptive timeout (``timeout_ms="auto"``): the acker gives the deadline from its
# latency estimate for the record's data topic. The record's ``timeout_ms`` is
# ``AUTO_TIMEOUT_MS`` (so a replay is auto too) and its value's prefix flags it adaptive, with
# created_ms + ``ADAPTIVE_FALLBACK_MS`` as its deadline (broker.schemas). A DLQ record of one
# carries ``rb-timeout: auto``.
H_TIMEOUT = "rb-timeout"
AUTO = "auto"
AUTO_B = b"auto"
AUTO_TIMEOUT_MS = -1
ADAPTIVE_FALLBACK_MS = 300_000

# --- persist tombstones: why the srid left the ledger (broker.completions reads them)
H_OUTCOME = "rb-outcome"
OUTCOME_COMPLETED = b"completed"
OUTCOME_REPLAY = b"replay"
OUTCOME_DLQ = b"dlq"

# --- dead letters and quarantined input (broker.acker.replay writes, broker.dlq reads)
H_REASON = "rb-reason"
H_ATTEMPTS = "rb-attempts"
H_TOPIC = "rb-topic"
H_KEY_HASH_PARTITION = "rb-key-hash-partition"
H_PARTITIONER = "rb-partitioner"
H_HISTORY = "rb-history"
H_SOURCE = "rb-source"
# Headers the acker appends to a dead-lettered record, after the user's own headers.
# ``rb-timeout: auto`` among them marks a record whose timeout was adaptive: a redrive keeps it.
DLQ_HEADERS = frozenset(
    {H_REASON, H_ATTEMPTS, H_TOPIC, H_KEY_HASH_PARTITION, H_PARTITIONER, H_HISTORY, H_ORIGIN, H_TIMEOUT}
)
QUARANTINE_PREFIX = "quarantine: "

# --- bridged input (broker.bridge): where a source record was read from, and when it was
# written there. User headers to the pipeline: they travel in the persist record and every attempt.
H_INPUT = "rb-input"
H_INPUT_TS = "rb-input-ts"
LOST_PREFIX = "payload lost: "  # rb-reason of a failed record dead-lettered without its value

# --- outage beats (broker.task.outage -> broker.ledger.outages): the source topics whose
# records the beat holds. A header, not a field of the beat's value: an acker that does not
# know it reads the beat as one for every record - what every beat meant before it - so a
# scoped beat never holds less at an older acker, and a beat without it keeps that meaning.
H_SCOPE = "rb-scope"
MAX_SCOPE = 64  # topics a beat may name: a task reads a few

Headers = Sequence[tuple[str, bytes | None]]
TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")  # what Kafka allows


def as_bytes(value: bytes | str | None) -> bytes | None:
    """Keys, values and header values as the producer takes them (``str`` as UTF-8)."""
    if value is None or isinstance(value, bytes):
        return value
    return value.encode()


def tracking_headers(srid: int, record_id: int, origin: int, attempt: int) -> list[tuple[str, bytes]]:
    """The tracking of a data record: its one ``rb-t`` header."""
    return [(H_TRACKING, Tracking.pack(srid, record_id, origin, attempt))]


def path_of(headers: Headers | None) -> str:
    """The record's ``rb-path`` (the last one when repeated); ``ROOT_PATH`` when it is
    missing or empty - a source record and its replays carry none."""
    path = None
    for k, v in headers or ():
        if k == H_PATH:
            path = v
    return path.decode("utf-8", "replace") if path else ROOT_PATH


def child_path(parent: str, index: int) -> str:
    """The path of the ``index``-th record emitted for an input whose path is ``parent``."""
    return f"{parent}.{index}"


def child_path_header(parent_headers: Headers | None, index: int) -> tuple[str, bytes]:
    """The ``rb-path`` header of the ``index``-th child of the record with ``parent_headers``."""
    return (H_PATH, child_path(path_of(parent_headers), index).encode())


def scope_header(topics: Sequence[str]) -> tuple[str, bytes]:
    """The ``rb-scope`` header of a beat holding the records of ``topics``."""
    return (H_SCOPE, ",".join(sorted(set(topics))).encode())


def scope_of(headers: Headers | None) -> frozenset[str] | None:
    """The source topics an outage beat holds (None: no ``rb-scope``, every record). Raises
    ``ValueError`` for a scope that names no topic, more than ``MAX_SCOPE``, or a name no
    Kafka topic has: a writer's bug, the beat is quarantined like any undecodable input."""
    raw = None
    for k, v in headers or ():
        if k == H_SCOPE:
            raw = v
    if raw is None:
        return None
    names = raw.decode("ascii", "replace").split(",")
    if not 0 < len(names) <= MAX_SCOPE or not all(TOPIC_NAME.fullmatch(n) for n in names):
        raise ValueError(f"rb-scope {raw[:300]!r} is not 1 to {MAX_SCOPE} topic names")
    return frozenset(names)


def outcome_of(headers: Headers | None) -> bytes:
    """Why a persist tombstone's srid left the ledger: its ``rb-outcome`` header, and
    ``completed`` for a tombstone without one (a completion needs no header)."""
    for k, v in headers or ():
        if k == H_OUTCOME and v:
            return v
    return OUTCOME_COMPLETED


def user_headers(headers: Headers | None) -> tuple[tuple[str, bytes | None], ...]:
    """The caller's headers without any tracking header (those are the broker's to set)."""
    if not headers:
        return ()
    return tuple((k, as_bytes(v)) for k, v in headers if k not in TRACKING_HEADERS)


# ``rb-t``'s fields (name, byte offset, size), its lengths and the attempts it holds: the one
# definition of the header, which ``unpack_tracking`` reads with ``struct`` and Spark
# (spark_jobs.tracking) with SQL. A field is present when the value reaches its end: the
# origin (else the srid) from 24 bytes, the attempt (unsigned; else 1) at 28.
TRACKING_FIELDS = (("srid", 0, 8), ("record_id", 8, 8), ("origin", 16, 8), ("attempt", 24, 4))
TRACKING_SIZES = tuple(offset + size for _, offset, size in TRACKING_FIELDS[1:])  # 16, 24, 28
MAX_ATTEMPT = 2**31 - 1  # what Spark's int column holds
_IDS, _IDS_ORIGIN, _IDS_ORIGIN_ATTEMPT = (
    struct.Struct(">" + "".join("q" if size == 8 else "I" for _, _, size in TRACKING_FIELDS[:n])) for n in (2, 3, 4)
)
_FIRST, _ORIGIN, _ATTEMPT = TRACKING_SIZES
assert (_IDS.size, _IDS_ORIGIN.size, _IDS_ORIGIN_ATTEMPT.size) == TRACKING_SIZES
# A NamedTuple's ``_make`` without its Python frame: a task decodes a Tracking per input.
_new_tuple = tuple.__new__


class Tracking(NamedTuple):
    """The tracking of a data record (its ``rb-t`` header), decoded."""

    srid: int
    record_id: int
    origin: int
    attempt: int

    @staticmethod
    def pack(srid: int, record_id: int, origin: int, attempt: int) -> bytes:
        """The ``rb-t`` value: as short as the record allows (a first send: 16 bytes)."""
        if attempt != 1:
            return _IDS_ORIGIN_ATTEMPT.pack(srid, record_id, origin, attempt)
        if origin != srid:
            return _IDS_ORIGIN.pack(srid, record_id, origin)
        return _IDS.pack(srid, record_id)

    @staticmethod
    def unpack(value: bytes | None) -> Tracking | None:
        """None when ``value`` is no valid ``rb-t``: not 16, 24 or 28 bytes, a srid or record
        id of 0 (the XOR identity, never an id) or an attempt out of 1 to ``MAX_ATTEMPT``."""
        return unpack_tracking(value)

    def child(self, record_id: int) -> bytes:
        """The ``rb-t`` of a child of this record: its srid, origin and attempt, a new id."""
        return self.pack(self.srid, record_id, self.origin, self.attempt)

    @staticmethod
    def from_headers(headers: Headers | None) -> Tracking | None:
        """None when the record is not tracked (no or malformed ``rb-t``). A repeated header:
        the last one wins."""
        return tracking_of(headers)


# The decoders as module functions: a task calls them once per input, and a classmethod's
# call costs a bound method and a frame more.
def unpack_tracking(value: bytes | None) -> Tracking | None:
    """``Tracking.unpack``."""
    if not value:
        return None
    size = len(value)
    if size == _FIRST:  # the usual: a first attempt's record
        srid, record_id = _IDS.unpack(value)
        return _new_tuple(Tracking, (srid, record_id, srid, 1)) if srid and record_id else None
    if size == _ORIGIN:
        srid, record_id, origin = _IDS_ORIGIN.unpack(value)
        attempt = 1
    elif size == _ATTEMPT:
        srid, record_id, origin, attempt = _IDS_ORIGIN_ATTEMPT.unpack(value)
        if not 0 < attempt <= MAX_ATTEMPT:
            return None
    else:
        return None
    if not srid or not record_id:
        return None
    return _new_tuple(Tracking, (srid, record_id, origin, attempt))


def tracking_of(headers: Headers | None) -> Tracking | None:
    """``Tracking.from_headers``."""
    if not headers:
        return None
    if len(headers) == 1:  # the usual: the lone rb-t of a record without user headers
        key, packed = headers[0]
        return unpack_tracking(packed) if key == H_TRACKING else None
    packed = None
    for k, v in headers:
        if k == H_TRACKING:
            packed = v
    return unpack_tracking(packed)
