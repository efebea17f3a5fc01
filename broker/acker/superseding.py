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
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from broker import ids
from broker.acker.payloads import PayloadCache
from broker.acker.state import PartitionState
from broker.headers import OUTCOME_COMPLETED
from broker.replay import Outgoing
from broker.schemas import XorBatch
from broker.topics import Namespace

PRODUCER = "acker"
"""``XorBatch.producer`` of the acker's own superseded marks."""


def take(
    states: Iterable[tuple[int, PartitionState]], ns: Namespace, partitions: int, markers: bool, cache: PayloadCache,
) -> list[tuple[int, Outgoing]]:
    """The outputs of every state's late completions (marker, superseded mark), and the
    settled superseded replays moved to the state's tombstones. ``markers``: whether
    ``ns.superseded`` exists (a namespace created before it has no task-side skip)."""
    out: list[tuple[int, Outgoing]] = []
    empty = np.empty(0, np.int64)
    for lp, st in states:
        settled = st.table.take_settled()
        if len(settled):
            srids = settled.srids.tolist()
            st.count("superseded_settled", len(srids))
            st.tombstones.append((settled.srids, OUTCOME_COMPLETED))
            cache.discard_many(srids)
        late = st.table.take_superseded()
        if not len(late):
            continue
        st.count("superseded", len(late))
        by_lp: dict[int, list[int]] = defaultdict(list)
        for original, replay in zip(late.srids.tolist(), late.offsets.tolist(), strict=True):
            target = ids.ledger_partition(replay, partitions)
            by_lp[target].append(replay)
            if markers:
                out.append((lp, Outgoing(ns.superseded, target, ids.encode_id(replay), ids.encode_id(original))))
        for target, replays in sorted(by_lp.items()):
            mark = XorBatch(target, empty, empty, empty, PRODUCER, superseded=np.array(replays, np.int64))
            out.append((lp, Outgoing(ns.acks, target, None, mark.encode())))
    return out
