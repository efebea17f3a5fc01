"""The acker's ledger for one ledger partition: srid -> entry, as a numpy hash table.

What an entry means (docs/design.md §4)
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
Open addressing with linear probing over five columns of capacity ``C`` (any multiple of 8,
not a power of two): ``keys`` int64 (srid; 0 = never used), ``value`` int64 (running XOR),
``offset`` int64 (persist-record offset, -1 until registered), ``deadline`` int32 (tick) and
``flags`` uint8. 29 bytes per slot and no Python object per entry. Bytes per pending entry =
29 / load. Every rebuild sizes the table so that the entries it must hold fill 62.5 % of it
(``max_load - 1/8`` with the default ``max_load`` 0.75), and the next rebuild comes when live
+ deleted slots would pass 75 %: a growing table runs between load 0.625 (46 B per entry) and
0.75 (39 B) at every size, growing by x1.2 per rebuild (a power-of-two table doubles and
swings between 0.375 and 0.75: 39..77 B). Deletions alone never rebuild, so the load drops
below 0.625 only while entries leave faster than new ones arrive, until the next rebuild.
``nbytes`` also counts the srids queued for ``take_failed`` and ``take_dirty`` (emptied by
those calls); a rebuild briefly holds the old and the new columns. Attempt, origin and
key-hash partition (docs/design.md §5) are not columns: they are in the persist record, which a replay
fetches at ``offset`` anyway.

The home slot is ``(t * C) >> 32`` where ``t`` is the top 32 bits of
``srid * 0x9E3779B97F4A7C15`` (Fibonacci hashing of the uint64 view, scaled to ``[0, C)``
by "fastrange" multiplication instead of a power-of-two shift; it fits uint64 while
``C <= 2**32``), not the low bits: every srid of one ledger partition has the same
``srid mod P``, so the low bits are correlated and would cluster. Probes wrap at ``C``.

Every operation works on a whole batch of srids at once: the batch is sorted and reduced per
srid first (duplicates XOR-folded with ``bitwise_xor.reduceat``), then all keys probe in
rounds - each round looks at the next slot of every key still searching, and once fewer than
4096 keys search, at the next window of up to 64 consecutive slots of each (one round per
slot would cost ~20 numpy calls for each step of the longest probe path). New keys that
race for the same free slot all write their key into it and read it back: exactly one write
survives, that key won, the others keep probing from the next slot.

Deletion: tombstones, not backward shift
----------------------------------------
A deleted slot keeps ``keys == INT64_MIN`` with the internal LIVE flag bit clear; probes walk
over it, insertions reuse the first one they pass. Backward-shift deletion would leave no
tombstones, but the shift of one slot depends on every other deletion in the same cluster, so
a batch of deletions would have to be applied one by one in Python. A tombstone is one
vectorised write. Tombstones are reclaimed by reuse and by a rebuild when live + deleted slots
would exceed 75 %: the rebuild resizes the table to hold the live entries plus the batch being
inserted at 62.5 % (so at least C/8 insertions pass before the next rebuild): it grows, keeps
its size under steady churn, and shrinks when the table has drained (never below the initial
capacity). INT64_MIN is still a valid srid: whether such a slot is live is decided
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
time + timeout, fixed (docs/design.md §6). Unregistered entries (events before their persist
record, or late events after completion) carry the orphan deadline they were created with.

Changelog (docs/design.md §5)
---------------------
Every change sets DIRTY. ``take_dirty`` returns the entries still alive with DIRTY set (they
become LOGGED) and the srids that left the table while LOGGED and are not in it now
(tombstones). An entry born and removed between two calls is never LOGGED, so it never
touches the changelog. This is the only mechanism for changelog tombstones: the results of
``fold`` / ``register`` / ``expire`` / ``take_failed`` do not repeat it.

Failure wins: an entry with FAILED never completes; ``take_failed`` hands out the registered
ones so the service replays them. Nothing here does I/O or reads a clock.

Deferred decisions
------------------
A failed entry (timed out or FAILED) leaves the table to be decided; when its decision has to
wait - its payload could not be read yet, or the commit read as many payloads as it may -
``defer`` puts it back with DEFERRED and the tick to decide it again in ``deadline``. Being in
the table is what keeps it durable: the changelog holds it like any other entry, so a restart
decides it too. A DEFERRED entry never completes, never times out again (``expire`` skips it)
and is not handed out by ``take_failed``; ``take_deferred`` hands it out once its tick has
come, timed-out and FAILED ones apart (they keep their reason), the oldest (smallest persist
offset) first up to a limit - the rest stay untouched, costing no changelog write - and
only looks at the srids deferred (not the whole table). ``expire``'s lower bound of the deadlines may count deferred
entries: a bound that is too low costs a scan, never a missed expiry.
"""

from __future__ import annotations

import math
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
DEFERRED = 0x10
"""Failed, decision put off until ``deadline`` (``defer`` / ``take_deferred``)."""
DURABLE_FLAGS = REGISTERED | FAILED | DEFERRED
"""The flag bits that belong to the entry's state and travel through the changelog."""

_LIVE = 0x80  # internal: the slot holds an entry (empty and deleted slots have it clear)
_NOT_DIRTY = np.uint8(0xFF & ~DIRTY)
_FAILED_MASK = REGISTERED | FAILED | DEFERRED
_FAILED_NOW = REGISTERED | FAILED  # what take_failed hands out (a DEFERRED entry waits)
_TOMBSTONE_KEY = np.iinfo(np.int64).min
_DIRTY_BYTES = np.uint64(0x0101010101010101 * DIRTY)  # DIRTY in each byte of a uint64 word
_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)
_INT32_MIN = int(np.iinfo(np.int32).min)
_INT32_MAX = int(np.iinfo(np.int32).max)
_MIN_CAPACITY = 8
_MAX_CAPACITY = 1 << 32  # fastrange keeps (32-bit hash) * C inside uint64 while C <= 2**32
_REUSE_HEADROOM = 0.125  # a rebuild leaves at least C/8 free slots before the next one
_SHIFT32 = np.uint64(32)
_MAX_WINDOW = 64  # at most this many slots per key in one probe round
_WINDOW_BUDGET = 4096  # slots one probe round looks at once fewer keys than this still search
_STEPS = np.arange(_MAX_WINDOW, dtype=np.intp)


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

    @property
    def complete(self) -> bool:
        return self.registered and not self.failed and not self.deferred and self.value == 0


def _i64(a: Iterable[int] | np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64).reshape(-1)


def _empty_removed() -> Removed:
    return Removed(np.empty(0, np.int64), np.empty(0, np.int64))


def _clamp_tick(tick: int) -> int:
    return max(_INT32_MIN, min(_INT32_MAX, int(tick)))


def _multiple_of_8(n: int) -> int:
    """Capacities are multiples of 8: ``take_dirty`` scans the flags 8 per uint64 word."""
    return max(_MIN_CAPACITY, -(-int(n) // 8) * 8)


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


def _first_true(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a 2-D bool array: the column of each row's first True (0 if none), and whether
    the row has one."""
    if mask.shape[1] == 1:  # argmax along an axis of length 1 costs a call per row
        return np.zeros(mask.shape[0], np.intp), mask[:, 0]
    col = mask.argmax(axis=1)
    return col, mask.reshape(-1)[_row_offsets(mask.shape[0], mask.shape[1]) + col]


def _row_offsets(rows: int, width: int) -> np.ndarray:
    """Flat index of the first element of each row of a C-contiguous (rows, width) array."""
    return np.arange(0, rows * width, width, dtype=np.intp)


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
        self._min_capacity = _multiple_of_8(initial_capacity)
        self._allocate(self._min_capacity)
        self._live = 0
        self._dead = 0  # tombstone slots
        self._min_deadline = _INT32_MAX  # lower bound of every live entry's deadline
        self._left_logged: list[np.ndarray] = []  # srids that left while LOGGED
        self._failed_candidates: list[np.ndarray] = []  # srids that may be REGISTERED|FAILED
        self._deferred: list[np.ndarray] = []  # srids that may be DEFERRED
        self._min_deferred = _INT32_MAX  # lower bound of every DEFERRED entry's deadline

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
        one event that can complete a tree early (docs/design.md §4), so it is refused and counted.

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
        for its persist record (and then goes to ``take_failed``) or expires as an orphan. A
        DEFERRED entry stays deferred (its reason becomes the explicit failure).
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

    def take_failed(self, hold: np.ndarray | None = None) -> Removed:
        """Remove and return the registered entries marked FAILED (replay them now).

        Srids in ``hold`` stay in the table, FAILED (a durable flag: the changelog keeps it),
        and are handed out by a later call - the service holds fresh fail marks briefly so
        that marks of one key arriving through different ledger partitions are decided
        together, in the order of their records.
        """
        if not self._failed_candidates:
            return _empty_removed()
        candidates = np.unique(np.concatenate(self._failed_candidates))
        self._failed_candidates.clear()
        if hold is not None and hold.size:
            held = np.isin(candidates, hold)
            if held.any():
                self._failed_candidates.append(candidates[held])
                candidates = candidates[~held]
        pos = self._lookup(candidates)
        pos = pos[pos >= 0]
        f = self.flags[pos]
        return self._remove_where(pos, (f & _FAILED_MASK) == _FAILED_NOW)

    def defer(
        self,
        srids: np.ndarray,
        offsets: np.ndarray,
        deadlines: np.ndarray | int,
        failed: np.ndarray | None = None,
    ) -> None:
        """Put failed entries back whose decision must wait until ``deadlines`` (ticks).

        Each becomes REGISTERED | DEFERRED (| FAILED where ``failed``, the reason it failed)
        with its persist ``offset``; it is written to the changelog like any change, so the
        wait is durable. ``take_deferred`` hands it out once its tick has come (see the module
        doc). A srid given twice: its last occurrence counts. A srid still in the table keeps
        its value and flags and gains these.
        """
        s = _i64(srids)
        offs = _i64(offsets)
        dls = np.broadcast_to(np.asarray(deadlines, dtype=np.int64), s.shape)
        fl = np.zeros(s.size, dtype=bool) if failed is None else np.asarray(failed, dtype=bool).reshape(-1)
        if not s.size == offs.size == fl.size:
            raise ValueError("defer needs srids, offsets, failed of one length")
        if s.size == 0:
            return
        u, src = _first_occurrences(s, last=True)
        _check_nonzero(u)
        new_dl = np.clip(dls[src], _INT32_MIN, _INT32_MAX - 1).astype(np.int32)
        pos, _ = self._find_or_insert(u, _INT32_MAX)
        add = np.where(fl[src], FAILED, 0).astype(np.uint8) | np.uint8(REGISTERED | DEFERRED | DIRTY)
        self.flags[pos] |= add
        self.offset[pos] = offs[src]
        self.deadline[pos] = new_dl
        self._deferred.append(u)
        self._min_deferred = min(self._min_deferred, int(new_dl.min()))

    def deferred_due(self, now_tick: int) -> int:
        """How many DEFERRED entries have ``deadline <= now_tick`` (what ``take_deferred``
        would hand out without a limit)."""
        now = min(_clamp_tick(now_tick), _INT32_MAX - 1)
        pos = self._deferred_slots(now)
        return 0 if pos is None else int(np.count_nonzero(self.deadline[pos] <= now))

    def take_deferred(self, now_tick: int, limit: int | None = None) -> Deferred:
        """Remove and return the DEFERRED entries with ``deadline <= now_tick``, by reason;
        at most ``limit`` of them, those with the smallest persist offsets (the oldest: a
        partition's failures are decided in persist order). The rest stay as they are.

        Costs nothing while ``now_tick`` is below every deferred deadline; otherwise one
        lookup of the deferred srids (never a scan of the table).
        """
        now = min(_clamp_tick(now_tick), _INT32_MAX - 1)
        pos = self._deferred_slots(now)
        if pos is None:
            return Deferred(_empty_removed(), _empty_removed())
        due = self.deadline[pos] <= now
        take = pos[due]
        next_offset = -1
        if limit is not None and take.size > limit:
            order = np.argsort(self.offset[take], kind="stable")
            take = take[order]
            next_offset = int(self.offset[take[limit]])
            take = take[:limit]
            due[np.isin(pos, take, assume_unique=True, invert=True)] = False
        later = pos[~due]
        self._deferred[:] = [self.keys[later]] if later.size else []
        self._min_deferred = int(self.deadline[later].min()) if later.size else _INT32_MAX
        failed = (self.flags[take] & FAILED) != 0
        out = Deferred(
            Removed(self.keys[take[~failed]], self.offset[take[~failed]]),
            Removed(self.keys[take[failed]], self.offset[take[failed]]),
            next_offset,
        )
        self._remove(take)
        return out

    def _deferred_slots(self, now: int) -> np.ndarray | None:
        """Slots of the DEFERRED entries, the queue compacted to them; None while none can be
        due at tick ``now``."""
        if now < self._min_deferred or not self._deferred:
            return None
        queued = np.unique(np.concatenate(self._deferred))
        pos = self._lookup(queued)
        found = pos >= 0
        queued, pos = queued[found], pos[found]
        waiting = (self.flags[pos] & DEFERRED) != 0  # removed or restored otherwise since
        self._deferred[:] = [queued[waiting]]
        return pos[waiting]

    def expire(self, now_tick: int) -> Expired:
        """Remove and return entries with ``deadline <= now_tick``; call once per tick.

        Registered ones timed out (replay them), unregistered ones are orphans. DEFERRED
        entries are not expired: their deadline is ``take_deferred``'s. See the module doc
        for why this is Storm's RotatingMap.
        """
        now = min(_clamp_tick(now_tick), _INT32_MAX - 1)  # a deadline of INT32_MAX is "never"
        if now < self._min_deadline:
            return Expired(_empty_removed(), _empty_removed())
        due = np.flatnonzero(self.deadline <= now)  # free slots hold INT32_MAX: never due
        due = due[(self.flags[due] & DEFERRED) == 0]
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
        pos, _ = self._find_or_insert(u, _INT32_MAX)
        new_flags = (fl[src].astype(np.uint8) & DURABLE_FLAGS) | (_LIVE | LOGGED)
        new_dl = np.clip(dls[src], _INT32_MIN, _INT32_MAX).astype(np.int32)
        self.value[pos] = vals[src]
        self.flags[pos] = new_flags
        self.offset[pos] = offs[src]
        self.deadline[pos] = new_dl
        self._min_deadline = min(self._min_deadline, int(new_dl.min()))
        failed = (new_flags & _FAILED_MASK) == _FAILED_NOW
        if failed.any():
            self._failed_candidates.append(u[failed])
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
            deferred=bool(f & DEFERRED),
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
        """Bytes held by the columns plus the srids queued for ``take_failed`` / ``take_dirty``
        / ``take_deferred`` (the only other arrays that grow with entries; the first two are
        empty right after those calls, the last holds the srids still deferred)."""
        queued = sum(a.nbytes for a in (*self._left_logged, *self._failed_candidates, *self._deferred))
        return int(
            self.keys.nbytes
            + self.value.nbytes
            + self.offset.nbytes
            + self.deadline.nbytes
            + self.flags.nbytes
            + queued
        )

    @property
    def bytes_per_entry(self) -> float:
        """``nbytes / len``: the memory figure of docs/design.md §9 (inf when empty)."""
        return self.nbytes / self._live if self._live else float("inf")

    # ------------------------------------------------------------------ hash table internals

    def _allocate(self, capacity: int) -> None:
        if capacity > _MAX_CAPACITY:
            raise MemoryError(f"a ledger table holds at most {_MAX_CAPACITY} slots")
        self.keys = np.zeros(capacity, np.int64)
        self.value = np.zeros(capacity, np.int64)
        self.offset = np.full(capacity, -1, np.int64)
        self.deadline = np.full(capacity, _INT32_MAX, np.int32)  # INT32_MAX: not live
        self.flags = np.zeros(capacity, np.uint8)
        self._capacity = capacity
        self._capacity_u64 = np.uint64(capacity)
        self._max_width = min(capacity, _MAX_WINDOW)
        self._max_used = int(capacity * self._max_load)

    def _home(self, keys: np.ndarray) -> np.ndarray:
        """Fibonacci hashing + fastrange: the top 32 bits t of key * 2**64/phi (wrapping
        uint64) scaled to [0, C) as ``(t * C) >> 32``."""
        h = keys.view(np.uint64) * _FIBONACCI
        h >>= _SHIFT32
        h *= self._capacity_u64
        h >>= _SHIFT32
        return h.astype(np.intp)

    def _width(self, searching: int) -> int:
        """Slots per key in the next probe round: 1 while many keys search, wider for the
        few with long probe paths (each round costs ~20 numpy calls whatever its size)."""
        return max(1, min(self._max_width, _WINDOW_BUDGET // searching))

    def _window(self, s: np.ndarray, width: int) -> np.ndarray:
        """Slots ``s + 0 .. s + width - 1`` of each of ``s`` (one row each), wrapping at C."""
        if width == 1:
            return s[:, None]
        idx = s[:, None] + _STEPS[:width]
        idx[idx >= self._capacity] -= self._capacity
        return idx

    def _probe(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For sorted unique keys ``u``: (slot or -1, first free slot on the probe path).

        The free slot (first tombstone passed, else the empty slot that ended the probe) is
        where a missing key would be inserted. A round looks at one slot per key while many
        keys search, then at windows of consecutive slots (``_width``): the few keys with long
        probe paths cost a few rounds, not one round per slot.
        """
        n = u.size
        pos = np.full(n, -1, np.intp)
        free = np.full(n, -1, np.intp)
        if n == 0:
            return pos, free
        keys, flags = self.keys, self.flags
        may_be_min = bool(u[0] == _TOMBSTONE_KEY)  # u is sorted: INT64_MIN comes first
        tombstones = self._dead > 0
        gi = np.arange(n)  # batch index of each searching key
        k = u
        s = self._home(u)
        while k.size:
            width = self._width(k.size)
            idx = self._window(s, width)
            kk = keys[idx]
            hit = kk == k[:, None]
            flat_idx = idx.reshape(-1)
            if may_be_min:  # a srid of INT64_MIN matches only a live slot
                m = np.flatnonzero(hit & (k == _TOMBSTONE_KEY)[:, None])
                hit.reshape(-1)[m] = (flags[flat_idx[m]] & _LIVE) != 0
            stop = hit | (kk == 0)
            col, stopped = _first_true(stop)  # the first hit or empty slot of each row
            at = _row_offsets(k.size, width) + col
            slot = flat_idx[at]
            found = hit.reshape(-1)[at] & stopped
            pos[gi[found]] = slot[found]
            if tombstones:  # the first tombstone before the stop (or in the whole window)
                tomb = kk == _TOMBSTONE_KEY
                m = np.flatnonzero(tomb)
                tomb.reshape(-1)[m] = (flags[flat_idx[m]] & _LIVE) == 0
                if width > 1:
                    tomb &= _STEPS[:width] < np.where(stopped, col, width)[:, None]
                tcol, has = _first_true(tomb)
                t = np.flatnonzero(has)
                t = t[free[gi[t]] < 0]
                free[gi[t]] = flat_idx[_row_offsets(k.size, width)[t] + tcol[t]]
            e = np.flatnonzero(stopped & ~found)  # ended at an empty slot
            e = e[free[gi[e]] < 0]
            free[gi[e]] = slot[e]
            searching = np.flatnonzero(~stopped)
            gi = gi[searching]
            k = k[searching]
            s = idx[searching, -1] + 1
            s[s == self._capacity] = 0
        return pos, free

    def _lookup(self, u: np.ndarray) -> np.ndarray:
        return self._probe(u)[0]

    def _claim(self, k: np.ndarray, start: np.ndarray) -> np.ndarray:
        """Insert missing unique keys ``k``, probing from ``start``; return their slots.

        Each key takes the first free slot of its window (``_width`` slots, as in ``_probe``).
        Keys racing for one free slot all write it and read it back: the surviving write
        wins, the others move on from the next slot. Only ``keys`` and the LIVE bit are set
        here.
        """
        out = np.empty(k.size, np.intp)
        keys, flags = self.keys, self.flags
        gi = np.arange(k.size)
        s = start
        reused = 0
        while gi.size:
            width = self._width(gi.size)
            idx = self._window(s, width)
            kk = keys[idx]
            flat_idx = idx.reshape(-1)
            is_free = kk == 0
            m = np.flatnonzero(kk == _TOMBSTONE_KEY)
            is_free.reshape(-1)[m] = (flags[flat_idx[m]] & _LIVE) == 0
            col, has = _first_true(is_free)
            f = np.flatnonzero(has)
            at = f if width == 1 else _row_offsets(gi.size, width)[f] + col[f]
            sf = flat_idx[at]
            kf = k[f]
            keys[sf] = kf
            won = keys[sf] == kf
            ws = sf[won]
            flags[ws] = _LIVE
            reused += int(np.count_nonzero(kk.reshape(-1)[at[won]] == _TOMBSTONE_KEY))
            out[gi[f[won]]] = ws
            # losers go on after the slot they lost, keys without a free slot after the window
            nxt = idx[:, -1] + 1
            if width > 1:
                nxt[f] = sf + 1
            lost = np.ones(gi.size, dtype=bool)
            lost[f[won]] = False
            gi = gi[lost]
            k = k[lost]
            s = nxt[lost]
            s[s == self._capacity] = 0
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
        """Rehash the live entries into a table that holds ``need`` at load max_load - 1/8
        (62.5 %; never below the initial capacity): it grows, keeps or shrinks to fit.

        No probing: in order of home slot, entry ``i`` goes to ``max(home_i, slot_{i-1} + 1)``
        (what inserting them one by one would give), i.e. ``i + cummax(home - i)``. The homes
        are nearly sorted already (old slot order, and fastrange keeps the hash order), so the
        stable sort is cheap. Entries pushed past the last slot wrap: ``_claim`` puts them
        in the first free slots from slot 0.
        """
        capacity = max(self._min_capacity, _multiple_of_8(math.ceil(need / (self._max_load - _REUSE_HEADROOM))))
        old_keys, old_value, old_offset, old_deadline, old_flags = (
            self.keys, self.value, self.offset, self.deadline, self.flags)
        live = np.flatnonzero(old_flags & _LIVE)
        keys = old_keys[live]
        self._allocate(capacity)
        home = self._home(keys)
        order = np.argsort(home, kind="stable")
        live = live[order]
        keys = keys[order]
        i = np.arange(live.size)
        slots = np.maximum.accumulate(home[order] - i) + i
        fit = int(np.searchsorted(slots, capacity))  # slots is increasing
        head = slots[:fit]
        self.keys[head] = keys[:fit]
        self.flags[head] = old_flags[live[:fit]]  # LIVE before _claim: an INT64_MIN srid is live
        self._live = fit
        self._dead = 0
        if fit < live.size:
            wrapped = self._claim(keys[fit:], np.zeros(live.size - fit, np.intp))
            slots[fit:] = wrapped
            self.flags[wrapped] = old_flags[live[fit:]]
        self.value[slots] = old_value[live]
        self.offset[slots] = old_offset[live]
        self.deadline[slots] = old_deadline[live]

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
