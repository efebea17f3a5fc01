"""Restores in the poll loop: partitions assigned to the acker are restored a slice at a
time between polls, so the partitions it already owns keep folding and committing while a
takeover reads a large changelog (docs/design.md §5, Assignment and restore).

One assignment callback is one ``Pending``: its input partitions are assigned paused. First
their committed offsets are fetched (stable ones: this waits for a transaction a dead owner
left open - up to its transaction timeout - so it is asked again each step, briefly, never
blocking the loop); then the watermarks of its changelogs and persist partitions, in one
batch each; then its ledger partitions' ``RestoreJob``s are read side by side (up to
``MAX_READING`` partitions at once, for at most ``budget_s`` per step), each followed by the
read of ``ns.persist`` that registers the entries its changelog leaves out
(broker.acker.unlogged), from its restore floor. When the last one is done, the caller installs the
states, seeks the inputs to the committed offsets (anything fetched before is read again)
and resumes them. A partition revoked or lost while restoring is cancelled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition

from broker.acker.changelog import MAX_READING, ChangelogReader, RestoreJob
from broker.acker.state import PartitionState
from broker.acker.unlogged import Register, Unlogged, UnloggedJob
from broker.ranges import counted

log = logging.getLogger(__name__)

# A restore slower than this says what it waits for, once per this many seconds.
SLOW_RESTORE_S = 30.0


@dataclass
class Pending:
    """The partitions of one assignment callback, restoring."""

    lps: list[int]
    tps: list[TopicPartition]  # its input partitions
    starts: list[TopicPartition] | None = None  # ... at their committed offsets, once known
    jobs: dict[int, RestoreJob] = field(default_factory=dict)
    persist_marks: dict[int, tuple[int, int]] = field(default_factory=dict)  # asked after ``starts``
    committed: dict[int, int] = field(default_factory=dict)  # ledger partition -> its persist input's start
    unlogged: dict[int, UnloggedJob | None] = field(default_factory=dict)  # once its changelog is read
    began: float = field(default_factory=time.monotonic)
    states: dict[int, PartitionState] = field(default_factory=dict)
    read: int = 0
    warm: int = 0
    reported: float = 0.0  # when it last said what it waits for (monotonic)

    @property
    def done(self) -> bool:
        return self.starts is not None and not self.jobs


# (input partitions, timeout s) -> their start positions, or None when not known yet
Starts = Callable[[list[TopicPartition], float], list[TopicPartition] | None]


class Restores:
    def __init__(self, changelog: ChangelogReader, starts: Starts, register: Register) -> None:
        self.changelog = changelog
        self._starts = starts
        self.unlogged = Unlogged(changelog.ns, changelog, register)
        self.pending: list[Pending] = []

    @property
    def lps(self) -> set[int]:
        return {lp for p in self.pending for lp in p.lps}

    def add(self, lps: list[int], tps: list[TopicPartition]) -> Pending:
        """A new assignment's partitions, restored first (the acker tries to finish them
        inside the assignment callback)."""
        pending = Pending(list(lps), list(tps))
        self.pending.insert(0, pending)
        return pending

    def step(self, budget_s: float) -> Pending | None:
        """Restore for about ``budget_s``; returns a callback's partitions once all of them are
        restored (their ``states`` filled), else None."""
        if not self.pending:
            return None
        head = self.pending[0]
        self._report_slow(head)
        if head.starts is None:
            head.starts = self._starts(head.tps, max(budget_s, 0.05))
            if head.starts is None:
                return None
            # After the offsets: the ends are read now, past whatever they reflect.
            marks = self.changelog.marks_of(head.lps)
            head.persist_marks = self.changelog.marks_of(head.lps, self.changelog.ns.persist)
            head.jobs = {lp: self.changelog.begin(lp, marks[lp]) for lp in head.lps}
        deadline = time.monotonic() + budget_s
        while True:
            self._sweep(head)
            if not head.jobs or time.monotonic() >= deadline:
                break
            self.changelog.pump(min(0.05, max(deadline - time.monotonic(), 0.001)))
        if head.done:
            self.pending.pop(0)
            return head
        return None

    def _sweep(self, head: Pending) -> None:
        """Start what may start, and take the partitions whose reads are all done."""
        for lp, job in list(head.jobs.items()):
            if not job.done and not job.reading:
                if self.changelog.reading >= MAX_READING:
                    continue
                self.changelog.start(job)
            if not job.done or not self._read_unlogged(head, lp, job):
                continue
            assert job.state is not None
            job.state.turns_unknown = True  # they were given by the owner before
            head.states[lp] = job.state
            head.read += job.read
            head.warm += job.reused
            del head.jobs[lp]

    def _report_slow(self, head: Pending) -> None:
        now = time.monotonic()
        if now - head.began < SLOW_RESTORE_S or now - head.reported < SLOW_RESTORE_S:
            return
        head.reported = now
        if head.starts is None:
            waits = "the stable committed offsets of its inputs (a transaction left open by a dead owner?)"
        else:
            lp, job = next(iter(head.jobs.items()))
            read = head.unlogged.get(lp)
            if read is None:
                waits = f"the changelog of ledger partition {lp} ({job.read} records read from offset {job.start})"
            else:
                waits = (
                    f"{self.changelog.ns.persist}[{lp}] from its restore floor ({read.read} records read "
                    f"from offset {read.start}, to {read.end})"
                )
        log.warning(
            "ledger partitions %s restoring for %.0fs (%d pending callbacks): waiting for %s",
            counted(head.lps), now - head.began, len(self.pending), waits,
        )

    def _read_unlogged(self, head: Pending, lp: int, job: RestoreJob) -> bool:
        """After ``lp``'s changelog: its entries the changelog leaves out, from ``ns.persist``
        below the committed persist offset. True once done."""
        assert job.state is not None and head.starts is not None
        if lp not in head.unlogged:
            if not head.committed:
                persist = self.changelog.ns.persist
                head.committed = {tp.partition: tp.offset for tp in head.starts if tp.topic == persist}
            committed = head.committed[lp]
            head.unlogged[lp] = self.unlogged.begin(lp, job.state, committed, head.persist_marks.get(lp))
        read = head.unlogged[lp]
        if read is None:
            return True
        if not read.done and not read.reading and self.changelog.reading < MAX_READING:
            self.unlogged.start(read)
        return read.done

    def cancel(self, lps: Iterable[int]) -> None:
        """Partitions revoked or lost while restoring: forget them."""
        gone = set(lps)
        for p in self.pending:
            for lp in gone & set(p.jobs):
                self.changelog.cancel(p.jobs.pop(lp))
            for lp in gone & set(p.unlogged):
                read = p.unlogged.pop(lp)
                if read is not None:
                    self.unlogged.cancel(read)
            for lp in gone & set(p.states):
                del p.states[lp]
            p.lps = [lp for lp in p.lps if lp not in gone]
            p.tps = [tp for tp in p.tps if tp.partition not in gone]
            if p.starts is not None:
                p.starts = [tp for tp in p.starts if tp.partition not in gone]
        self.pending = [p for p in self.pending if p.lps]
