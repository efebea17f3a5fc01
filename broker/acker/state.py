"""One ledger partition's state: its table, its exactly-once counters, and the outputs due."""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from broker.acker.fate import Reason
from broker.ledger.adaptive import AutoRegistrations
from broker.ledger.outages import ClockStops, EntryTopics
from broker.ledger.table import LedgerTable
from broker.metrics import ATTEMPT_BUCKETS

_BOUNDS = np.array(ATTEMPT_BUCKETS, dtype=np.int64)
_BUCKET_NAMES = (*map(str, ATTEMPT_BUCKETS), "inf")

COUNTERS = (
    "registered",  # persist records folded
    "duplicate_roots",  # persist records refused because the srid was registered already
    "folded",  # (srid, xor) pairs folded
    "fail_marks",  # explicit failure marks received
    "completed",  # trees completed -> persist tombstone
    "timed_out",  # registered entries past their deadline
    "failed",  # entries failed explicitly (replayed or dead-lettered)
    "replayed",  # new attempts published to <topic>.replay
    "dlq",  # records dead-lettered after max attempts
    "orphans",  # unregistered entries dropped after the orphan TTL (late or stray events)
    "quarantined",  # undecodable or misrouted input messages, kept in the DLQ
    "payload_fetches",  # replays whose payload came from ns.persist, not the cache
    "payload_retries",  # payload reads that failed and were put off to a later commit
    "payload_lost",  # failed records dead-lettered without their value: payload unreadable
    "refused",  # outputs the broker refused for good, decided again: replay -> DLQ, DLQ w/o value
    "adaptive",  # deadlines given from the latency estimate (timeout "auto")
    "superseded",  # replayed srids whose original attempt completed late: the replay marked superseded
    "superseded_marks",  # superseded marks received for this partition's replay srids
    "superseded_settled",  # superseded replays that timed out or failed: settled, not replayed
    "superseded_unknown",  # superseded marks of srids never registered here (the replay had completed)
    "unwatched",  # watches that ended without a late completion
    "watch_skipped",  # replayed timeouts not watched (max_watches reached, or the decision was put off)
    "dlq_held",  # last attempts whose dead letter waited (an earlier attempt's watch, or its own late events)
    "completed_late",  # timed-out records whose tree completed while their decision waited (in "completed")
    "outage_beats",  # outage beats of tasks received (broker.ledger.outages)
    "outage_stopped_ms",  # how long the partition's timeout clock stood still for tasks in an outage (for some entries)
    "outage_scoped_beats",  # outage beats that named the source topics they hold (rb-scope)
    "outage_held",  # deadlines outage beats moved (an entry once per beat that moved it)
)


class Ended(NamedTuple):
    """An attempt that timed out or failed, until its decision (broker.acker.decisions)."""

    srid: int
    offset: int  # of its persist record
    reason: Reason


class Turn(NamedTuple):
    """A replay's turn (broker.acker.decisions: ``Decider._turn``): its record waits deferred
    until then."""

    turn: float  # epoch ms: its own wait passed and its place under the replay rate and its key
    key: tuple[str, bytes]  # (data topic, record key; a record without one: its srid)
    backing_off: bool  # its own wait is what it waits for (not the rate or its key)
    until: int | None  # when its own wait ends (``Decider._waits_until``): the turn stands while it does
    sent: tuple[int, int]  # (created_ms, persist offset) of its record: its place in its key's order


class Watch(NamedTuple):
    """A replayed attempt to watch (broker.ledger.table: ``LedgerTable.watch``)."""

    srid: int
    value: int  # its XOR value when it timed out (0: failed)
    replay: int  # its replay's srid
    failed: bool


class RegistrationTimes:
    """When the persist records at which offsets were registered: ``(first offset, timestamp)``
    of each batch of persist records folded, in offset order - so the registration time of
    the oldest pending entry (its persist offset is in the table, a time is not: a column of
    it would cost every entry 4 bytes) can be told at a commit without a read.

    ``time_of(offset)`` is the time of the batch the offset falls in, which is at or before
    the record's own (a batch is one poll: milliseconds, seconds while a backlog is read):
    an age from it is never too young. After a restore the only sample is the oldest pending
    entry's from the restored counters record: the entries restored with it get its time
    until they have all left.
    """

    def __init__(self) -> None:
        self._offsets: list[int] = []
        self._ms: list[int] = []

    def note(self, offset: int, ms: int) -> None:
        """A batch of persist records from ``offset`` on, timestamped ``ms``."""
        if self._offsets and offset <= self._offsets[-1]:
            return  # read again after a rewind: the earlier sample stands
        self._offsets.append(offset)
        self._ms.append(ms)

    def reset(self, offset: int | None, ms: int | None) -> None:
        """Restored: the one known time is the oldest pending entry's (none: nothing known)."""
        self._offsets, self._ms = ([offset], [ms]) if offset is not None and ms is not None else ([], [])

    def time_of(self, offset: int) -> int | None:
        """The time of the batch that held ``offset``, dropping the samples of every batch
        before it (the oldest pending entry only moves forward). None: no sample that old."""
        i = bisect_right(self._offsets, offset) - 1
        if i < 0:
            return None
        del self._offsets[:i], self._ms[:i]
        return self._ms[0]

    def __len__(self) -> int:
        return len(self._offsets)


@dataclass
class PartitionState:
    """One ledger partition: the table, its cumulative counters, and the outputs due."""

    table: LedgerTable
    counters: dict[str, int]
    # This instance's decisions, over all partitions it ever owned (shared by all states).
    totals: dict[str, int] = field(default_factory=dict)
    counters_dirty: bool = False
    # Persist tombstones to write, in runs of srids with one outcome (a batch's completions
    # are one run: no tuple per srid).
    tombstones: list[tuple[np.ndarray | Sequence[int], bytes]] = field(default_factory=list)  # srids, outcome
    failures: list[Ended] = field(default_factory=list)
    recent_fails: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (ms, srids)
    # srid -> failed reads of its payload so far. In memory only: a new owner of the
    # partition starts counting again (a provably lost record is dead-lettered at once).
    payload_tries: dict[int, int] = field(default_factory=dict)
    # srid -> XOR value of the entries that timed out in this commit, until their decision:
    # a replayed one is watched with it (LedgerTable.watch).
    expired_values: dict[int, int] = field(default_factory=dict)
    # srid -> when it timed out, until its decision: a last attempt's own window runs from
    # there (broker.acker.decisions). Durable while it waits: the changelog record of a
    # deferred timeout carries it (broker.acker.commit) and a restore brings it back, so a new
    # owner continues the window instead of starting it again.
    timed_out_at: dict[int, int] = field(default_factory=dict)
    # srid -> why the task rejected it (ctx.reject, a fatal exception), until its decision:
    # it is dead-lettered with that reason whatever attempts it has left. Durable: the changelog
    # record of the (FAILED) entry carries it, and a restore brings it back.
    rejections: dict[int, str] = field(default_factory=dict)
    # srid -> when its replay may go (epoch ms) as the task asked with its fail mark
    # (ctx.fail(retry_after_ms=...): its fold's time plus the delay), until its decision: used
    # instead of its record's back-off. Durable like a rejection: the changelog record of the
    # entry carries it, so a new owner replays it then too, neither earlier nor later.
    retry_at: dict[int, int] = field(default_factory=dict)
    # srid -> its replay's turn (``Turn``, broker.acker.decisions): it waits deferred until
    # then, and goes then; per key, the turns waiting; how many wait for their back-off (the
    # rest are due, held back by the rate or their key's order). In memory: a new owner gives
    # them turns again (later, never earlier).
    replay_turns: dict[int, Turn] = field(default_factory=dict)
    replays_waiting: dict[tuple[str, bytes], dict[int, Turn]] = field(default_factory=dict)
    # Taken over (broker.acker.restoring): its deferred entries' keys are not known here (their
    # changelog entries do not carry them), so its next decision takes them all again, whatever
    # their ticks - those whose turn has not come wait again, and a later record of their key
    # waits behind them instead of going first.
    turns_unknown: bool = False
    # srid -> persist offset: deferred entries that wait without a turn here - their payload
    # not read since (over a commit's reads: their key is not known) or held back by the
    # reading order - so a failure persisted after them waits until they are decided again:
    # it may be of their key. (One whose payload could not be read holds back none: it may
    # not be readable for a long time.)
    turnless: dict[int, int] = field(default_factory=dict)
    backing_off: int = 0
    # srid -> its attempt, for the registered replays (attempt > 1; a first attempt is not
    # kept): the attempt a completion ends at (``count_ended``). In memory, refilled by the
    # persist records a new owner reads again; one restored from the changelog alone counts as 1.
    replay_attempts: dict[int, int] = field(default_factory=dict)
    # srid -> when its fail mark was folded, until it is replayed: its back-off runs from there
    # (a timeout's from ``timed_out_at``). Durable: its changelog record carries it
    # (``timed_out_ms`` of a failed entry), so a new owner continues the back-off.
    failed_at: dict[int, int] = field(default_factory=dict)
    # How far the timeout clock stood still for tasks in an outage, and which tasks: durable,
    # in the counters record (broker.ledger.outages).
    stops: ClockStops = field(default_factory=ClockStops)
    # The data topic of each registered entry, for the beats scoped to some (broker.ledger.outages).
    topics: EntryTopics = field(default_factory=EntryTopics)
    # Decided in this commit, to be watched.
    watches: list[Watch] = field(default_factory=list)
    registrations: RegistrationTimes = field(default_factory=RegistrationTimes)
    # When and for which topic the auto entries were registered: their latencies when they
    # leave (broker.ledger.adaptive). Not restored: a new owner learns again.
    auto_runs: AutoRegistrations = field(default_factory=AutoRegistrations)
    # The table's pending entries as of the last counters record (None: unknown - restored
    # from a record without them; computed when the metrics need them): published with the
    # counters, read by the metrics. A new, empty table has none.
    pending: int | None = 0
    oldest_pending_offset: int | None = None
    oldest_pending_ms: int | None = None
    # The restore floor of the last counters record written or read (None: none known): a
    # lower bound of the table's floor now, which only moves up (broker.acker.commit).
    floor: int | None = None
    # (acker's clock ms, persist position) of the commits of the last ``unlogged_ms``: the
    # entries registered below the position of one that old have waited long enough
    # unlogged (``log_old_entries``).
    commit_positions: deque[tuple[int, int]] = field(default_factory=deque)
    _timed_out_checked: int = 1024
    _logged_below: int = -1  # every entry registered below this persist offset is logged

    def log_old_entries(self, now_ms: int, position: int, unlogged_ms: int) -> None:
        """A commit at ``now_ms`` (the acker's clock) with the persist input at ``position``:
        the entries left out of the changelog (docs/design.md §5) that were registered
        ``unlogged_ms`` ago or earlier - below the position of a commit that old - are logged
        by this one, whatever kind of commit it is (interval or early), so the restore floor
        stays that recent in time. A scan of the table only when the floor may be that old."""
        positions = self.commit_positions
        if positions and positions[-1][0] == now_ms:
            positions[-1] = (now_ms, max(positions[-1][1], position))  # one per clock value
        else:
            positions.append((now_ms, position))
        bound = None
        while positions and positions[0][0] <= now_ms - unlogged_ms:
            bound = positions.popleft()[1]
        if bound is not None and (self.floor is None or self.floor < bound) and bound > self._logged_below:
            self.table.log_older(bound)
            # Nothing registered from now on lies below (a rewind builds a new state): the
            # next scan is for a higher bound. The acker reads its own tombstones back, so
            # the position of a partition moves past a floor that no counters record moves.
            self._logged_below = bound

    def idle(self) -> bool:
        """Nothing for a commit to decide or write here: a quiet table, no tombstone, failure,
        held fail mark or watch pending, counters as written - most partitions at a large P,
        which a commit then skips (``Acker._commit``)."""
        return self.table.quiet() and not (
            self.tombstones or self.failures or self.recent_fails or self.watches or self.counters_dirty
            or self.replay_turns
        )

    def summarize(self) -> None:
        """Compute the pending figures the next counters record carries (O(capacity))."""
        count, offset = self.table.pending()
        self.pending = count
        self.oldest_pending_offset = None if offset < 0 else offset
        self.oldest_pending_ms = None if offset < 0 else self.registrations.time_of(offset)
        self.auto_runs.drop_below(offset)
        self.topics.drop_below(offset)

    def decided(self, srid: int) -> int | None:
        """``srid`` is decided: forget what was kept for its decision; its XOR value at
        expiry, if it timed out in this commit (or was deferred with it)."""
        self.payload_tries.pop(srid, None)
        self.timed_out_at.pop(srid, None)
        self.rejections.pop(srid, None)
        self.retry_at.pop(srid, None)
        self.failed_at.pop(srid, None)
        self.replay_attempts.pop(srid, None)
        self.end_turn(srid)
        return self.expired_values.pop(srid, None)

    def wait_turn(self, srid: int, turn: Turn) -> None:
        """``srid`` waits for its replay's ``turn``."""
        self.replay_turns[srid] = turn
        self.replays_waiting.setdefault(turn.key, {})[srid] = turn
        self.backing_off += turn.backing_off

    def earlier_turn(self, key: tuple[str, bytes], sent: tuple[int, int]) -> float | None:
        """The latest turn of the records of ``key`` sent before ``sent`` that wait (None: none
        waits): a record of the key is replayed after them, never behind a later one."""
        waiting = self.replays_waiting.get(key)
        if not waiting:
            return None
        return max((t.turn for t in waiting.values() if t.sent < sent), default=None)

    def end_turn(self, srid: int) -> None:
        """``srid`` no longer waits for its replay's turn (replayed, or gone otherwise)."""
        turn = self.replay_turns.pop(srid, None)
        if turn is not None:
            self.backing_off -= turn.backing_off
            waiting = self.replays_waiting[turn.key]
            del waiting[srid]
            if not waiting:
                del self.replays_waiting[turn.key]

    def let_go_turns(self) -> None:
        """A turn is held by a record of the table: the turns of those that left it for any
        reason (completed late while they waited, settled as superseded, dropped) go, so
        that they hold back no later record of their key and no gauge counts them."""
        if self.replay_turns:
            srids = np.fromiter(self.replay_turns, np.int64, len(self.replay_turns))
            for srid in srids[self.table.hashtable.lookup(srids) < 0].tolist():
                self.end_turn(srid)
        if self.turnless:
            srids = np.fromiter(self.turnless, np.int64, len(self.turnless))
            for srid in srids[self.table.hashtable.lookup(srids) < 0].tolist():
                del self.turnless[srid]

    def forget_decided(self) -> None:
        """Drop what is kept per srid (``timed_out_at``, ``rejections``, ``retry_at``, the
        turns) for srids that left the table otherwise (completed late while it waited, an
        orphan that expired, a fail mark for a decided one): checked only when the dicts have
        doubled since the last check."""
        kinds: tuple[dict[int, Any], ...] = (
            self.timed_out_at, self.rejections, self.retry_at, self.replay_turns, self.failed_at,
            self.replay_attempts,
        )
        if sum(map(len, kinds)) <= self._timed_out_checked:
            return
        for kept in kinds:
            if kept:
                srids = np.unique(np.fromiter(kept, np.int64, len(kept)))
                for srid in srids[self.table.hashtable.lookup(srids) < 0].tolist():
                    if kept is self.replay_turns:
                        self.end_turn(srid)
                    else:
                        del kept[srid]
        self._timed_out_checked = 2 * sum(map(len, kinds)) + 1024

    def count_ended(self, outcome: str, attempts: Sequence[int]) -> None:
        """Records that ended (``outcome``: completed, dlq) at these attempts, for the attempts
        histogram: counters per bucket (``ended_<outcome>_le_<bound>``) and their sum - in
        the changelog's counters, so they go on across owners like the others."""
        a = np.asarray(attempts, dtype=np.int64)
        per_bucket = np.bincount(np.searchsorted(_BOUNDS, a), minlength=len(_BOUNDS) + 1).tolist()
        for name, n in zip(_BUCKET_NAMES, per_bucket, strict=True):
            self.count(f"ended_{outcome}_le_{name}", n)
        self.count(f"ended_{outcome}_attempts", int(a.sum()))

    def count_completed(self, srids: list[int]) -> None:
        """``srids`` completed: at the attempts kept for the replays among them, the others at
        their first (no look-up while no replay is pending)."""
        if self.replay_attempts:
            pop = self.replay_attempts.pop
            self.count_ended("completed", [pop(s, 1) for s in srids])
        else:
            self.count("ended_completed_le_1", len(srids))
            self.count("ended_completed_attempts", len(srids))

    def count(self, name: str, n: int = 1) -> None:
        if n:
            self.counters[name] = self.counters.get(name, 0) + n
            self.totals[name] = self.totals.get(name, 0) + n
            self.counters_dirty = True


def empty_state(totals: dict[str, int]) -> PartitionState:
    return PartitionState(LedgerTable(), {}, totals)
