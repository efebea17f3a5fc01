"""Deadlines of the ledger table's entries: ``touch`` pushes them forward, ``stop`` holds
them back while a task is in an outage, ``expire`` takes out the entries whose deadline has come.

Timeouts are Storm's RotatingMap, one bucket per tick
------------------------------------------------------
Storm's RotatingMap keeps N buckets; new keys go into the head bucket; every timeout/N the
tail bucket is dropped and all it holds expires. Here every entry stores the tick its bucket
would be dropped in: its ``deadline``. ``expire(now_tick)``, called once per tick, drops every
entry with ``deadline <= now_tick`` - a rotation that drops all due buckets at once, with one
bucket per tick (so expiry is exact to one tick instead of to timeout/N). The scan over the
columns is vectorised and skipped entirely while ``now_tick`` is below a lower bound of all
deadlines (the store's ``min_deadline``); free slots hold deadline INT32_MAX, so the scan is
one comparison of the int32 column and needs no flags. A deadline of
INT32_MAX never expires. Unlike Storm's ``put``, folding does not move an entry to the head:
the deadline is persist time + timeout, fixed (docs/design.md §6); only ``touch`` (Storm's
``resetTimeout``) moves it, and only later. Unregistered entries (events before their persist
record, or late events after completion) carry the orphan deadline they were created with.

``Timeouts`` owns the counts of what ``expire`` drops besides its result (ended watches,
superseded marks of srids never registered: ``take_expired_counts``). Nothing here reads a
clock: ticks come from the service (``broker.ledger.clock``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from broker.ledger.batches import INT32_MAX, INT32_MIN, as_int64, clamp_tick
from broker.ledger.entries import (
    DEFERRED,
    DIRTY,
    FAILED_NOW,
    REGISTERED,
    STATE,
    SUPERSEDED,
    WATCH,
    Expired,
    Removed,
)
from broker.ledger.store import EntryStore
from broker.ledger.watches import Watches


class Timeouts:
    """Deadlines: touched forward, expired at their tick (see the module doc)."""

    __slots__ = ("_store", "_unknown_marks", "_unwatched", "_watches")

    def __init__(self, store: EntryStore, watches: Watches) -> None:
        self._store = store
        self._watches = watches  # takes the superseded entries that time out
        self._unwatched = 0  # watches expire dropped since the last take_expired_counts
        self._unknown_marks = 0  # unregistered SUPERSEDED entries expire dropped since then

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
        s = as_int64(srids)
        d = as_int64(deadlines)
        if s.shape != d.shape:
            raise ValueError(f"{s.size} srids but {d.size} deadlines")
        if s.size == 0:
            return 0
        order = np.lexsort((d, s))  # per srid, the largest deadline last
        s, d = s[order], d[order]
        last = np.append(s[1:] != s[:-1], True)
        u, ud = s[last], np.clip(d[last], INT32_MIN, INT32_MAX - 1)
        u, ud = u[u != 0], ud[u != 0]  # 0 is never a srid
        if u.size == 0:
            return 0
        store = self._store
        # An unknown srid gets an unregistered entry, as an event makes it.
        pos, fresh = store.find_or_insert(u, INT32_MAX, DIRTY)
        t = store.hashtable
        f = t.flags[pos]
        state = f & STATE
        pending = state == REGISTERED
        applies = pending | (state == 0)  # registered and pending, or unregistered and not failed
        target = np.where(pending, ud, np.minimum(ud + orphan_ttl, INT32_MAX - 1))
        later = applies & (target > t.deadline[pos])
        later[fresh] = True
        moved = pos[later]
        t.deadline[moved] = target[later].astype(t.deadline.dtype)
        t.flags[moved] = f[later] | DIRTY
        if moved.size:
            store.lower_min_deadline(int(target[later].min()))
        return int(applies.sum())

    def stop(self, start: int, before: list[tuple[int, int]], after: list[tuple[int, int]],
             only: Callable[[np.ndarray], np.ndarray] | None = None) -> int:
        """The clock stood still over the stops ``after`` (ticks ``[a, b)``, in order) where it
        stood still over ``before``, from tick ``start`` on (a task's outage,
        broker.ledger.outages): every registered, pending entry due after ``start`` is due
        where a clock standing still over ``after`` puts the time left from ``start`` under
        ``before`` - so the stops of several beats add up to their union, whatever order they
        came in, and a deadline due before ``start`` does not move. Failed, deferred and
        watched entries are decided already, orphans wait for a persist record, not a task:
        none of them moves. A deadline that moved is DIRTY (the changelog carries it: a
        restore keeps the stop). ``only``: of the entries at some persist offsets, which the
        stop holds (None: every one; a beat scoped to some topics, broker.ledger.outages).
        Returns how many moved. One scan of the columns."""
        t = self._store.hashtable
        moved = np.flatnonzero(
            ((t.flags & STATE) == REGISTERED) & (t.deadline > start) & (t.deadline < INT32_MAX)
        )
        if only is not None and moved.size:
            moved = moved[only(t.offset[moved].astype(np.int64))]
        if moved.size:
            due = t.deadline[moved].astype(np.int64)
            left = due - start  # the time the entry has left from ``start``, on a clock that runs
            for a, b in before:
                left -= np.clip(np.minimum(due, b) - max(a, start), 0, None)
            later = start + left
            for a, b in after:
                a = max(a, start)
                later = np.where(later > a, later + (b - a), later)
            t.deadline[moved] = np.minimum(later, INT32_MAX - 1).astype(t.deadline.dtype)
            t.flags[moved] |= DIRTY
        return int(moved.size)

    def expire(self, now_tick: int) -> Expired:
        """Remove and return entries with ``deadline <= now_tick``; call once per tick.

        Registered ones timed out (replay them), unregistered ones are orphans. DEFERRED
        entries are not expired: their deadline is ``take_deferred``'s; nor are registered
        FAILED ones: they are failures, ``take_failed``'s. See the module doc
        for why this is Storm's RotatingMap.
        """
        now = min(clamp_tick(now_tick), INT32_MAX - 1)  # a deadline of INT32_MAX is "never"
        store = self._store
        if now < store.min_deadline:
            return Expired(Removed.empty(), Removed.empty())
        t = store.hashtable
        due = np.flatnonzero(t.deadline <= now)  # free slots hold INT32_MAX: never due
        # A fail mark wins over the clock: a registered FAILED entry is ``take_failed``'s
        # (held briefly by fail_hold_ms, or restored by a new owner after its deadline).
        f = t.flags[due]
        due = due[((f & DEFERRED) == 0) & ((f & FAILED_NOW) != FAILED_NOW)]
        f = t.flags[due]
        registered = (f & REGISTERED) != 0
        superseded = (f & SUPERSEDED) != 0
        watched = (f & WATCH) != 0
        settle = registered & superseded
        if settle.any():
            self._watches.add_settled(Removed(t.keys[due[settle]], t.offset[due[settle]]))
        timed_out = due[registered & ~superseded]
        orphans = due[~registered & ~watched]
        result = Expired(
            Removed(t.keys[timed_out], t.offset[timed_out], t.value[timed_out]),
            Removed(t.keys[orphans], t.offset[orphans]),
        )
        self._unwatched += int(np.count_nonzero(watched))
        self._unknown_marks += int(np.count_nonzero(~registered & superseded))
        store.remove(due)
        store.reset_min_deadline()
        return result

    def due(self, now_tick: int) -> int:
        """How many entries ``expire(now_tick)`` would remove, removing nothing (the acker
        counts the expiries it holds back while it is behind on its inputs)."""
        now = min(clamp_tick(now_tick), INT32_MAX - 1)
        if now < self._store.min_deadline:
            return 0
        return int(np.count_nonzero(self._store.hashtable.deadline <= now))

    def take_expired_counts(self) -> tuple[int, int]:
        """What ``expire`` dropped besides its result since the last call: watches that ended
        without a late completion, and superseded marks of srids never registered here
        (also among the orphans: the replay had completed before the mark, or its persist
        record never came)."""
        out = (self._unwatched, self._unknown_marks)
        self._unwatched = self._unknown_marks = 0
        return out
