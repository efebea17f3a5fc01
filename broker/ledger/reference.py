"""The ledger's semantics in plain Python: a dict of small objects, one pair at a time.

Two uses: the oracle of the property tests (``LedgerTable`` must return the same results on
any sequence of operations) and the "plain Python dict fold" baseline of the benchmark
(docs/design.md §9). It mirrors ``LedgerTable`` method for method and returns the same result types;
results are sorted by srid (``LedgerTable`` leaves their order unspecified).

``reject_duplicate_roots=False`` folds every persist record, even a second one for a srid
that is registered: that is the unsafe naive fold the tests use to show that a duplicated
root event completes a tree early.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from broker.acker.fate import Outcome, Reason
from broker.ledger.outages import BEAT_BOUND_MS
from broker.ledger.table import (
    DEFERRED,
    FAILED,
    REGISTERED,
    ChangelogDelta,
    Deferred,
    Entries,
    Entry,
    Expired,
    Registered,
    Removed,
)

_INT32_MAX = int(np.iinfo(np.int32).max)


@dataclass
class RefEntry:
    value: int = 0
    registered: bool = False
    failed: bool = False
    deferred: bool = False
    logged: bool = False
    dirty: bool = True
    offset: int = -1
    deadline: int = 0

    @property
    def durable_flags(self) -> int:
        return (
            (REGISTERED if self.registered else 0)
            | (FAILED if self.failed else 0)
            | (DEFERRED if self.deferred else 0)
        )


def _removed(items: list[tuple[int, int]]) -> Removed:
    items.sort()
    return Removed(
        np.array([s for s, _ in items], dtype=np.int64),
        np.array([o for _, o in items], dtype=np.int64),
    )


def _entries(items: list[tuple[int, RefEntry]]) -> Entries:
    items.sort(key=lambda item: item[0])
    return Entries(
        srids=np.array([s for s, _ in items], dtype=np.int64),
        values=np.array([e.value for _, e in items], dtype=np.int64),
        flags=np.array([e.durable_flags for _, e in items], dtype=np.int16),
        offsets=np.array([e.offset for _, e in items], dtype=np.int64),
        deadlines=np.array([e.deadline for _, e in items], dtype=np.int32),
    )


class ReferenceLedger:
    """``LedgerTable`` as a dict: srid -> ``RefEntry``."""

    def __init__(self, *, reject_duplicate_roots: bool = True) -> None:
        self.entries_by_srid: dict[int, RefEntry] = {}
        self.reject_duplicate_roots = reject_duplicate_roots
        self._left_logged: set[int] = set()
        self._late_completed = 0

    def _leave(self, srid: int, *, record_tombstone: bool = True) -> RefEntry:
        entry = self.entries_by_srid.pop(srid)
        if entry.logged and record_tombstone:
            self._left_logged.add(srid)
        return entry

    def _complete(self, srid: int, entry: RefEntry) -> bool:
        # A deferred (timed-out) entry keeps its value and completes at 0 too.
        return entry.registered and not entry.failed and entry.value == 0

    def fold(self, srids: np.ndarray, xors: np.ndarray, orphan_deadline: int) -> Removed:
        touched: dict[int, None] = {}
        for srid, x in zip(srids.tolist(), xors.tolist(), strict=True):
            if srid == 0:
                raise ValueError("srid 0 is not a valid id")
            entry = self.entries_by_srid.get(srid)
            if entry is None:
                entry = self.entries_by_srid[srid] = RefEntry(deadline=orphan_deadline)
            entry.value ^= x  # Python ints: the XOR of two int64 values stays in int64
            entry.dirty = True
            touched[srid] = None
        done: list[tuple[int, int]] = []
        for srid in touched:
            entry = self.entries_by_srid[srid]
            if self._complete(srid, entry):
                self._late_completed += entry.deferred
                self._leave(srid)
                done.append((srid, entry.offset))
        return _removed(done)

    def take_late_completed(self) -> int:
        n, self._late_completed = self._late_completed, 0
        return n

    def register(
        self,
        srids: np.ndarray,
        root_xors: np.ndarray,
        offsets: np.ndarray,
        deadlines: np.ndarray,
        given: np.ndarray | None = None,
        orphan_ttl: int | None = None,
    ) -> Registered:
        duplicates = np.zeros(len(srids), dtype=bool)
        touched: dict[int, None] = {}
        gave = [False] * len(srids) if given is None else np.asarray(given, dtype=bool).tolist()
        rows = zip(
            srids.tolist(), root_xors.tolist(), offsets.tolist(), deadlines.tolist(), gave, strict=True
        )
        for i, (srid, root, offset, deadline, acker_deadline) in enumerate(rows):
            if srid == 0:
                raise ValueError("srid 0 is not a valid id")
            entry = self.entries_by_srid.get(srid)
            new = entry is None
            if entry is None:  # its persist record is all of it (unless the acker gave its deadline)
                entry = self.entries_by_srid[srid] = RefEntry(dirty=acker_deadline)
            if entry.registered and self.reject_duplicate_roots:
                duplicates[i] = True
                continue
            entry.value ^= root
            entry.registered = True
            entry.offset = offset
            if orphan_ttl is not None and not new:  # waited unregistered: keeps its touches
                deadline = max(deadline, entry.deadline - orphan_ttl)
            entry.deadline = deadline
            entry.dirty = entry.dirty or not new
            touched[srid] = None
        done: list[tuple[int, int]] = []
        for srid in touched:
            entry = self.entries_by_srid.get(srid)
            if entry is not None and self._complete(srid, entry):
                self._leave(srid)
                done.append((srid, entry.offset))
        return Registered(_removed(done), duplicates)

    def touch(self, srids: np.ndarray, deadlines: np.ndarray, orphan_ttl: int = 0) -> int:
        latest: dict[int, int] = {}
        for srid, deadline in zip(srids.tolist(), deadlines.tolist(), strict=True):
            latest[srid] = max(latest.get(srid, deadline), deadline)
        applied = 0
        for srid, deadline in latest.items():
            if srid == 0:
                continue
            entry = self.entries_by_srid.get(srid)
            fresh = entry is None
            if entry is None:  # kept for its persist record, as an event would be
                entry = self.entries_by_srid[srid] = RefEntry()
            if entry.failed or entry.deferred:
                continue
            applied += 1
            target = deadline if entry.registered else min(deadline + orphan_ttl, _INT32_MAX - 1)
            if fresh or target > entry.deadline:
                entry.deadline = target
                entry.dirty = True
        return applied

    def mark_failed(self, srids: np.ndarray, orphan_deadline: int) -> None:
        for srid in srids.tolist():
            if srid == 0:
                raise ValueError("srid 0 is not a valid id")
            entry = self.entries_by_srid.get(srid)
            if entry is None:
                entry = self.entries_by_srid[srid] = RefEntry(deadline=orphan_deadline)
            if not entry.failed:
                entry.failed = True
                entry.dirty = True

    def take_failed(self) -> Removed:
        out = [
            (srid, self._leave(srid).offset)
            for srid, entry in list(self.entries_by_srid.items())
            if entry.registered and entry.failed and not entry.deferred
        ]
        return _removed(out)

    def defer(self, srids: np.ndarray, offsets: np.ndarray, deadlines: np.ndarray | int,
              failed: np.ndarray | None = None, values: np.ndarray | None = None) -> None:
        n = len(srids)
        dls = np.broadcast_to(np.asarray(deadlines), (n,)).tolist()
        fl = [False] * n if failed is None else np.asarray(failed, dtype=bool).tolist()
        vals = [0] * n if values is None else np.asarray(values, dtype=np.int64).tolist()
        last = {s: (o, d, f, v) for s, o, d, f, v in zip(srids.tolist(), offsets.tolist(), dls, fl, vals, strict=True)}
        for srid, (offset, deadline, f, v) in last.items():
            if srid == 0:
                raise ValueError("srid 0 is not a valid id")
            entry = self.entries_by_srid.get(srid)
            if entry is None:
                entry = self.entries_by_srid[srid] = RefEntry()
            entry.registered = entry.deferred = entry.dirty = True
            entry.value ^= v
            entry.failed = entry.failed or f
            entry.offset = offset
            entry.deadline = min(deadline, 2**31 - 2)

    def deferred_due(self, now_tick: int) -> int:
        return sum(e.deferred and e.deadline <= now_tick for e in self.entries_by_srid.values())

    def take_deferred(self, now_tick: int, limit: int | None = None) -> Deferred:
        due = sorted(
            (entry.offset, srid) for srid, entry in self.entries_by_srid.items()
            if entry.deferred and entry.deadline <= now_tick
        )
        next_offset = -1
        if limit is not None and len(due) > limit:
            next_offset = due[limit][0]
            due = due[:limit]
        timed_out: list[tuple[int, int]] = []
        values: dict[int, int] = {}
        failed: list[tuple[int, int]] = []
        for offset, srid in due:
            entry = self._leave(srid)
            (failed if entry.failed else timed_out).append((srid, offset))
            values[srid] = entry.value
        out = _removed(timed_out)
        return Deferred(
            Removed(out.srids, out.offsets, np.array([values[s] for s in out.srids.tolist()], dtype=np.int64)),
            _removed(failed),
            next_offset,
        )

    def expire(self, now_tick: int) -> Expired:
        timed_out: list[tuple[int, int]] = []
        orphans: list[tuple[int, int]] = []
        for srid, entry in list(self.entries_by_srid.items()):
            # a registered FAILED entry is take_failed's: a fail mark wins over the clock
            if entry.deadline <= now_tick and not entry.deferred and not (entry.registered and entry.failed):
                self._leave(srid)
                (timed_out if entry.registered else orphans).append((srid, entry.offset))
        return Expired(_removed(timed_out), _removed(orphans))

    def take_dirty(self) -> ChangelogDelta:
        for srid in self._left_logged & self.entries_by_srid.keys():
            self.entries_by_srid[srid].dirty = True  # back: logged over the old entry's record
        dirty = [(s, e) for s, e in self.entries_by_srid.items() if e.dirty]
        for _, entry in dirty:
            entry.dirty = False
            entry.logged = True
        gone = sorted(s for s in self._left_logged if s not in self.entries_by_srid)
        self._left_logged.clear()
        return ChangelogDelta(_entries(dirty), np.array(gone, dtype=np.int64))

    def restore(
        self,
        srids: np.ndarray,
        values: np.ndarray,
        flags: np.ndarray,
        offsets: np.ndarray,
        deadlines: np.ndarray,
    ) -> None:
        rows = zip(
            srids.tolist(),
            values.tolist(),
            flags.tolist(),
            offsets.tolist(),
            deadlines.tolist(),
            strict=True,
        )
        for srid, value, flag, offset, deadline in rows:
            if srid == 0:
                raise ValueError("srid 0 is not a valid id")
            self.entries_by_srid[srid] = RefEntry(
                value=value,
                registered=bool(flag & REGISTERED),
                failed=bool(flag & FAILED),
                deferred=bool(flag & DEFERRED),
                logged=True,
                dirty=False,
                offset=offset,
                deadline=deadline,
            )

    def remove(self, srids: np.ndarray) -> None:
        for srid in srids.tolist():
            if srid in self.entries_by_srid:
                self._leave(srid, record_tombstone=False)

    def get(self, srid: int) -> Entry | None:
        entry = self.entries_by_srid.get(srid)
        if entry is None:
            return None
        return Entry(
            srid=srid,
            value=entry.value,
            offset=entry.offset,
            deadline=entry.deadline,
            registered=entry.registered,
            failed=entry.failed,
            logged=entry.logged,
            dirty=entry.dirty,
            deferred=entry.deferred,
        )

    def entries(self) -> Entries:
        return _entries(list(self.entries_by_srid.items()))

    def __len__(self) -> int:
        return len(self.entries_by_srid)

    def __contains__(self, srid: object) -> bool:
        return srid in self.entries_by_srid


# ------------------------------------------------------------------ the fate rule


@dataclass
class ModelAttempt:
    """One attempt of a source record, as the world around the acker knows it."""

    srid: int
    origin: int
    number: int
    max_attempts: int
    deadline_ms: int  # its deadline (held back by outages); of an adaptive one, a lower bound (created + the floor)
    created_ms: int | None = None  # None: before every stop known
    acked_ms: int | None = None  # every event of its tree written at this time
    failed_ms: int | None = None  # a fail mark written at this time
    outcome: Outcome | None = None  # its persist tombstone's rb-outcome, once written
    reason: Reason | None = None  # why it was replayed (its replay's history), once known
    timed_out_ms: int | None = None  # when it timed out (its replay's history ``at_ms``), once known
    given_ms: int | None = None  # an adaptive deadline as the acker first gave it, once seen
    payload_lost: bool = False  # its persist record was deleted before it was decided
    rejected: bool = False  # its fail mark was a rejection (``failed_ms``): its last attempt
    retry_after_ms: int | None = None  # its fail mark asked its replay to wait this long
    replayed_ms: int | None = None  # when its replay was decided (its replay's history ``at_ms``), once known
    topic: str | None = None  # its data topic: which scoped outage beats hold it (None: the unscoped only)

    @property
    def window_from_ms(self) -> int:
        """Its window opens here and lasts ``watch_ms``: at its timeout (or
        after its deadline while the timeout is not known: a timeout is never earlier)."""
        return self.timed_out_ms if self.timed_out_ms is not None else self.deadline_ms


class FateModel:
    """The fate rule of docs/design.md §6 in plain Python, judged from what the world did
    (events written, with their times) and what the acker wrote (tombstones, replays and
    their histories):

    ============================  =====================================================
    the attempt's tree completed  the record's fate
    ============================  =====================================================
    before its deadline           completed (this attempt)
    within the window after its   completed (this attempt late, or a replay settled as
    timeout (``watch_ms``)        superseded)
    after a fail mark             never by this attempt (a failed tree does not count)
    never, on every attempt       dead-lettered after its last attempt, once every
                                  window has closed
    ============================  =====================================================

    The window is judged by the timeout the acker recorded (``at_ms`` in its replay's
    history): a tree completed before ``at_ms + watch_ms`` must complete the record, whatever
    the acker's lag (the end of a watch is gated). Of the last attempt, whose timeout is
    written nowhere before its dead letter, the window counts from its deadline (a timeout
    is never earlier). Only a tree completed after the window may or may not count
    (``None``: both fates are right): the acker may have read it before it took the window's
    end (``whole_window=False`` judges only up to ``deadline + watch_ms / 2`` exactly, the
    rule before it was judged by ``at_ms``). An attempt whose persist record was deleted before it was decided may end either
    way, but must end. ``violations`` checks every tombstone written so far against the
    rule; ``expected`` gives the fate a drained acker must have reached.
    """

    def __init__(self, watch_ms: int, *, whole_window: bool = True) -> None:
        self.watch_ms = watch_ms
        # False: only a tree completed before ``deadline + watch_ms / 2`` must count (inside
        # the window whatever the acker's lag), anything later may or may not.
        self.whole_window = whole_window
        self.attempts: dict[int, ModelAttempt] = {}
        self.origins: dict[int, list[ModelAttempt]] = {}
        # When the clock stood still for a task's outage (§6, *Outages*), per scope (a topic;
        # None: every record): ``[since, until)``, oldest first, none overlapping; and per
        # class of attempts (their topic; None: held by the unscoped stops only) each part its
        # union gained from a beat, with the time it was sent: ``(start, until, sent)``, oldest first.
        self.stops: dict[str | None, list[tuple[int, int]]] = {}
        self.pieces: dict[str | None, list[tuple[int, int, int]]] = {None: []}

    def attempt(self, srid: int, origin: int, number: int, max_attempts: int, deadline_ms: int,
                created_ms: int | None = None, topic: str | None = None) -> ModelAttempt:
        """A new attempt of data ``topic``; created at ``created_ms`` (None: before every stop
        known), its deadline held back by the stops of its class since."""
        a = ModelAttempt(srid, origin, number, max_attempts, self.held(created_ms, deadline_ms, topic), created_ms,
                         topic=topic)
        self.attempts[srid] = a
        self.origins.setdefault(origin, []).append(a)
        return a

    def held(self, created_ms: int | None, deadline_ms: int, topic: str | None = None) -> int:
        """A deadline as a clock that stood still in the stops of its class must make it: each
        part of a stop after the creation holds it back by its length, by the rest of it if
        created during it (``_holds``)."""
        for piece in self._pieces_of(topic):
            deadline_ms += self._holds(piece, created_ms, deadline_ms)
        return deadline_ms

    @staticmethod
    def _holds(piece: tuple[int, int, int], created_ms: int | None, deadline_ms: int) -> int:
        """How much the part ``[start, until)`` of a stop, added by a beat sent at ``sent``,
        must hold back a deadline: ``until - max(start, created)`` if the deadline is after
        both ``start`` and ``sent``, else nothing. A deadline due by ``sent`` may have timed
        out before the beat was read (an expiry waits only for what was sent before its tick);
        of a record created in ``[start, sent)`` (a beat that covers a gap back to its
        outage's start), the acker holds back the whole part if it registered the record before
        the beat, the rest from its creation if after: the model asks the least."""
        start, until, sent = piece
        begin = start if created_ms is None else max(created_ms, start)
        return until - begin if begin < until and deadline_ms > max(start, sent) else 0

    def _pieces_of(self, topic: str | None) -> list[tuple[int, int, int]]:
        """The parts the union of ``topic``'s class gained: a class new here had the
        unscoped stops' until now (no scoped stop named it)."""
        if topic not in self.pieces:
            self.pieces[topic] = list(self.pieces[None])
        return self.pieces[topic]

    def _union(self, topic: str | None) -> list[tuple[int, int]]:
        """The stops that hold an attempt of ``topic``: the unscoped ones and its topic's."""
        both = [*self.stops.get(None, []), *(self.stops.get(topic, []) if topic is not None else [])]
        merged: list[tuple[int, int]] = []
        for a, b in sorted(both):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return merged

    def stop(self, since_ms: int, until_ms: int, sent_ms: int, scope: frozenset[str] | None = None) -> None:
        """An outage beat sent at ``sent_ms`` for the attempts of the topics ``scope`` (None:
        every attempt): the clock stands still from ``since_ms`` (at most ``BEAT_BOUND_MS``
        before ``sent_ms``) to ``until_ms`` for them, the stops of its scope become their
        union with it; every attempt of a class it covers still pending is held back by each
        part its class's stops did not cover yet, as ``_holds`` says. The acker may hold
        more (an attempt whose topic it does not know: by every beat); the model asks the least."""
        since_ms = max(since_ms, sent_ms - BEAT_BOUND_MS)
        if until_ms <= since_ms:
            return
        known = {a.topic for a in self.attempts.values()} | set(self.pieces) | set(self.stops)
        classes: list[str | None] = (
            [*sorted(t for t in known if t is not None), None] if scope is None else [*sorted(scope)]
        )
        gained: dict[str | None, list[tuple[int, int]]] = {}
        for topic in classes:
            self._pieces_of(topic)
            gaps: list[tuple[int, int]] = []
            start = since_ms
            for a, b in self._union(topic):
                if b <= start or a >= until_ms:
                    continue
                if a > start:
                    gaps.append((start, a))
                start = max(start, b)
            if start < until_ms:
                gaps.append((start, until_ms))
            gained[topic] = gaps
        for key in [None] if scope is None else sorted(scope):
            merged: list[tuple[int, int]] = []
            for a, b in sorted([*self.stops.get(key, []), (since_ms, until_ms)]):
                if merged and a <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], b))
                else:
                    merged.append((a, b))
            self.stops[key] = merged
        for topic, gaps in gained.items():
            for gap_start, gap_end in gaps:
                piece = (gap_start, gap_end, sent_ms)
                self.pieces[topic].append(piece)
                for attempt in self.attempts.values():
                    if attempt.topic == topic and attempt.outcome is None and attempt.reason is None:
                        attempt.deadline_ms += self._holds(piece, attempt.created_ms, attempt.deadline_ms)

    def counts(self, a: ModelAttempt) -> bool | None:
        """Whether ``a``'s completed tree must complete the record (None: it may)."""
        if a.acked_ms is None or (a.failed_ms is not None and a.failed_ms <= a.acked_ms):
            return False
        if a.payload_lost:
            return None
        if a.acked_ms < max(a.deadline_ms, a.given_ms or 0):
            return True
        if self.whole_window:
            return True if a.acked_ms < a.window_from_ms + self.watch_ms else None
        return True if a.acked_ms < a.deadline_ms + self.watch_ms // 2 else None

    def expected(self, origin: int) -> Outcome | None:
        """``COMPLETED``, ``DLQ``, or None (either is right)."""
        verdicts = [self.counts(a) for a in self.origins[origin]]
        if True in verdicts:
            return Outcome.COMPLETED
        if any(a.payload_lost for a in self.origins[origin]):
            return None
        return Outcome.DLQ if all(v is False for v in verdicts) else None

    def violations(self) -> list[str]:
        out: list[str] = []
        for origin, attempts in self.origins.items():
            completed = [a for a in attempts if a.outcome is Outcome.COMPLETED]
            dead = [a for a in attempts if a.outcome is Outcome.DLQ]
            if len(completed) + len(dead) > 1:
                out.append(f"origin {origin} ended twice: {[(a.number, a.outcome) for a in completed + dead]}")
            for a in completed:
                # completed only by its own tree, or settled because an earlier attempt's did
                if a.acked_ms is None and not any(b.acked_ms is not None for b in attempts if b.number < a.number):
                    out.append(f"attempt {a.number} of {origin} completed with no tree completed")
            lost = any(b.payload_lost for b in attempts)
            for a in dead:
                if a.number < a.max_attempts and not lost and not a.rejected:
                    out.append(f"attempt {a.number} of {origin} dead-lettered before its last attempt")
                if self.expected(origin) is Outcome.COMPLETED:
                    out.append(f"origin {origin} dead-lettered though attempt(s) {[b.number for b in attempts if self.counts(b)]} completed in time")
            for a in attempts:
                if a.outcome is Outcome.REPLAY and a.rejected and a.failed_ms is not None:
                    out.append(f"attempt {a.number} of {origin} replayed though it was rejected")
                if a.outcome is Outcome.REPLAY and a.acked_ms is not None and a.acked_ms < a.deadline_ms and (
                        a.failed_ms is None):
                    out.append(f"attempt {a.number} of {origin} replayed though its tree completed before its deadline")
                # a replay its fail mark asked to wait goes no sooner (ctx.fail(retry_after_ms=...))
                if (a.reason is Reason.FAILED and a.retry_after_ms is not None and a.failed_ms is not None
                        and a.replayed_ms is not None and a.replayed_ms < a.failed_ms + a.retry_after_ms):
                    out.append(f"attempt {a.number} of {origin} replayed at {a.replayed_ms}, before its retry-after "
                               f"({a.retry_after_ms} ms from its fail mark at {a.failed_ms})")
                # a fail mark wins over the clock: written before the deadline, it is the reason
                if a.reason is Reason.TIMEOUT and a.failed_ms is not None and a.failed_ms < a.deadline_ms:
                    out.append(f"attempt {a.number} of {origin} failed before its deadline, replayed as a timeout")
                # a deadline once given is never shortened (adaptive timeouts, §6)
                if a.timed_out_ms is not None and a.given_ms is not None and a.timed_out_ms < a.given_ms:
                    out.append(f"attempt {a.number} of {origin} timed out at {a.timed_out_ms}, before the "
                               f"deadline {a.given_ms} it was given")
        return out
