"""Decisions that wait, in the ledger table (docs/design.md §6, "The fate rule"): deferred and
held decisions. ``Deferrals`` owns the queue of the srids deferred and a lower bound of their
deadlines; the entries themselves stay in the store like any other (the watches of replayed
attempts are ``broker.ledger.watches``).

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
out, with its value, once its tick has come, timed-out and FAILED ones apart (they keep their
reason), the oldest (smallest persist offset) first up to a limit - the rest stay untouched,
costing no changelog write - and only looks at the srids deferred (not the whole table).
``expire``'s lower bound of the deadlines (the store's ``min_deadline``) counts deferred
entries too: ``due`` counts them, and a bound that is too low costs a scan, never a missed
expiry.
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
)
from broker.ledger.entries import DEFERRED, DIRTY, FAILED, REGISTERED, SUPERSEDED, Deferred, Removed
from broker.ledger.store import EntryStore
from broker.ledger.watches import Watches


class Deferrals:
    """Deferred entries: the srids that may be DEFERRED and when the first may be due (see the
    module doc)."""

    __slots__ = ("_min_deadline", "_queue", "_store", "_watches")

    def __init__(self, store: EntryStore, watches: Watches) -> None:
        self._store = store
        self._watches = watches  # takes the superseded entries whose deferral ends
        self._queue: list[np.ndarray] = []  # srids that may be DEFERRED
        self._min_deadline = INT32_MAX  # lower bound of every DEFERRED entry's deadline

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
        s = as_int64(srids)
        offs = as_int64(offsets)
        dls = np.broadcast_to(np.asarray(deadlines, dtype=np.int64), s.shape)
        fl = np.zeros(s.size, dtype=bool) if failed is None else np.asarray(failed, dtype=bool).reshape(-1)
        if not s.size == offs.size == fl.size:
            raise ValueError("defer needs srids, offsets, failed of one length")
        if s.size == 0:
            return
        u, src = first_occurrences(s, last=True)
        check_nonzero(u)
        new_dl = np.clip(dls[src], INT32_MIN, INT32_MAX - 1).astype(np.int32)
        store = self._store
        pos, _ = store.find_or_insert(u, INT32_MAX)
        t = store.hashtable
        if values is not None:
            vals = as_int64(values)
            if vals.size != s.size:
                raise ValueError("defer needs srids, offsets, failed, values of one length")
            t.value[pos] ^= vals[src]
        add = np.where(fl[src], FAILED, 0).astype(np.uint8) | np.uint8(REGISTERED | DEFERRED | DIRTY)
        t.flags[pos] |= add
        t.offset[pos] = offs[src]
        t.deadline[pos] = new_dl
        self.enqueue(u, new_dl)

    def enqueue(self, srids: np.ndarray, deadlines: np.ndarray) -> None:
        """DEFERRED entries were written with these ``deadlines`` (a ``defer``, a restore):
        ``take_deferred`` looks at them once their tick has come."""
        self._queue.append(srids)
        least = int(deadlines.min())
        self._min_deadline = min(self._min_deadline, least)
        # Still a lower bound of every live entry's deadline: ``due`` counts the deferred too,
        # and the lag gate asks an idle input for its watermark only while something is due.
        self._store.lower_min_deadline(least)

    @property
    def queued(self) -> bool:
        """Whether a DEFERRED entry may be in the table (``fold`` counts late completions
        only then)."""
        return bool(self._queue)

    def deferred_due(self, now_tick: int) -> int:
        """How many DEFERRED entries have ``deadline <= now_tick`` (what ``take_deferred``
        would hand out without a limit)."""
        now = min(clamp_tick(now_tick), INT32_MAX - 1)
        pos = self._slots(now)
        return 0 if pos is None else int(np.count_nonzero(self._store.hashtable.deadline[pos] <= now))

    def take_deferred(self, now_tick: int, limit: int | None = None) -> Deferred:
        """Remove and return the DEFERRED entries with ``deadline <= now_tick``, by reason;
        at most ``limit`` of them, those with the smallest persist offsets (the oldest: a
        partition's failures are decided in persist order). The rest stay as they are.

        Costs nothing while ``now_tick`` is below every deferred deadline; otherwise one
        lookup of the deferred srids (never a scan of the table).
        """
        now = min(clamp_tick(now_tick), INT32_MAX - 1)
        pos = self._slots(now)
        if pos is None:
            return Deferred(Removed.empty(with_values=True), Removed.empty())
        store = self._store
        t = store.hashtable
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
        self._queue[:] = [t.keys[later]] if later.size else []
        self._min_deadline = int(t.deadline[later].min()) if later.size else INT32_MAX
        sup = (t.flags[take] & SUPERSEDED) != 0
        if sup.any():
            self._watches.add_settled(Removed(t.keys[take[sup]], t.offset[take[sup]]))
            store.remove(take[sup])
            take = take[~sup]
        failed = (t.flags[take] & FAILED) != 0
        timed_out = take[~failed]
        out = Deferred(
            Removed(t.keys[timed_out], t.offset[timed_out], t.value[timed_out]),
            Removed(t.keys[take[failed]], t.offset[take[failed]]),
            next_offset,
        )
        store.remove(take)
        return out

    def _slots(self, now: int) -> np.ndarray | None:
        """Slots of the DEFERRED entries, the queue compacted to them; None while none can be
        due at tick ``now``."""
        if now < self._min_deadline or not self._queue:
            return None
        t = self._store.hashtable
        queued = np.unique(np.concatenate(self._queue))
        pos = t.lookup(queued)
        found = pos >= 0
        queued, pos = queued[found], pos[found]
        waiting = (t.flags[pos] & DEFERRED) != 0  # removed or restored otherwise since
        self._queue[:] = [queued[waiting]]
        return pos[waiting]

    @property
    def nbytes(self) -> int:
        """Bytes of the srids queued (those still deferred, after ``take_deferred``)."""
        return int(sum(a.nbytes for a in self._queue))
