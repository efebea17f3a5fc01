"""Partitioners: published vectors, vectors read from Spark 4.3, and a literal Java reference.

The reference functions below transliterate the Java sources line by line (signed ints,
``>>>`` as a masked shift); the module under test is hand-optimised, so the properties check
that the two agree on arbitrary input, including keys longer than the cached unpackers.
"""

from __future__ import annotations

import math
import struct
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import ConfigurationError, ReplayBrokerError
from broker.partitioning import (
    PARTITIONERS,
    KafkaPartitioner,
    SparkFloat,
    SparkInt,
    SparkPartitioner,
    get_partitioner,
    kafka_partition,
    murmur2,
    partition_keys,
    spark_hash,
    spark_partition,
)

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
PARTITION_COUNTS = st.integers(1, 10_000)
# Up to 300 bytes: past the 256-byte keys whose unpackers are cached.
KEY_BYTES = st.binary(max_size=300)

# --------------------------------------------------------------------------------------------
# Literal Java references
# --------------------------------------------------------------------------------------------

_M = 0xFFFFFFFF


def _i32(x: int) -> int:
    x &= _M
    return x - (1 << 32) if x & 0x80000000 else x


def _ushr(x: int, n: int) -> int:  # Java's >>> on an int
    return (x & _M) >> n


def _rotl(x: int, n: int) -> int:  # Integer.rotateLeft
    return _i32(((x & _M) << n) | _ushr(x, 32 - n))


def java_murmur2(data: bytes) -> int:
    """``org.apache.kafka.common.utils.Utils.murmur2``."""
    length = len(data)
    m = 0x5BD1E995
    h = _i32(0x9747B28C ^ length)
    for i in range(length // 4):
        i4 = i * 4
        k = data[i4] + (data[i4 + 1] << 8) + (data[i4 + 2] << 16) + (data[i4 + 3] << 24)
        k = _i32(k * m)
        k ^= _ushr(k, 24)
        k = _i32(k * m)
        h = _i32(h * m)
        h ^= k
    base = length & ~3
    rem = length % 4
    if rem == 3:
        h ^= data[base + 2] << 16
    if rem >= 2:
        h ^= data[base + 1] << 8
    if rem >= 1:
        h ^= data[base]
        h = _i32(h * m)
    h ^= _ushr(h, 13)
    h = _i32(h * m)
    h ^= _ushr(h, 15)
    return _i32(h)


def _mix_k1(k1: int) -> int:
    return _i32(_rotl(_i32(k1 * 0xCC9E2D51), 15) * 0x1B873593)


def _mix_h1(h1: int, k1: int) -> int:
    return _i32(_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64)


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= _ushr(h1, 16)
    h1 = _i32(h1 * 0x85EBCA6B)
    h1 ^= _ushr(h1, 13)
    h1 = _i32(h1 * 0xC2B2AE35)
    h1 ^= _ushr(h1, 16)
    return _i32(h1)


def java_hash_unsafe_bytes(data: bytes, seed: int) -> int:
    """``Murmur3_x86_32.hashUnsafeBytes`` on a little-endian platform."""
    aligned = len(data) - len(data) % 4
    h1 = seed
    for i in range(0, aligned, 4):
        h1 = _mix_h1(h1, _mix_k1(int.from_bytes(data[i : i + 4], "little", signed=True)))
    for i in range(aligned, len(data)):
        h1 = _mix_h1(h1, _mix_k1(int.from_bytes(data[i : i + 1], "little", signed=True)))
    return _fmix(h1, len(data))


def java_hash_int(value: int, seed: int) -> int:
    return _fmix(_mix_h1(seed, _mix_k1(value)), 4)


def java_hash_long(value: int, seed: int) -> int:
    h1 = _mix_h1(seed, _mix_k1(_i32(value)))
    h1 = _mix_h1(h1, _mix_k1(_i32(value >> 32)))
    return _fmix(h1, 8)


def reference_spark_hash(*values: Any) -> int:
    """``Murmur3Hash(children, 42)``: chained, nulls skipped."""
    h = 42
    for v in values:
        if v is None:
            continue
        if isinstance(v, str):
            h = java_hash_unsafe_bytes(v.encode("utf-8"), h)
        elif isinstance(v, bytes):
            h = java_hash_unsafe_bytes(v, h)
        elif isinstance(v, bool):
            h = java_hash_int(1 if v else 0, h)
        elif isinstance(v, int):
            h = java_hash_long(v, h)
        elif isinstance(v, SparkInt):
            h = java_hash_int(v.value, h)
        elif isinstance(v, float):
            d = 0.0 if v == 0.0 else v
            bits = (
                0x7FF8000000000000
                if math.isnan(d)
                else struct.unpack("<q", struct.pack("<d", d))[0]
            )
            h = java_hash_long(bits, h)
        else:
            raise TypeError(type(v))
    return h


# --------------------------------------------------------------------------------------------
# Kafka
# --------------------------------------------------------------------------------------------

# Kafka's own UtilsTest.testMurmur2 vectors.
KAFKA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS)
def test_murmur2_matches_kafka_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected
    assert java_murmur2(data) == expected


@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS)
@pytest.mark.parametrize("num_partitions", [1, 3, 16, 200])
def test_kafka_partition_is_to_positive_mod_n(
    data: bytes, expected: int, num_partitions: int
) -> None:
    assert kafka_partition(data, num_partitions) == (expected & 0x7FFFFFFF) % num_partitions


@given(KEY_BYTES)
def test_murmur2_equals_the_java_transliteration(data: bytes) -> None:
    assert murmur2(data) == java_murmur2(data)


@given(KEY_BYTES, PARTITION_COUNTS)
def test_kafka_partition_in_range_and_deterministic(data: bytes, n: int) -> None:
    p = kafka_partition(data, n)
    assert 0 <= p < n
    assert kafka_partition(bytes(data), n) == p


@given(st.text(), PARTITION_COUNTS)
def test_kafka_partitioner_hashes_str_as_its_utf8_bytes(key: str, n: int) -> None:
    kafka = KafkaPartitioner()
    assert kafka.partition(key, n) == kafka.partition(key.encode("utf-8"), n)
    assert kafka.partition(key, n) == kafka_partition(key.encode("utf-8"), n)


def test_kafka_partitioner_refuses_a_null_key() -> None:
    with pytest.raises(ValueError, match="needs a key"):
        KafkaPartitioner().partition(None, 3)


# --------------------------------------------------------------------------------------------
# Spark
# --------------------------------------------------------------------------------------------

NAN = math.nan

# Read from Spark 4.3.0: SELECT hash(...). IntegerType is spelled SparkInt, FloatType SparkFloat.
SPARK_VECTORS: list[tuple[tuple[Any, ...], int]] = [
    (("abc",), 1322437556),
    (("",), 142593372),
    (("a",), 1485273170),
    (("ab",), -97053317),
    (("abcd",), -396302900),
    (("abcde",), 814637928),
    (("中",), -1211605188),
    (("é",), 2119106806),
    (("😀",), 1877935379),
    ((1,), -1712319331),  # hash(1L)
    ((SparkInt(1),), -559580957),  # hash(1)
    ((-1,), -939490007),
    ((0,), -1670924195),
    ((2**63 - 1,), -1604625029),
    ((-(2**63),), -853646085),
    ((SparkInt(2**31 - 1),), 133916647),
    ((SparkInt(-(2**31)),), 723455942),
    ((SparkInt(7),), 1079293707),  # also hash(CAST(7 AS SMALLINT)) and TINYINT
    ((True,), -559580957),
    ((False,), 933211791),
    ((0.0,), -1670924195),
    ((-0.0,), -1670924195),
    ((NAN,), -1281358385),
    ((1.5,), 1290763749),
    ((SparkFloat(1.5),), -221251528),
    ((SparkFloat(-0.0),), 933211791),
    ((b"\xff",), 1398487324),
    ((b"",), 142593372),
    ((date(1970, 1, 2),), -559580957),
    ((datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),), -1715802514),
    (("abc", 1), 898287948),
    ((None,), 42),
    ((), 42),
    ((None, "abc"), 1322437556),
    (("abc", None), 1322437556),
    ((SparkInt(1), "abc", None), -1267584506),
]


@pytest.mark.parametrize(("values", "expected"), SPARK_VECTORS, ids=repr)
def test_spark_hash_matches_spark(values: tuple[Any, ...], expected: int) -> None:
    assert spark_hash(*values) == expected


@pytest.mark.parametrize(
    ("key", "num_partitions", "expected"),
    [("abc", 7, 6), ("a", 200, 170), (("abc", 1), 1, 0), ("abc", 1322437557, 1322437556)],
)
def test_spark_partition_matches_spark_pmod(key: Any, num_partitions: int, expected: int) -> None:
    assert spark_partition(key, num_partitions) == expected


def test_trailing_bytes_are_not_textbook_murmur3() -> None:
    # Blocks are textbook murmur3 (Hive's TestMurmur3 vector, 24 bytes, seed 123), the tail
    # is not: textbook murmur3_32(b"21", 123) is 896581614.
    from broker.partitioning import _hash_bytes

    assert _i32(_hash_bytes(b"a-little-bit-long-string", 123)) == -1479816207
    assert _i32(_hash_bytes(b"21", 123)) != 896581614
    assert _i32(_hash_bytes(b"21", 123)) == java_hash_unsafe_bytes(b"21", 123)


SPARK_VALUES = st.one_of(
    st.none(),
    st.text(max_size=80),
    st.binary(max_size=300),
    I64,
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    I32.map(SparkInt),
)


@given(st.lists(SPARK_VALUES, max_size=5))
def test_spark_hash_equals_the_java_transliteration(values: list[Any]) -> None:
    assert spark_hash(*values) == reference_spark_hash(*values)


@given(st.text(), PARTITION_COUNTS)
def test_spark_string_and_binary_hash_alike(key: str, n: int) -> None:
    assert spark_hash(key) == spark_hash(key.encode("utf-8"))
    assert spark_partition(key, n) == spark_partition(key.encode("utf-8"), n)


@given(st.lists(SPARK_VALUES, min_size=1, max_size=4), PARTITION_COUNTS)
def test_spark_partition_is_pmod_of_hash(values: list[Any], n: int) -> None:
    key = tuple(values)
    p = spark_partition(key, n)
    assert 0 <= p < n
    assert p == spark_hash(*key) % n
    assert SparkPartitioner().partition(key, n) == p
    if len(values) == 1:  # a scalar is a one-column key
        assert spark_partition(values[0], n) == p


@given(st.lists(SPARK_VALUES, max_size=3), st.lists(SPARK_VALUES, max_size=3))
def test_nulls_leave_the_running_hash_unchanged(left: list[Any], right: list[Any]) -> None:
    assert spark_hash(*left, None, *right) == spark_hash(*left, *right)
    assert spark_hash(None, *left, None) == spark_hash(*left)


@given(st.text(max_size=20), I64)
def test_each_column_seeds_the_next(s: str, v: int) -> None:
    seed = spark_hash(s)
    assert spark_hash(s, v) == java_hash_long(v, seed)
    assert spark_hash(s, v, s) == java_hash_unsafe_bytes(s.encode(), java_hash_long(v, seed))


@given(I32)
def test_a_spark_int_hashes_as_an_int_and_a_python_int_as_a_long(v: int) -> None:
    assert spark_hash(SparkInt(v)) == java_hash_int(v, 42)
    assert spark_hash(v) == java_hash_long(v, 42)


def test_bool_is_int_one_or_zero() -> None:
    assert spark_hash(True) == spark_hash(SparkInt(1))
    assert spark_hash(False) == spark_hash(SparkInt(0))
    assert spark_hash(True) != spark_hash(1)


@pytest.mark.parametrize("nan_bits", [0x7FF8000000000001, 0xFFF8000000000000, 0x7FF0000000000001])
def test_every_double_nan_hashes_as_the_canonical_one(nan_bits: int) -> None:
    nan = struct.unpack("<d", nan_bits.to_bytes(8, "little"))[0]
    assert math.isnan(nan)
    assert spark_hash(nan) == spark_hash(NAN)


def test_floats_round_to_float32_and_overflow_to_infinity() -> None:
    assert spark_hash(SparkFloat(0.1)) == java_hash_int(0x3DCCCCCD, 42)
    assert spark_hash(SparkFloat(1e39)) == spark_hash(SparkFloat(math.inf))
    assert spark_hash(SparkFloat(-1e39)) == spark_hash(SparkFloat(-math.inf))
    assert spark_hash(SparkFloat(math.nan)) == java_hash_int(0x7FC00000, 42)


def test_timestamps_are_utc_micros_and_intervals_micros() -> None:
    plus_one = timezone(timedelta(hours=1))
    instant = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    micros = int((instant - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()) * 1_000_000 + 123456
    assert spark_hash(instant) == java_hash_long(micros, 42)
    assert spark_hash(instant.astimezone(plus_one)) == spark_hash(instant)
    assert spark_hash(timedelta(days=-1, microseconds=5)) == java_hash_long(-86_400_000_000 + 5, 42)
    assert spark_hash(date(1969, 12, 31)) == java_hash_int(-1, 42)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (2**63, ValueError),
        (-(2**63) - 1, ValueError),
        (datetime(2024, 1, 1), ValueError),  # naive: PySpark would use the host's time zone
        ([1, 2], TypeError),
        (object(), TypeError),
    ],
    ids=["long overflow", "long underflow", "naive datetime", "list", "object"],
)
def test_values_spark_cannot_take_are_refused(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        spark_hash(value)


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1])
def test_spark_int_must_fit_32_bits(value: int) -> None:
    with pytest.raises(ValueError, match="32-bit"):
        SparkInt(value)


def test_subclasses_hash_as_their_base_type() -> None:
    class Name(str):
        pass

    assert spark_hash(Name("abc")) == spark_hash("abc")


# --------------------------------------------------------------------------------------------
# Registry and partition_keys
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PARTITIONERS)
def test_get_partitioner_by_name(name: str) -> None:
    assert get_partitioner(name).name == name


@pytest.mark.parametrize("name", ["", "murmur2", "KAFKA", "hash"])
def test_unknown_partitioner_is_a_configuration_error(name: str) -> None:
    with pytest.raises(ConfigurationError, match="unknown partitioner") as caught:
        get_partitioner(name)
    assert isinstance(caught.value, ReplayBrokerError)


@pytest.mark.parametrize("n", [0, -1])
@pytest.mark.parametrize("partitioner", PARTITIONERS)
def test_num_partitions_must_be_positive(partitioner: str, n: int) -> None:
    with pytest.raises(ValueError, match="num_partitions"):
        get_partitioner(partitioner).partition("abc", n)


def test_partition_keys_one_index_per_key() -> None:
    keys = ["21", "foobar", "abc", "a", ""]
    assert partition_keys("kafka", 16, keys) == [kafka_partition(k.encode(), 16) for k in keys]
    assert partition_keys("spark", 7, keys) == [spark_partition(k, 7) for k in keys]
    assert partition_keys("spark", 7, ["abc", "a"]) == [6, 1485273170 % 7]
    assert partition_keys("kafka", 3, []) == []
    with pytest.raises(ConfigurationError):
        partition_keys("crc32", 3, keys)


# --------------------------------------------------------------------------------------------
# A batch of keys at once (Source.send_many)
# --------------------------------------------------------------------------------------------

# Lengths around the block and tail boundaries, and past MAX_BATCH_KEY (hashed one by one).
BATCH_KEYS = st.lists(
    st.one_of(KEY_BYTES, st.sampled_from([0, 1, 2, 3, 4, 5, 8, 127, 128, 129]).flatmap(
        lambda n: st.binary(min_size=n, max_size=n))),
    max_size=80,
)


@given(BATCH_KEYS, PARTITION_COUNTS)
def test_a_batch_of_keys_gets_each_key_s_kafka_partition(keys: list[bytes], n: int) -> None:
    assert KafkaPartitioner().partition_many(keys, n) == [kafka_partition(k, n) for k in keys]


@given(BATCH_KEYS, PARTITION_COUNTS)
def test_a_batch_of_keys_gets_each_key_s_spark_partition(keys: list[bytes], n: int) -> None:
    assert SparkPartitioner().partition_many(keys, n) == [spark_partition(k, n) for k in keys]


@settings(deadline=None)  # six batch hashes per example: slow on a loaded machine, not wrong
@given(BATCH_KEYS, PARTITION_COUNTS, PARTITION_COUNTS)
def test_keys_hashed_once_for_two_counts_get_their_partition_in_each(keys: list[bytes], n: int, p: int) -> None:
    """A key's data partition and its ledger partition from one hash (Placements.learn)."""
    for partitioner in (KafkaPartitioner(), SparkPartitioner()):
        assert partitioner.partition_many_by(keys, (n, p)) == [
            partitioner.partition_many(keys, n), partitioner.partition_many(keys, p)]


@given(st.lists(st.binary(min_size=18, max_size=18), min_size=1, max_size=40), PARTITION_COUNTS)
def test_a_batch_of_equal_length_keys_matches_the_java_transliteration(keys: list[bytes], n: int) -> None:
    # Equal lengths: every key has every block, nothing is masked (the batch's fast path).
    assert KafkaPartitioner().partition_many(keys, n) == [(java_murmur2(k) & 0x7FFFFFFF) % n for k in keys]


@pytest.mark.parametrize("partitioner", PARTITIONERS)
def test_a_batch_needs_a_positive_partition_count(partitioner: str) -> None:
    with pytest.raises(ValueError, match="num_partitions"):
        get_partitioner(partitioner).partition_many([b"k"], 0)
