"""The acker's ledger for one ledger partition: srid -> entry, on a numpy hash table.

``LedgerTable`` is the one object the acker holds per ledger partition. It is made of parts
that each own their state and are handed the store (and the parts they hand entries to) when
the table is built; its methods are theirs:

- ``EntryStore`` (``broker.ledger.store``): the hash table (``broker.ledger.hashtable``) and
  the summaries kept across its columns - the least deadline, whether a watch may be
  there, the LOGGED srids that left; reading entries (``get``, ``entries``, ``pending``);
- ``Folding`` (``broker.ledger.folding``): what an entry means and the rules that fold events
  and persist records into it - ``fold``, ``register``, ``mark_failed`` / ``take_failed``;
- ``Timeouts`` (``broker.ledger.timeouts``): deadlines - ``touch``, ``stop_clock``, ``expire``, ``due``;
- ``Deferrals`` (``broker.ledger.waiting``): decisions that wait - ``defer``,
  ``take_deferred``;
- ``Watches`` (``broker.ledger.watches``): replayed attempts watched for a late completion
  and superseded replays - ``watch``, ``mark_superseded``, ``take_superseded``,
  ``take_settled``;
- ``Changelog`` (``broker.ledger.changelog``): ``take_dirty``, ``restore``, the unlogged
  entries.

The flags and result types are ``broker.ledger.entries``; the batch helpers every part uses,
``broker.ledger.batches``.

An entry is four columns of the hash table: ``value`` (running XOR), ``offset``,
``deadline`` and ``flags``. 29 bytes per slot, so bytes per pending entry = 29 / load (39..46 B
while the table grows; see the hash table's module doc). ``nbytes`` also counts the srids
queued for ``take_failed``, ``take_dirty``, ``take_deferred``, ``take_superseded`` and
``take_settled``.

Every operation works on a whole batch of srids at once (``broker.ledger.batches``). Nothing
in the table does I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from broker.ledger.batches import xor_by_srid
from broker.ledger.changelog import Changelog
from broker.ledger.entries import (
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
)
from broker.ledger.folding import Folding
from broker.ledger.hashtable import SridTable
from broker.ledger.store import EntryStore
from broker.ledger.timeouts import Timeouts
from broker.ledger.waiting import Deferrals
from broker.ledger.watches import Watches

__all__ = [
    "DEFERRED", "DIRTY", "DURABLE_FLAGS", "FAILED", "LOGGED", "REGISTERED", "SUPERSEDED", "WATCH",
    "ChangelogDelta", "Deferred", "Entries", "Entry", "Expired", "LedgerTable", "Registered", "Removed",
    "xor_by_srid",
]


class LedgerTable:
    """srid -> (value, flags, offset, deadline) for one ledger partition: the parts of the
    module doc, composed. Each method is its part's; its doc states the rule."""

    __slots__ = ("_changelog", "_deferrals", "_folding", "_store", "_timeouts", "_watches")

    def __init__(self, initial_capacity: int = 1024, *, max_load: float = 0.75) -> None:
        store = EntryStore(initial_capacity, max_load=max_load)
        watches = Watches(store)
        deferrals = Deferrals(store, watches)
        folding = Folding(store, deferrals, watches)
        self._store = store
        self._watches = watches
        self._deferrals = deferrals
        self._folding = folding
        self._timeouts = Timeouts(store, watches)
        self._changelog = Changelog(store, folding, deferrals)

    # ------------------------------------------------------------------ folding (Folding)

    def fold(self, srids: np.ndarray, xors: np.ndarray, orphan_deadline: int) -> Removed:
        """Fold task events; return the trees completed (``Folding.fold``)."""
        return self._folding.fold(srids, xors, orphan_deadline)

    def register(
        self,
        srids: np.ndarray,
        root_xors: np.ndarray,
        offsets: np.ndarray,
        deadlines: np.ndarray,
        given: np.ndarray | None = None,
        orphan_ttl: int | None = None,
    ) -> Registered:
        """Fold persist records, refusing duplicate roots (``Folding.register``)."""
        return self._folding.register(srids, root_xors, offsets, deadlines, given, orphan_ttl)

    def mark_failed(self, srids: np.ndarray, orphan_deadline: int) -> None:
        """Set FAILED on each srid (``Folding.mark_failed``)."""
        self._folding.mark_failed(srids, orphan_deadline)

    def take_failed(self, hold: np.ndarray | None = None) -> Removed:
        """Remove and return the registered FAILED entries but ``hold`` (``Folding.take_failed``)."""
        return self._folding.take_failed(hold)

    def take_late_completed(self) -> int:
        """Deferred timeouts ``fold`` completed since the last call
        (``Folding.take_late_completed``)."""
        return self._folding.take_late_completed()

    # ------------------------------------------------------------------ deadlines (Timeouts)

    def touch(self, srids: np.ndarray, deadlines: np.ndarray, orphan_ttl: int = 0) -> int:
        """Push deadlines forward, never back (``Timeouts.touch``)."""
        return self._timeouts.touch(srids, deadlines, orphan_ttl)

    def stop_clock(self, start: int, before: list[tuple[int, int]], after: list[tuple[int, int]],
                   only: Callable[[np.ndarray], np.ndarray] | None = None) -> int:
        """From tick ``start`` on the clock stood still over ``after``, not ``before``, for the
        entries ``only`` selects by persist offset (``Timeouts.stop``)."""
        return self._timeouts.stop(start, before, after, only)

    def expire(self, now_tick: int) -> Expired:
        """Remove and return the entries due at ``now_tick`` (``Timeouts.expire``)."""
        return self._timeouts.expire(now_tick)

    def due(self, now_tick: int) -> int:
        """How many entries ``expire(now_tick)`` would remove (``Timeouts.due``)."""
        return self._timeouts.due(now_tick)

    def take_expired_counts(self) -> tuple[int, int]:
        """Watches ended and unknown superseded marks ``expire`` dropped since the last call
        (``Timeouts.take_expired_counts``)."""
        return self._timeouts.take_expired_counts()

    # ------------------------------------------------------------------ waiting (Deferrals)

    def defer(
        self,
        srids: np.ndarray,
        offsets: np.ndarray,
        deadlines: np.ndarray | int,
        failed: np.ndarray | None = None,
        values: np.ndarray | None = None,
    ) -> None:
        """Put failed entries back to be decided at ``deadlines`` (``Deferrals.defer``)."""
        self._deferrals.defer(srids, offsets, deadlines, failed, values)

    def deferred_due(self, now_tick: int) -> int:
        """How many deferred entries are due (``Deferrals.deferred_due``)."""
        return self._deferrals.deferred_due(now_tick)

    def take_deferred(self, now_tick: int, limit: int | None = None) -> Deferred:
        """Remove and return the due deferred entries, oldest first (``Deferrals.take_deferred``)."""
        return self._deferrals.take_deferred(now_tick, limit)

    # ------------------------------------------------------------------ watches (Watches)

    def watch(
        self, srids: np.ndarray, values: np.ndarray, replays: np.ndarray, deadline: int,
        failed: np.ndarray | None = None,
    ) -> Removed:
        """Watch replayed srids for a late completion (``Watches.watch``)."""
        return self._watches.watch(srids, values, replays, deadline, failed)

    def watching(self) -> int:
        """How many WATCH entries the table holds (``EntryStore.watching``)."""
        return self._store.watching()

    def quiet(self) -> bool:
        """No entry, and nothing queued to be taken out (srids that left LOGGED, superseded
        or settled replays): a commit has nothing to take from this table."""
        return not len(self._store) and not self._store.left_logged() and not self._watches.queued()

    def take_superseded(self) -> Removed:
        """Watched srids completed late, with their replay's srid (``Watches.take_superseded``)."""
        return self._watches.take_superseded()

    def mark_superseded(self, srids: np.ndarray, orphan_deadline: int) -> int:
        """Set SUPERSEDED on replay srids (``Watches.mark_superseded``)."""
        return self._watches.mark_superseded(srids, orphan_deadline)

    def take_settled(self) -> Removed:
        """Superseded entries that timed out or failed (``Watches.take_settled``)."""
        return self._watches.take_settled()

    # ------------------------------------------------------------------ changelog (Changelog)

    def take_dirty(self) -> ChangelogDelta:
        """What the changelog needs since the last call (``Changelog.take_dirty``)."""
        return self._changelog.take_dirty()

    def restore(
        self,
        srids: np.ndarray,
        values: np.ndarray,
        flags: np.ndarray,
        offsets: np.ndarray,
        deadlines: np.ndarray,
    ) -> None:
        """Load changelog records (``Changelog.restore``)."""
        self._changelog.restore(srids, values, flags, offsets, deadlines)

    def remove(self, srids: np.ndarray) -> None:
        """Apply changelog tombstones (``Changelog.remove``)."""
        self._changelog.remove(srids)

    def unlogged_floor(self) -> int:
        """The smallest persist offset the changelog does not hold (``Changelog.unlogged_floor``)."""
        return self._changelog.unlogged_floor()

    def log_older(self, offset: int) -> int:
        """Make unlogged entries below ``offset`` DIRTY (``Changelog.log_older``)."""
        return self._changelog.log_older(offset)

    def drop_unlogged(self) -> None:
        """Forget the entries the changelog does not hold (``Changelog.drop_unlogged``)."""
        self._changelog.drop_unlogged()

    # ------------------------------------------------------------------ reading (EntryStore)

    @property
    def hashtable(self) -> SridTable:
        """The hash table, for inspection, tests and benchmarks: change it only through the
        rules."""
        return self._store.hashtable

    def get(self, srid: int) -> Entry | None:
        """The entry of ``srid``, or None."""
        return self._store.get(srid)

    def entries(self) -> Entries:
        """Every live entry, as columns (order unspecified). O(capacity)."""
        return self._store.entries()

    def pending(self) -> tuple[int, int]:
        """How many entries are registered and the smallest persist offset among them (-1:
        none) (``EntryStore.pending``)."""
        return self._store.pending()

    def __len__(self) -> int:
        return len(self._store)

    def __contains__(self, srid: object) -> bool:
        return isinstance(srid, int | np.integer) and self._store.get(int(srid)) is not None

    @property
    def capacity(self) -> int:
        return self._store.capacity

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns plus the srids queued for ``take_failed`` / ``take_dirty``
        / ``take_deferred`` / ``take_superseded`` / ``take_settled`` (the only other arrays
        that grow with entries; all but the deferred are empty right after those calls, the
        deferred queue holds the srids still deferred)."""
        return self._store.nbytes + self._folding.nbytes + self._deferrals.nbytes + self._watches.nbytes

    @property
    def bytes_per_entry(self) -> float:
        """``nbytes / len``: the memory figure of docs/design.md §9 (inf when empty)."""
        live = len(self._store)
        return self.nbytes / live if live else float("inf")
