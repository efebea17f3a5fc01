"""Avro codecs (broker.schemas): round trips, and DecodeError for everything that is not a
well-formed value of the expected schema - garbage, truncation, trailing bytes, emptiness
and values of another schema - so the acker can quarantine bad input instead of dying."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from typing import Any

import fastavro
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import DecodeError
from broker.headers import AUTO_TIMEOUT_MS
from broker.retry import RetryPolicy
from broker.schemas import (
    LEDGER_COUNTERS_LAYOUTS,
    LEDGER_ENTRY_FULL,
    LEDGER_ENTRY_LAYOUTS,
    LEDGER_ENTRY_WITH_REJECTION,
    PERSIST_BACKOFF,
    PERSIST_PREFIX,
    PERSIST_PREFIX_LEN,
    XOR_BATCH,
    XOR_BATCH_FULL,
    XOR_BATCH_LAYOUTS,
    XOR_BATCH_WITH_REJECTED,
    XOR_BATCH_WITH_SUPERSEDED,
    XOR_BATCH_WITH_TOUCHES,
    Failure,
    Layouts,
    LedgerCounters,
    LedgerEntry,
    PersistedRecord,
    XorBatch,
    avro_long,
    decode_counters,
    encode_counters,
    encode_ledger_entries,
)

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
ids64 = st.integers(I64_MIN, I64_MAX).filter(bool)
optional_bytes = st.none() | st.binary(max_size=64)

RECORD = PersistedRecord(
    srid=0x1F3A_5C7E_9B2D_4E61,
    origin=-0x5A4F_2E1C_9B3D_7A11,
    attempt=3,
    root_xor=I64_MIN,
    record_id=I64_MAX,
    topic="orders",
    key_hash_partition=7,
    key=b"customer-42",
    value=b'{"order": 1}',
    created_ms=1_700_000_000_123,
    partitioner="spark",
    headers=(("trace", b"\x00\xff"), ("empty", None), ("text", b"")),
    timeout_ms=600_000,
    max_attempts=9,
    history=(
        Failure(srid=-1, attempt=1, reason="timeout", at_ms=1_700_000_000_000),
        Failure(srid=I64_MAX, attempt=2, reason="failed: injected \u00e9", at_ms=1_700_000_000_100),
    ),
)
BATCH = XorBatch(
    ledger_partition=5,
    srids=np.array([5, -3, I64_MIN + 1, I64_MAX - 2], dtype=np.int64),
    xors=np.array([1, I64_MIN, -1, I64_MAX], dtype=np.int64),
    failed=np.array([13, -11], dtype=np.int64),
    producer="leaf@1234",
)
ENTRY = LedgerEntry(value=I64_MIN, flags=3, persist_offset=-1, deadline_ms=1_700_000_030_000)
COUNTERS = {"completed": 10_000, "replayed": 0, "quarantined": 2**40}


def _batches_equal(a: XorBatch, b: XorBatch) -> bool:
    return (
        a.ledger_partition == b.ledger_partition
        and a.producer == b.producer
        and all(
            x.dtype == np.int64 and np.array_equal(x, y)
            for x, y in ((b.srids, a.srids), (b.xors, a.xors), (b.failed, a.failed))
        )
    )


# --------------------------------------------------------------------------- round trips


def test_persisted_record_round_trip() -> None:
    assert PersistedRecord.decode(RECORD.encode()) == RECORD


def test_persisted_record_defaults_and_null_payload() -> None:
    minimal = PersistedRecord(
        srid=1,
        origin=1,
        attempt=1,
        root_xor=2,
        record_id=2,
        topic="t",
        key_hash_partition=0,
        key=None,
        value=None,
        created_ms=0,
    )
    decoded = PersistedRecord.decode(minimal.encode())
    assert decoded == minimal
    assert (decoded.partitioner, decoded.timeout_ms, decoded.max_attempts) == ("kafka", 30_000, 5)
    assert decoded.headers == () and decoded.history == ()


@settings(max_examples=200, deadline=None)
@given(
    srid=ids64,
    origin=ids64,
    root=ids64,
    attempt=st.integers(1, 2**31 - 1),
    key=optional_bytes,
    value=optional_bytes,
    headers=st.lists(st.tuples(st.text(max_size=8), optional_bytes), max_size=4),
    topic=st.text(min_size=1, max_size=30),
)
def test_persisted_record_round_trip_property(
    srid: int,
    origin: int,
    root: int,
    attempt: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]],
    topic: str,
) -> None:
    record = PersistedRecord(
        srid=srid,
        origin=origin,
        attempt=attempt,
        root_xor=root,
        record_id=root,
        topic=topic,
        key_hash_partition=attempt % 64,
        key=key,
        value=value,
        created_ms=attempt,
        headers=tuple(headers),
    )
    assert PersistedRecord.decode(record.encode()) == record


@settings(max_examples=300, deadline=None)
@given(
    field=st.sampled_from(PERSIST_PREFIX.names or ()),
    bit=st.integers(0, 7),
    timeout_ms=st.sampled_from([30_000, AUTO_TIMEOUT_MS]),
    partitioner=st.sampled_from(["kafka", "spark", "murmur2"]),
)
def test_a_persist_value_whose_prefix_says_other_than_its_record_is_refused(
    field: str, bit: int, timeout_ms: int, partitioner: str
) -> None:
    """The acker registers a value and checks the rule's domain on its prefix alone; every
    other reader - a replay first - decodes the record, the truth, and must refuse a prefix
    that says otherwise in any field (the earlier decoder compared the srid and root only)."""
    record = dataclasses.replace(RECORD, timeout_ms=timeout_ms, partitioner=partitioner)
    value = record.encode()
    row = np.frombuffer(value, PERSIST_PREFIX, 1).copy()
    row[field] ^= 1 << bit  # one bit of one field
    with pytest.raises(DecodeError, match=f"persist prefix and PersistedRecord differ: {field} "):
        PersistedRecord.decode(row.tobytes() + value[PERSIST_PREFIX_LEN:])
    assert PersistedRecord.decode(value) == record


def test_xor_batch_round_trip() -> None:
    assert _batches_equal(XorBatch.decode(BATCH.encode()), BATCH)


def test_xor_batch_empty_arrays_round_trip() -> None:
    empty = np.empty(0, dtype=np.int64)
    batch = XorBatch(0, empty, empty, empty)
    decoded = XorBatch.decode(batch.encode())
    assert _batches_equal(decoded, batch)
    assert decoded.srids.size == decoded.xors.size == decoded.failed.size == 0


@settings(max_examples=200, deadline=None)
@given(
    lp=st.integers(0, 2**31 - 1),
    pairs=st.lists(st.tuples(ids64, st.integers(I64_MIN, I64_MAX)), max_size=50),
    failed=st.lists(ids64, max_size=10),
)
def test_xor_batch_round_trip_property(
    lp: int, pairs: list[tuple[int, int]], failed: list[int]
) -> None:
    batch = XorBatch(
        lp,
        np.array([s for s, _ in pairs], dtype=np.int64),
        np.array([x for _, x in pairs], dtype=np.int64),
        np.array(failed, dtype=np.int64),
        "p",
    )
    assert _batches_equal(XorBatch.decode(batch.encode()), batch)


def test_xor_batch_arrays_travel_as_packed_little_endian_int64() -> None:
    """The Avro ``bytes`` fields hold ``<i8`` arrays - whatever the caller's byte order - so
    any reader (the JVM side included) decodes them with a plain ``frombuffer``."""
    big_endian = XorBatch(
        1,
        BATCH.srids.astype(">i8"),
        BATCH.xors.astype(">i8"),
        BATCH.failed.astype(">i8"),
    )
    data = big_endian.encode()
    assert data[:2] == XOR_BATCH_LAYOUTS.tags[0]  # its layout's tag, then the Avro record
    raw = fastavro.schemaless_reader(io.BytesIO(data[2:]), XOR_BATCH, None)
    assert isinstance(raw, dict)
    assert raw["srids"] == BATCH.srids.astype("<i8").tobytes()
    assert raw["xors"] == BATCH.xors.astype("<i8").tobytes()
    assert raw["failed"] == BATCH.failed.astype("<i8").tobytes()
    # first srid, 5, spelled out byte by byte: least significant byte first
    assert raw["srids"][:8] == b"\x05" + b"\x00" * 7
    for field in ("srids", "xors", "failed"):
        assert np.array_equal(np.frombuffer(raw[field], dtype="<i8"), getattr(BATCH, field))


def test_xor_batch_decodes_hand_packed_arrays() -> None:
    """A producer that packs the arrays itself (as the Spark job does) is understood."""
    srids = np.array([9, -7], dtype="<i8")
    xors = np.array([I64_MAX, I64_MIN], dtype="<i8")
    buf = io.BytesIO()
    fastavro.schemaless_writer(
        buf,
        XOR_BATCH,
        {
            "ledger_partition": 1,
            "srids": srids.tobytes(),
            "xors": xors.tobytes(),
            "failed": b"",
            "producer": "jvm",
        },
    )
    decoded = XorBatch.decode(buf.getvalue())
    assert decoded.srids.dtype == decoded.xors.dtype == np.int64
    assert decoded.srids.tolist() == [9, -7]
    assert decoded.xors.tolist() == [I64_MAX, I64_MIN]
    assert decoded.failed.size == 0 and decoded.producer == "jvm"


def test_xor_batch_refuses_to_encode_unequal_arrays() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        XorBatch(
            0, np.array([1, 2], dtype=np.int64), np.array([1], dtype=np.int64), np.empty(0)
        ).encode()


def test_ledger_entry_round_trip() -> None:
    assert LedgerEntry.decode(ENTRY.encode()) == ENTRY
    other = LedgerEntry(value=I64_MAX, flags=0, persist_offset=2**40, deadline_ms=0)
    assert LedgerEntry.decode(other.encode()) == other
    held = LedgerEntry(value=5, flags=0x11, persist_offset=3, deadline_ms=1_700_000_090_000, timed_out_ms=1_700_000_030_000)
    assert LedgerEntry.decode(held.encode()) == held
    assert len(held.encode()) > len(LedgerEntry(5, 0x11, 3, 1_700_000_090_000).encode())  # appended only when kept


def test_counters_round_trip() -> None:
    assert decode_counters(encode_counters(COUNTERS, 1_700_000_000_999)) == (
        COUNTERS,
        1_700_000_000_999,
    )
    assert decode_counters(encode_counters({}, 0)) == ({}, 0)


def _counters_before_pending_fields(counters: dict[str, int], updated_ms: int) -> bytes:
    """A __counters__ record as acker versions before the pending fields wrote it, encoded
    by fastavro with that schema (not by the code under test)."""
    old = fastavro.parse_schema({
        "type": "record", "name": "LedgerCounters", "namespace": "replaybroker",
        "fields": [{"name": "counters", "type": {"type": "map", "values": "long"}}, {"name": "updated_ms", "type": "long"}],
    })
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, old, {"counters": counters, "updated_ms": updated_ms})
    return buf.getvalue()


def test_counters_with_pending_figures_round_trip() -> None:
    full = LedgerCounters(COUNTERS, 1_700_000_000_999, pending=12, oldest_pending_offset=2**40, oldest_pending_ms=1_700_000_000_123)
    assert LedgerCounters.decode(full.encode()) == full
    none_pending = LedgerCounters({}, 5, pending=0)
    assert LedgerCounters.decode(none_pending.encode()) == none_pending
    assert decode_counters(full.encode()) == (COUNTERS, 1_700_000_000_999)  # the older reader's view


def test_counters_written_before_the_pending_fields_still_decode() -> None:
    old = _counters_before_pending_fields(COUNTERS, 7)
    assert LedgerCounters.decode(old) == LedgerCounters(COUNTERS, 7, None, None, None)
    assert decode_counters(old) == (COUNTERS, 7)
    # without pending figures the record is still written in the older layout, tagged
    assert encode_counters(COUNTERS, 7) == LEDGER_COUNTERS_LAYOUTS.tags[0] + old


def test_counters_with_a_restore_floor_round_trip_and_older_ones_decode_without() -> None:
    full = LedgerCounters(COUNTERS, 9, pending=2, oldest_pending_offset=3, oldest_pending_ms=4, restore_floor=5)
    assert LedgerCounters.decode(full.encode()) == full
    floor_only = LedgerCounters({}, 9, restore_floor=0)
    assert LedgerCounters.decode(floor_only.encode()) == floor_only
    pending = LedgerCounters(COUNTERS, 9, pending=2, oldest_pending_offset=3, oldest_pending_ms=4)
    # a record written before the floor existed ends after the pending fields: no floor
    assert pending.encode()[2:] == full.encode()[2 : len(pending.encode())]
    assert LedgerCounters.decode(pending.encode()).restore_floor is None
    assert decode_counters(full.encode()) == (COUNTERS, 9)


def test_counters_with_garbage_after_the_last_field_are_refused() -> None:
    data = LedgerCounters(COUNTERS, 7, pending=1, oldest_pending_offset=3, oldest_pending_ms=4, restore_floor=5).encode()
    with pytest.raises(DecodeError, match="trailing bytes"):
        LedgerCounters.decode(data + b"\x00")


# --------------------------------------------------------------------------- bad input

DECODERS = {
    "PersistedRecord": PersistedRecord.decode,
    "XorBatch": XorBatch.decode,
    "LedgerEntry": LedgerEntry.decode,
    "LedgerCounters": decode_counters,
}
ENCODED = {
    "PersistedRecord": RECORD.encode(),
    "XorBatch": BATCH.encode(),
    # With every field: what follows a record written without its last field is that field.
    "LedgerEntry": LedgerEntry(ENTRY.value, ENTRY.flags, ENTRY.persist_offset, ENTRY.deadline_ms, 7, "why").encode(),
    "LedgerCounters": encode_counters(COUNTERS, 1),
}


@pytest.mark.parametrize("schema", DECODERS)
@pytest.mark.parametrize("empty", [None, b""], ids=["none", "zero-bytes"])
def test_empty_value_is_a_decode_error(schema: str, empty: bytes | None) -> None:
    with pytest.raises(DecodeError, match="empty"):
        DECODERS[schema](empty)


@pytest.mark.parametrize("schema", DECODERS)
@pytest.mark.parametrize(
    "garbage",
    [
        b"\xff" * 16,  # a varint that never ends
        b"\x01",  # a negative zig-zag length prefix / nothing after it
        b"not avro at all, just text",
        bytes(range(256)),
    ],
    ids=["endless-varint", "one-byte", "text", "all-bytes"],
)
def test_garbage_is_a_decode_error(schema: str, garbage: bytes) -> None:
    with pytest.raises(DecodeError):
        DECODERS[schema](garbage)


@pytest.mark.parametrize("schema", DECODERS)
def test_random_bytes_never_escape_as_another_exception(schema: str) -> None:
    """Whatever random bytes decode to, the only error a decoder raises is DecodeError."""
    rng = np.random.default_rng(20241121)
    decoded = 0
    for _ in range(2000):
        data = rng.bytes(int(rng.integers(1, 80)))
        try:
            DECODERS[schema](data)
            decoded += 1
        except DecodeError:
            pass
    assert decoded < 2000 // 2, "most random bytes must not be well-formed values"


_RETRY = RetryPolicy(initial_ms=500, multiplier=2.0, max_ms=30_000, jitter=0.2)
_I = np.array([9, -9], dtype=np.int64)
# What the writers make of every layout: each field group present or not.
WRITTEN = {
    "PersistedRecord": [RECORD, dataclasses.replace(RECORD, retry=_RETRY), dataclasses.replace(RECORD, history=())],
    "XorBatch": [
        BATCH,
        dataclasses.replace(BATCH, touched=_I, touched_deadlines=_I),
        dataclasses.replace(BATCH, superseded=_I),
        dataclasses.replace(BATCH, rejected=_I, rejected_reasons=("a", "b")),
        dataclasses.replace(BATCH, retry_after_ms=np.array([5, -1], dtype=np.int64)),
        dataclasses.replace(BATCH, touched=_I, touched_deadlines=_I, superseded=_I, rejected=_I,
                            rejected_reasons=("a", "b"), retry_after_ms=np.array([5, -1], dtype=np.int64)),
    ],
    "LedgerEntry": [
        ENTRY,
        dataclasses.replace(ENTRY, timed_out_ms=7),
        dataclasses.replace(ENTRY, rejection="why"),
        dataclasses.replace(ENTRY, timed_out_ms=7, rejection="why"),
        dataclasses.replace(ENTRY, retry_at_ms=0),
        dataclasses.replace(ENTRY, timed_out_ms=7, retry_at_ms=1_700_000_040_000),
    ],
    "LedgerCounters": [
        LedgerCounters(COUNTERS, 1),
        LedgerCounters(COUNTERS, 1, 3, 4, 5),
        LedgerCounters(COUNTERS, 1, 3, 4, 5, 6),
        LedgerCounters(COUNTERS, 1, None, None, None, 6),
    ],
}


@pytest.mark.parametrize(
    ("schema", "record"),
    [pytest.param(s, r, id=f"{s}-{i}") for s, rs in WRITTEN.items() for i, r in enumerate(rs)],
)
def test_every_truncation_of_a_written_record_is_a_decode_error(schema: str, record: Any) -> None:
    """A record cut short is refused at every length - never read as a shorter (older)
    layout of the same record type, whose last field would end where the cut is."""
    data = record.encode()
    assert _decodes(DECODERS[schema], data)
    decoded = [n for n in range(1, len(data)) if _decodes(DECODERS[schema], data[:n])]
    assert decoded == []


def _decodes(decode: Callable[[bytes], object], data: bytes) -> bool:
    try:
        decode(data)
    except DecodeError:
        return False
    return True


@pytest.mark.parametrize("schema", DECODERS)
@pytest.mark.parametrize(
    "extra", [b"\x00", b"\x02\x04", b"\x7ftail"], ids=["zero", "varints", "tail"]
)
def test_trailing_bytes_are_a_decode_error(schema: str, extra: bytes) -> None:
    with pytest.raises(DecodeError, match="trailing"):
        DECODERS[schema](ENCODED[schema] + extra)


@pytest.mark.parametrize(
    ("expected", "actual"), [(e, a) for e in DECODERS for a in ENCODED if e != a]
)
def test_a_value_of_another_schema_is_a_decode_error(expected: str, actual: str) -> None:
    with pytest.raises(DecodeError):
        DECODERS[expected](ENCODED[actual])


@pytest.mark.parametrize(
    ("srids", "xors", "failed"),
    [
        (b"\x01" * 7, b"\x01" * 7, b""),  # not a multiple of 8
        (b"\x01" * 16, b"\x01" * 8, b""),  # srids and xors differ in length
        (b"", b"", b"\x01" * 9),  # failed not a multiple of 8
    ],
    ids=["odd-length", "unequal", "odd-failed"],
)
def test_malformed_xor_batch_arrays_are_a_decode_error(
    srids: bytes, xors: bytes, failed: bytes
) -> None:
    buf = io.BytesIO()
    fastavro.schemaless_writer(
        buf,
        XOR_BATCH,
        {"ledger_partition": 0, "srids": srids, "xors": xors, "failed": failed, "producer": ""},
    )
    with pytest.raises(DecodeError, match="malformed"):
        XorBatch.decode(buf.getvalue())


def test_touches_round_trip_and_a_batch_without_them_keeps_the_older_encoding() -> None:
    touched = XorBatch(2, np.array([6], np.int64), np.array([9], np.int64), np.empty(0, np.int64), "t",
                       touched=np.array([6, 10], np.int64), touched_deadlines=np.array([1_000, 2_000], np.int64))
    back = XorBatch.decode(touched.encode())
    assert back.touched.tolist() == [6, 10] and back.touched_deadlines.tolist() == [1_000, 2_000]
    assert back.srids.tolist() == [6] and back.producer == "t"
    plain = XorBatch(2, np.array([6], np.int64), np.array([9], np.int64), np.empty(0, np.int64), "t")
    older = io.BytesIO()  # what a sender from before touches writes
    fastavro.schemaless_writer(older, XOR_BATCH, {"ledger_partition": 2, "srids": plain.srids.astype("<i8").tobytes(),
                               "xors": plain.xors.astype("<i8").tobytes(), "failed": b"", "producer": "t"})
    assert plain.encode() == XOR_BATCH_LAYOUTS.tags[0] + older.getvalue()  # that layout, tagged
    assert XorBatch.decode(older.getvalue()).touched.size == 0


def test_malformed_touches_are_a_decode_error() -> None:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, XOR_BATCH_WITH_TOUCHES, {
        "ledger_partition": 0, "srids": b"", "xors": b"", "failed": b"", "producer": "",
        "touched": b"\x01" * 8, "touched_deadlines": b"\x01" * 16,
    })
    with pytest.raises(DecodeError, match="touches are malformed"):
        XorBatch.decode(buf.getvalue())


def test_superseded_marks_round_trip_and_batches_without_them_keep_the_shorter_encodings() -> None:
    empty = np.empty(0, np.int64)
    marks = XorBatch(3, empty, empty, empty, "acker", superseded=np.array([7, -11], np.int64))
    back = XorBatch.decode(marks.encode())
    assert back.superseded.tolist() == [7, -11] and back.touched.size == 0 and back.srids.size == 0
    both = XorBatch(3, np.array([7], np.int64), np.array([5], np.int64), empty, "t", touched=np.array([7], np.int64),
                    touched_deadlines=np.array([1_000], np.int64), superseded=np.array([11], np.int64))
    back = XorBatch.decode(both.encode())
    assert (back.srids.tolist(), back.touched.tolist(), back.superseded.tolist()) == ([7], [7], [11])
    touched = XorBatch(3, empty, empty, empty, "t", touched=np.array([7], np.int64),
                       touched_deadlines=np.array([1_000], np.int64))
    older = io.BytesIO()  # what a sender from before superseded marks writes
    fastavro.schemaless_writer(older, XOR_BATCH_WITH_TOUCHES, {
        "ledger_partition": 3, "srids": b"", "xors": b"", "failed": b"", "producer": "t",
        "touched": touched.touched.astype("<i8").tobytes(), "touched_deadlines": touched.touched_deadlines.astype("<i8").tobytes(),
    })
    assert touched.encode() == XOR_BATCH_LAYOUTS.tags[1] + older.getvalue()
    assert XorBatch.decode(older.getvalue()).superseded.size == 0


def test_rejections_round_trip_with_their_reasons_and_batches_without_them_keep_the_shorter_encodings() -> None:
    empty = np.empty(0, np.int64)
    rejects = XorBatch(3, np.array([7], np.int64), np.array([5], np.int64), np.array([9], np.int64), "t",
                       rejected=np.array([11, -13], np.int64), rejected_reasons=("ValueError: bad json", "no such sku"))
    back = XorBatch.decode(rejects.encode())
    assert (back.srids.tolist(), back.failed.tolist(), back.rejected.tolist()) == ([7], [9], [11, -13])
    assert back.rejected_reasons == ("ValueError: bad json", "no such sku") and back.superseded.size == 0
    marks = XorBatch(3, empty, empty, empty, "acker", superseded=np.array([7], np.int64))
    older = io.BytesIO()  # what a sender from before rejections writes
    fastavro.schemaless_writer(older, XOR_BATCH_WITH_SUPERSEDED, {
        "ledger_partition": 3, "srids": b"", "xors": b"", "failed": b"", "producer": "acker",
        "touched": b"", "touched_deadlines": b"", "superseded": marks.superseded.astype("<i8").tobytes(),
    })
    assert marks.encode() == XOR_BATCH_LAYOUTS.tags[2] + older.getvalue()
    assert XorBatch.decode(older.getvalue()).rejected.size == 0
    with pytest.raises(ValueError, match="rejected and rejected_reasons differ"):
        XorBatch(3, empty, empty, empty, "t", rejected=np.array([1], np.int64)).encode()


@pytest.mark.parametrize(("rejected", "reasons"), [(b"\x01" * 9, ["x"]), (b"\x01" * 8, []), (b"", ["x"])])
def test_malformed_rejections_are_a_decode_error(rejected: bytes, reasons: list[str]) -> None:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, XOR_BATCH_WITH_REJECTED, {
        "ledger_partition": 0, "srids": b"", "xors": b"", "failed": b"", "producer": "",
        "touched": b"", "touched_deadlines": b"", "superseded": b"", "rejected": rejected, "rejected_reasons": reasons,
    })
    with pytest.raises(DecodeError, match="rejections are malformed"):
        XorBatch.decode(buf.getvalue())


def test_retry_afters_round_trip_beside_their_fail_marks_and_batches_without_them_keep_the_shorter_encodings() -> None:
    empty = np.empty(0, np.int64)
    failed = np.array([9, 21], np.int64)
    asked = XorBatch(3, empty, empty, failed, "t", retry_after_ms=np.array([30_000, -1], np.int64))
    back = XorBatch.decode(asked.encode())
    assert (back.failed.tolist(), back.retry_after_ms.tolist(), back.rejected.size) == ([9, 21], [30_000, -1], 0)
    rejects = XorBatch(3, empty, empty, failed, "t", rejected=np.array([11], np.int64), rejected_reasons=("bad",))
    older = io.BytesIO()  # what a sender from before retry-afters writes
    fastavro.schemaless_writer(older, XOR_BATCH_WITH_REJECTED, {
        "ledger_partition": 3, "srids": b"", "xors": b"", "failed": failed.astype("<i8").tobytes(), "producer": "t",
        "touched": b"", "touched_deadlines": b"", "superseded": b"", "rejected": np.array([11], "<i8").tobytes(),
        "rejected_reasons": ["bad"],
    })
    assert rejects.encode() == XOR_BATCH_LAYOUTS.tags[3] + older.getvalue()
    assert XorBatch.decode(older.getvalue()).retry_after_ms.size == 0
    plain = XorBatch(3, empty, empty, failed, "t")
    assert plain.encode() == XorBatch.decode(plain.encode()).encode()  # the shortest encoding still
    assert len(plain.encode()) < len(rejects.encode()) < len(asked.encode())
    with pytest.raises(ValueError, match="retry_after_ms and failed differ"):
        XorBatch(3, empty, empty, failed, "t", retry_after_ms=np.array([1], np.int64)).encode()


def test_malformed_retry_afters_are_a_decode_error() -> None:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, XOR_BATCH_FULL, {
        "ledger_partition": 0, "srids": b"", "xors": b"", "failed": b"\x01" * 16, "producer": "",
        "touched": b"", "touched_deadlines": b"", "superseded": b"", "rejected": b"", "rejected_reasons": [],
        "retry_after_ms": b"\x01" * 8,
    })
    with pytest.raises(DecodeError, match="retry-afters are malformed"):
        XorBatch.decode(buf.getvalue())


def test_a_ledger_entrys_retry_after_round_trips_and_older_entries_decode_without_it() -> None:
    waits = LedgerEntry(5, 0x13, 3, 1_700_000_090_000, retry_at_ms=45_000)
    assert LedgerEntry.decode(waits.encode()) == waits
    timed = LedgerEntry(5, 0x11, 3, 1_700_000_090_000, timed_out_ms=1_700_000_030_000, retry_at_ms=0)
    assert LedgerEntry.decode(timed.encode()) == timed
    older = io.BytesIO()  # an entry from before retry-afters: a rejected one, the longest then
    datum = {"value": 5, "flags": 3, "persist_offset": 3, "deadline_ms": 7, "timed_out_ms": -1, "rejection": "why"}
    fastavro.schemaless_writer(older, LEDGER_ENTRY_WITH_REJECTION, datum)
    assert LedgerEntry.decode(older.getvalue()) == LedgerEntry(5, 3, 3, 7, -1, "why")
    assert LedgerEntry(5, 3, 3, 7, -1, "why", retry_at_ms=9).encode() == LEDGER_ENTRY_LAYOUTS.tags[2] + older.getvalue()  # never replayed
    for bad in ({**datum, "retry_at_ms": 9}, {**datum, "rejection": "", "retry_at_ms": -5}):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, LEDGER_ENTRY_FULL, bad)
        with pytest.raises(DecodeError, match="trailing bytes"):
            LedgerEntry.decode(buf.getvalue())
    columns = [np.array([5, 6], np.int64), np.array([3, 3], np.int64), np.array([3, 4], np.int64), np.array([7, 8], np.int64)]
    rows = encode_ledger_entries(*columns, None, None, {1: 45_000})
    assert [LedgerEntry.decode(r) for r in rows] == [LedgerEntry(5, 3, 3, 7), LedgerEntry(6, 3, 4, 8, retry_at_ms=45_000)]


def test_malformed_superseded_marks_are_a_decode_error() -> None:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, XOR_BATCH_WITH_SUPERSEDED, {
        "ledger_partition": 0, "srids": b"", "xors": b"", "failed": b"", "producer": "",
        "touched": b"", "touched_deadlines": b"", "superseded": b"\x01" * 9,
    })
    with pytest.raises(DecodeError, match="superseded array is malformed"):
        XorBatch.decode(buf.getvalue())


@settings(max_examples=2000, deadline=None)
@given(st.integers(I64_MIN, I64_MAX))
def test_no_untagged_value_starts_as_a_layout_tag(n: int) -> None:
    """An untagged value starts with a minimal varint (an int, a long, a map's block count):
    a byte with its continuation bit is never followed by a zero last byte, as a tag is."""
    first = avro_long(n)
    assert not (first[0] >= 0x80 and first[1:2] == b"\x00")


@pytest.mark.parametrize("layouts", [XOR_BATCH_LAYOUTS, LEDGER_ENTRY_LAYOUTS, LEDGER_COUNTERS_LAYOUTS],
                         ids=lambda layouts: layouts.what)
def test_a_tag_of_an_unknown_layout_or_another_type_is_a_decode_error(layouts: Layouts) -> None:
    others = {tag for other in (XOR_BATCH_LAYOUTS, LEDGER_ENTRY_LAYOUTS, LEDGER_COUNTERS_LAYOUTS) for tag in other.tags}
    assert len(others) == 4 + 5 + 3  # one tag per type and layout
    for tag in [*sorted(others - set(layouts.tags)), bytes((layouts.tags[-1][0] + 1, 0))]:
        with pytest.raises(DecodeError, match="unknown layout tag"):
            layouts.read(tag + b"\x02" * 40)


def test_a_persist_value_flagged_with_a_retry_reads_only_with_it() -> None:
    with_retry = dataclasses.replace(RECORD, retry=_RETRY).encode()
    assert with_retry[40] & PERSIST_BACKOFF and not RECORD.encode()[40] & PERSIST_BACKOFF
    assert PersistedRecord.decode(with_retry).retry == _RETRY
    flagged_without = bytearray(RECORD.encode())
    flagged_without[40] |= PERSIST_BACKOFF
    with pytest.raises(DecodeError, match="flags 0x02 say the record ends with its retry"):
        PersistedRecord.decode(bytes(flagged_without))
