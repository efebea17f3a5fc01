"""Key partitioners, bit-exact with the implementations they stand in for.

The source computes a record's ``key_hash_partition`` once, so it must agree with whoever
else routes the same key:

- ``kafka``: the Java client's default for keyed records,
  ``Utils.toPositive(Utils.murmur2(key)) % n`` (murmur2, seed ``0x9747b28c``). librdkafka's
  own default (``consistent_random``, CRC32) differs; our producers set ``murmur2_random``.
- ``spark``: Spark SQL ``hash(cols...)`` / ``HashPartitioning``, i.e.
  ``pmod(Murmur3_x86_32(cols, seed 42), n)``. Two things differ from textbook murmur3:

  1. ``hashUnsafeBytes`` mixes each trailing byte (``len % 4`` of them) on its own, as a full
     ``mixK1``/``mixH1`` round of the *sign-extended* byte, where murmur3 packs the tail into
     one little-endian word. Only lengths that are a multiple of 4 match standard murmur3.
  2. Several columns chain: column ``i``'s hash is the seed of column ``i + 1``, and a null
     column is skipped (the running hash passes through unchanged).

Python values are typed as PySpark infers them: ``str`` -> string, ``bool`` -> boolean,
``int`` -> bigint, ``float`` -> double, ``bytes``/``bytearray`` -> binary, ``date`` -> date,
aware ``datetime`` -> timestamp, ``timedelta`` -> day-time interval, ``None`` -> null. Wrap a
value in :class:`SparkInt` or :class:`SparkFloat` to hash it as an int / float column.

Everything here is pure. The hash loops are hand-inlined because the source calls them once
per record; all arithmetic is on unsigned 32-bit values, converted to a signed Java int last.
``partition_many`` hashes a batch of byte keys at once (numpy, one pass per 4-byte block over
all the keys), several times cheaper a key than one call each for ``Source.send_many`` with keys
that do not repeat (docs/benchmarks.md).
"""

from __future__ import annotations

import calendar
import math
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any, Final, Protocol

import numpy as np

from broker.errors import ConfigurationError

__all__ = [
    "PARTITIONERS",
    "KafkaPartitioner",
    "Partitioner",
    "SparkFloat",
    "SparkInt",
    "SparkPartitioner",
    "get_partitioner",
    "kafka_partition",
    "kafka_partitions",
    "murmur2",
    "partition_keys",
    "spark_hash",
    "spark_partition",
    "spark_partitions",
]

PARTITIONERS: Final = ("kafka", "spark")

_M32: Final = 0xFFFFFFFF
_SIGN32: Final = 0x80000000
_I32_MIN: Final = -(1 << 31)
_I32_MAX: Final = (1 << 31) - 1
_I64_MIN: Final = -(1 << 63)
_I64_MAX: Final = (1 << 63) - 1

# Unpackers of ``k`` little-endian uint32 blocks from the start of a buffer (trailing bytes are
# ignored), cached for keys up to 256 bytes; longer keys build theirs (``struct`` caches too).
_CACHED_BLOCKS: Final = 65
_UNPACK_BLOCKS: Final = tuple(struct.Struct(f"<{k}I").unpack_from for k in range(_CACHED_BLOCKS))


def _unpack_blocks(count: int) -> Callable[[bytes], tuple[int, ...]]:
    if count < _CACHED_BLOCKS:
        return _UNPACK_BLOCKS[count]
    return struct.Struct(f"<{count}I").unpack_from


def _to_signed32(h: int) -> int:
    return (h ^ _SIGN32) - _SIGN32


# --------------------------------------------------------------------------------------------
# Kafka: murmur2
# --------------------------------------------------------------------------------------------

_MURMUR2_SEED: Final = 0x9747B28C
_MURMUR2_M: Final = 0x5BD1E995


def _murmur2_u32(data: bytes) -> int:
    """``Utils.murmur2`` as an unsigned 32-bit value."""
    m = _MURMUR2_M
    mask = _M32
    length = len(data)
    h = _MURMUR2_SEED ^ length
    count = length >> 2
    if count:
        unpack = _UNPACK_BLOCKS[count] if count < _CACHED_BLOCKS else _unpack_blocks(count)
        for k in unpack(data):
            k = (k * m) & mask
            h = ((h * m) ^ ((k ^ (k >> 24)) * m)) & mask
    tail = length & 3
    if tail:
        # Java's fall-through switch: the 1..3 trailing bytes as one little-endian value.
        h = ((h ^ int.from_bytes(data[length - tail :], "little")) * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    return h ^ (h >> 15)


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2(data)``: a signed 32-bit Java int."""
    return _to_signed32(_murmur2_u32(data))


def kafka_partition(key: bytes, num_partitions: int) -> int:
    """The Java client's partition for a non-null key: ``toPositive(murmur2(key)) % n``."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    return (_murmur2_u32(key) & 0x7FFFFFFF) % num_partitions


# --------------------------------------------------------------------------------------------
# Spark: Murmur3_x86_32 with hashUnsafeBytes and HashExpression's type rules
# --------------------------------------------------------------------------------------------

SPARK_SEED: Final = 42
_C1: Final = 0xCC9E2D51
_C2: Final = 0x1B873593
_N: Final = 0xE6546B64
_F1: Final = 0x85EBCA6B
_F2: Final = 0xC2B2AE35


def _mix_k1(k1: int) -> int:
    k1 = (k1 * _C1) & _M32
    return ((((k1 << 15) | (k1 >> 17)) & _M32) * _C2) & _M32


# mixK1 of every trailing byte, sign-extended as Java's ``(int) Platform.getByte`` does.
_TAIL_K1: Final = tuple(_mix_k1(b if b < 0x80 else b | 0xFFFFFF00) for b in range(256))


def _hash_bytes(data: bytes, seed: int) -> int:
    """``Murmur3_x86_32.hashUnsafeBytes(data, seed)``, unsigned."""
    mask = _M32
    c1 = _C1
    c2 = _C2
    n = _N
    length = len(data)
    h1 = seed
    count = length >> 2
    if count:
        unpack = _UNPACK_BLOCKS[count] if count < _CACHED_BLOCKS else _unpack_blocks(count)
        # h1 may exceed 32 bits at the end of a round: the next round masks it after the XOR,
        # which is the same modulo 2**32 and saves one operation per block.
        for k1 in unpack(data):
            k1 = (k1 * c1) & mask
            h1 = (h1 ^ (((k1 << 15) | (k1 >> 17)) * c2)) & mask
            h1 = ((h1 << 13) | (h1 >> 19)) * 5 + n
    if length & 3:
        tail_k1 = _TAIL_K1
        for b in data[count << 2 :]:
            h1 = (h1 ^ tail_k1[b]) & mask
            h1 = ((h1 << 13) | (h1 >> 19)) * 5 + n
    # fmix(h1, length)
    h1 = (h1 ^ length) & mask
    h1 ^= h1 >> 16
    h1 = (h1 * _F1) & mask
    h1 ^= h1 >> 13
    h1 = (h1 * _F2) & mask
    return h1 ^ (h1 >> 16)


def _hash_int(value: int, seed: int) -> int:
    """``Murmur3_x86_32.hashInt(value, seed)``, unsigned; ``value`` is any int (low 32 bits)."""
    mask = _M32
    k1 = ((value & mask) * _C1) & mask
    h1 = (seed ^ (((k1 << 15) | (k1 >> 17)) * _C2)) & mask
    h1 = ((((h1 << 13) | (h1 >> 19)) * 5 + _N) ^ 4) & mask
    h1 ^= h1 >> 16
    h1 = (h1 * _F1) & mask
    h1 ^= h1 >> 13
    h1 = (h1 * _F2) & mask
    return h1 ^ (h1 >> 16)


def _hash_long(value: int, seed: int) -> int:
    """``Murmur3_x86_32.hashLong(value, seed)``, unsigned: low word, then high word."""
    mask = _M32
    k1 = ((value & mask) * _C1) & mask
    h1 = (seed ^ (((k1 << 15) | (k1 >> 17)) * _C2)) & mask
    h1 = (((h1 << 13) | (h1 >> 19)) * 5 + _N) & mask
    k1 = (((value >> 32) & mask) * _C1) & mask
    h1 = (h1 ^ (((k1 << 15) | (k1 >> 17)) * _C2)) & mask
    h1 = ((((h1 << 13) | (h1 >> 19)) * 5 + _N) ^ 8) & mask
    h1 ^= h1 >> 16
    h1 = (h1 * _F1) & mask
    h1 ^= h1 >> 13
    h1 = (h1 * _F2) & mask
    return h1 ^ (h1 >> 16)


_DOUBLE: Final = struct.Struct("<d")
_FLOAT: Final = struct.Struct("<f")
_DOUBLE_NAN_BITS: Final = 0x7FF8000000000000  # Double.doubleToLongBits canonical NaN
_FLOAT_NAN_BITS: Final = 0x7FC00000  # Float.floatToIntBits canonical NaN
_EPOCH_ORDINAL: Final = date(1970, 1, 1).toordinal()


def _double_bits(value: float) -> int:
    """``doubleToLongBits`` after Spark's ``-0.0 -> 0.0``; NaN is canonical as in Java."""
    if value == 0.0:
        return 0
    if value != value:
        return _DOUBLE_NAN_BITS
    return int.from_bytes(_DOUBLE.pack(value), "little")


@dataclass(frozen=True, slots=True)
class SparkInt:
    """An int column (IntegerType; ShortType and ByteType hash the same way)."""

    value: int

    def __post_init__(self) -> None:
        if not _I32_MIN <= self.value <= _I32_MAX:
            raise ValueError(f"{self.value} does not fit a Spark int (32-bit)")


@dataclass(frozen=True, slots=True)
class SparkFloat:
    """A float column (FloatType): ``value`` is rounded to float32 as Spark would store it."""

    value: float

    def bits(self) -> int:
        """``floatToIntBits`` after Spark's ``-0.0f -> 0.0f``; NaN is canonical as in Java."""
        value = self.value
        if value == 0.0:
            return 0
        if value != value:
            return _FLOAT_NAN_BITS
        try:
            return int.from_bytes(_FLOAT.pack(value), "little")
        except OverflowError:  # beyond float32: Java's (float) cast rounds to infinity
            return int.from_bytes(_FLOAT.pack(math.copysign(math.inf, value)), "little")


def _hash_str(value: str, seed: int) -> int:
    return _hash_bytes(value.encode(), seed)


def _hash_bigint(value: int, seed: int) -> int:
    if not _I64_MIN <= value <= _I64_MAX:
        raise ValueError(f"{value} does not fit a Spark bigint (64-bit)")
    return _hash_long(value, seed)


def _hash_bool(value: bool, seed: int) -> int:
    return _hash_int(1 if value else 0, seed)


def _hash_double(value: float, seed: int) -> int:
    return _hash_long(_double_bits(value), seed)


def _hash_binary(value: bytes | bytearray, seed: int) -> int:
    return _hash_bytes(bytes(value), seed)


def _hash_spark_int(value: SparkInt, seed: int) -> int:
    return _hash_int(value.value, seed)


def _hash_spark_float(value: SparkFloat, seed: int) -> int:
    return _hash_int(value.bits(), seed)


def _hash_date(value: date, seed: int) -> int:
    # DateType is days since the epoch, an int.
    return _hash_int(value.toordinal() - _EPOCH_ORDINAL, seed)


def _hash_datetime(value: datetime, seed: int) -> int:
    # TimestampType is microseconds since the epoch, a long. PySpark reads a naive datetime in
    # the *process's* local time zone, so two hosts could disagree: we refuse to guess.
    if value.utcoffset() is None:
        raise ValueError(f"naive datetime {value!r}: give it a tzinfo to hash it as a timestamp")
    # PySpark's TimestampType.toInternal, to the letter (whole UTC seconds + local micros).
    micros = calendar.timegm(value.utctimetuple()) * 1_000_000 + value.microsecond
    return _hash_long(micros, seed)


def _hash_timedelta(value: timedelta, seed: int) -> int:
    # DayTimeIntervalType is microseconds, a long.
    return _hash_long((value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds, seed)


_HASH_BY_TYPE: Final[dict[type, Callable[[Any, int], int]]] = {
    str: _hash_str,
    int: _hash_bigint,
    bool: _hash_bool,
    float: _hash_double,
    bytes: _hash_bytes,
    bytearray: _hash_binary,
    SparkInt: _hash_spark_int,
    SparkFloat: _hash_spark_float,
    date: _hash_date,
    datetime: _hash_datetime,
    timedelta: _hash_timedelta,
}


def _hasher_for(value: object) -> Callable[[Any, int], int]:
    """Slow path for subclasses (IntEnum, str subclasses...): most specific type first."""
    for kind in (bool, int, float, str, bytes, bytearray, datetime, date, timedelta):
        if isinstance(value, kind):
            return _HASH_BY_TYPE[kind]
    raise TypeError(f"cannot hash a {type(value).__name__} column like Spark does")


def _spark_hash_u32(columns: Iterable[object]) -> int:
    h = SPARK_SEED
    by_type = _HASH_BY_TYPE
    for value in columns:
        if value is None:  # a null column leaves the running hash unchanged
            continue
        hasher = by_type.get(type(value)) or _hasher_for(value)
        h = hasher(value, h)
    return h


def spark_hash(*values: object) -> int:
    """Spark SQL ``hash(values...)``: a signed 32-bit int (``hash()`` of no columns is 42)."""
    return _to_signed32(_spark_hash_u32(values))


def spark_partition(values: object, num_partitions: int) -> int:
    """``pmod(hash(cols...), n)``: the partition ``HashPartitioning`` gives these key columns.

    ``values`` is one column's value, or a tuple of columns.
    """
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if type(values) is str:  # the common case, without the generic dispatch
        h = _hash_bytes(values.encode(), SPARK_SEED)
    elif type(values) is tuple:
        h = _spark_hash_u32(values)
    elif type(values) is int:
        h = _hash_bigint(values, SPARK_SEED)
    else:
        h = _spark_hash_u32((values,))
    # Python's % already has pmod's sign (that of the positive divisor).
    return ((h ^ _SIGN32) - _SIGN32) % num_partitions


# --------------------------------------------------------------------------------------------
# A batch of byte keys at once
# --------------------------------------------------------------------------------------------

MAX_BATCH_KEY: Final = 128
"""Longer keys are hashed one by one: the batch pads every key to the longest."""

_U32 = np.uint32
_TAIL_K1_U32: Final = np.array(_TAIL_K1, dtype=np.uint32)


def _key_matrix(keys: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The keys as rows of a zero-padded byte matrix (its width a multiple of 4), their
    4-byte blocks (little-endian) and their lengths."""
    lengths = np.fromiter(map(len, keys), np.int64, len(keys))
    width = max(4, (int(lengths.max()) + 3) & ~3)
    matrix = np.zeros((len(keys), width), np.uint8)
    matrix[np.arange(width) < lengths[:, None]] = np.frombuffer(b"".join(keys), np.uint8)
    return matrix, matrix.view("<u4"), lengths


def _tail_bytes(matrix: np.ndarray, lengths: np.ndarray, j: int) -> np.ndarray:
    """Byte ``j`` after each key's last full block (0 past the matrix's width)."""
    col = np.minimum((lengths & ~3) + j, matrix.shape[1] - 1)
    return matrix[np.arange(len(lengths)), col]


def _blocks(count: np.ndarray, width: int) -> list[tuple[int, bool]]:
    """Each block index, and whether every key has that block (no key is masked)."""
    least = int(count.min())
    return [(b, b < least) for b in range(width)]


def _murmur2_u32_many(keys: list[bytes]) -> np.ndarray:
    """``_murmur2_u32`` of each key (all at most ``MAX_BATCH_KEY`` long)."""
    matrix, blocks, lengths = _key_matrix(keys)
    m = _U32(_MURMUR2_M)
    count = lengths >> 2
    h: np.ndarray = _U32(_MURMUR2_SEED) ^ lengths.astype(np.uint32)
    for b, every in _blocks(count, blocks.shape[1]):
        k: np.ndarray = blocks[:, b] * m
        k = (k ^ (k >> 24)) * m
        h = (h * m) ^ k if every else np.where(count > b, (h * m) ^ k, h)
    tail = lengths & 3
    if tail.any():
        last = np.zeros(len(keys), np.uint32)
        for j in range(3):
            last |= np.where(tail > j, _tail_bytes(matrix, lengths, j), 0).astype(np.uint32) << _U32(8 * j)
        h = np.where(tail > 0, (h ^ last) * m, h)
    h ^= h >> 13
    h *= m
    return h ^ (h >> 15)


def _rotl_round(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    """mixH1: ``rotl(h1 ^ k1, 13) * 5 + n``."""
    h1 = h1 ^ k1
    return ((h1 << 13) | (h1 >> 19)) * _U32(5) + _U32(_N)


def _hash_bytes_many(keys: list[bytes], seed: int) -> np.ndarray:
    """``_hash_bytes`` of each key (all at most ``MAX_BATCH_KEY`` long)."""
    matrix, blocks, lengths = _key_matrix(keys)
    c1, c2 = _U32(_C1), _U32(_C2)
    count = lengths >> 2
    h1: np.ndarray = np.full(len(keys), seed, np.uint32)
    for b, every in _blocks(count, blocks.shape[1]):
        k1: np.ndarray = blocks[:, b] * c1
        k1 = ((k1 << 15) | (k1 >> 17)) * c2
        h1 = _rotl_round(h1, k1) if every else np.where(count > b, _rotl_round(h1, k1), h1)
    tail = lengths & 3
    for j in range(int(tail.max())):  # every trailing byte a round of its own (hashUnsafeBytes)
        h1 = np.where(tail > j, _rotl_round(h1, _TAIL_K1_U32[_tail_bytes(matrix, lengths, j)]), h1)
    h1 ^= lengths.astype(np.uint32)
    h1 ^= h1 >> 16
    h1 *= _U32(_F1)
    h1 ^= h1 >> 13
    h1 *= _U32(_F2)
    return h1 ^ (h1 >> 16)


def _batch_hashes(
    keys: list[bytes], num_partitions: int, hash_many: Callable[[list[bytes]], np.ndarray], one: Callable[[bytes], int]
) -> np.ndarray:
    """Unsigned 32-bit hashes of ``keys``: the short ones in one batch, the long ones alone."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    long = [i for i, k in enumerate(keys) if len(k) > MAX_BATCH_KEY]
    if not long:
        return hash_many(keys) if keys else np.empty(0, np.uint32)
    out = np.empty(len(keys), np.uint32)
    if short := [i for i, k in enumerate(keys) if len(k) <= MAX_BATCH_KEY]:
        out[short] = hash_many([keys[i] for i in short])
    for i in long:
        out[i] = one(keys[i])
    return out


def _kafka_hashes(keys: list[bytes], num_partitions: int) -> np.ndarray:
    """The non-negative murmur2 hashes ``kafka_partition`` takes modulo the count."""
    return _batch_hashes(keys, num_partitions, _murmur2_u32_many, _murmur2_u32) & _U32(0x7FFFFFFF)


def _spark_hashes(keys: list[bytes], num_partitions: int) -> np.ndarray:
    """The signed Murmur3 hashes ``spark_partition`` takes ``pmod`` the count."""
    h = _batch_hashes(keys, num_partitions, lambda ks: _hash_bytes_many(ks, SPARK_SEED),
                      lambda k: _hash_bytes(k, SPARK_SEED))
    return h.astype(np.int64) - ((h >> 31).astype(np.int64) << 32)


def kafka_partitions(keys: list[bytes], num_partitions: int) -> list[int]:
    """``kafka_partition`` of each key, in one batch."""
    return (_kafka_hashes(keys, num_partitions) % num_partitions).tolist()


def spark_partitions(keys: list[bytes], num_partitions: int) -> list[int]:
    """``spark_partition`` of each key as one binary column, in one batch."""
    return (_spark_hashes(keys, num_partitions) % num_partitions).tolist()


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------


class Partitioner(Protocol):
    """Maps a record key to one of ``num_partitions`` partitions, deterministically."""

    @property
    def name(self) -> str: ...

    def partition(self, key: Any, num_partitions: int) -> int: ...

    def partition_many(self, keys: list[bytes], num_partitions: int) -> list[int]:
        """``partition`` of each byte key, in one batch."""
        ...

    def partition_many_by(self, keys: list[bytes], counts: tuple[int, ...]) -> list[list[int]]:
        """``partition_many`` for each of ``counts``, the keys hashed once."""
        ...


class KafkaPartitioner:
    """The Java client's keyed-record partitioner. ``str`` keys are hashed as UTF-8."""

    name: Final = "kafka"

    def partition(self, key: bytes | str | None, num_partitions: int) -> int:
        if key is None:
            # Java spreads null keys (sticky partitioner); which to use is the caller's choice.
            raise ValueError("the kafka partitioner needs a key; got None")
        return kafka_partition(key.encode() if isinstance(key, str) else key, num_partitions)

    def partition_many(self, keys: list[bytes], num_partitions: int) -> list[int]:
        return kafka_partitions(keys, num_partitions)

    def partition_many_by(self, keys: list[bytes], counts: tuple[int, ...]) -> list[list[int]]:
        h = _kafka_hashes(keys, min(counts))
        return [(h % n).tolist() for n in counts]


class SparkPartitioner:
    """Spark SQL ``HashPartitioning``: a key is one column's value or a tuple of columns."""

    name: Final = "spark"

    def partition(self, key: object, num_partitions: int) -> int:
        return spark_partition(key, num_partitions)

    def partition_many(self, keys: list[bytes], num_partitions: int) -> list[int]:
        return spark_partitions(keys, num_partitions)

    def partition_many_by(self, keys: list[bytes], counts: tuple[int, ...]) -> list[list[int]]:
        h = _spark_hashes(keys, min(counts))
        return [(h % n).tolist() for n in counts]


_REGISTRY: Final[dict[str, Partitioner]] = {
    KafkaPartitioner.name: KafkaPartitioner(),
    SparkPartitioner.name: SparkPartitioner(),
}


def get_partitioner(name: str) -> Partitioner:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown partitioner {name!r}; choose one of {', '.join(PARTITIONERS)}"
        ) from None


def partition_keys(partitioner: str, num_partitions: int, keys: list[str]) -> list[int]:
    """One partition per string key (``replaybroker partition``).

    Bad input is a :class:`ConfigurationError` (the CLI reports it in one line), not the
    ``ValueError`` the partitioners raise. Keys are hashed as UTF-8: a key that is not text
    (a command-line argument of non-UTF-8 bytes arrives with lone surrogates) is refused.
    """
    partition = get_partitioner(partitioner).partition
    if num_partitions < 1:
        raise ConfigurationError(
            f"the number of partitions must be at least 1, got {num_partitions}"
        )
    try:
        return [partition(key, num_partitions) for key in keys]
    except UnicodeEncodeError as exc:
        raise ConfigurationError(f"key {exc.object!r} is not valid UTF-8 text") from None
