"""Restores in the poll loop: partitions assigned to the acker are restored a slice at a
time between polls, so the partitions it already owns keep folding and committing while a
takeover reads a large changelog (docs/design.md §5, Assignment and restore).

One assignment callback is one ``Pending``: its input partitions are assigned paused at their
committed offsets; its ledger partitions' ``RestoreJob``s run one after the other, each for
at most ``budget_s`` per step; when the last one is done, the caller installs the states,
seeks the inputs to the committed offsets (anything fetched before is read again) and
resumes them. A partition revoked or lost while restoring is cancelled.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition

from broker.acker.changelog import Changelog, RestoreJob
from broker.acker.state import PartitionState


@dataclass
class Pending:
    """The partitions of one assignment callback, restoring."""

    lps: list[int]
    jobs: dict[int, RestoreJob]
    starts: list[TopicPartition]  # input partitions at their committed offsets
    began: float = field(default_factory=time.monotonic)
    states: dict[int, PartitionState] = field(default_factory=dict)
    read: int = 0
    warm: int = 0

    @property
    def done(self) -> bool:
        return not self.jobs


class Restores:
    def __init__(self, changelog: Changelog) -> None:
        self.changelog = changelog
        self.pending: list[Pending] = []

    @property
    def lps(self) -> set[int]:
        return {lp for p in self.pending for lp in p.lps}

    def add(self, lps: list[int], starts: list[TopicPartition]) -> Pending:
        """A new assignment's partitions, restored first (the acker tries to finish them
        inside the assignment callback)."""
        jobs = {lp: self.changelog.begin(lp) for lp in lps}
        pending = Pending(list(lps), jobs, list(starts))
        self.pending.insert(0, pending)
        return pending

    def step(self, budget_s: float) -> Pending | None:
        """Restore for about ``budget_s``; returns a callback's partitions once all of them are
        restored (their ``states`` filled), else None."""
        if not self.pending:
            return None
        head = self.pending[0]
        if head.jobs:
            lp, job = next(iter(head.jobs.items()))
            if self.changelog.advance(job, budget_s):
                assert job.state is not None
                head.states[lp] = job.state
                head.read += job.read
                head.warm += job.reused
                del head.jobs[lp]
        if head.done:
            self.pending.pop(0)
            return head
        return None

    def cancel(self, lps: Iterable[int]) -> None:
        """Partitions revoked or lost while restoring: forget them."""
        gone = set(lps)
        for p in self.pending:
            for lp in gone & set(p.jobs):
                self.changelog.cancel(p.jobs.pop(lp))
            for lp in gone & set(p.states):
                del p.states[lp]
            p.lps = [lp for lp in p.lps if lp not in gone]
            p.starts = [tp for tp in p.starts if tp.partition not in gone]
        self.pending = [p for p in self.pending if p.lps]
