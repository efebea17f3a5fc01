"""Ids: random non-zero signed 64-bit integers, and their 8-byte big-endian wire form.

Zero is reserved: it is the XOR identity, so an id of 0 would vanish from the ledger.
Ids are signed int64 so that they fit numpy ``int64`` columns and Avro ``long``.
"""

from __future__ import annotations

import os
import struct

import numpy as np

_I64 = struct.Struct(">q")


_POOL_SIZE = 4096
# Ids drawn ahead, in bulk: one os.urandom call per 4096 ids instead of one per id. list.pop
# is atomic, so threads never share an id; a forked child must not reuse its parent's pool
# (the same ids in two processes would cancel in the ledger), so it starts empty.
_pool: list[int] = []
os.register_at_fork(after_in_child=_pool.clear)


def new_id() -> int:
    """One random non-zero int64."""
    try:
        return _pool.pop()
    except IndexError:
        _pool.extend(new_ids(_POOL_SIZE).tolist())
        return _pool.pop()


def new_ids(n: int) -> np.ndarray:
    """``n`` random non-zero int64 ids as a numpy array."""
    out = np.frombuffer(os.urandom(8 * n), dtype=np.int64).copy()
    zero = out == 0
    while zero.any():  # probability 2**-64 per id; the loop is for correctness, not speed
        out[zero] = np.frombuffer(os.urandom(8 * int(zero.sum())), dtype=np.int64)
        zero = out == 0
    return out


def encode_id(value: int) -> bytes:
    """8 bytes, big-endian, two's complement: the key of persist and ledger records."""
    return _I64.pack(value)


def decode_id(data: bytes) -> int:
    if len(data) != 8:
        raise ValueError(f"an id is 8 bytes, got {len(data)}")
    return int(_I64.unpack(data)[0])


def in_partition(srid: int, partition: int, partitions: int) -> int:
    """A random id ``srid`` moved into ``partition``: ``result mod partitions == partition``.

    Every attempt of an origin lives in one ledger partition (docs/design.md §2): a keyed
    record's first attempt in its key's, each replay in its original's. Half of ``srid``'s
    range keeps the sum inside int64; 62 random bits remain, and 0 becomes ``partitions``.
    """
    base = srid >> 1
    return base - base % partitions + partition or partitions


def in_partitions(srids: np.ndarray, partition: int | np.ndarray, partitions: int) -> np.ndarray:
    """``in_partition`` of each of ``srids`` (numpy, same values); ``partition`` one for all, or
    one each."""
    base = srids >> 1
    out = base - base % partitions + partition
    out[out == 0] = partitions
    return out


def new_id_in(partition: int, partitions: int) -> int:
    """One random non-zero int64 ``srid`` with ``srid mod partitions == partition``."""
    return in_partition(new_id(), partition, partitions)


def ledger_partition(srid: int, partitions: int) -> int:
    """Which partition of persist / acks / ledger owns ``srid``: ``srid mod P`` (non-negative)."""
    return srid % partitions
