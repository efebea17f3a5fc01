"""Batches of srids as every part of the ledger table takes them: int64 columns, sorted and
reduced per srid before the hash table sees them, ticks clamped to the int32 ``deadline``
column.

Every rule of the table works on a whole batch at once: the batch is sorted and reduced per
srid first (duplicates XOR-folded with ``bitwise_xor.reduceat``, or their first or last
occurrence kept), then the hash table finds or inserts all of them in one batched probe, and
the rule is applied to the columns at those slots with a few vectorised writes.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

INT32_MIN = int(np.iinfo(np.int32).min)
INT32_MAX = int(np.iinfo(np.int32).max)
"""The deadline that never comes: free slots hold it, ``expire`` never reaches it."""


def as_int64(a: Iterable[int] | np.ndarray) -> np.ndarray:
    """``a`` as a flat contiguous int64 array (no copy when it is one already)."""
    return np.ascontiguousarray(a, dtype=np.int64).reshape(-1)


def clamp_tick(tick: int) -> int:
    """``tick`` clamped to what the int32 ``deadline`` column holds."""
    return max(INT32_MIN, min(INT32_MAX, int(tick)))


def check_nonzero(sorted_srids: np.ndarray) -> None:
    """0 is the XOR identity and the empty-slot key: it is never a srid (``broker.ids``)."""
    i = int(np.searchsorted(sorted_srids, 0))
    if i < sorted_srids.size and sorted_srids[i] == 0:
        raise ValueError("srid 0 is not a valid id; drop it where the batch is decoded")


def first_occurrences(srids: np.ndarray, *, last: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique srids and, for each, the input index of its first (or last) occurrence."""
    n = srids.size
    if last:
        order = np.argsort(srids[::-1], kind="stable")
        order = (n - 1) - order
    else:
        order = np.argsort(srids, kind="stable")
    s = srids[order]
    keep = np.empty(n, dtype=bool)
    keep[:1] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep], order[keep]


def xor_by_srid(srids: np.ndarray, xors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique srids and the XOR of all values given for each (int64 arrays)."""
    if srids.size == 0:
        return srids, xors
    order = np.argsort(srids)
    s = srids[order]
    x = xors[order]
    starts = np.flatnonzero(s[1:] != s[:-1]) + 1
    if starts.size + 1 == s.size:  # no duplicates: nothing to reduce
        return s, x
    starts = np.concatenate((np.zeros(1, np.intp), starts))
    return s[starts], np.bitwise_xor.reduceat(x, starts)
