"""The ledger table's storage layer: the entry's flags and result types, the batch helpers,
and ``TableBase`` - the hash table access every rule goes through and the changelog's view of
the entries (``broker.ledger.table`` has the rules; ``broker.ledger.waiting`` the decisions
that wait).

Changelog (docs/design.md §5)
-----------------------------
The changelog holds what ``ns.persist`` does not. Every change sets DIRTY, except the
registration of a srid new to the table with its record's deadline: that entry is its
persist record (srid, root, offset, deadline), so it stays unlogged until something else
changes it (an event, a mark, a touch, a decision) or the service logs it for its age
(``log_older``); one whose deadline the acker gave (adaptive, ``register``'s ``given``) is
a change at once. ``take_dirty`` returns the entries still alive with DIRTY set (they become
LOGGED) and the srids that left the table while LOGGED and are not in it now (tombstones).
An entry never LOGGED - born and removed between two calls, or unlogged to its end - never
touches the changelog. This is the only mechanism for changelog tombstones: the results of
``fold`` / ``register`` / ``expire`` / ``take_failed`` do not repeat it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from broker.ledger.hashtable import LIVE, SridTable

REGISTERED = 0x01
"""The persist record has been folded (the root event is in ``value``)."""
FAILED = 0x02
"""An explicit failure mark has been seen; the entry never completes, it is replayed."""
LOGGED = 0x04
"""A live changelog record exists for the entry (it needs a tombstone when it leaves)."""
DIRTY = 0x08
"""Changed since the last ``take_dirty`` in a way its persist record does not say."""
DEFERRED = 0x10
"""Failed, decision put off until ``deadline`` (``defer`` / ``take_deferred``)."""
WATCH = 0x20
"""Not an attempt any more: a timed-out entry that was replayed, kept with its ``value`` so that
late events of the original attempt can still bring it to 0 (``watch`` / ``take_superseded``);
its ``offset`` column holds the replay's srid, its ``deadline`` the end of the watch."""
SUPERSEDED = 0x40
"""The original attempt of this (replay) srid completed late: the entry completes as usual
when its events arrive, but is never replayed or dead-lettered (``take_settled``)."""
DURABLE_FLAGS = REGISTERED | FAILED | DEFERRED | WATCH | SUPERSEDED
"""The flag bits that belong to the entry's state and travel through the changelog."""
_NOT_DIRTY = np.uint8(0xFF & ~DIRTY)
_STATE = REGISTERED | FAILED | DEFERRED | WATCH  # what decides whether an entry completes
_FAILED_MASK = REGISTERED | FAILED | DEFERRED
_FAILED_NOW = REGISTERED | FAILED  # what take_failed hands out (a DEFERRED entry waits)
_HELD = REGISTERED | DEFERRED  # a timed-out entry waiting for its decision, value kept: completes at 0
_INT32_MIN = int(np.iinfo(np.int32).min)
_INT32_MAX = int(np.iinfo(np.int32).max)


@dataclass(frozen=True, eq=False)
class Removed:
    """Entries that left the table in one call, as columns (order unspecified).

    ``offsets`` is the persist-record offset to fetch the payload from when replaying
    (-1 for entries that were never registered: orphans).
    """

    srids: np.ndarray  # int64
    offsets: np.ndarray  # int64
    values: np.ndarray | None = None  # int64 XOR values, where the caller needs them (timeouts)

    def __len__(self) -> int:
        return int(self.srids.size)


class Registered(NamedTuple):
    """Result of ``register``."""

    completed: Removed
    """Trees completed by their persist record (all events had arrived before it)."""
    duplicates: np.ndarray
    """bool, aligned with the input: persist records that were NOT folded (srid registered)."""


class Deferred(NamedTuple):
    """Result of ``take_deferred``: deferred entries whose tick has come, by reason."""

    timed_out: Removed
    """Deferred after a timeout."""
    failed: Removed
    """Deferred after an explicit failure (FAILED)."""
    next_offset: int = -1
    """The smallest persist offset of the due entries left in the table by ``limit`` (-1:
    none left)."""


class Expired(NamedTuple):
    """Result of ``expire``."""

    timed_out: Removed
    """Registered entries past their deadline: replay them."""
    orphans: Removed
    """Unregistered entries past their orphan deadline: count them, nothing to replay."""


@dataclass(frozen=True, eq=False)
class Entries:
    """Entry state as columns: what a changelog record holds.

    ``flags`` carries only ``DURABLE_FLAGS``; ``deadlines`` are ticks of this process's
    ``Ticker`` (convert to ms before they leave the process).
    """

    srids: np.ndarray  # int64
    values: np.ndarray  # int64
    flags: np.ndarray  # uint8
    offsets: np.ndarray  # int64
    deadlines: np.ndarray  # int32

    def __len__(self) -> int:
        return int(self.srids.size)


@dataclass(frozen=True, eq=False)
class ChangelogDelta:
    """Result of ``take_dirty``: what the changelog needs since the previous call.

    ``upserts`` and ``tombstones`` never share a srid, so they may be written in any order.
    """

    upserts: Entries
    tombstones: np.ndarray  # int64 srids


@dataclass(frozen=True)
class Entry:
    """One entry, for tests and tooling (the service works with columns)."""

    srid: int
    value: int
    offset: int
    deadline: int
    registered: bool
    failed: bool
    logged: bool
    dirty: bool
    deferred: bool = False
    watching: bool = False
    superseded: bool = False

    @property
    def complete(self) -> bool:
        return (self.registered and not self.failed and not self.deferred and not self.watching
                and self.value == 0)


def _i64(a: Iterable[int] | np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64).reshape(-1)


def _empty_removed(with_values: bool = False) -> Removed:
    return Removed(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64) if with_values else None)


def _concat_removed(parts: list[Removed]) -> Removed:
    if not parts:
        return _empty_removed()
    if len(parts) == 1:
        return parts[0]
    return Removed(np.concatenate([p.srids for p in parts]), np.concatenate([p.offsets for p in parts]))


def _clamp_tick(tick: int) -> int:
    return max(_INT32_MIN, min(_INT32_MAX, int(tick)))


def _check_nonzero(sorted_srids: np.ndarray) -> None:
    """0 is the XOR identity and the empty-slot key: it is never a srid (``broker.ids``)."""
    i = int(np.searchsorted(sorted_srids, 0))
    if i < sorted_srids.size and sorted_srids[i] == 0:
        raise ValueError("srid 0 is not a valid id; drop it where the batch is decoded")


def _first_occurrences(srids: np.ndarray, *, last: bool = False) -> tuple[np.ndarray, np.ndarray]:
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


class TableBase:
    """The entries of one ledger partition on a ``SridTable`` (public as ``hashtable`` for
    inspection, tests and benchmarks; change them only through the rules), and what the
    changelog needs of them."""

    hashtable: SridTable

    def __init__(self, initial_capacity: int = 1024, *, max_load: float = 0.75) -> None:
        self.hashtable = SridTable(initial_capacity, max_load=max_load)
        self._min_deadline = _INT32_MAX  # lower bound of every live entry's deadline
        self._left_logged: list[np.ndarray] = []  # srids that left while LOGGED
        self._failed_candidates: list[np.ndarray] = []  # srids that may be REGISTERED|FAILED
        self._deferred: list[np.ndarray] = []  # srids that may be DEFERRED
        self._min_deferred = _INT32_MAX  # lower bound of every DEFERRED entry's deadline
        self._superseded: list[Removed] = []  # late completions of watched srids (take_superseded)
        self._settled: list[Removed] = []  # superseded replays that failed (take_settled)
        self._may_watch = False  # a WATCH entry may be in the table (pending() masks then)
        self._unwatched = 0  # watches expire dropped since the last take_expired_counts
        self._unknown_marks = 0  # unregistered SUPERSEDED entries expire dropped since then
        self._late_completed = 0  # deferred timeouts fold completed since take_late_completed

    def take_dirty(self) -> ChangelogDelta:
        """What the changelog needs since the last call; marks the upserted entries LOGGED.

        ``upserts``: entries alive now and changed since the last call. ``tombstones``: srids
        that left the table while LOGGED and are not in it now (a srid that left and came
        back is an upsert instead: the new record supersedes the old one).

        Cost: one vectorised scan of the ``flags`` column, 8 slots per uint64 word
        (O(capacity): ~0.6 ms for 2M slots), once per commit interval.
        """
        t = self.hashtable
        tombstones = np.empty(0, np.int64)
        if self._left_logged:
            gone = np.unique(np.concatenate(self._left_logged))
            self._left_logged.clear()
            found = t.lookup(gone)
            tombstones = gone[found < 0]
            # Back in the table (registered again, an event after an orphan left): its
            # changelog record is the old entry's, so the new one is logged over it.
            back = found[found >= 0]
            t.flags[back] |= DIRTY
        slots = t.flagged(DIRTY)
        f = t.flags[slots]
        upserts = Entries(
            srids=t.keys[slots],
            values=t.value[slots],
            flags=(f & DURABLE_FLAGS).astype(np.int16),
            offsets=t.offset[slots],
            deadlines=t.deadline[slots],
        )
        t.flags[slots] = (f & _NOT_DIRTY) | LOGGED
        return ChangelogDelta(upserts, tombstones)

    def restore(
        self,
        srids: np.ndarray,
        values: np.ndarray,
        flags: np.ndarray,
        offsets: np.ndarray,
        deadlines: np.ndarray,
    ) -> None:
        """Load changelog records (later records of one srid win). Entries come out LOGGED.

        Only ``DURABLE_FLAGS`` of ``flags`` are used. Entries are taken as they are: nothing
        completes here (a complete entry is never written to the changelog). Registered
        failed entries are handed out by the next ``take_failed``, deferred ones by
        ``take_deferred`` at their deadline.
        """
        s = _i64(srids)
        vals = _i64(values)
        fl = np.asarray(flags).reshape(-1)
        offs = _i64(offsets)
        dls = np.asarray(deadlines).reshape(-1)
        if not s.size == vals.size == fl.size == offs.size == dls.size:
            raise ValueError("restore needs columns of one length")
        if s.size == 0:
            return
        u, src = _first_occurrences(s, last=True)
        _check_nonzero(u)
        pos = self._find_or_insert(u, _INT32_MAX)
        t = self.hashtable
        fs = fl[src].astype(np.int64)
        new_flags = ((fs & DURABLE_FLAGS) | (LIVE | LOGGED)).astype(np.uint8)
        new_dl = np.clip(dls[src], _INT32_MIN, _INT32_MAX).astype(np.int32)
        t.value[pos] = vals[src]
        t.flags[pos] = new_flags
        t.offset[pos] = offs[src]
        t.deadline[pos] = new_dl
        self._min_deadline = min(self._min_deadline, int(new_dl.min()))
        failed = (new_flags & _FAILED_MASK) == _FAILED_NOW
        if failed.any():
            self._failed_candidates.append(u[failed])
        if ((new_flags & WATCH) != 0).any():
            self._may_watch = True
        deferred = (new_flags & DEFERRED) != 0
        if deferred.any():
            self._deferred.append(u[deferred])
            self._min_deferred = min(self._min_deferred, int(new_dl[deferred].min()))

    def remove(self, srids: np.ndarray) -> None:
        """Apply changelog tombstones: drop these srids (unknown ones are ignored).

        The changelog already holds the tombstone, so none is produced by ``take_dirty``.
        """
        s = _i64(srids)
        if s.size == 0:
            return
        u = np.unique(s)
        _check_nonzero(u)
        pos = self.hashtable.lookup(u)
        self.hashtable.delete(pos[pos >= 0])

    def get(self, srid: int) -> Entry | None:
        """The entry of ``srid``, or None."""
        if srid == 0:
            return None
        t = self.hashtable
        pos = int(t.lookup(np.array([srid], dtype=np.int64))[0])
        if pos < 0:
            return None
        f = int(t.flags[pos])
        return Entry(
            srid=int(srid),
            value=int(t.value[pos]),
            offset=int(t.offset[pos]),
            deadline=int(t.deadline[pos]),
            registered=bool(f & REGISTERED),
            failed=bool(f & FAILED),
            logged=bool(f & LOGGED),
            dirty=bool(f & DIRTY),
            deferred=bool(f & DEFERRED),
            watching=bool(f & WATCH),
            superseded=bool(f & SUPERSEDED),
        )

    def entries(self) -> Entries:
        """Every live entry, as columns (order unspecified). O(capacity)."""
        t = self.hashtable
        slots = t.live_slots()
        return Entries(
            srids=t.keys[slots],
            values=t.value[slots],
            flags=(t.flags[slots] & DURABLE_FLAGS).astype(np.int16),
            offsets=t.offset[slots],
            deadlines=t.deadline[slots],
        )

    def pending(self) -> tuple[int, int]:
        """How many entries are registered (the records this partition guarantees: pending,
        deferred ones included; unregistered events are not records yet), and the smallest
        persist offset among them (-1: none) - the oldest pending record, as persist order is
        registration order. Two unmasked scans (O(capacity), ~1 ms for 10^6 slots): only a
        registered entry holds an offset >= 0 (free slots, unregistered entries: -1, which
        read as unsigned is the largest value)."""
        t = self.hashtable
        count = int(np.count_nonzero(t.flags & np.uint8(REGISTERED)))
        if self._may_watch:  # a watch's offset column holds a srid: leave those out
            watching = (t.flags & np.uint8(WATCH)) != 0
            self._may_watch = bool(watching.any())
            if self._may_watch:
                return count, (-1 if count == 0 else int(t.offset.view(np.uint64)[~watching].min()))
        if count == 0:
            return 0, -1
        return count, int(t.offset.view(np.uint64).min())

    def __len__(self) -> int:
        return len(self.hashtable)

    def __contains__(self, srid: object) -> bool:
        return isinstance(srid, int | np.integer) and self.get(int(srid)) is not None

    @property
    def capacity(self) -> int:
        return self.hashtable.capacity

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns plus the srids queued for ``take_failed`` / ``take_dirty``
        / ``take_deferred`` (the only other arrays that grow with entries; the first two are
        empty right after those calls, the last holds the srids still deferred)."""
        queued = sum(a.nbytes for a in (*self._left_logged, *self._failed_candidates, *self._deferred))
        queued += sum(r.srids.nbytes + r.offsets.nbytes for r in (*self._superseded, *self._settled))
        return int(self.hashtable.nbytes + queued)

    @property
    def bytes_per_entry(self) -> float:
        """``nbytes / len``: the memory figure of docs/design.md §9 (inf when empty)."""
        live = len(self.hashtable)
        return self.nbytes / live if live else float("inf")

    def _find_or_insert(self, u: np.ndarray, deadline: int) -> np.ndarray:
        """Slots of sorted unique srids ``u``; the missing ones become fresh entries: value 0,
        offset -1, ``deadline``, DIRTY (a new entry is a change), unregistered."""
        pos, fresh = self.hashtable.find_or_insert(u, deadline, DIRTY)
        if fresh.size:
            self._min_deadline = min(self._min_deadline, deadline)
        return pos

    def _remove(self, slots: np.ndarray) -> None:
        """Free live ``slots`` (unique), remembering the LOGGED srids: ``take_dirty`` owes
        the changelog a tombstone for each."""
        if slots.size == 0:
            return
        t = self.hashtable
        logged = (t.flags[slots] & LOGGED) != 0
        if logged.any():
            self._left_logged.append(t.keys[slots[logged]])
        t.delete(slots)

    def _remove_where(self, pos: np.ndarray, mask: np.ndarray) -> Removed:
        slots = pos[mask]
        if slots.size == 0:
            return _empty_removed()
        t = self.hashtable
        removed = Removed(t.keys[slots], t.offset[slots])
        self._remove(slots)
        return removed
