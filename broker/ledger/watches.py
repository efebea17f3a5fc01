"""Watches of replayed attempts and superseded replays, in the ledger table (docs/design.md §6,
"The fate rule"): what waits for a late completion, and the srids handed out because of one.

A timed-out srid that the service replayed can be put back as a WATCH entry (``watch``): its
XOR value at expiry, the replay's srid in the ``offset`` column, the end of the watch in
``deadline``. Late events fold into it as into any entry; at 0 the original's tree completed
after all and ``take_superseded`` hands out (srid, replay srid). A watch is not registered: it
never completes, times out or is replayed; ``expire`` drops it at its deadline. A replay srid
marked SUPERSEDED (``mark_superseded``) still completes at 0, but when it times out or fails it
goes to ``take_settled`` instead of ``expire``'s timeouts or ``take_failed``. Both flags are
durable: the changelog carries them.

``Watches`` owns the two queues of srids handed out later: late completions of watched srids
(``take_superseded``; the fold adds those it completes, ``add_superseded``) and superseded
replays that timed out or failed (``take_settled``; expiry, ``take_failed`` and
``take_deferred`` add those they take out, ``add_settled``).
"""

from __future__ import annotations

import numpy as np

from broker.ledger.batches import INT32_MAX, as_int64, check_nonzero, clamp_tick, first_occurrences
from broker.ledger.entries import (
    DEFERRED,
    DIRTY,
    FAILED,
    REGISTERED,
    STATE,
    SUPERSEDED,
    WATCH,
    Removed,
)
from broker.ledger.store import EntryStore


class Watches:
    """Watched srids and superseded replays, and the queues of what they hand out (see the
    module doc)."""

    __slots__ = ("_settled", "_store", "_superseded")

    def __init__(self, store: EntryStore) -> None:
        self._store = store
        self._superseded: list[Removed] = []  # late completions of watched srids (take_superseded)
        self._settled: list[Removed] = []  # superseded replays that failed (take_settled)

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
        s = as_int64(srids)
        vals = as_int64(values)
        reps = as_int64(replays)
        if not s.size == vals.size == reps.size:
            raise ValueError("watch needs srids, values, replays of one length")
        if s.size == 0:
            return Removed.empty()
        u, src = first_occurrences(s)
        check_nonzero(u)
        dl = min(clamp_tick(deadline), INT32_MAX - 1)
        store = self._store
        pos, _ = store.find_or_insert(u, dl)
        t = store.hashtable
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
        store.lower_min_deadline(dl)
        store.watch_added()
        done = store.remove_where(pos, ((nf & STATE) == WATCH) & (value == 0))
        if len(done):
            self._superseded.append(done)
        return done

    def add_superseded(self, removed: Removed) -> None:
        """Watched srids that left the table completed (srid, replay srid in ``offsets``):
        ``take_superseded`` hands them out."""
        self._superseded.append(removed)

    def take_superseded(self) -> Removed:
        """The watched srids whose original attempt completed late, since the last call, with
        the replay's srid in ``offsets``. They have left the table."""
        out = Removed.concat(self._superseded)
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
        s = as_int64(srids)
        if s.size == 0:
            return 0
        u = np.unique(s)
        check_nonzero(u)
        store = self._store
        pos, _ = store.find_or_insert(u, clamp_tick(orphan_deadline))
        flags = store.hashtable.flags
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
            removed = store.remove_where(pos, chained | settle)
            chain = np.isin(removed.srids, u[chained])
            self._superseded.append(Removed(removed.srids[chain], removed.offsets[chain]))
            self._settled.append(Removed(removed.srids[~chain], removed.offsets[~chain]))
        return registered

    def add_settled(self, removed: Removed) -> None:
        """Superseded entries that left the table timed out or failed: ``take_settled``
        hands them out."""
        self._settled.append(removed)

    def queued(self) -> bool:
        """Whether ``take_superseded`` or ``take_settled`` has something to hand out."""
        return bool(self._superseded or self._settled)

    def take_settled(self) -> Removed:
        """Superseded entries that timed out or failed since the last call (they have left the
        table): the acker settles them - their origin completed through the original."""
        out = Removed.concat(self._settled)
        self._settled.clear()
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of the srids queued for ``take_superseded`` and ``take_settled``."""
        return int(sum(r.srids.nbytes + r.offsets.nbytes for r in (*self._superseded, *self._settled)))
