"""The ledger table's changelog side (docs/design.md §5): what the changelog needs of the
entries since the last call, loading it back, and the entries it does not hold.

The changelog holds what ``ns.persist`` does not. Every change sets DIRTY, except the
registration of a srid new to the table with its record's deadline: that entry is its
persist record (srid, root, offset, deadline), so it stays unlogged until something else
changes it (an event, a mark, a touch, a decision) or the service logs it for its age
(``log_older``); one whose deadline the acker gave (adaptive, ``register``'s ``given``) is
a change at once. ``take_dirty`` returns the entries still alive with DIRTY set (they become
LOGGED) and the srids that left the table while LOGGED and are not in it now (tombstones;
the store remembers every LOGGED srid it removes). An entry never LOGGED - born and removed
between two calls, or unlogged to its end - never touches the changelog. This is the only
mechanism for changelog tombstones: the results of ``fold`` / ``register`` / ``expire`` /
``take_failed`` do not repeat it.

``Changelog`` keeps no state of its own: the flags and the store's record of removals are
all of it. A restore hands the failed and deferred entries it loads to the parts that hand
them out (``Folding``, ``Deferrals``).
"""

from __future__ import annotations

import numpy as np

from broker.ledger.batches import INT32_MAX, INT32_MIN, as_int64, check_nonzero, first_occurrences
from broker.ledger.entries import (
    DEFERRED,
    DIRTY,
    DURABLE_FLAGS,
    FAILED_MASK,
    FAILED_NOW,
    LOGGED,
    REGISTERED,
    WATCH,
    ChangelogDelta,
    Entries,
)
from broker.ledger.folding import Folding
from broker.ledger.hashtable import LIVE
from broker.ledger.store import EntryStore
from broker.ledger.waiting import Deferrals

_NOT_DIRTY = np.uint8(0xFF & ~DIRTY)

# ``take_dirty`` of a partition with nothing to log, shared: a column of no entries cannot change.
_NOTHING = ChangelogDelta(
    Entries(*(np.empty(0, dtype) for dtype in (np.int64, np.int64, np.int16, np.int64, np.int32))),
    np.empty(0, np.int64),
)
_NO_SRIDS = _NOTHING.tombstones


class Changelog:
    """The entries as the changelog sees them: dirty ones out, records back in, unlogged ones
    (see the module doc)."""

    __slots__ = ("_deferrals", "_folding", "_store")

    def __init__(self, store: EntryStore, folding: Folding, deferrals: Deferrals) -> None:
        self._store = store
        self._folding = folding  # hands out the restored failed entries
        self._deferrals = deferrals  # hands out the restored deferred entries

    def take_dirty(self) -> ChangelogDelta:
        """What the changelog needs since the last call; marks the upserted entries LOGGED.

        ``upserts``: entries alive now and changed since the last call. ``tombstones``: srids
        that left the table while LOGGED and are not in it now (a srid that left and came
        back is an upsert instead: the new record supersedes the old one).

        Cost: one vectorised scan of the ``flags`` column, 8 slots per uint64 word
        (O(capacity)), once per commit interval.
        """
        store = self._store
        gone = store.take_left_logged()
        if not gone.size and not len(store):
            return _NOTHING  # an empty table: nothing left, nothing to log (no scan at all)
        t = store.hashtable
        tombstones = _NO_SRIDS
        if gone.size:
            found = t.lookup(gone)
            tombstones = gone[found < 0]
            # Back in the table (registered again, an event after an orphan left): its
            # changelog record is the old entry's, so the new one is logged over it.
            back = found[found >= 0]
            t.flags[back] |= DIRTY
        slots = t.flagged(DIRTY)
        if not slots.size and not tombstones.size:
            return _NOTHING  # the common case of an idle partition: no column gathered
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
        s = as_int64(srids)
        vals = as_int64(values)
        fl = np.asarray(flags).reshape(-1)
        offs = as_int64(offsets)
        dls = np.asarray(deadlines).reshape(-1)
        if not s.size == vals.size == fl.size == offs.size == dls.size:
            raise ValueError("restore needs columns of one length")
        if s.size == 0:
            return
        u, src = first_occurrences(s, last=True)
        check_nonzero(u)
        store = self._store
        pos, _ = store.find_or_insert(u, INT32_MAX)
        t = store.hashtable
        fs = fl[src].astype(np.int64)
        new_flags = ((fs & DURABLE_FLAGS) | (LIVE | LOGGED)).astype(np.uint8)
        new_dl = np.clip(dls[src], INT32_MIN, INT32_MAX).astype(np.int32)
        t.value[pos] = vals[src]
        t.flags[pos] = new_flags
        t.offset[pos] = offs[src]
        t.deadline[pos] = new_dl
        store.lower_min_deadline(int(new_dl.min()))
        failed = (new_flags & FAILED_MASK) == FAILED_NOW
        if failed.any():
            self._folding.enqueue_failed(u[failed])
        if ((new_flags & WATCH) != 0).any():
            store.watch_added()
        deferred = (new_flags & DEFERRED) != 0
        if deferred.any():
            self._deferrals.enqueue(u[deferred], new_dl[deferred])

    def remove(self, srids: np.ndarray) -> None:
        """Apply changelog tombstones: drop these srids (unknown ones are ignored).

        The changelog already holds the tombstone, so none is produced by ``take_dirty``.
        """
        s = as_int64(srids)
        if s.size == 0:
            return
        u = np.unique(s)
        check_nonzero(u)
        pos = self._store.lookup(u)
        self._store.drop(pos[pos >= 0])

    # ------------------------------------------------------------------ unlogged entries

    def _unlogged(self) -> np.ndarray:
        """Slots of the registered entries with no changelog record: new entries not changed
        since their registration (their persist record is all of them), or changed since the
        last ``take_dirty``."""
        t = self._store.hashtable
        return np.flatnonzero((t.flags & np.uint8(REGISTERED | LOGGED)) == REGISTERED)

    def unlogged_floor(self) -> int:
        """The smallest persist offset of an entry the changelog does not hold (-1: none).
        Right after ``take_dirty`` those are exactly the entries whose persist record is all
        of them: a restore reads ``ns.persist`` from here (docs/design.md §5)."""
        slots = self._unlogged()
        return int(self._store.hashtable.offset[slots].min()) if slots.size else -1

    def log_older(self, offset: int) -> int:
        """Make the unlogged entries registered from persist offsets below ``offset`` DIRTY:
        the next ``take_dirty`` logs them, so the restore floor moves past them. Returns how
        many there were."""
        t = self._store.hashtable
        slots = self._unlogged()
        slots = slots[t.offset[slots] < offset]
        t.flags[slots] |= np.uint8(DIRTY)
        return int(slots.size)

    def drop_unlogged(self) -> None:
        """Forget the entries the changelog does not hold (none of them needs a tombstone):
        the table then equals its changelog, and ``ns.persist`` gives the rest back."""
        self._store.drop(self._unlogged())
