"""Folding events into the ledger table's entries, and the rules that take completed and
failed entries out: ``fold`` (task events), ``register`` (persist records), ``mark_failed`` /
``take_failed`` (explicit failures).

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

Failure wins: an entry with FAILED never completes; ``take_failed`` hands out the registered
ones so the service replays them. ``Folding`` owns the srids that may be REGISTERED | FAILED
(the queue ``take_failed`` looks up instead of scanning the table) and the count of deferred
timeouts the fold completed late (``take_late_completed``).
"""

from __future__ import annotations

import numpy as np

from broker.ledger.batches import (
    INT32_MAX,
    INT32_MIN,
    as_int64,
    check_nonzero,
    clamp_tick,
    first_occurrences,
    xor_by_srid,
)
from broker.ledger.entries import (
    DEFERRED,
    DIRTY,
    FAILED,
    FAILED_MASK,
    FAILED_NOW,
    REGISTERED,
    STATE,
    SUPERSEDED,
    WATCH,
    Registered,
    Removed,
)
from broker.ledger.store import EntryStore
from broker.ledger.waiting import Deferrals
from broker.ledger.watches import Watches

_HELD = REGISTERED | DEFERRED  # a timed-out entry waiting for its decision, value kept: completes at 0


class Folding:
    """The rules that fold events and persist records into entries, and failures (see the
    module doc)."""

    __slots__ = ("_deferrals", "_failed_candidates", "_late_completed", "_store", "_watches")

    def __init__(self, store: EntryStore, deferrals: Deferrals, watches: Watches) -> None:
        self._store = store
        self._deferrals = deferrals  # a late completion counts only while something is deferred
        self._watches = watches  # takes late completions of watched srids, settled failures
        self._failed_candidates: list[np.ndarray] = []  # srids that may be REGISTERED|FAILED
        self._late_completed = 0  # deferred timeouts fold completed since take_late_completed

    def fold(self, srids: np.ndarray, xors: np.ndarray, orphan_deadline: int) -> Removed:
        """XOR each ``xors[i]`` into the entry of ``srids[i]``; return the trees completed.

        Pairs of one srid are XOR-reduced first, so order inside the batch is irrelevant.
        An unknown srid creates an unregistered entry whose deadline is ``orphan_deadline``
        (a tick); it becomes an orphan if its persist record does not arrive in time.
        Completed entries (REGISTERED, not FAILED, value 0) are removed before returning.
        """
        s = as_int64(srids)
        x = as_int64(xors)
        if s.shape != x.shape:
            raise ValueError(f"{s.size} srids but {x.size} xors")
        if s.size == 0:
            return Removed.empty()
        u, ux = xor_by_srid(s, x)
        check_nonzero(u)
        store = self._store
        pos, _ = store.find_or_insert(u, clamp_tick(orphan_deadline))
        t = store.hashtable
        value = t.value[pos]
        value ^= ux
        t.value[pos] = value
        f = t.flags[pos] | DIRTY
        t.flags[pos] = f
        zero = value == 0
        state = f & STATE
        if store.may_watch:
            late = zero & (state == WATCH)  # the original attempt of a replay completed late
            if late.any():
                self._watches.add_superseded(store.remove_where(pos, late))
        done = zero & ((state == REGISTERED) | (state == _HELD))
        if self._deferrals.queued:
            self._late_completed += int(np.count_nonzero(done & (state == _HELD)))
        return store.remove_where(pos, done)

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
        s = as_int64(srids)
        roots = as_int64(root_xors)
        offs = as_int64(offsets)
        dls = np.asarray(deadlines).reshape(-1)
        if not s.size == roots.size == offs.size == dls.size or (given is not None and np.size(given) != s.size):
            raise ValueError("register needs srids, root_xors, offsets, deadlines (and given) of one length")
        duplicates = np.zeros(s.size, dtype=bool)
        if s.size == 0:
            return Registered(Removed.empty(), duplicates)
        u, src = first_occurrences(s)
        duplicates[:] = True
        duplicates[src] = False
        check_nonzero(u)
        store = self._store
        pos, new = store.find_or_insert(u, INT32_MAX, 0)
        t = store.hashtable
        # An entry new to the table is not DIRTY: it is its persist record (srid, root, offset,
        # deadline), which ns.persist keeps - the changelog need not (broker.ledger.changelog).
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
        new_dl = np.clip(dls[i], INT32_MIN, INT32_MAX).astype(np.int32)
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
            store.lower_min_deadline(int(new_dl.min()))
        failed = (nf & FAILED) != 0
        if failed.any():
            self._failed_candidates.append(u[failed])
        return Registered(store.remove_where(p, ~failed & (value == 0)), duplicates)

    def mark_failed(self, srids: np.ndarray, orphan_deadline: int) -> None:
        """Set FAILED on each srid (an unknown srid gets an unregistered entry, as in ``fold``).

        Registered failed entries are handed out by ``take_failed``; an unregistered one waits
        for its persist record (and then goes to ``take_failed``) or expires as an orphan. A
        DEFERRED entry stays deferred (its reason becomes the explicit failure).
        """
        s = as_int64(srids)
        if s.size == 0:
            return
        u = np.unique(s)
        check_nonzero(u)
        store = self._store
        pos, _ = store.find_or_insert(u, clamp_tick(orphan_deadline))
        flags = store.hashtable.flags
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
            return Removed.empty()
        candidates = np.unique(np.concatenate(self._failed_candidates))
        self._failed_candidates.clear()
        if hold is not None and hold.size:
            held = np.isin(candidates, hold)
            if held.any():
                self._failed_candidates.append(candidates[held])
                candidates = candidates[~held]
        store = self._store
        pos = store.lookup(candidates)
        pos = pos[pos >= 0]
        f = store.hashtable.flags[pos]
        now = (f & FAILED_MASK) == FAILED_NOW
        settle = now & ((f & SUPERSEDED) != 0)
        if settle.any():
            self._watches.add_settled(store.remove_where(pos, settle))
        return store.remove_where(pos, now & ~settle)

    def take_late_completed(self) -> int:
        """How many deferred timeouts ``fold`` completed since the last call: trees that
        completed after their deadline, before their decision (module doc)."""
        n, self._late_completed = self._late_completed, 0
        return n

    def enqueue_failed(self, srids: np.ndarray) -> None:
        """Registered FAILED entries were written (a restore): the next ``take_failed`` hands
        them out."""
        self._failed_candidates.append(srids)

    @property
    def nbytes(self) -> int:
        """Bytes of the srids queued for ``take_failed`` (empty right after it)."""
        return int(sum(a.nbytes for a in self._failed_candidates))
