"""Superseded replays (docs/design.md §6): what a commit writes for the late completions and
the settled replays its tables found.

A timed-out srid ``s`` that was replayed as ``s'`` is watched for a while (a WATCH entry with
its XOR value, broker.ledger.table). When late events of ``s`` bring it to 0, the original's
whole tree completed after all, and ``s'`` is superseded. In the same transaction the acker
writes:

1. a marker to ``ns.superseded[s' mod P]``, key ``s'`` -> value ``s`` (8 bytes each,
   compacted): tasks read it and skip ``s'`` - they ack it without working on it, so it
   completes like any tree;
2. an ``XorBatch`` with ``superseded = [s']`` to ``ns.acks[s' mod P]``: the acker that owns
   ``s'`` folds it like any event (transactionally, in the changelog) and sets SUPERSEDED, so
   that ``s'`` is never replayed or dead-lettered - when it times out or fails, it is settled:
   tombstoned as completed (its origin completed, through ``s``), counted in
   ``superseded_settled``. The marker comes after ``s'``'s persist record (an earlier
   transaction) but may be folded before it (persist and acks are read apart): an unknown
   ``s'`` gets an unregistered SUPERSEDED entry that its persist record registers; if none
   comes, the replay had completed already and the mark expires as an orphan, counted in
   ``superseded_unknown``.

Either way the origin ends once: ``s`` has outcome ``replay`` and ``s'`` ``completed``.

A completion read in a step wins over a dead letter decided in the same step
(``hand_on``): before the commit decides anything, the late completions its folds found are
marked on the replays this acker owns - at once, in the tables, so the same transaction's
changelog carries them - and handed on down a chain. Only a replay owned elsewhere gets the
mark through ``ns.acks``. Without this, a completion read just after the end of the window
that holds the replay's dead letter would write the dead letter and the marker in one commit:
the mark would go out through ``ns.acks`` after the window it was meant to close.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from broker import ids
from broker.acker.payloads import PayloadCache
from broker.acker.replay import Outgoing
from broker.acker.state import PartitionState
from broker.headers import OUTCOME_COMPLETED
from broker.schemas import XorBatch
from broker.topics import Namespace

PRODUCER = "acker"
"""``XorBatch.producer`` of the acker's own superseded marks."""


@dataclass(frozen=True)
class LateCompletion:
    """A watched attempt ``original`` (of ledger partition ``lp``) whose tree completed late:
    its replay ``replay`` is superseded."""

    lp: int
    original: int
    replay: int


def hand_on(
    states: Mapping[int, PartitionState], partitions: int, orphan_tick: int,
    busy: dict[int, PartitionState] | None = None,
) -> list[LateCompletion]:
    """Mark the replays of every late completion found since the last commit as superseded
    where this acker owns them, and return the late completions (for ``take``).

    Called before the commit decides anything: a held dead letter of a replay whose original
    completed in this step is settled, not decided (docs/design.md §6, the fate rule: a
    decision that ends an attempt waits until everything that could change it has been
    read and applied). A mark that reaches a replay which was itself replayed (a WATCH) is
    handed on to the next one, round after round, to the end of the chain.

    ``busy``: the partitions to look in (None: all of ``states``); a partition given a mark
    joins it."""
    late: list[LateCompletion] = []
    among = states if busy is None else busy
    while True:
        owned: dict[int, list[int]] = defaultdict(list)
        for lp, st in among.items():
            found = st.table.take_superseded()
            if not len(found):
                continue
            st.count("superseded", len(found))
            for original, replay in zip(found.srids.tolist(), found.offsets.tolist(), strict=True):
                late.append(LateCompletion(lp, original, replay))
                target = ids.ledger_partition(replay, partitions)
                if target in states:
                    owned[target].append(replay)
        if not owned:
            return late
        for target, replays in owned.items():
            st = states[target]
            st.count("superseded_marks", len(replays))
            st.table.mark_superseded(np.array(replays, np.int64), orphan_tick)
            if busy is not None:
                busy[target] = st


def take(
    states: Iterable[tuple[int, PartitionState]], late: Iterable[LateCompletion], ns: Namespace, partitions: int,
    markers: bool, cache: PayloadCache, owned: Container[int] | None = None,
) -> list[tuple[int, Outgoing]]:
    """The outputs of the late completions (``hand_on``'s): a marker each, and a superseded
    mark for each replay owned elsewhere; and the settled superseded replays moved to their
    state's tombstones. ``markers``: whether ``ns.superseded`` exists (a namespace created
    before it has no task-side skip). ``owned``: the partitions this acker owns (None: those
    of ``states``)."""
    out: list[tuple[int, Outgoing]] = []
    empty = np.empty(0, np.int64)
    seen: set[int] = set()
    for lp, st in states:
        seen.add(lp)
        settled = st.table.take_settled()
        if len(settled):
            srids = settled.srids.tolist()
            st.count("superseded_settled", len(srids))
            st.tombstones.append((settled.srids, OUTCOME_COMPLETED))
            cache.discard_many(srids)
    elsewhere: dict[tuple[int, int], list[int]] = defaultdict(list)
    for c in late:
        target = ids.ledger_partition(c.replay, partitions)
        if markers:
            out.append((c.lp, Outgoing(ns.superseded, target, ids.encode_id(c.replay), ids.encode_id(c.original))))
        if target not in (seen if owned is None else owned):
            elsewhere[(c.lp, target)].append(c.replay)
    for (lp, target), replays in sorted(elsewhere.items()):
        mark = XorBatch(target, empty, empty, empty, PRODUCER, superseded=np.array(replays, np.int64))
        out.append((lp, Outgoing(ns.acks, target, None, mark.encode())))
    return out
