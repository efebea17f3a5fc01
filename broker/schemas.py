"""Avro codecs for the three record types; ``schemas/*.avsc`` is the single source of truth.

Each schema is parsed once at import. Encoding is schemaless Avro (no container header): the
topic says which schema a value has. Decoding errors are ``DecodeError`` so services can
quarantine the message instead of dying.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import fastavro
import numpy as np

from broker.errors import DecodeError

_LE_I64 = np.dtype("<i8")


def _load(name: str) -> Any:
    text = resources.files("schemas").joinpath(f"{name}.avsc").read_text()
    return fastavro.parse_schema(json.loads(text))


PERSISTED_RECORD = _load("persisted_record")
XOR_BATCH = _load("xor_batch")
LEDGER_ENTRY = _load("ledger_entry")


def _encode(schema: Any, datum: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, datum)
    return buf.getvalue()


def _decode(schema: Any, data: bytes | None, what: str) -> dict[str, Any]:
    if not data:
        raise DecodeError(f"empty {what}")
    buf = io.BytesIO(data)
    try:
        datum = fastavro.schemaless_reader(buf, schema, None)
    except Exception as exc:
        raise DecodeError(f"undecodable {what}: {type(exc).__name__}: {exc}") from exc
    if buf.tell() != len(data):
        raise DecodeError(f"{what} has {len(data) - buf.tell()} trailing bytes (wrong schema?)")
    if not isinstance(datum, dict):
        raise DecodeError(f"{what} is not a record")
    return datum


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

    def encode(self) -> bytes:
        return _encode(
            PERSISTED_RECORD,
            {
                "srid": self.srid,
                "origin": self.origin,
                "attempt": self.attempt,
                "root_xor": self.root_xor,
                "record_id": self.record_id,
                "topic": self.topic,
                "key_hash_partition": self.key_hash_partition,
                "partitioner": self.partitioner,
                "key": self.key,
                "value": self.value,
                "headers": [{"key": k, "value": v} for k, v in self.headers],
                "created_ms": self.created_ms,
                "timeout_ms": self.timeout_ms,
                "max_attempts": self.max_attempts,
                "history": [
                    {"srid": f.srid, "attempt": f.attempt, "reason": f.reason, "at_ms": f.at_ms}
                    for f in self.history
                ],
            },
        )

    @classmethod
    def decode(cls, data: bytes | None) -> PersistedRecord:
        d = _decode(PERSISTED_RECORD, data, "PersistedRecord")
        try:
            return cls(
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
            )
        except (KeyError, TypeError) as exc:
            raise DecodeError(f"PersistedRecord is missing {exc}") from exc


# --------------------------------------------------------------------------- XorBatch


@dataclass(frozen=True)
class XorBatch:
    """Events of one ledger partition. ``srids``/``xors``/``failed`` are int64 arrays."""

    ledger_partition: int
    srids: np.ndarray
    xors: np.ndarray
    failed: np.ndarray
    producer: str = ""

    def encode(self) -> bytes:
        if len(self.srids) != len(self.xors):
            raise ValueError("srids and xors differ in length")
        return _encode(
            XOR_BATCH,
            {
                "ledger_partition": self.ledger_partition,
                "srids": np.ascontiguousarray(self.srids, dtype=_LE_I64).tobytes(),
                "xors": np.ascontiguousarray(self.xors, dtype=_LE_I64).tobytes(),
                "failed": np.ascontiguousarray(self.failed, dtype=_LE_I64).tobytes(),
                "producer": self.producer,
            },
        )

    @classmethod
    def decode(cls, data: bytes | None) -> XorBatch:
        d = _decode(XOR_BATCH, data, "XorBatch")
        srids, xors, failed = d["srids"], d["xors"], d["failed"]
        if len(srids) != len(xors) or len(srids) % 8 or len(failed) % 8:
            raise DecodeError(
                f"XorBatch arrays are malformed ({len(srids)}, {len(xors)}, {len(failed)} bytes)"
            )
        return cls(
            ledger_partition=d["ledger_partition"],
            srids=np.frombuffer(srids, dtype=_LE_I64).astype(np.int64, copy=False),
            xors=np.frombuffer(xors, dtype=_LE_I64).astype(np.int64, copy=False),
            failed=np.frombuffer(failed, dtype=_LE_I64).astype(np.int64, copy=False),
            producer=d["producer"],
        )


# --------------------------------------------------------------------------- LedgerEntry


@dataclass(frozen=True)
class LedgerEntry:
    value: int
    flags: int
    persist_offset: int
    deadline_ms: int

    def encode(self) -> bytes:
        return _encode(
            LEDGER_ENTRY,
            {
                "value": self.value,
                "flags": self.flags,
                "persist_offset": self.persist_offset,
                "deadline_ms": self.deadline_ms,
            },
        )

    @classmethod
    def decode(cls, data: bytes | None) -> LedgerEntry:
        d = _decode(LEDGER_ENTRY, data, "LedgerEntry")
        return cls(d["value"], d["flags"], d["persist_offset"], d["deadline_ms"])


# --------------------------------------------------------------------------- LedgerCounters

LEDGER_COUNTERS = _load("ledger_counters")
COUNTERS_KEY = b"__counters__"


def encode_counters(counters: dict[str, int], updated_ms: int) -> bytes:
    return _encode(LEDGER_COUNTERS, {"counters": counters, "updated_ms": updated_ms})


def decode_counters(data: bytes | None) -> tuple[dict[str, int], int]:
    d = _decode(LEDGER_COUNTERS, data, "LedgerCounters")
    return dict(d["counters"]), int(d["updated_ms"])
