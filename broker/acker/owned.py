"""The ledger partitions an acker owns, and what it keeps of them between two commits
(docs/design.md §5): each partition's state, its inputs' positions, whether they were read,
the records due in the next transaction, and the instance's totals.

``OwnedPartitions`` is the only writer of all of it. The loop, the commit, the rebalance
callbacks and the recovery from a failed commit change it through its methods, so what each
of them resets is read here:

- ``install``: restored partitions join, their inputs at the committed offsets;
- ``consumed``: a batch of one input was read (its position moves, its partition is read);
- ``queue`` / ``take_outgoing``: records for the next transaction (quarantines) / taken by it;
- ``take_read`` and ``committed``: what a commit looks at, and what it made durable;
- ``drop``: revoked, lost or rewound partitions leave with their positions, reads and
  outputs not committed (their next owner derives them again from the changelog and the
  inputs after the committed offsets) and the gates forget them;
- ``rewind_totals``: the counts of what no transaction committed are taken back.

The states themselves change by their own methods (``PartitionState``, the fold); the
totals they count into are this owner's, one dict for every state it ever installed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import TYPE_CHECKING

from confluent_kafka import TopicPartition

from broker.acker.replay import Outgoing
from broker.acker.state import COUNTERS, PartitionState, empty_state

if TYPE_CHECKING:
    from broker.acker.lag import ExpiryGate
    from broker.acker.reading import ReadingOrder

class OwnedPartitions:
    """The owned partitions' states, positions, reads, outputs due and totals (module doc)."""

    __slots__ = ("_committed_positions", "_committed_totals", "_expiry", "_outgoing", "_positions", "_read",
                 "_reading", "_states", "totals")

    def __init__(self, expiry: ExpiryGate | None = None, reading: ReadingOrder | None = None) -> None:
        """``expiry`` and ``reading``: the gates that keep each owned partition's progress
        beside its state (broker.acker.lag, broker.acker.reading); it starts over when the
        partition is installed, and is forgotten when it leaves."""
        self._states: dict[int, PartitionState] = {}
        # This instance's decisions over every partition it ever owned: the states count into
        # it (``PartitionState.count``), and so does the changelog's reading.
        self.totals: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        # ``totals`` as of the last committed transaction: an aborted one's counts are undone
        # with its state by the rewind, or the inputs read again would be counted twice.
        self._committed_totals = dict(self.totals)
        # The input position of every owned partition. A transaction commits those that moved
        # since the last commit and those of the partitions it writes for - never none:
        # offsets are what the group coordinator checks against the member's generation
        # (epoch), so a member that lost its partitions (stalled past max.poll.interval.ms,
        # or its session expired) cannot commit anything any more. Not all of them each time:
        # a commit's offsets, and its records of __consumer_offsets, would grow with P.
        self._positions: dict[tuple[str, int], int] = {}
        self._committed_positions: dict[tuple[str, int], int] = {}  # as the last commit left them
        self._read: set[int] = set()  # ledger partitions whose input was consumed since the last commit
        # Records due in the next transaction, with the ledger partition they belong to: they
        # are dropped with the partition when it is revoked or lost.
        self._outgoing: list[tuple[int, Outgoing]] = []
        self._expiry = expiry
        self._reading = reading

    # ------------------------------------------------------------------ read

    @property
    def states(self) -> Mapping[int, PartitionState]:
        return self._states

    @property
    def positions(self) -> Mapping[tuple[str, int], int]:
        return self._positions

    @property
    def read(self) -> Set[int]:
        """The ledger partitions read since the last commit."""
        return self._read

    @property
    def outgoing(self) -> bool:
        """Whether records wait for the next transaction."""
        return bool(self._outgoing)

    def committed_totals(self) -> dict[str, int]:
        return dict(self._committed_totals)

    def new_state(self) -> PartitionState:
        """An empty state counting into these totals (a restore from the beginning)."""
        return empty_state(self.totals)

    def moved_positions(self, touched: Set[int]) -> dict[tuple[str, int], int]:
        """The input positions a transaction commits: those that moved since the last commit
        and those of the ledger partitions ``touched``; all of them if that is none (a
        transaction always carries offsets: the coordinator checks the member on them)."""
        done = self._committed_positions
        moved = {k: v for k, v in self._positions.items() if k[1] in touched or done.get(k) != v}
        return moved or dict(self._positions)

    # ------------------------------------------------------------------ write

    def install(self, states: Mapping[int, PartitionState], starts: Sequence[TopicPartition]) -> None:
        """Restored partitions join; their inputs resume at ``starts``."""
        if self._expiry is not None:
            self._expiry.assigned(starts)
        self._read.difference_update(states)
        self._positions.update(((tp.topic, tp.partition), tp.offset) for tp in starts)
        self._states.update(states)

    def consumed(self, topic: str, lp: int, next_offset: int) -> None:
        """A batch of ``topic[lp]`` was read up to ``next_offset`` (exclusive)."""
        self._positions[(topic, lp)] = next_offset
        self._read.add(lp)

    def queue(self, lp: int, record: Outgoing) -> None:
        """A record for the next transaction, of ledger partition ``lp``."""
        self._outgoing.append((lp, record))

    def take_outgoing(self) -> list[tuple[int, Outgoing]]:
        out, self._outgoing = self._outgoing, []
        return out

    def take_read(self) -> set[int]:
        """The partitions read since the last commit; none from now on."""
        read, self._read = self._read, set()
        return read

    def committed(self, positions: Mapping[tuple[str, int], int]) -> None:
        """A transaction committed ``positions`` and the totals as they are now."""
        self._committed_positions.update(positions)
        self._committed_totals = dict(self.totals)

    def drop(self, lps: Set[int]) -> dict[int, PartitionState]:
        """Partitions leave (revoked, lost, rewound, or everything on a rejoin): their states
        (returned), positions, reads and the outputs not committed yet, which their next owner
        derives again from the changelog and the inputs after the committed offsets
        (quarantines too)."""
        dropped = {lp: st for lp in lps if (st := self._states.pop(lp, None)) is not None}
        for tp in [tp for tp in self._positions if tp[1] in lps]:
            del self._positions[tp]
        self._read -= lps
        self._outgoing = [(lp, rec) for lp, rec in self._outgoing if lp not in lps]
        if self._expiry is not None:
            self._expiry.forget(lps)
        if self._reading is not None:
            self._reading.forget(lps)
        return dropped

    def rewind_totals(self) -> None:
        """What was counted since the last commit is taken back (an abort, a rejoin): the same
        dict, which every state counts into."""
        self.totals.clear()
        self.totals.update(self._committed_totals)
