"""The tracking header (``rb-t``) and ``rb-path`` as Spark SQL expressions, evaluated in the JVM.

Ids travel as 8-byte big-endian two's-complement headers (``broker.ids.encode_id``). Spark has
no binary->long cast under ANSI mode (the default since 4.0), and ``conv(hex(b), 16, 10)`` is
unsigned: ids with the top bit set come out as 2**64 - |id| and overflow ``bigint``. A
negative *target* base makes ``conv`` signed, so

    CAST(conv(hex(b), 16, -10) AS BIGINT)

reads ``FFFFFFFFFFFFFFFF`` as -1 and ``8000000000000000`` as -2**63 (tested on the edges).
The way back is ``unhex(lpad(hex(id), 16, '0'))``: ``hex`` of a bigint is the two's
complement digits, 16 of them for negative ids, fewer (hence the ``lpad``) for positive ones.

``rb-t`` packs srid, record id [, origin [, attempt]] as ``broker.headers.TRACKING_FIELDS``
lays them out (the one definition, ``Tracking`` reads it too): each field a ``substring`` of
it (binary in, binary out), the ids 8 bytes, the attempt 4, unsigned.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from broker.headers import (
    H_PATH,
    H_TRACKING,
    MAX_ATTEMPT,
    ROOT_PATH,
    TRACKING_FIELDS,
    TRACKING_HEADERS,
    TRACKING_SIZES,
)

SRID, RECORD_ID, ORIGIN, ATTEMPT, PATH = "srid", "record_id", "origin", "attempt", "path"
TRACKING_COLUMNS = (SRID, RECORD_ID, ORIGIN, ATTEMPT, PATH)
assert TRACKING_COLUMNS[:4] == tuple(name for name, _, _ in TRACKING_FIELDS)
IS_REPLAY = "is_replay"


def header_value(headers: Column | str, name: str) -> Column:
    """The value of header ``name`` (the last one when repeated, as ``Tracking`` reads it);
    null when absent."""
    matching = F.filter(F.col(headers) if isinstance(headers, str) else headers, lambda h: h["key"] == name)
    return F.try_element_at(matching, F.lit(-1))["value"]


def id_from_bytes(data: Column) -> Column:
    """8 bytes big-endian -> signed bigint; null unless exactly 8 bytes."""
    return F.when(
        F.octet_length(data) == 8, F.conv(F.hex(data), 16, -10).cast("bigint")
    )


def id_to_bytes(value: Column) -> Column:
    """Signed bigint -> 8 bytes big-endian (``broker.ids.encode_id``)."""
    return F.unhex(F.lpad(F.hex(value), 16, "0"))


def packed_ids_sql(values: str) -> str:
    """SQL text: the bigint array ``values`` as its ids' 8-byte big-endian two's complement,
    concatenated (``id_to_bytes`` per element) - how ``xor_events`` ships its arrays."""
    return f"unhex(array_join(transform({values}, v -> lpad(hex(v), 16, '0')), ''))"


def new_id() -> Column:
    """A random non-zero bigint per row (xxhash64 of a random UUID: 64 mixed random bits).

    Non-deterministic: pin the rows (``localCheckpoint``) before using the ids twice."""
    h = F.xxhash64(F.expr("uuid()"))
    return F.when(h == 0, F.lit(1).cast("bigint")).otherwise(h)


def with_tracking_columns(df: DataFrame, headers: str = "headers") -> DataFrame:
    """``df`` plus srid, record_id, origin, attempt, path decoded from its Kafka ``headers``.

    Like ``broker.headers.Tracking.from_headers``: a 16-byte ``rb-t`` has origin = srid and
    attempt 1, a 24-byte one attempt 1; a record whose ``rb-t`` is missing or of another
    length, whose srid or record id is 0 (the XOR identity: the acker refuses it) or whose
    attempt is out of 1 to ``MAX_ATTEMPT`` is untracked - all five columns null. The path
    (``rb-path``, ``broker.headers.path_of``) defaults to the root's, ``"0"``.

    Three projections, so each header is decoded once per row (Spark does not collapse a
    projection into one that references its non-trivial expressions more than once).
    """
    raw = [f"_rb_{name}" for name in TRACKING_COLUMNS]
    packed = "_rb_t"
    decoded = df.withColumns({packed: header_value(headers, H_TRACKING), raw[4]: header_value(headers, H_PATH)})
    t, size = F.col(packed), F.octet_length(F.col(packed))
    fields = {}
    for column, (_, offset, width) in zip(raw[:4], TRACKING_FIELDS, strict=True):
        part = F.substring(t, offset + 1, width)
        value = id_from_bytes(part) if width == 8 else F.conv(F.hex(part), 16, 10).try_cast("bigint")
        # A field past the shortest rb-t is there only when the value reaches its end.
        fields[column] = value if offset + width <= TRACKING_SIZES[0] else F.when(size >= offset + width, value)
    decoded = decoded.withColumns(fields)
    srid, record_id, origin, attempt = (F.col(c) for c in raw[:4])
    decoded = decoded.withColumns(
        {
            raw[2]: F.coalesce(origin, srid),
            raw[3]: F.coalesce(attempt, F.lit(1).cast("bigint")),
            raw[4]: F.coalesce(F.nullif(F.col(raw[4]).cast("string"), F.lit("")), F.lit(ROOT_PATH)),
        }
    )
    attempt = F.col(raw[3])
    tracked = (
        size.isin(*TRACKING_SIZES)
        & (srid != 0)
        & (record_id != 0)
        & (attempt >= 1)
        & (attempt <= MAX_ATTEMPT)
    )
    columns = {name: F.when(tracked, F.col(c)) for name, c in zip(TRACKING_COLUMNS, raw, strict=True)}
    columns[ATTEMPT] = F.when(tracked, attempt.cast("int"))
    return decoded.withColumns(columns).drop(*raw, packed)


def child_path(parent: Column, index: Column) -> Column:
    """The path of the ``index``-th child of a record whose path is ``parent``
    (``broker.headers.child_path``)."""
    return F.concat(parent, F.lit("."), index.cast("string"))


def tracking_headers(
    srid: Column, record_id: Column, origin: Column, attempt: Column, path: Column | None = None
) -> Column:
    """The tracking header of a record (``rb-t``, always the 28 bytes with origin and attempt:
    a valid form of it) as the Kafka sink's ``headers`` column type (``rb-path`` too when
    ``path`` is given)."""

    def header(name: str, value: Column) -> Column:
        return F.struct(F.lit(name).alias("key"), value.alias("value"))

    values = (srid, record_id, origin, attempt)
    packed = F.concat(*(
        id_to_bytes(value) if width == 8 else F.unhex(F.lpad(F.hex(value.cast("bigint")), 2 * width, "0"))
        for value, (_, _, width) in zip(values, TRACKING_FIELDS, strict=True)
    ))
    headers = [header(H_TRACKING, packed)]
    if path is not None:
        headers.append(header(H_PATH, path.cast("binary")))
    return F.array(*headers)


def user_headers(headers: Column) -> Column:
    """``headers`` without the tracking ones (they are re-issued for every emitted record)."""
    names = sorted(TRACKING_HEADERS)
    return F.filter(headers, lambda h: ~h["key"].isin(names))
