"""The hand-written encoders and parsers produce exactly what the reference ones do.

- ``PersistedRecord.encode`` / ``LedgerEntry.encode`` (hand-rolled Avro) against
  ``fastavro.schemaless_writer`` (the references below) - byte for byte, over random records;
- ``Tracking.from_headers`` (one pass, ``struct``) against a reference reading of ``rb-t``'s fields;
- the persist value's prefix the acker registers from (read for a batch at once) against the
  record it describes, read value by value.
"""

from __future__ import annotations

import dataclasses
import io

import fastavro
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import ids
from broker.headers import (
    ADAPTIVE_FALLBACK_MS,
    AUTO_TIMEOUT_MS,
    H_ORIGIN,
    H_PATH,
    H_TRACKING,
    Tracking,
    tracking_headers,
)
from broker.retry import RetryPolicy
from broker.schemas import (
    LEDGER_ENTRY,
    LEDGER_ENTRY_LAYOUTS,
    LEDGER_ENTRY_V1,
    PERSIST_ADAPTIVE,
    PERSIST_BACKOFF,
    PERSIST_PREFIX_LEN,
    PERSISTED_RECORD,
    PERSISTED_RECORD_FULL,
    Failure,
    FirstAttempts,
    LedgerEntry,
    PersistedRecord,
    avro_headers,
    avro_long,
    avro_placement,
    avro_rows,
    encode_first_persisted,
    first_attempt_ids,
    read_persist_prefixes,
)


def _fastavro(schema: object, datum: dict[str, object]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, datum)
    return buf.getvalue()


def persisted_with_fastavro(record: PersistedRecord) -> bytes:
    """The reference encoding of a persist value: its prefix, then the record by fastavro
    (with its ``retry`` when it has one)."""
    datum = {
        "srid": record.srid,
        "origin": record.origin,
        "attempt": record.attempt,
        "root_xor": record.root_xor,
        "record_id": record.record_id,
        "topic": record.topic,
        "key_hash_partition": record.key_hash_partition,
        "partitioner": record.partitioner,
        "key": record.key,
        "value": record.value,
        "headers": [{"key": k, "value": v} for k, v in record.headers],
        "created_ms": record.created_ms,
        "timeout_ms": record.timeout_ms,
        "max_attempts": record.max_attempts,
        "history": [{"srid": f.srid, "attempt": f.attempt, "reason": f.reason, "at_ms": f.at_ms} for f in record.history],
    }
    if record.retry is None:
        return record.prefix() + _fastavro(PERSISTED_RECORD, datum)
    return record.prefix() + _fastavro(PERSISTED_RECORD_FULL, {**datum, "retry": dataclasses.asdict(record.retry)})


def ledger_entry_with_fastavro(entry: LedgerEntry) -> bytes:
    """The reference encoding: its layout's tag, then fastavro's record - without
    ``timed_out_ms`` (-1) the layout before it."""
    datum = {
        "value": entry.value, "flags": entry.flags, "persist_offset": entry.persist_offset,
        "deadline_ms": entry.deadline_ms,
    }
    if entry.timed_out_ms < 0:
        return LEDGER_ENTRY_LAYOUTS.tags[0] + _fastavro(LEDGER_ENTRY_V1, datum)
    return LEDGER_ENTRY_LAYOUTS.tags[1] + _fastavro(LEDGER_ENTRY, {**datum, "timed_out_ms": entry.timed_out_ms})


LONGS = st.integers(-(2**63), 2**63 - 1)
INTS = st.integers(-(2**31), 2**31 - 1)
OPT_BYTES = st.none() | st.binary(max_size=300)
TEXT = st.text(max_size=40)

PERSISTED = st.builds(
    PersistedRecord,
    srid=LONGS, origin=LONGS, attempt=INTS, root_xor=LONGS, record_id=LONGS, topic=TEXT,
    key_hash_partition=INTS, key=OPT_BYTES, value=OPT_BYTES, created_ms=LONGS, partitioner=TEXT,
    headers=st.lists(st.tuples(TEXT, OPT_BYTES), max_size=5).map(tuple),
    timeout_ms=INTS, max_attempts=INTS,
    history=st.lists(st.builds(Failure, srid=LONGS, attempt=INTS, reason=TEXT, at_ms=LONGS), max_size=4).map(tuple),
    retry=st.sampled_from([None, RetryPolicy(500, 2.0, 30_000, 0.2), RetryPolicy(1, 1.0, 2**40, 1.0)]),
)


@settings(max_examples=500, deadline=None)
@given(PERSISTED)
def test_persisted_record_encoding_is_fastavros(record: PersistedRecord) -> None:
    assert record.encode() == persisted_with_fastavro(record)
    assert PersistedRecord.decode(record.encode()) == record


@settings(max_examples=500, deadline=None)
@given(PERSISTED, st.integers(0, 20_000), st.integers(0, 20_000))
def test_a_first_attempt_from_encoded_parts_is_fastavros(record: PersistedRecord, key_len: int, value_len: int) -> None:
    """``Source.send``'s encoder: origin = srid, attempt 1, root_xor = record_id, no history;
    keys and values past the one-lookup lengths (8 192 B) too."""
    first = dataclasses.replace(record, origin=record.srid, attempt=1, root_xor=record.record_id, history=())
    shared = FirstAttempts.of(first.created_ms, first.timeout_ms, first.max_attempts, first.partitioner, first.retry)
    (ids_avro,) = first_attempt_ids(np.array([first.srid]), np.array([first.record_id]))
    for key, value in ((first.key, first.value), (b"k" * key_len, b"v" * value_len)):
        first = dataclasses.replace(first, key=key, value=value)
        encoded = encode_first_persisted(
            ids.encode_id(first.srid) + ids.encode_id(first.record_id), ids_avro,
            avro_placement(first.topic, first.key_hash_partition, first.partitioner), first.key, first.value,
            avro_headers(first.headers), shared,
        )
        assert encoded == persisted_with_fastavro(first) == first.encode()


@settings(max_examples=500, deadline=None)
@given(LONGS, INTS, LONGS, LONGS, st.one_of(st.just(-1), st.integers(0, 2**62)))
def test_ledger_entry_encoding_is_fastavros(value: int, flags: int, offset: int, deadline: int, timed_out: int) -> None:
    entry = LedgerEntry(value, flags, offset, deadline, timed_out)
    assert entry.encode() == ledger_entry_with_fastavro(entry)
    assert LedgerEntry.decode(entry.encode()) == entry


@settings(max_examples=300, deadline=None)
@given(LONGS)
def test_avro_long_is_fastavros(n: int) -> None:
    import io

    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, "long", n)
    assert avro_long(n) == buf.getvalue()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(PERSISTED | st.builds(dataclasses.replace, PERSISTED, timeout_ms=st.just(AUTO_TIMEOUT_MS)),
                          st.integers(0, 40), st.booleans()), min_size=1, max_size=20))
def test_persist_prefixes_read_at_once_are_the_records_they_describe(
    batch: list[tuple[PersistedRecord, int, bool]],
) -> None:
    """A batch of values, some cut short (they run into their neighbours): each prefix read
    with numpy says what the record says (8-byte big-endian ids, the deadline held to a long)."""
    values = [r.encode()[:cut] if short else r.encode() for r, cut, short in batch]
    pre = read_persist_prefixes(values)
    for i, ((record, _, _), value) in enumerate(zip(batch, values, strict=True)):
        if len(value) < PERSIST_PREFIX_LEN:
            assert pre.short[i] and not pre.body_srid_ok[i]
            continue
        auto = record.timeout_ms == AUTO_TIMEOUT_MS
        deadline = record.created_ms + (ADAPTIVE_FALLBACK_MS if auto else record.timeout_ms)
        assert not pre.short[i]
        assert (int(pre.srids[i]), int(pre.roots[i])) == (record.srid, record.root_xor)
        assert int(pre.deadlines_ms[i]) == min(max(deadline, -(2**63)), 2**63 - 1)
        assert int(pre.created_ms[i]) == record.created_ms
        assert (int(pre.attempts[i]), int(pre.max_attempts[i])) == (record.attempt, record.max_attempts)
        assert int(pre.flags[i]) == (PERSIST_ADAPTIVE if auto else 0) | (0 if record.retry is None else PERSIST_BACKOFF)
        known = {"kafka": 1, "spark": 2}
        assert int(pre.partitioners[i]) == known.get(record.partitioner, 0)
        assert bool(pre.body_srid_ok[i]) == value[PERSIST_PREFIX_LEN:].startswith(avro_long(record.srid))


def _reference_tracking(headers: list[tuple[str, bytes | None]] | None) -> Tracking | None:
    """``rb-t`` read field by field, as its table in broker.headers states it (the last header
    wins; 16, 24 or 28 bytes; a zero srid or record id and an attempt out of 1..2**31-1 are
    not tracking)."""
    found = {k: v for k, v in headers or () if k == H_TRACKING}
    value = found.get(H_TRACKING)
    if not value or len(value) not in (16, 24, 28):
        return None
    srid, rid = ids.decode_id(value[:8]), ids.decode_id(value[8:16])
    origin = ids.decode_id(value[16:24]) if len(value) >= 24 else srid
    attempt = int.from_bytes(value[24:], "big") if len(value) == 28 else 1
    if srid == 0 or rid == 0 or not 1 <= attempt <= 2**31 - 1:
        return None
    return Tracking(srid, rid, origin, attempt)


NONZERO = LONGS.filter(lambda n: n != 0)
ATTEMPTS = st.integers(0, 2**32 - 1)
PACKED = (
    st.tuples(LONGS, LONGS).map(lambda t: ids.encode_id(t[0]) + ids.encode_id(t[1]))
    | st.tuples(LONGS, LONGS, LONGS).map(lambda t: b"".join(map(ids.encode_id, t)))
    | st.tuples(LONGS, LONGS, LONGS, ATTEMPTS).map(
        lambda t: b"".join(map(ids.encode_id, t[:3])) + t[3].to_bytes(4, "big")
    )
)
HEADER_VALUES = st.none() | st.binary(max_size=30) | PACKED
HEADER = st.tuples(st.sampled_from([H_TRACKING, H_ORIGIN, H_PATH, "user", "rb-other"]), HEADER_VALUES)


@settings(max_examples=1000, deadline=None)
@given(st.none() | st.lists(HEADER, max_size=8))
def test_tracking_parse_matches_the_reference(headers: list[tuple[str, bytes | None]] | None) -> None:
    assert Tracking.from_headers(headers) == _reference_tracking(headers)


@given(NONZERO, NONZERO, LONGS, st.integers(1, 2**31 - 1), st.lists(st.tuples(TEXT, OPT_BYTES), max_size=3))
def test_tracking_parse_reads_tracking_headers(
    srid: int, rid: int, origin: int, attempt: int, user: list[tuple[str, bytes | None]]
) -> None:
    headers = [*user, *tracking_headers(srid, rid, origin, attempt)]
    assert Tracking.from_headers(headers) == Tracking(srid, rid, origin, attempt)


_T = tracking_headers(7, 9, 7, 1)[0]
_T2 = tracking_headers(8, 10, 3, 2)[0]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([_T], Tracking(7, 9, 7, 1)),  # the usual: a lone rb-t
        ((_T2,), Tracking(8, 10, 3, 2)),  # a tuple, as a task hands it on
        ([("user", b"x")], None),
        ([(H_TRACKING, None)], None),
        ([(H_TRACKING, b"short")], None),
        ([(H_TRACKING, bytes(16))], None),  # srid and record id 0
        ([("user", b"x"), _T], Tracking(7, 9, 7, 1)),
        ([_T, ("user", None)], Tracking(7, 9, 7, 1)),
        ([_T, _T2], Tracking(8, 10, 3, 2)),  # repeated: the last wins
        ([_T2, (H_TRACKING, b"bad")], None),  # even when it is malformed
        ([(H_TRACKING, b"bad"), _T2], Tracking(8, 10, 3, 2)),
    ],
)
def test_tracking_from_headers_one_or_several(
    headers: list[tuple[str, bytes | None]], expected: Tracking | None
) -> None:
    got = Tracking.from_headers(headers)
    assert got == expected == _reference_tracking(list(headers))
    assert got is None or (type(got) is Tracking and got.origin == expected.origin)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("origin", "attempt", "size"),
    [(7, 1, 16), (8, 1, 24), (7, 2, 28), (8, 5, 28)],  # srid 7: the origin is written only when not it
)
def test_tracking_is_as_short_as_the_record_allows(origin: int, attempt: int, size: int) -> None:
    (name, value), = tracking_headers(7, 9, origin, attempt)
    assert name == H_TRACKING and len(value) == size
    assert Tracking.unpack(value) == Tracking(7, 9, origin, attempt)


def test_a_child_keeps_its_parents_srid_origin_and_attempt() -> None:
    parent = Tracking(7, 9, 3, 4)
    assert Tracking.unpack(parent.child(11)) == Tracking(7, 11, 3, 4)


def test_new_id_is_never_zero_and_does_not_repeat() -> None:
    drawn = [ids.new_id() for _ in range(20_000)]
    assert 0 not in drawn and len(set(drawn)) == len(drawn)


BOUNDARIES = sorted({
    v for b in (6, 7, 13, 14, 20, 27, 28, 34, 35, 41, 48, 55, 56, 62, 63)
    for v in (2**b - 1, 2**b, -(2**b), -(2**b) - 1) if -(2**63) <= v < 2**63
} | {0, 1, -1})


def test_avro_long_is_fastavros_at_every_varint_length_boundary() -> None:
    import io

    for n in BOUNDARIES:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, "long", n)
        assert avro_long(n) == buf.getvalue(), n


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(LONGS, LONGS), max_size=300))
def test_avro_rows_encodes_each_row_as_avro_long_does_each_value(rows: list[tuple[int, int]]) -> None:
    columns = [np.array([r[i] for r in rows], dtype=np.int64) for i in range(2)]
    assert avro_rows(*columns) == [avro_long(a) + avro_long(b) for a, b in rows]
    assert avro_rows(*columns, tag=b"\x91\x00") == [b"\x91\x00" + avro_long(a) + avro_long(b) for a, b in rows]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(LONGS, LONGS), max_size=300))
def test_first_attempt_ids_are_the_avro_of_srid_origin_attempt_root_xor_record_id(rows: list[tuple[int, int]]) -> None:
    srids, record_ids = (np.array([r[i] for r in rows], dtype=np.int64) for i in range(2))
    assert first_attempt_ids(srids, record_ids) == [
        avro_long(s) + avro_long(s) + avro_long(1) + avro_long(r) + avro_long(r) for s, r in rows
    ]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(LONGS, st.integers(0, 255), st.integers(0, 2**62), st.integers(0, 2**50),
                          st.one_of(st.just(-1), st.integers(0, 2**50))), max_size=100))
def test_ledger_entries_encoded_column_wise_are_fastavros_bytes(rows: list[tuple[int, int, int, int, int]]) -> None:
    """A deferred timeout's ``timed_out_ms`` is appended; every other entry keeps the shorter
    encoding (the one written before the field existed)."""
    import numpy as np

    from broker.schemas import LEDGER_ENTRY, LEDGER_ENTRY_V1, encode_ledger_entries
    tags = LEDGER_ENTRY_LAYOUTS.tags

    columns = [np.array([r[i] for r in rows], dtype=np.int64) for i in range(5)]
    expected = []
    for value, flags, offset, deadline, timed_out in rows:
        buf = io.BytesIO()
        datum = {"value": value, "flags": flags, "persist_offset": offset, "deadline_ms": deadline}
        if timed_out < 0:
            fastavro.schemaless_writer(buf, LEDGER_ENTRY_V1, datum)
        else:
            fastavro.schemaless_writer(buf, LEDGER_ENTRY, {**datum, "timed_out_ms": timed_out})
        expected.append((tags[0] if timed_out < 0 else tags[1]) + buf.getvalue())
    assert encode_ledger_entries(*columns) == expected
    assert encode_ledger_entries(*columns[:4]) == [
        ledger_entry_with_fastavro(LedgerEntry(*r[:4])) for r in rows  # without the column: none appended
    ]
    assert [LedgerEntry.decode(b) for b in expected] == [LedgerEntry(*r) for r in rows]
