"""The entries of one ledger partition: where they live and what every rule reads of them
before it writes.

``EntryStore`` owns the ``SridTable`` (``broker.ledger.hashtable``: columns, hashing, batched
probing, growth, tombstones) and what is kept across its columns so that a rule can skip a
scan or owe nothing later:

- a lower bound of every live entry's deadline (``min_deadline``): every part that writes a
  deadline lowers it (``lower_min_deadline``), ``expire`` skips its scan while ``now`` is
  below it and sets it again after a scan. A bound that is too low costs a scan, never a
  missed expiry;
- whether a WATCH entry may be present (``may_watch``; a part that writes one says so,
  ``watch_added``): a watch's ``offset`` column holds a srid, so ``pending`` masks watches out
  while one may be there, and ``fold`` looks for late completions only then;
- the srids that left while LOGGED (``take_left_logged``): a rule takes entries out through
  ``remove`` / ``remove_where``, which remember them; the changelog owes each a tombstone
  (``drop`` frees slots that owe it nothing: tombstones it holds, entries it never held).

The parts of ``broker.ledger.table.LedgerTable`` change the columns through slots from
``find_or_insert`` / ``lookup`` (taken after any insertion: a rebuild replaces the columns)
and free slots only through the store.
"""

from __future__ import annotations

import numpy as np

from broker.ledger.batches import INT32_MAX
from broker.ledger.entries import (
    DEFERRED,
    DIRTY,
    DURABLE_FLAGS,
    FAILED,
    LOGGED,
    REGISTERED,
    SUPERSEDED,
    WATCH,
    Entries,
    Entry,
    Removed,
)
from broker.ledger.hashtable import SridTable


class EntryStore:
    """The entries of one ledger partition on a ``SridTable`` and the summaries kept across
    them (see the module doc). ``hashtable`` is public for inspection, tests and benchmarks;
    the ledger's parts change it only through the rules."""

    __slots__ = ("_left_logged", "_may_watch", "_min_deadline", "hashtable")

    def __init__(self, initial_capacity: int = 1024, *, max_load: float = 0.75) -> None:
        self.hashtable = SridTable(initial_capacity, max_load=max_load)
        self._min_deadline = INT32_MAX  # lower bound of every live entry's deadline
        self._left_logged: list[np.ndarray] = []  # srids that left while LOGGED
        self._may_watch = False  # a WATCH entry may be in the table

    # ------------------------------------------------------------------ slots

    def find_or_insert(self, u: np.ndarray, deadline: int, flags: int = DIRTY) -> tuple[np.ndarray, np.ndarray]:
        """Slots of sorted unique srids ``u``; the missing ones become fresh entries: value 0,
        offset -1, ``deadline``, ``flags`` (default DIRTY: a new entry is a change),
        unregistered. Returns (slots, batch indices of the fresh ones)."""
        pos, fresh = self.hashtable.find_or_insert(u, deadline, flags)
        if fresh.size and deadline < self._min_deadline:
            self._min_deadline = deadline
        return pos, fresh

    def lookup(self, u: np.ndarray) -> np.ndarray:
        """Slots of sorted unique srids ``u`` (-1 for srids not in the table)."""
        return self.hashtable.lookup(u)

    def remove(self, slots: np.ndarray) -> None:
        """Free live ``slots`` (unique), remembering the LOGGED srids: ``take_dirty`` owes
        the changelog a tombstone for each."""
        if slots.size == 0:
            return
        t = self.hashtable
        logged = (t.flags[slots] & LOGGED) != 0
        if logged.any():
            self._left_logged.append(t.keys[slots[logged]])
        t.delete(slots)

    def remove_where(self, pos: np.ndarray, mask: np.ndarray) -> Removed:
        """Remove the entries at ``pos[mask]`` and return them (srids and offsets)."""
        slots = pos[mask]
        if slots.size == 0:
            return Removed.empty()
        t = self.hashtable
        removed = Removed(t.keys[slots], t.offset[slots])
        self.remove(slots)
        return removed

    def drop(self, slots: np.ndarray) -> None:
        """Free ``slots`` owing the changelog nothing: entries it does not hold, or srids whose
        tombstone it holds already."""
        self.hashtable.delete(slots)

    def left_logged(self) -> bool:
        """Whether srids left while LOGGED since the last ``take_left_logged``."""
        return bool(self._left_logged)

    def take_left_logged(self) -> np.ndarray:
        """The sorted unique srids that left while LOGGED since the last call (some may be
        back in the table by now)."""
        if not self._left_logged:
            return np.empty(0, np.int64)
        gone = np.unique(np.concatenate(self._left_logged))
        self._left_logged.clear()
        return gone

    # ------------------------------------------------------------------ deadlines

    @property
    def min_deadline(self) -> int:
        """A lower bound of every live entry's deadline (INT32_MAX: none can be due)."""
        return self._min_deadline

    def lower_min_deadline(self, tick: int) -> None:
        """An entry's deadline became ``tick``: keep ``min_deadline`` a lower bound."""
        if tick < self._min_deadline:
            self._min_deadline = tick

    def reset_min_deadline(self) -> None:
        """Make ``min_deadline`` exact again: one scan of the ``deadline`` column."""
        self._min_deadline = int(self.hashtable.deadline.min())

    # ------------------------------------------------------------------ watches

    @property
    def may_watch(self) -> bool:
        """Whether a WATCH entry may be in the table (False: certainly none)."""
        return self._may_watch

    def watch_added(self) -> None:
        """A WATCH entry was written (``pending`` clears the mark when its scan finds none)."""
        self._may_watch = True

    # ------------------------------------------------------------------ reading

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
        registration order. Two unmasked scans (O(capacity)): only a
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

    def watching(self) -> int:
        """How many WATCH entries the table holds (one scan of the flags; 0 at once when none
        was ever added)."""
        if not self._may_watch:
            return 0
        return int(np.count_nonzero(self.hashtable.flags & np.uint8(WATCH)))

    def __len__(self) -> int:
        return len(self.hashtable)

    @property
    def capacity(self) -> int:
        return self.hashtable.capacity

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns plus the srids owed a tombstone."""
        return int(self.hashtable.nbytes + sum(a.nbytes for a in self._left_logged))
