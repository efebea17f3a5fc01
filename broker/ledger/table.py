"""The acker's ledger for one ledger partition: srid -> entry, as a numpy hash table.

What an entry means (DESIGN §4)
-------------------------------
Every record id is XORed into its srid's ``value`` exactly twice: once by the event that
created it (the persist record's ``root_xor`` for the source's emissions, the parent task's
event for derived records) and once by the event that acked it. The entry is *complete* when
it is REGISTERED (its persist record has been folded) and ``value == 0``. A non-empty set of
events XORs to 0 only if it holds both events of every id it mentions, i.e. the whole tree,
so completion cannot come early - provided each event is folded once. A duplicated task event
cancels itself and only delays completion (timeout, replay: at-least-once holds). A duplicated
*root* event can complete a tree early and lose data, which is why ``register`` refuses a
second persist record for a srid it already holds.

Layout
------
Open addressing with linear probing over five columns of capacity ``C`` (a power of two):
``keys`` int64 (srid; 0 = never used), ``value`` int64 (running XOR), ``offset`` int64
(persist-record offset, -1 until registered), ``deadline`` int32 (tick) and ``flags`` uint8.
29 bytes per slot and no Python object per entry. Bytes per pending entry = 29 / load: a
growing table runs between load 0.375 (just after doubling: 77 B) and 0.75 (39 B); 1M entries
sit in 2**21 slots (61 B). A churning table may double at live load 0.625 (see deletion
below), so 39..93 B overall. Attempt, origin and key-hash partition (DESIGN §5) are not
columns: they are in the persist record, which a replay fetches at ``offset`` anyway.

The home slot is the top ``log2(C)`` bits of ``srid * 0x9E3779B97F4A7C15`` (Fibonacci
hashing of the uint64 view), not the low bits: every srid of one ledger partition has the same
``srid mod P``, so the low bits are correlated and would cluster.

Every operation works on a whole batch of srids at once: the batch is sorted and reduced per
srid first (duplicates XOR-folded with ``bitwise_xor.reduceat``), then all keys probe in
rounds - round ``r`` looks at slot ``home + r`` of every key still searching. New keys that
race for the same free slot all write their key into it and read it back: exactly one write
survives, that key won, the others keep probing from the next slot.

Deletion: tombstones, not backward shift
----------------------------------------
A deleted slot keeps ``keys == INT64_MIN`` with the internal LIVE flag bit clear; probes walk
over it, insertions reuse the first one they pass. Backward-shift deletion would leave no
tombstones, but the shift of one slot depends on every other deletion in the same cluster, so
a batch of deletions would have to be applied one by one in Python. A tombstone is one
vectorised write. Tombstones are reclaimed by reuse and by a rebuild when live + deleted slots
would exceed 75 %: the rebuild keeps the capacity if the live entries fit in 62.5 % of it (so
at least C/8 insertions pass before the next rebuild), doubles it otherwise, and halves it when
the table has drained. INT64_MIN is still a valid srid: whether such a slot is live is decided
by the LIVE bit, which the probe reads only for INT64_MIN slots.

Timeouts are Storm's RotatingMap, one bucket per tick
------------------------------------------------------
Storm's RotatingMap keeps N buckets; new keys go into the head bucket; every timeout/N the
tail bucket is dropped and all it holds expires. Here every entry stores the tick its bucket
would be dropped in: its ``deadline``. ``expire(now_tick)``, called once per tick, drops every
entry with ``deadline <= now_tick`` - a rotation that drops all due buckets at once, with one
bucket per tick (so expiry is exact to one tick instead of to timeout/N). The scan over the
columns is vectorised and skipped entirely while ``now_tick`` is below a lower bound of all
deadlines; free slots hold deadline INT32_MAX, so the scan is one comparison of the int32
column (~0.5 ms for 2M slots) and needs no flags. A deadline of INT32_MAX never expires.
Unlike Storm's ``put``, folding does not move an entry to the head: the deadline is persist
time + timeout, fixed (DESIGN §6). Unregistered entries (events before their persist
record, or late events after completion) carry the orphan deadline they were created with.

Changelog (DESIGN §5)
---------------------
Every change sets DIRTY. ``take_dirty`` returns the entries still alive with DIRTY set (they
become LOGGED) and the srids that left the table while LOGGED and are not in it now
(tombstones). An entry born and removed between two calls is never LOGGED, so it never
touches the changelog. This is the only mechanism for changelog tombstones: the results of
``fold`` / ``register`` / ``expire`` / ``take_failed`` do not repeat it.

Failure wins: an entry with FAILED never completes; ``take_failed`` hands out the registered
ones so the service replays them. Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

REGISTERED = 0x01
"""The persist record has been folded (the root event is in ``value``)."""
FAILED = 0x02
"""An explicit failure mark has been seen; the entry never completes, it is replayed."""
LOGGED = 0x04
"""A live changelog record exists for the entry (it needs a tombstone when it leaves)."""
DIRTY = 0x08
"""Changed since the last ``take_dirty``."""
DURABLE_FLAGS = REGISTERED | FAILED
"""The flag bits that belong to the entry's state and travel through the changelog."""

_LIVE = 0x80  # internal: the slot holds an entry (empty and deleted slots have it clear)
_NOT_DIRTY = np.uint8(0xFF & ~DIRTY)
_TOMBSTONE_KEY = np.iinfo(np.int64).min
_DIRTY_BYTES = np.uint64(0x0101010101010101 * DIRTY)  # DIRTY in each byte of a uint64 word
_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)
_INT32_MIN = int(np.iinfo(np.int32).min)
_INT32_MAX = int(np.iinfo(np.int32).max)
_MIN_CAPACITY = 8
_REUSE_HEADROOM = 0.125  # a rebuild leaves at least C/8 free slots before the next one


@dataclass(frozen=True, eq=False)
class Removed:
    """Entries that left the table in one call, as columns (order unspecified).

    ``offsets`` is the persist-record offset to fetch the payload from when replaying
    (-1 for entries that were never registered: orphans).
    """

    srids: np.ndarray  # int64
    offsets: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.srids.size)


class Registered(NamedTuple):
    """Result of ``register``."""

    completed: Removed
    """Trees completed by their persist record (all events had arrived before it)."""
    duplicates: np.ndarray
    """bool, aligned with the input: persist records that were NOT folded (srid registered)."""


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

    @property
    def complete(self) -> bool:
        return self.registered and not self.failed and self.value == 0


def _i64(a: Iterable[int] | np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64).reshape(-1)


def _empty_removed() -> Removed:
    return Removed(np.empty(0, np.int64), np.empty(0, np.int64))


def _clamp_tick(tick: int) -> int:
    return max(_INT32_MIN, min(_INT32_MAX, int(tick)))


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


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


def _xor_by_srid(srids: np.ndarray, xors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique srids and the XOR of all values given for each."""
    order = np.argsort(srids)
    s = srids[order]
    x = xors[order]
    starts = np.flatnonzero(s[1:] != s[:-1]) + 1
    if starts.size + 1 == s.size:  # no duplicates: nothing to reduce
        return s, x
    starts = np.concatenate((np.zeros(1, np.intp), starts))
    return s[starts], np.bitwise_xor.reduceat(x, starts)


class LedgerTable:
    """srid -> (value, flags, offset, deadline) for one ledger partition; see the module doc.

    The columns ``keys``, ``value``, ``offset``, ``deadline``, ``flags`` are public for
    inspection and benchmarks; change them only through the methods.
    """

    keys: np.ndarray
    value: np.ndarray
    offset: np.ndarray
    deadline: np.ndarray
    flags: np.ndarray

    def __init__(self, initial_capacity: int = 1024, *, max_load: float = 0.75) -> None:
        if not 0.25 < max_load <= 0.9:
            raise ValueError(f"max_load must be in (0.25, 0.9], got {max_load}")
        self._max_load = max_load
        self._min_capacity = _pow2_at_least(max(initial_capacity, _MIN_CAPACITY))
        self._allocate(self._min_capacity)
        self._live = 0
        self._dead = 0  # tombstone slots
        self._min_deadline = _INT32_MAX  # lower bound of every live entry's deadline
        self._left_logged: list[np.ndarray] = []  # srids that left while LOGGED
        self._failed_candidates: list[np.ndarray] = []  # srids that may be REGISTERED|FAILED

    # ------------------------------------------------------------------ public operations

    def fold(self, srids: np.ndarray, xors: np.ndarray, orphan_deadline: int) -> Removed:
        """XOR each ``xors[i]`` into the entry of ``srids[i]``; return the trees completed.

        Pairs of one srid are XOR-reduced first, so order inside the batch is irrelevant.
        An unknown srid creates an unregistered entry whose deadline is ``orphan_deadline``
        (a tick); it becomes an orphan if its persist record does not arrive in time.
        Completed entries (REGISTERED, not FAILED, value 0) are removed before returning.
        """
        s = _i64(srids)
        x = _i64(xors)
        if s.shape != x.shape:
            raise ValueError(f"{s.size} srids but {x.size} xors")
        if s.size == 0:
            return _empty_removed()
        u, ux = _xor_by_srid(s, x)
        _check_nonzero(u)
        pos, _ = self._find_or_insert(u, _clamp_tick(orphan_deadline))
        value = self.value[pos]
        value ^= ux
        self.value[pos] = value
        f = self.flags[pos] | DIRTY
        self.flags[pos] = f
        done = ((f & DURABLE_FLAGS) == REGISTERED) & (value == 0)
        return self._remove_where(pos, done)

    def register(
        self,
        srids: np.ndarray,
        root_xors: np.ndarray,
        offsets: np.ndarray,
        deadlines: np.ndarray,
    ) -> Registered:
        """Fold persist records: XOR in ``root_xors``, set REGISTERED, offset and deadline.

        Returns the trees this completes and a mask of *duplicate root events*, which are
        NOT folded: a srid that is already registered (or repeated in this batch; the first
        occurrence counts). Folding a root twice cancels it (x ^ r ^ r = x): the value then
        drops to the XOR of the task events alone, which is 0 e.g. before any task event
        arrived - the tree would "complete" with its records unprocessed and never be
        replayed. A duplicated task event can only delay completion; a duplicated root is the
        one event that can complete a tree early (DESIGN §4), so it is refused and counted.

        The table cannot recognise a duplicate that arrives after the tree completed (the
        entry is gone): it registers a new entry that never completes and times out - a
        spurious replay, not a loss. Transactional folding keeps both cases from happening.

        An entry already marked FAILED stays failed: it goes to ``take_failed``, not here.
        """
        s = _i64(srids)
        roots = _i64(root_xors)
        offs = _i64(offsets)
        dls = np.asarray(deadlines).reshape(-1)
        if not s.size == roots.size == offs.size == dls.size:
            raise ValueError("register needs srids, root_xors, offsets, deadlines of one length")
        duplicates = np.zeros(s.size, dtype=bool)
        if s.size == 0:
            return Registered(_empty_removed(), duplicates)
        u, src = _first_occurrences(s)
        duplicates[:] = True
        duplicates[src] = False
        _check_nonzero(u)
        pos, _ = self._find_or_insert(u, _INT32_MAX)
        f = self.flags[pos]
        again = (f & REGISTERED) != 0
        duplicates[src[again]] = True
        fresh = ~again
        p = pos[fresh]
        i = src[fresh]
        u = u[fresh]
        new_dl = np.clip(dls[i], _INT32_MIN, _INT32_MAX).astype(np.int32)
        value = self.value[p] ^ roots[i]
        self.value[p] = value
        nf = f[fresh] | (REGISTERED | DIRTY)
        self.flags[p] = nf
        self.offset[p] = offs[i]
        self.deadline[p] = new_dl
        if new_dl.size:
            self._min_deadline = min(self._min_deadline, int(new_dl.min()))
        failed = (nf & FAILED) != 0
        if failed.any():
            self._failed_candidates.append(u[failed])
        return Registered(self._remove_where(p, ~failed & (value == 0)), duplicates)

    def mark_failed(self, srids: np.ndarray, orphan_deadline: int) -> None:
        """Set FAILED on each srid (an unknown srid gets an unregistered entry, as in ``fold``).

        Registered failed entries are handed out by ``take_failed``; an unregistered one waits
        for its persist record (and then goes to ``take_failed``) or expires as an orphan.
        """
        s = _i64(srids)
        if s.size == 0:
            return
        u = np.unique(s)
        _check_nonzero(u)
        pos, _ = self._find_or_insert(u, _clamp_tick(orphan_deadline))
        f = self.flags[pos]
        self.flags[pos] = np.where((f & FAILED) != 0, f, f | (FAILED | DIRTY))
        registered = (f & REGISTERED) != 0
        if registered.any():
            self._failed_candidates.append(u[registered])

    def take_failed(self) -> Removed:
        """Remove and return the registered entries marked FAILED (replay them now)."""
        if not self._failed_candidates:
            return _empty_removed()
        candidates = np.unique(np.concatenate(self._failed_candidates))
        self._failed_candidates.clear()
        pos = self._lookup(candidates)
        pos = pos[pos >= 0]
        f = self.flags[pos]
        return self._remove_where(pos, (f & DURABLE_FLAGS) == DURABLE_FLAGS)

    def expire(self, now_tick: int) -> Expired:
        """Remove and return entries with ``deadline <= now_tick``; call once per tick.

        Registered ones timed out (replay them), unregistered ones are orphans. See the
        module doc for why this is Storm's RotatingMap.
        """
        now = min(_clamp_tick(now_tick), _INT32_MAX - 1)  # a deadline of INT32_MAX is "never"
        if now < self._min_deadline:
            return Expired(_empty_removed(), _empty_removed())
        due = np.flatnonzero(self.deadline <= now)  # free slots hold INT32_MAX: never due
        registered = (self.flags[due] & REGISTERED) != 0
        timed_out = due[registered]
        orphans = due[~registered]
        result = Expired(
            Removed(self.keys[timed_out], self.offset[timed_out]),
            Removed(self.keys[orphans], self.offset[orphans]),
        )
        self._remove(due)
        self._min_deadline = int(self.deadline.min())
        return result

    def take_dirty(self) -> ChangelogDelta:
        """What the changelog needs since the last call; marks the upserted entries LOGGED.

        ``upserts``: entries alive now and changed since the last call. ``tombstones``: srids
        that left the table while LOGGED and are not in it now (a srid that left and came
        back is an upsert instead: the new record supersedes the old one).

        Cost: one vectorised scan of the ``flags`` column, 8 slots per uint64 word
        (O(capacity): ~0.6 ms for 2M slots), once per commit interval.
        """
        slots = self._dirty_slots()
        f = self.flags[slots]
        upserts = Entries(
            srids=self.keys[slots],
            values=self.value[slots],
            flags=f & DURABLE_FLAGS,
            offsets=self.offset[slots],
            deadlines=self.deadline[slots],
        )
        self.flags[slots] = (f & _NOT_DIRTY) | LOGGED
        tombstones = np.empty(0, np.int64)
        if self._left_logged:
            gone = np.unique(np.concatenate(self._left_logged))
            self._left_logged.clear()
            tombstones = gone[self._lookup(gone) < 0]
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
        failed entries are handed out by the next ``take_failed``.
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
        pos, _ = self._find_or_insert(u, _INT32_MAX)
        new_flags = (fl[src].astype(np.uint8) & DURABLE_FLAGS) | (_LIVE | LOGGED)
        new_dl = np.clip(dls[src], _INT32_MIN, _INT32_MAX).astype(np.int32)
        self.value[pos] = vals[src]
        self.flags[pos] = new_flags
        self.offset[pos] = offs[src]
        self.deadline[pos] = new_dl
        self._min_deadline = min(self._min_deadline, int(new_dl.min()))
        failed = (new_flags & DURABLE_FLAGS) == DURABLE_FLAGS
        if failed.any():
            self._failed_candidates.append(u[failed])

    def remove(self, srids: np.ndarray) -> None:
        """Apply changelog tombstones: drop these srids (unknown ones are ignored).

        The changelog already holds the tombstone, so none is produced by ``take_dirty``.
        """
        s = _i64(srids)
        if s.size == 0:
            return
        u = np.unique(s)
        _check_nonzero(u)
        pos = self._lookup(u)
        self._remove(pos[pos >= 0], record_tombstones=False)

    def get(self, srid: int) -> Entry | None:
        """The entry of ``srid``, or None."""
        if srid == 0:
            return None
        pos = int(self._lookup(np.array([srid], dtype=np.int64))[0])
        if pos < 0:
            return None
        f = int(self.flags[pos])
        return Entry(
            srid=int(srid),
            value=int(self.value[pos]),
            offset=int(self.offset[pos]),
            deadline=int(self.deadline[pos]),
            registered=bool(f & REGISTERED),
            failed=bool(f & FAILED),
            logged=bool(f & LOGGED),
            dirty=bool(f & DIRTY),
        )

    def entries(self) -> Entries:
        """Every live entry, as columns (order unspecified). O(capacity)."""
        slots = np.flatnonzero(self.flags & _LIVE)
        return Entries(
            srids=self.keys[slots],
            values=self.value[slots],
            flags=self.flags[slots] & DURABLE_FLAGS,
            offsets=self.offset[slots],
            deadlines=self.deadline[slots],
        )

    def __len__(self) -> int:
        return self._live

    def __contains__(self, srid: object) -> bool:
        return isinstance(srid, int | np.integer) and self.get(int(srid)) is not None

    @property
    def capacity(self) -> int:
        return int(self.keys.size)

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns (the whole table: nothing else grows with entries)."""
        return int(
            self.keys.nbytes
            + self.value.nbytes
            + self.offset.nbytes
            + self.deadline.nbytes
            + self.flags.nbytes
        )

    @property
    def bytes_per_entry(self) -> float:
        """``nbytes / len``: the memory figure of DESIGN §9 (inf when empty)."""
        return self.nbytes / self._live if self._live else float("inf")

    # ------------------------------------------------------------------ hash table internals

    def _allocate(self, capacity: int) -> None:
        self.keys = np.zeros(capacity, np.int64)
        self.value = np.zeros(capacity, np.int64)
        self.offset = np.full(capacity, -1, np.int64)
        self.deadline = np.full(capacity, _INT32_MAX, np.int32)  # INT32_MAX: not live
        self.flags = np.zeros(capacity, np.uint8)
        self._mask = capacity - 1
        self._shift = np.uint64(64 - (capacity.bit_length() - 1))
        self._max_used = int(capacity * self._max_load)

    def _home(self, keys: np.ndarray) -> np.ndarray:
        """Fibonacci hashing: the top log2(C) bits of key * 2**64/phi (wrapping uint64)."""
        return ((keys.view(np.uint64) * _FIBONACCI) >> self._shift).astype(np.intp)

    def _probe(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For sorted unique keys ``u``: (slot or -1, first free slot on the probe path).

        The free slot (first tombstone passed, else the empty slot that ended the probe) is
        where a missing key would be inserted.
        """
        n = u.size
        pos = np.full(n, -1, np.intp)
        free = np.full(n, -1, np.intp)
        if n == 0:
            return pos, free
        keys, flags, mask = self.keys, self.flags, self._mask
        may_be_min = bool(u[0] == _TOMBSTONE_KEY)  # u is sorted: INT64_MIN comes first
        tombstones = self._dead > 0
        gi: np.ndarray | None = None  # batch index of each searching key (None: all of them)
        k = u
        s = self._home(u)
        while k.size:
            kk = keys[s]
            hit = kk == k
            if may_be_min:  # a srid of INT64_MIN matches only a live slot
                m = np.flatnonzero(hit & (k == _TOMBSTONE_KEY))
                hit[m] = (flags[s[m]] & _LIVE) != 0
            empty = kk == 0
            if gi is None:
                pos[hit] = s[hit]
                if tombstones:
                    t = np.flatnonzero((kk == _TOMBSTONE_KEY) & ~hit)
                    t = t[(flags[s[t]] & _LIVE) == 0]
                    free[t] = s[t]
                e = np.flatnonzero(empty)
                e = e[free[e] < 0]
                free[e] = s[e]
            else:
                pos[gi[hit]] = s[hit]
                if tombstones:
                    t = np.flatnonzero((kk == _TOMBSTONE_KEY) & ~hit)
                    t = t[(flags[s[t]] & _LIVE) == 0]
                    t = t[free[gi[t]] < 0]
                    free[gi[t]] = s[t]
                e = np.flatnonzero(empty)
                e = e[free[gi[e]] < 0]
                free[gi[e]] = s[e]
            searching = np.flatnonzero(~(hit | empty))
            gi = searching if gi is None else gi[searching]
            k = k[searching]
            s = (s[searching] + 1) & mask
        return pos, free

    def _lookup(self, u: np.ndarray) -> np.ndarray:
        return self._probe(u)[0]

    def _claim(self, k: np.ndarray, start: np.ndarray) -> np.ndarray:
        """Insert missing unique keys ``k``, probing from ``start``; return their slots.

        Keys racing for one free slot all write it and read it back: the surviving write
        wins, the others move on. Only ``keys`` and the LIVE bit are set here.
        """
        out = np.empty(k.size, np.intp)
        keys, flags, mask = self.keys, self.flags, self._mask
        gi = np.arange(k.size)
        s = start
        reused = 0
        while gi.size:
            kk = keys[s]
            is_free = kk == 0
            t = np.flatnonzero(kk == _TOMBSTONE_KEY)
            is_free[t] = (flags[s[t]] & _LIVE) == 0
            f = np.flatnonzero(is_free)
            sf = s[f]
            kf = k[f]
            keys[sf] = kf
            won = keys[sf] == kf
            ws = sf[won]
            flags[ws] = _LIVE
            reused += int(np.count_nonzero(kk[f[won]] == _TOMBSTONE_KEY))
            out[gi[f[won]]] = ws
            lost = np.ones(gi.size, dtype=bool)
            lost[f[won]] = False
            gi = gi[lost]
            k = k[lost]
            s = (s[lost] + 1) & mask
        self._live += out.size
        self._dead -= reused
        return out

    def _find_or_insert(self, u: np.ndarray, deadline: int) -> tuple[np.ndarray, np.ndarray]:
        """Slots of sorted unique keys ``u``, inserting the missing ones as fresh entries.

        A fresh entry: value 0, offset -1, ``deadline``, flags DIRTY (unregistered).
        Returns (slots, batch indices of the fresh ones).
        """
        pos, free = self._probe(u)
        missing = np.flatnonzero(pos < 0)
        if missing.size == 0:
            return pos, missing
        if self._live + self._dead + missing.size > self._max_used:
            self._rebuild(self._live + missing.size)
            pos, free = self._probe(u)
        slots = self._claim(u[missing], free[missing])
        pos[missing] = slots
        self.value[slots] = 0
        self.offset[slots] = -1
        self.deadline[slots] = deadline
        self.flags[slots] = _LIVE | DIRTY
        self._min_deadline = min(self._min_deadline, deadline)
        return pos, missing

    def _rebuild(self, need: int) -> None:
        """Rehash the live entries into the smallest table that holds ``need`` at <= 62.5 %."""
        capacity = self._min_capacity
        while need > (self._max_load - _REUSE_HEADROOM) * capacity:
            capacity *= 2
        live = np.flatnonzero(self.flags & _LIVE)
        keys = self.keys[live]
        value = self.value[live]
        offset = self.offset[live]
        deadline = self.deadline[live]
        flags = self.flags[live]
        self._allocate(capacity)
        self._live = 0
        self._dead = 0
        slots = self._claim(keys, self._home(keys))
        self.value[slots] = value
        self.offset[slots] = offset
        self.deadline[slots] = deadline
        self.flags[slots] = flags

    def _dirty_slots(self) -> np.ndarray:
        """Slots with DIRTY set: find the uint64 words holding one, then look inside them."""
        words = np.flatnonzero(self.flags.view(np.uint64) & _DIRTY_BYTES)
        candidates = (words[:, None] * 8 + np.arange(8)).reshape(-1)
        return candidates[(self.flags[candidates] & DIRTY) != 0]

    def _remove(self, slots: np.ndarray, *, record_tombstones: bool = True) -> None:
        """Turn live ``slots`` (unique) into tombstones, remembering LOGGED srids."""
        if slots.size == 0:
            return
        if record_tombstones:
            logged = (self.flags[slots] & LOGGED) != 0
            if logged.any():
                self._left_logged.append(self.keys[slots[logged]])
        self.keys[slots] = _TOMBSTONE_KEY
        self.flags[slots] = 0
        self.deadline[slots] = _INT32_MAX
        self._live -= slots.size
        self._dead += slots.size

    def _remove_where(self, pos: np.ndarray, mask: np.ndarray) -> Removed:
        slots = pos[mask]
        if slots.size == 0:
            return _empty_removed()
        removed = Removed(self.keys[slots], self.offset[slots])
        self._remove(slots)
        return removed
