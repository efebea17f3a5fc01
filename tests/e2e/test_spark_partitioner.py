"""Our Spark partitioner against real Spark: ``hash(cols...)`` and ``pmod(hash(cols...), n)``.

Each case builds one DataFrame, lets Spark compute every hash and partition in one ``collect``,
and then checks every row in Python, reporting all the keys that disagree.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from broker.partitioning import SparkFloat, SparkInt, spark_hash, spark_partition

pytestmark = pytest.mark.e2e

NUM_PARTITIONS = (1, 7, 16, 200)
I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1

_rng = random.Random(20240607)

# Multi-byte UTF-8 of every width, so trailing bytes are often >= 0x80 (sign extension).
_ALPHABET = "abcXYZ019 _-\x00\x7f" + "é\x80ÿß" + "中文€\u0800\uffff" + "😀🎉\U00010000"


def _ascii(length: int) -> str:
    return "".join(_rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(length))


def _unicode(chars: int) -> str:
    return "".join(_rng.choice(_ALPHABET) for _ in range(chars))


def _strings() -> list[str]:
    specials = ["", "a", "abc", "abcd", "\x00", "\x80", "ÿ", "é", "中", "😀", "a😀", "ab中"]
    ascii_keys = [_ascii(length) for length in range(41) for _ in range(20)]
    unicode_keys = [_unicode(chars) for chars in range(1, 15) for _ in range(40)]
    long_keys = [_ascii(length) for length in (100, 255, 256, 257, 259, 300, 1024, 1027)]
    return specials + ascii_keys + unicode_keys + long_keys + [_unicode(400)]


def _binaries() -> list[bytes]:
    keys = [
        bytes(_rng.randrange(256) for _ in range(length)) for length in range(41) for _ in range(10)
    ]
    return [*keys, b"", b"\xff" * 3, b"\x80\x7f\x00", bytes(range(256))]


def _longs() -> list[int]:
    edges = [
        0,
        1,
        -1,
        42,
        I32_MAX,
        I32_MIN,
        I32_MAX + 1,
        I32_MIN - 1,
        2**32,
        -(2**32),
        I64_MAX,
        I64_MIN,
    ]
    scales = [2**7, 2**15, 2**31, 2**40, 2**63 - 1]
    return edges + [_rng.randint(-s, s) for s in scales for _ in range(200)]


def _ints() -> list[int]:
    edges = [0, 1, -1, 42, I32_MAX, I32_MIN, 255, -128, 65535, -32768]
    return edges + [_rng.randint(I32_MIN, I32_MAX) for _ in range(1000)]


def _doubles() -> list[float]:
    edges = [
        0.0,
        -0.0,
        math.nan,
        -math.nan,
        math.inf,
        -math.inf,
        1.0,
        -1.5,
        5e-324,
        1.7976931348623157e308,
        0.1,
    ]
    return (
        edges
        + [_rng.uniform(-1e6, 1e6) for _ in range(500)]
        + [_rng.gauss(0, 1e-300) for _ in range(100)]
    )


def _floats() -> list[float]:
    edges = [
        0.0,
        -0.0,
        math.nan,
        math.inf,
        -math.inf,
        1.0,
        0.1,
        3.4028234663852886e38,
        1e-45,
        16777217.0,
    ]
    return edges + [_rng.uniform(-1e6, 1e6) for _ in range(500)]


def _maybe_null(values: list[Any], every: int = 7) -> list[Any]:
    return [None if i % every == 0 else v for i, v in enumerate(values)]


@dataclass(frozen=True)
class Case:
    id: str
    types: tuple[DataType, ...]
    rows: list[tuple[Any, ...]]  # the Python values handed to Spark, one tuple per key


def _as_ours(value: Any, dtype: DataType) -> Any:
    """Our spelling of a Spark value: wrap the types Python cannot infer."""
    if value is None:
        return None
    if isinstance(dtype, IntegerType | ShortType | ByteType):
        return SparkInt(value)
    if isinstance(dtype, FloatType):
        return SparkFloat(value)
    return value


def _cases() -> list[Case]:
    strings = _strings()
    longs = _longs()
    ints = _ints()
    n = len(strings)
    dates = [date(1970, 1, 1), date(1969, 12, 31), date(1, 1, 1), date(9999, 12, 31)] + [
        date.fromordinal(_rng.randint(date(1900, 1, 1).toordinal(), date(2100, 1, 1).toordinal()))
        for _ in range(300)
    ]
    zones = [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]
    timestamps = [
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999999, UTC),
    ] + [datetime.fromtimestamp(_rng.uniform(-3e9, 4e9), _rng.choice(zones)) for _ in range(300)]
    intervals = [timedelta(0), timedelta(microseconds=-1), timedelta(days=-3, hours=5)] + [
        timedelta(microseconds=_rng.randint(-(10**15), 10**15)) for _ in range(300)
    ]
    return [
        Case("string", (StringType(),), [(s,) for s in [*strings, None]]),
        Case("binary", (BinaryType(),), [(b,) for b in [*_binaries(), None]]),
        Case("long", (LongType(),), [(v,) for v in [*longs, None]]),
        Case("int", (IntegerType(),), [(v,) for v in [*ints, None]]),
        Case("short", (ShortType(),), [(v,) for v in range(-32768, 32768, 97)]),
        Case("byte", (ByteType(),), [(v,) for v in range(-128, 128)]),
        Case("boolean", (BooleanType(),), [(True,), (False,), (None,)]),
        Case("double", (DoubleType(),), [(v,) for v in [*_doubles(), None]]),
        Case("float", (FloatType(),), [(v,) for v in [*_floats(), None]]),
        Case("date", (DateType(),), [(d,) for d in [*dates, None]]),
        Case("timestamp", (TimestampType(),), [(t,) for t in [*timestamps, None]]),
        Case("interval", (DayTimeIntervalType(),), [(t,) for t in [*intervals, None]]),
        Case(
            "string,long",
            (StringType(), LongType()),
            list(
                zip(
                    _maybe_null(strings, 5),
                    _maybe_null([longs[i % len(longs)] for i in range(n)], 3),
                    strict=True,
                )
            ),
        ),
        Case(
            "int,string,null",
            (IntegerType(), StringType(), StringType()),
            [(ints[i % len(ints)], s, None) for i, s in enumerate(_maybe_null(strings, 4))],
        ),
        Case(
            "null,double,boolean,binary",
            (StringType(), DoubleType(), BooleanType(), BinaryType()),
            [
                (None, d, i % 2 == 0, s.encode())
                for i, (d, s) in enumerate(zip(_doubles(), strings, strict=False))
            ],
        ),
        Case("all null", (StringType(), LongType()), [(None, None)] * 3),
    ]


CASES = _cases()


def _frame(spark: SparkSession, case: Case) -> tuple[DataFrame, list[str]]:
    names = [f"c{i}" for i in range(len(case.types))]
    fields = [StructField("id", LongType(), False)]
    fields += [
        StructField(name, dtype, True) for name, dtype in zip(names, case.types, strict=True)
    ]
    rows = [(i, *row) for i, row in enumerate(case.rows)]
    return spark.createDataFrame(rows, StructType(fields)), names


def test_cases_cover_every_byte_length_mod_4() -> None:
    strings = [row[0] for row in CASES[0].rows if row[0] is not None]
    lengths = {len(s.encode()) for s in strings}
    assert set(range(41)) <= lengths
    # non-ASCII keys end on a high byte in every tail length
    assert {len(s.encode()) % 4 for s in strings if s and s.encode()[-1] >= 0x80} == {0, 1, 2, 3}


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_hash_and_pmod_agree_with_spark(spark: SparkSession, case: Case) -> None:
    df, names = _frame(spark, case)
    cols = [F.col(name) for name in names]
    hashed = df.select(
        "id",
        F.hash(*cols).alias("hash"),
        *[F.pmod(F.hash(*cols), F.lit(n)).alias(f"p{n}") for n in NUM_PARTITIONS],
    ).collect()
    assert len(hashed) == len(case.rows)

    mismatches = []
    for row in hashed:
        key = case.rows[row["id"]]
        ours_key = tuple(_as_ours(v, t) for v, t in zip(key, case.types, strict=True))
        ours = spark_hash(*ours_key)
        ours_partitions = [spark_partition(ours_key, n) for n in NUM_PARTITIONS]
        theirs_partitions = [row[f"p{n}"] for n in NUM_PARTITIONS]
        if ours != row["hash"] or ours_partitions != theirs_partitions:
            mismatches.append((key, row["hash"], ours, theirs_partitions, ours_partitions))
    assert not mismatches, (
        f"{len(mismatches)} of {len(hashed)} keys disagree, e.g. {mismatches[:10]}"
    )


def test_inferred_python_types_match_our_type_rules(spark: SparkSession) -> None:
    """No schema: PySpark infers str/int/float/bool/bytes, and we hash them the same way."""
    rows = [
        (s, v, d, i % 3 == 0, s.encode())
        for i, (s, v, d) in enumerate(zip(_strings(), _longs(), _doubles(), strict=False))
    ]
    df = spark.createDataFrame(rows, ["s", "v", "d", "b", "x"])
    assert [t for _, t in df.dtypes] == ["string", "bigint", "double", "boolean", "binary"]
    got = df.select(F.hash(*df.columns).alias("h"), *df.columns).collect()
    theirs = sorted(r["h"] for r in got)
    ours = sorted(spark_hash(*row) for row in rows)
    assert ours == theirs


@pytest.mark.parametrize("num_partitions", [7, 200])
def test_repartition_puts_each_key_where_we_say(spark: SparkSession, num_partitions: int) -> None:
    """The real ``HashPartitioning`` of ``repartition(n, cols)``, read via spark_partition_id()."""
    keys = [(s, v) for s, v in zip(_maybe_null(_strings(), 9), _longs(), strict=False)]
    df = spark.createDataFrame(
        keys, StructType([StructField("s", StringType()), StructField("v", LongType())])
    )
    placed = (
        df.repartition(num_partitions, "s", "v")
        .select("s", "v", F.spark_partition_id().alias("pid"))
        .collect()
    )
    assert len(placed) == len(keys)
    wrong = [
        (r["s"], r["v"], r["pid"])
        for r in placed
        if spark_partition((r["s"], r["v"]), num_partitions) != r["pid"]
    ]
    assert not wrong, f"{len(wrong)} keys in another partition than ours, e.g. {wrong[:10]}"
