"""Decisions that wait, in the ledger table (docs/design.md §6, "The fate rule"): deferred and
held decisions, and the watches of replayed attempts that pass superseded marks on.

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

import numpy as np

from broker.ledger.entries import (
    _INT32_MAX,
    _INT32_MIN,
    _STATE,
    DEFERRED,
    DIRTY,
    FAILED,
    REGISTERED,
    SUPERSEDED,
    WATCH,
    Deferred,
    Removed,
    TableBase,
    _check_nonzero,
    _clamp_tick,
    _concat_removed,
    _empty_removed,
    _first_occurrences,
    _i64,
)


class Waiting(TableBase):
    """Deferred entries and watches (see the module doc)."""

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
        # Still a lower bound of every live entry's deadline: ``due`` counts the deferred too,
        # and the lag gate asks an idle input for its watermark only while something is due.
        self._min_deadline = min(self._min_deadline, int(new_dl.min()))

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

    def take_settled(self) -> Removed:
        """Superseded entries that timed out or failed since the last call (they have left the
        table): the acker settles them - their origin completed through the original."""
        out = _concat_removed(self._settled)
        self._settled.clear()
        return out

    def take_expired_counts(self) -> tuple[int, int]:
        """What ``expire`` dropped besides its result since the last call: watches that ended
        without a late completion, and superseded marks of srids never registered here
        (also among the orphans: the replay had completed before the mark, or its persist
        record never came)."""
        out = (self._unwatched, self._unknown_marks)
        self._unwatched = self._unknown_marks = 0
        return out
