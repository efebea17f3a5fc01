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
DIRTY, DEFERRED, WATCH, SUPERSEDED). 29 bytes per slot, so bytes per pending entry = 29 / load (39..46 B while the table
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

Failure wins: an entry with FAILED never completes; ``take_failed`` hands out the registered
ones so the service replays them. Nothing in the table does I/O or reads a clock.
"""

from __future__ import annotations

import numpy as np

from broker.ledger.entries import (
    _FAILED_MASK,
    _FAILED_NOW,
    _HELD,
    _INT32_MAX,
    _INT32_MIN,
    _STATE,
    DEFERRED,
    DIRTY,
    DURABLE_FLAGS,
    FAILED,
    LOGGED,
    REGISTERED,
    SUPERSEDED,
    WATCH,
    ChangelogDelta,
    Deferred,
    Entries,
    Entry,
    Expired,
    Registered,
    Removed,
    _check_nonzero,
    _clamp_tick,
    _empty_removed,
    _first_occurrences,
    _i64,
    xor_by_srid,
)
from broker.ledger.waiting import Waiting

__all__ = [
    "DEFERRED", "DIRTY", "DURABLE_FLAGS", "FAILED", "LOGGED", "REGISTERED", "SUPERSEDED", "WATCH",
    "ChangelogDelta", "Deferred", "Entries", "Entry", "Expired", "LedgerTable", "Registered", "Removed",
    "xor_by_srid",
]


class LedgerTable(Waiting):
    """srid -> (value, flags, offset, deadline) for one ledger partition: the rules that fold
    events into entries and take them out; see the module doc."""

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
        given: np.ndarray | None = None,
        orphan_ttl: int | None = None,
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

        ``given`` masks the deadlines the acker gave (adaptive, docs/design.md §6) instead of
        reading them from the persist record: such an entry is more than its persist record,
        so it is a change from the start - the changelog carries its deadline, and a restore
        gives back that one, not a new estimate.

        ``orphan_ttl`` (ticks, as ``touch`` was given it): an entry that waited unregistered
        keeps what a touch gave it - its deadline is at least its orphan deadline less
        ``orphan_ttl``, which is the latest touched deadline, or no later than its first event
        (its orphan deadline was that event's tick + ``orphan_ttl``). None: the record's
        deadline alone.
        """
        s = _i64(srids)
        roots = _i64(root_xors)
        offs = _i64(offsets)
        dls = np.asarray(deadlines).reshape(-1)
        if not s.size == roots.size == offs.size == dls.size or (given is not None and np.size(given) != s.size):
            raise ValueError("register needs srids, root_xors, offsets, deadlines (and given) of one length")
        duplicates = np.zeros(s.size, dtype=bool)
        if s.size == 0:
            return Registered(_empty_removed(), duplicates)
        u, src = _first_occurrences(s)
        duplicates[:] = True
        duplicates[src] = False
        _check_nonzero(u)
        t = self.hashtable
        pos, new = t.find_or_insert(u, _INT32_MAX, 0)
        # An entry new to the table is not DIRTY: it is its persist record (srid, root, offset,
        # deadline), which ns.persist keeps - the changelog need not (broker.ledger.entries).
        # One that had events or marks before, or whose deadline the acker gave, is a change.
        existed = np.ones(u.size, dtype=bool)
        existed[new] = False
        changed = existed.copy()
        if given is not None:
            changed |= np.asarray(given, dtype=bool).reshape(-1)[src]
        f = t.flags[pos]
        again = (f & (REGISTERED | WATCH)) != 0  # a watched srid was registered before its replay
        duplicates[src[again]] = True
        fresh = ~again
        p = pos[fresh]
        i = src[fresh]
        u = u[fresh]
        new_dl = np.clip(dls[i], _INT32_MIN, _INT32_MAX).astype(np.int32)
        if orphan_ttl is not None:
            waited = existed[fresh]  # unregistered before: events, marks or touches came first
            touched = t.deadline[p].astype(np.int64) - orphan_ttl
            new_dl = np.where(waited & (touched > new_dl), touched, new_dl).astype(np.int32)
        value = t.value[p] ^ roots[i]
        t.value[p] = value
        nf = f[fresh] | REGISTERED | np.where(changed[fresh], DIRTY, 0).astype(np.uint8)
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

    def take_late_completed(self) -> int:
        """How many deferred timeouts ``fold`` completed since the last call: trees that
        completed after their deadline, before their decision (module doc)."""
        n, self._late_completed = self._late_completed, 0
        return n

    def touch(self, srids: np.ndarray, deadlines: np.ndarray, orphan_ttl: int = 0) -> int:
        """Push deadlines forward (``ctx.touch``, Storm's ``resetTimeout``): each registered,
        pending entry of ``srids[i]`` gets ``max(deadline, deadlines[i])`` (ticks; a srid
        repeated in the batch: its latest deadline). A touch read before the srid's persist
        record is kept, like an event: the srid's unregistered entry (made by the touch if it
        is unknown) waits for its persist record until ``orphan_ttl`` past the touched
        deadline, and ``register`` gives it at least the touched deadline. Returns how many
        were applied; the others are ignored: failed or deferred entries (already decided)
        and watches (no attempt any more). A touch never shortens a deadline, never changes
        ``value`` and so never completes a tree. A deadline that moved is DIRTY: the
        changelog carries it, so a restored acker keeps it."""
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
        if u.size == 0:
            return 0
        t = self.hashtable
        pos, fresh = t.find_or_insert(u, _INT32_MAX, DIRTY)  # an unknown srid: unregistered, as an event makes it
        f = t.flags[pos]
        state = f & _STATE
        pending = state == REGISTERED
        applies = pending | (state == 0)  # registered and pending, or unregistered and not failed
        target = np.where(pending, ud, np.minimum(ud + orphan_ttl, _INT32_MAX - 1))
        later = applies & (target > t.deadline[pos])
        later[fresh] = True
        moved = pos[later]
        t.deadline[moved] = target[later].astype(t.deadline.dtype)
        t.flags[moved] = f[later] | DIRTY
        if moved.size:
            self._min_deadline = min(self._min_deadline, int(target[later].min()))
        return int(applies.sum())

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

    # ------------------------------------------------------------------ unlogged entries

    def _unlogged(self) -> np.ndarray:
        """Slots of the registered entries with no changelog record: new entries not changed
        since their registration (their persist record is all of them), or changed since the
        last ``take_dirty``."""
        t = self.hashtable
        return np.flatnonzero((t.flags & np.uint8(REGISTERED | LOGGED)) == REGISTERED)

    def unlogged_floor(self) -> int:
        """The smallest persist offset of an entry the changelog does not hold (-1: none).
        Right after ``take_dirty`` those are exactly the entries whose persist record is all
        of them: a restore reads ``ns.persist`` from here (docs/design.md §5)."""
        slots = self._unlogged()
        return int(self.hashtable.offset[slots].min()) if slots.size else -1

    def log_older(self, offset: int) -> int:
        """Make the unlogged entries registered from persist offsets below ``offset`` DIRTY:
        the next ``take_dirty`` logs them, so the restore floor moves past them. Returns how
        many there were."""
        t = self.hashtable
        slots = self._unlogged()
        slots = slots[t.offset[slots] < offset]
        t.flags[slots] |= np.uint8(DIRTY)
        return int(slots.size)

    def drop_unlogged(self) -> None:
        """Forget the entries the changelog does not hold (none of them needs a tombstone):
        the table then equals its changelog, and ``ns.persist`` gives the rest back."""
        self.hashtable.delete(self._unlogged())

    def due(self, now_tick: int) -> int:
        """How many entries ``expire(now_tick)`` would remove, removing nothing (the acker
        counts the expiries it holds back while it is behind on its inputs)."""
        now = min(_clamp_tick(now_tick), _INT32_MAX - 1)
        if now < self._min_deadline:
            return 0
        return int(np.count_nonzero(self.hashtable.deadline <= now))
