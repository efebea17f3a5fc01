"""The rb-* tracking headers as Spark SQL expressions, evaluated in the JVM.

Ids travel as 8-byte big-endian two's-complement headers (``broker.ids.encode_id``). Spark has
no binary->long cast under ANSI mode (the default since 4.0), and ``conv(hex(b), 16, 10)`` is
unsigned: ids with the top bit set come out as 2**64 - |id| and overflow ``bigint``. A
negative *target* base makes ``conv`` signed, so

    CAST(conv(hex(b), 16, -10) AS BIGINT)

reads ``FFFFFFFFFFFFFFFF`` as -1 and ``8000000000000000`` as -2**63 (tested on the edges).
The way back is ``unhex(lpad(hex(id), 16, '0'))``: ``hex`` of a bigint is the two's
complement digits, 16 of them for negative ids, fewer (hence the ``lpad``) for positive ones.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from broker.headers import H_ATTEMPT, H_ID, H_ORIGIN, H_PATH, H_SRID, ROOT_PATH, TRACKING_HEADERS

SRID, RECORD_ID, ORIGIN, ATTEMPT, PATH = "srid", "record_id", "origin", "attempt", "path"
TRACKING_COLUMNS = (SRID, RECORD_ID, ORIGIN, ATTEMPT, PATH)
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

    Like ``broker.client.Tracking.from_headers``: origin defaults to the srid and attempt to 1;
    a record whose srid or record id is missing, malformed or 0 (the XOR identity: the acker
    refuses it) or whose attempt is not a number is untracked - all five columns null. The
    path (``rb-path``, ``broker.headers.path_of``) defaults to the root's, ``"0"``.

    Three projections, so each header is decoded once per row (Spark does not collapse a
    projection into one that references its non-trivial expressions more than once).
    """
    raw = [f"_rb_{name}" for name in TRACKING_COLUMNS]
    decoded = df.withColumns(
        {
            raw[0]: id_from_bytes(header_value(headers, H_SRID)),
            raw[1]: id_from_bytes(header_value(headers, H_ID)),
            raw[2]: header_value(headers, H_ORIGIN),
            raw[3]: header_value(headers, H_ATTEMPT),
            raw[4]: header_value(headers, H_PATH),
        }
    )
    srid, record_id, origin_raw, attempt_raw, path_raw = (F.col(c) for c in raw)
    decoded = decoded.withColumns(
        {
            raw[2]: F.when(origin_raw.isNull(), srid).otherwise(id_from_bytes(origin_raw)),
            raw[3]: F.when(attempt_raw.isNull(), F.lit(1)).otherwise(
                attempt_raw.cast("string").try_cast("int")
            ),
            raw[4]: F.coalesce(F.nullif(path_raw.cast("string"), F.lit("")), F.lit(ROOT_PATH)),
        }
    )
    origin, attempt = F.col(raw[2]), F.col(raw[3])
    tracked = (
        srid.isNotNull()
        & (srid != 0)
        & record_id.isNotNull()
        & (record_id != 0)
        & origin.isNotNull()
        & attempt.isNotNull()
    )
    return decoded.withColumns(
        {name: F.when(tracked, F.col(c)) for name, c in zip(TRACKING_COLUMNS, raw, strict=True)}
    ).drop(*raw)


def child_path(parent: Column, index: Column) -> Column:
    """The path of the ``index``-th child of a record whose path is ``parent``
    (``broker.headers.child_path``)."""
    return F.concat(parent, F.lit("."), index.cast("string"))


def tracking_headers(
    srid: Column, record_id: Column, origin: Column, attempt: Column, path: Column | None = None
) -> Column:
    """The rb-* headers of a tracked record as the Kafka sink's ``headers`` column type
    (``rb-path`` too when ``path`` is given)."""

    def header(name: str, value: Column) -> Column:
        return F.struct(F.lit(name).alias("key"), value.alias("value"))

    headers = [
        header(H_SRID, id_to_bytes(srid)),
        header(H_ID, id_to_bytes(record_id)),
        header(H_ORIGIN, id_to_bytes(origin)),
        header(H_ATTEMPT, attempt.cast("string").cast("binary")),
    ]
    if path is not None:
        headers.append(header(H_PATH, path.cast("binary")))
    return F.array(*headers)


def user_headers(headers: Column) -> Column:
    """``headers`` without the rb-* ones (they are re-issued for every emitted record)."""
    names = sorted(TRACKING_HEADERS)
    return F.filter(headers, lambda h: ~h["key"].isin(names))
