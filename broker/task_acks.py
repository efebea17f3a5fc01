"""What a ``Task`` writes to ``ns.acks`` (docs/design.md §4): ``XorBatch`` values of one ledger
partition each - a batch's events (and the fail marks of the inputs it failed), the fail marks
of source records whose outputs could not be delivered, and touches (``TaskContext.touch``:
deadline extensions). All go out through the task's ``Outputs``, so an event batch that fails
to deliver is sent again like any output.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Protocol

import numpy as np

from broker import ids
from broker.delivery import Failed, Outputs, failed_srids
from broker.schemas import XorBatch

log = logging.getLogger("broker.task")  # the task's own lines: a user filters them there

# Per ledger partition: the srids and xors of the inputs acked, and the srids failed.
Events = dict[int, tuple[list[int], list[int], list[int]]]

_EMPTY = np.empty(0, dtype=np.int64)


class Counts(Protocol):
    """The counters of ``broker.task.TaskCounters`` that the writer keeps."""

    acked: int
    undeliverable: int
    dropped: int
    touches: int


class TaskAcks:
    """The task's writer to ``ns.acks``; ``ledger_partitions`` gives P when first needed."""

    __slots__ = ("acks", "counters", "ledger_partitions", "name", "outputs")

    def __init__(
        self, outputs: Outputs, acks: str, name: str, counters: Counts, ledger_partitions: Callable[[], int]
    ) -> None:
        self.outputs = outputs
        self.acks = acks
        self.name = name
        self.counters = counters
        self.ledger_partitions = ledger_partitions

    def send(self, events: Events) -> None:
        """One ``XorBatch`` per ledger partition with the batch's events and fail marks."""
        for lp, (srids, xors, failed) in events.items():
            value = XorBatch(
                lp,
                np.asarray(srids, dtype=np.int64),
                np.asarray(xors, dtype=np.int64),
                np.asarray(failed, dtype=np.int64),
                self.name,
            ).encode()
            self.outputs.produce(self.acks, value=value, partition=lp)

    def touch(self, srid: int, deadline_ms: int) -> None:
        """One touch, sent now: the handler is still running. Its delivery is not waited
        for: a touch that is lost costs at most a replay (the record times out as before)."""
        lp = ids.ledger_partition(srid, self.ledger_partitions())
        value = XorBatch(lp, _EMPTY, _EMPTY, _EMPTY, self.name, np.array([srid], dtype=np.int64),
                         np.array([deadline_ms], dtype=np.int64)).encode()
        self.outputs.produce(self.acks, value=value, partition=lp)
        self.outputs.producer.poll(0)
        self.counters.touches += 1

    def fail_undeliverable(self, lost: list[Failed], events: Events | None = None) -> set[int]:
        """Fail the source records of outputs that cannot be delivered - in ``events`` when
        they are still to be sent, else with fail marks of their own. The acker replays them
        (or sends them to the DLQ after max_attempts) - the existing path for a failed input.
        Returns the srids failed."""
        if not lost:
            return set()
        srids, dropped = failed_srids(lost, self.acks)
        if events is not None:
            self._fail_in_events(srids, events)
        else:
            self._send_fail_marks(srids)
        self.counters.undeliverable += len(srids)
        self.counters.dropped += dropped
        log.warning(
            "%d outputs not deliverable (%s, e.g. to %s) after up to %d retries: failed %d "
            "source records, dropped %d untracked outputs",
            len(lost), lost[0].error, lost[0].topic, self.outputs.retries, len(srids), dropped,
        )
        return srids

    def _fail_in_events(self, srids: set[int], events: Events) -> None:
        """Turn the events of ``srids`` not sent yet into fail marks: the acker must not fold
        an ack for an input whose output is missing."""
        for srid in srids:
            acked, xors, failed = events[ids.ledger_partition(srid, self.ledger_partitions())]
            keep = [i for i, s in enumerate(acked) if s != srid]
            self.counters.acked -= len(acked) - len(keep)
            acked[:], xors[:] = [acked[i] for i in keep], [xors[i] for i in keep]
            if srid not in failed:
                failed.append(srid)

    def _send_fail_marks(self, srids: set[int]) -> None:
        by_lp: dict[int, list[int]] = defaultdict(list)
        for srid in srids:
            by_lp[ids.ledger_partition(srid, self.ledger_partitions())].append(srid)
        for lp, failed in by_lp.items():
            value = XorBatch(lp, _EMPTY, _EMPTY, np.asarray(failed, dtype=np.int64), self.name).encode()
            self.outputs.produce(self.acks, value=value, partition=lp)
        self.outputs.producer.flush()
        if marks_lost := self.outputs.take_failed():
            # Still safe: a source record whose event or fail mark never arrives times out
            # at the acker and is replayed (its persist record is the root of truth).
            log.error(
                "%d fail marks not delivered (%s); their records will time out",
                len(marks_lost), marks_lost[0].error,
            )
