"""The acker's ledger for one ledger partition: srid -> entry, on a numpy hash table.

The storage - columns, hashing, batched probing, growth, tombstones - is
``broker.ledger.hashtable.SridTable``; this module holds what the entries mean and the rules
that change them.

What an entry means (docs/design.md §4)
---------------------------------------
Every record id is XORed into its srid's ``value`` exactly twice: once by the event that
created it (the persist record's ``root_xor`` for the source's emissions, the parent task's
event for derived records) and once by the event that acked it. The entry is *complete* when
it is REGISTERED (its persist record has been folded) and ``value == 0``. A non-empty set of
events XORs to 0 only if it holds both events of every id it mentions, i.e. the whole tree,
so completion cannot come early - provided each event is folded once. A duplicated task event
cancels itself and only delays completion (timeout, replay: at-least-once holds). A duplicated
*root* event can complete a tree early and lose data, which is why ``register`` refuses a
second persist record for a srid it already holds.

An entry is four columns of the hash table: ``value`` (running XOR), ``offset`` (persist-record
offset, -1 until registered), ``deadline`` (tick) and ``flags`` (REGISTERED, FAILED, LOGGED,
DIRTY). 29 bytes per slot, so bytes per pending entry = 29 / load (39..46 B while the table
grows; see the hash table's module doc). ``nbytes`` also counts the srids queued for
``take_failed`` and ``take_dirty`` (emptied by those calls). Attempt, origin and key-hash
partition (docs/design.md §5) are not columns: they are in the persist record, which a replay
fetches at ``offset`` anyway.

Every operation works on a whole batch of srids at once: the batch is sorted and reduced per
srid first (duplicates XOR-folded with ``bitwise_xor.reduceat``), then the hash table finds or
inserts all of them in one batched probe, and the rule is applied to the columns at those
slots with a few vectorised writes.

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
-----------------------------
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
wait - its payload could not be read yet, the commit read as many payloads as it may, or a
last attempt's dead letter is held - ``defer`` puts it back with DEFERRED and the tick to
decide it again in ``deadline``. Being in the table is what keeps it durable: the changelog
holds it like any other entry, so a restart decides it too. A timed-out entry is deferred
with its XOR value (``defer``'s ``values``: ``expire`` gave it), so events arriving while it
waits still fold into it, and at 0 its tree completed after all: it completes as any entry
does (``fold``'s result; counted by ``take_late_completed``) and is neither replayed nor
dead-lettered. A FAILED one never completes. A DEFERRED entry never times out again
(``expire`` skips it) and is not handed out by ``take_failed``; ``take_deferred`` hands it
out, with its value, once its tick has
come, timed-out and FAILED ones apart (they keep their reason), the oldest (smallest persist
offset) first up to a limit - the rest stay untouched, costing no changelog write - and
only looks at the srids deferred (not the whole table). ``expire``'s lower bound of the deadlines may count deferred
entries: a bound that is too low costs a scan, never a missed expiry.

Watches and superseded replays (docs/design.md §6)
--------------------------------------------------
A timed-out srid that the service replayed can be put back as a WATCH entry (``watch``): its
XOR value at expiry, the replay's srid in the ``offset`` column, the end of the watch in
``deadline``. Late events fold into it as into any entry; at 0 the original's tree completed
after all and ``take_superseded`` hands out (srid, replay srid). A watch is not registered: it
never completes, times out or is replayed; ``expire`` drops it at its deadline. A replay srid
marked SUPERSEDED (``mark_superseded``) still completes at 0, but when it times out or fails it
goes to ``take_settled`` instead of ``expire``'s timeouts or ``take_failed``. Both flags are
durable: the changelog carries them.
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
"""Changed since the last ``take_dirty``."""
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



class LedgerTable:
    """srid -> (value, flags, offset, deadline) for one ledger partition; see the module doc.

    The entries live in ``hashtable`` (a ``SridTable``), public for inspection, tests and
    benchmarks; change them only through the methods here.
    """

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
        u, ux = xor_by_srid(s, x)
        _check_nonzero(u)
        pos = self._find_or_insert(u, _clamp_tick(orphan_deadline))
        t = self.hashtable
        value = t.value[pos]
        value ^= ux
        t.value[pos] = value
        f = t.flags[pos] | DIRTY
        t.flags[pos] = f
        zero = value == 0
        state = f & _STATE
        if self._may_watch:
            late = zero & (state == WATCH)  # the original attempt of a replay completed late
            if late.any():
                self._superseded.append(self._remove_where(pos, late))
        done = zero & ((state == REGISTERED) | (state == _HELD))
        if self._deferred:
            self._late_completed += int(np.count_nonzero(done & (state == _HELD)))
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
        one event that can complete a tree early (docs/design.md §4), so it is refused and
        counted.

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
        pos = self._find_or_insert(u, _INT32_MAX)
        t = self.hashtable
        f = t.flags[pos]
        again = (f & (REGISTERED | WATCH)) != 0  # a watched srid was registered before its replay
        duplicates[src[again]] = True
        fresh = ~again
        p = pos[fresh]
        i = src[fresh]
        u = u[fresh]
        new_dl = np.clip(dls[i], _INT32_MIN, _INT32_MAX).astype(np.int32)
        value = t.value[p] ^ roots[i]
        t.value[p] = value
        nf = f[fresh] | (REGISTERED | DIRTY)
        t.flags[p] = nf
        t.offset[p] = offs[i]
        t.deadline[p] = new_dl
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
        pos = self._find_or_insert(u, _clamp_tick(orphan_deadline))
        flags = self.hashtable.flags
        f = flags[pos]
        flags[pos] = np.where((f & FAILED) != 0, f, f | (FAILED | DIRTY))
        registered = (f & REGISTERED) != 0
        if registered.any():
            self._failed_candidates.append(u[registered])

    def watch(
        self, srids: np.ndarray, values: np.ndarray, replays: np.ndarray, deadline: int,
        failed: np.ndarray | None = None,
    ) -> Removed:
        """Keep srids that were replayed, until tick ``deadline``: each gets a WATCH
        entry holding ``values[i]`` (its XOR value when it expired) and, in the ``offset``
        column, the replay's srid ``replays[i]``. Late events of the original attempt fold
        into it like any event; one that brings it to 0 means the original's whole tree
        completed after all (docs/design.md §4: 0 only with every event of the tree), and
        ``take_superseded`` hands it out. Where ``failed`` (an explicitly failed attempt) the
        watch is FAILED from the start: it never completes, but a superseded mark that reaches
        it is handed on to its replay all the same (``mark_superseded``: the chain of
        attempts is one, whatever ended each). A watch is no pending record: it never times out
        (``expire`` drops it, counted by ``take_expired_counts``), a fail mark makes it FAILED (it can
        then never complete) and a second persist record of the srid is refused.

        Returns the watches that are complete at once (events folded meanwhile into an
        unregistered entry of the srid made the value 0) - also handed out by
        ``take_superseded``. A srid that is registered again in the table is left alone.
        """
        s = _i64(srids)
        vals = _i64(values)
        reps = _i64(replays)
        if not s.size == vals.size == reps.size:
            raise ValueError("watch needs srids, values, replays of one length")
        if s.size == 0:
            return _empty_removed()
        u, src = _first_occurrences(s)
        _check_nonzero(u)
        dl = min(_clamp_tick(deadline), _INT32_MAX - 1)
        pos = self._find_or_insert(u, dl)
        t = self.hashtable
        f = t.flags[pos]
        free = (f & (REGISTERED | WATCH | DEFERRED)) == 0  # fresh, or late events already here
        pos, src = pos[free], src[free]
        value = t.value[pos] ^ vals[src]
        t.value[pos] = value
        nf = f[free] | (WATCH | DIRTY)
        if failed is not None:
            nf = nf | np.where(np.asarray(failed, bool).reshape(-1)[src], FAILED, 0).astype(np.uint8)
        t.flags[pos] = nf
        t.offset[pos] = reps[src]
        t.deadline[pos] = dl
        self._min_deadline = min(self._min_deadline, dl)
        self._may_watch = True
        done = self._remove_where(pos, ((nf & _STATE) == WATCH) & (value == 0))
        if len(done):
            self._superseded.append(done)
        return done

    def watching(self) -> int:
        """How many WATCH entries the table holds (one scan of the flags; 0 at once when none
        was ever added)."""
        if not self._may_watch:
            return 0
        return int(np.count_nonzero(self.hashtable.flags & np.uint8(WATCH)))

    def take_superseded(self) -> Removed:
        """The watched srids whose original attempt completed late, since the last call, with
        the replay's srid in ``offsets``. They have left the table."""
        out = _concat_removed(self._superseded)
        self._superseded.clear()
        return out

    def mark_superseded(self, srids: np.ndarray, orphan_deadline: int) -> int:
        """Set SUPERSEDED on replay srids whose original completed late. Such an entry still
        completes when its events arrive (a task acks it without working on it), but when it
        times out or fails it is settled (``take_settled``), never replayed or dead-lettered.
        An unknown srid gets an unregistered SUPERSEDED entry with ``orphan_deadline``: its
        persist record may not have been read yet; if none comes, the replay had completed
        before the mark (``take_expired_counts``). Returns how many
        srids were registered entries here."""
        s = _i64(srids)
        if s.size == 0:
            return 0
        u = np.unique(s)
        _check_nonzero(u)
        pos = self._find_or_insert(u, _clamp_tick(orphan_deadline))
        flags = self.hashtable.flags
        f = flags[pos]
        # A replay that timed out or failed itself and was replayed again (a chain) is a
        # WATCH here: its own replay is superseded in turn - handed on like a late completion.
        chained = (f & WATCH) != 0
        # One that failed and waits for its decision (DEFERRED: e.g. a last attempt whose dead
        # letter is held while its original is watched) is settled now.
        settle = (f & (REGISTERED | DEFERRED)) == (REGISTERED | DEFERRED)
        keep = ~(chained | settle)
        flags[pos[keep]] = f[keep] | (SUPERSEDED | DIRTY)
        registered = int(np.count_nonzero(f[~chained] & REGISTERED))
        if (chained | settle).any():  # removed last, at once: a removal may move other entries
            removed = self._remove_where(pos, chained | settle)
            chain = np.isin(removed.srids, u[chained])
            self._superseded.append(Removed(removed.srids[chain], removed.offsets[chain]))
            self._settled.append(Removed(removed.srids[~chain], removed.offsets[~chain]))
        return registered

    def take_expired_counts(self) -> tuple[int, int]:
        """What ``expire`` dropped besides its result since the last call: watches that ended
        without a late completion, and superseded marks of srids never registered here
        (also among the orphans: the replay had completed before the mark, or its persist
        record never came)."""
        out = (self._unwatched, self._unknown_marks)
        self._unwatched = self._unknown_marks = 0
        return out

    def take_late_completed(self) -> int:
        """How many deferred timeouts ``fold`` completed since the last call: trees that
        completed after their deadline, before their decision (module doc)."""
        n, self._late_completed = self._late_completed, 0
        return n

    def take_settled(self) -> Removed:
        """Superseded entries that timed out or failed since the last call (they have left the
        table): the acker settles them - their origin completed through the original."""
        out = _concat_removed(self._settled)
        self._settled.clear()
        return out

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
        pos = self.hashtable.lookup(candidates)
        pos = pos[pos >= 0]
        f = self.hashtable.flags[pos]
        now = (f & _FAILED_MASK) == _FAILED_NOW
        settle = now & ((f & SUPERSEDED) != 0)
        if settle.any():
            self._settled.append(self._remove_where(pos, settle))
        return self._remove_where(pos, now & ~settle)

    def defer(
        self,
        srids: np.ndarray,
        offsets: np.ndarray,
        deadlines: np.ndarray | int,
        failed: np.ndarray | None = None,
        values: np.ndarray | None = None,
    ) -> None:
        """Put failed entries back whose decision must wait until ``deadlines`` (ticks).

        Each becomes REGISTERED | DEFERRED (| FAILED where ``failed``, the reason it failed)
        with its persist ``offset``; it is written to the changelog like any change, so the
        wait is durable. ``take_deferred`` hands it out once its tick has come (see the module
        doc). A srid given twice: its last occurrence counts. A srid still in the table keeps
        its value and flags and gains these.

        ``values`` (default 0) are XORed into the entries: a timed-out entry must get the value
        ``expire`` (or ``take_deferred``) gave it, since it completes when later events bring
        it to 0 - one whose value is not known must be deferred as failed.
        """
        t = self.hashtable
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
        pos = self._find_or_insert(u, _INT32_MAX)
        if values is not None:
            vals = _i64(values)
            if vals.size != s.size:
                raise ValueError("defer needs srids, offsets, failed, values of one length")
            t.value[pos] ^= vals[src]
        add = np.where(fl[src], FAILED, 0).astype(np.uint8) | np.uint8(REGISTERED | DEFERRED | DIRTY)
        t.flags[pos] |= add
        t.offset[pos] = offs[src]
        t.deadline[pos] = new_dl
        self._deferred.append(u)
        self._min_deferred = min(self._min_deferred, int(new_dl.min()))

    def deferred_due(self, now_tick: int) -> int:
        """How many DEFERRED entries have ``deadline <= now_tick`` (what ``take_deferred``
        would hand out without a limit)."""
        t = self.hashtable
        now = min(_clamp_tick(now_tick), _INT32_MAX - 1)
        pos = self._deferred_slots(now)
        return 0 if pos is None else int(np.count_nonzero(t.deadline[pos] <= now))

    def take_deferred(self, now_tick: int, limit: int | None = None) -> Deferred:
        """Remove and return the DEFERRED entries with ``deadline <= now_tick``, by reason;
        at most ``limit`` of them, those with the smallest persist offsets (the oldest: a
        partition's failures are decided in persist order). The rest stay as they are.

        Costs nothing while ``now_tick`` is below every deferred deadline; otherwise one
        lookup of the deferred srids (never a scan of the table).
        """
        t = self.hashtable
        now = min(_clamp_tick(now_tick), _INT32_MAX - 1)
        pos = self._deferred_slots(now)
        if pos is None:
            return Deferred(_empty_removed(with_values=True), _empty_removed())
        due = t.deadline[pos] <= now
        take = pos[due]
        next_offset = -1
        if limit is not None and take.size > limit:
            order = np.argsort(t.offset[take], kind="stable")
            take = take[order]
            next_offset = int(t.offset[take[limit]])
            take = take[:limit]
            due[np.isin(pos, take, assume_unique=True, invert=True)] = False
        later = pos[~due]
        self._deferred[:] = [t.keys[later]] if later.size else []
        self._min_deferred = int(t.deadline[later].min()) if later.size else _INT32_MAX
        sup = (t.flags[take] & SUPERSEDED) != 0
        if sup.any():
            self._settled.append(Removed(t.keys[take[sup]], t.offset[take[sup]]))
            self._remove(take[sup])
            take = take[~sup]
        failed = (t.flags[take] & FAILED) != 0
        timed_out = take[~failed]
        out = Deferred(
            Removed(t.keys[timed_out], t.offset[timed_out], t.value[timed_out]),
            Removed(t.keys[take[failed]], t.offset[take[failed]]),
            next_offset,
        )
        self._remove(take)
        return out

    def _deferred_slots(self, now: int) -> np.ndarray | None:
        """Slots of the DEFERRED entries, the queue compacted to them; None while none can be
        due at tick ``now``."""
        t = self.hashtable
        if now < self._min_deferred or not self._deferred:
            return None
        queued = np.unique(np.concatenate(self._deferred))
        pos = self.hashtable.lookup(queued)
        found = pos >= 0
        queued, pos = queued[found], pos[found]
        waiting = (t.flags[pos] & DEFERRED) != 0  # removed or restored otherwise since
        self._deferred[:] = [queued[waiting]]
        return pos[waiting]

    def touch(self, srids: np.ndarray, deadlines: np.ndarray) -> int:
        """Push deadlines forward (``ctx.touch``, Storm's ``resetTimeout``): each registered,
        pending entry of ``srids[i]`` gets ``max(deadline, deadlines[i])`` (ticks; a srid
        repeated in the batch: its latest deadline). Returns how many were applied; the others
        are ignored: unknown srids (completed, decided, never seen - a touch creates no entry),
        unregistered entries (their persist record sets the deadline) and failed or deferred
        ones (already decided). A touch never shortens a deadline, never changes ``value`` and
        so never completes a tree. A deadline that moved is DIRTY: the changelog carries it,
        so a restored acker keeps it."""
        s = _i64(srids)
        d = _i64(deadlines)
        if s.shape != d.shape:
            raise ValueError(f"{s.size} srids but {d.size} deadlines")
        if s.size == 0:
            return 0
        order = np.lexsort((d, s))  # per srid, the largest deadline last
        s, d = s[order], d[order]
        last = np.append(s[1:] != s[:-1], True)
        u, ud = s[last], np.clip(d[last], _INT32_MIN, _INT32_MAX - 1)
        u, ud = u[u != 0], ud[u != 0]  # 0 is never a srid
        t = self.hashtable
        pos = t.lookup(u)
        found = pos >= 0
        pos, ud = pos[found], ud[found]
        f = t.flags[pos]
        pending = (f & _STATE) == REGISTERED
        pos, ud, f = pos[pending], ud[pending], f[pending]
        later = ud > t.deadline[pos]
        moved = pos[later]
        t.deadline[moved] = ud[later].astype(t.deadline.dtype)
        t.flags[moved] = f[later] | DIRTY
        return int(pending.sum())

    def expire(self, now_tick: int) -> Expired:
        """Remove and return entries with ``deadline <= now_tick``; call once per tick.

        Registered ones timed out (replay them), unregistered ones are orphans. DEFERRED
        entries are not expired: their deadline is ``take_deferred``'s; nor are registered
        FAILED ones: they are failures, ``take_failed``'s. See the module doc
        for why this is Storm's RotatingMap.
        """
        now = min(_clamp_tick(now_tick), _INT32_MAX - 1)  # a deadline of INT32_MAX is "never"
        if now < self._min_deadline:
            return Expired(_empty_removed(), _empty_removed())
        t = self.hashtable
        due = np.flatnonzero(t.deadline <= now)  # free slots hold INT32_MAX: never due
        # A fail mark wins over the clock: a registered FAILED entry is ``take_failed``'s
        # (held briefly by fail_hold_ms, or restored by a new owner after its deadline).
        f = t.flags[due]
        due = due[((f & DEFERRED) == 0) & ((f & _FAILED_NOW) != _FAILED_NOW)]
        f = t.flags[due]
        registered = (f & REGISTERED) != 0
        superseded = (f & SUPERSEDED) != 0
        watched = (f & WATCH) != 0
        settle = registered & superseded
        if settle.any():
            self._settled.append(Removed(t.keys[due[settle]], t.offset[due[settle]]))
        timed_out = due[registered & ~superseded]
        orphans = due[~registered & ~watched]
        result = Expired(
            Removed(t.keys[timed_out], t.offset[timed_out], t.value[timed_out]),
            Removed(t.keys[orphans], t.offset[orphans]),
        )
        self._unwatched += int(np.count_nonzero(watched))
        self._unknown_marks += int(np.count_nonzero(~registered & superseded))
        self._remove(due)
        self._min_deadline = int(t.deadline.min())
        return result

    def due(self, now_tick: int) -> int:
        """How many entries ``expire(now_tick)`` would remove, removing nothing (the acker
        counts the expiries it holds back while it is behind on its inputs)."""
        now = min(_clamp_tick(now_tick), _INT32_MAX - 1)
        if now < self._min_deadline:
            return 0
        return int(np.count_nonzero(self.hashtable.deadline <= now))

    def take_dirty(self) -> ChangelogDelta:
        """What the changelog needs since the last call; marks the upserted entries LOGGED.

        ``upserts``: entries alive now and changed since the last call. ``tombstones``: srids
        that left the table while LOGGED and are not in it now (a srid that left and came
        back is an upsert instead: the new record supersedes the old one).

        Cost: one vectorised scan of the ``flags`` column, 8 slots per uint64 word
        (O(capacity): ~0.6 ms for 2M slots), once per commit interval.
        """
        t = self.hashtable
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
        tombstones = np.empty(0, np.int64)
        if self._left_logged:
            gone = np.unique(np.concatenate(self._left_logged))
            self._left_logged.clear()
            tombstones = gone[t.lookup(gone) < 0]
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

    # ------------------------------------------------------------------ table access

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
