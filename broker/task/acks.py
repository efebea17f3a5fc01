"""What a ``Task`` writes to ``ns.acks`` (docs/design.md §4): ``XorBatch`` values of one ledger
partition each - a batch's events (and the fail marks of the inputs it failed), the fail marks
of source records whose outputs could not be delivered, and touches (``TaskContext.touch``:
deadline extensions), and outage beats (``TaskConfig.outage``: the clock of what waits behind
the task stops, broker.ledger.outages). All but the beats go out through the task's ``Outputs``, so an event batch that fails
to deliver is sent again like any output.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import numpy as np

from broker import ids, kafka_io
from broker.delivery import Failed, Outputs, failed_srids
from broker.headers import scope_header
from broker.schemas import OUTAGE_BEAT_KEY, OutageBeat, XorBatch

log = logging.getLogger("broker.task")  # the task's own lines: a user filters them there

_EMPTY = np.empty(0, dtype=np.int64)


class Events:
    """A batch's events until they are sent: the srids and xors of the inputs acked, and the
    srids failed, in the order they were settled. Flat lists - two appends per input -
    ``send`` splits them by ledger partition once per batch."""

    __slots__ = ("failed", "rejected", "retry_after_ms", "srids", "xors")

    def __init__(self) -> None:
        self.srids: list[int] = []
        self.xors: list[int] = []
        self.failed: list[int] = []
        self.rejected: dict[int, str] = {}  # srid -> why (ctx.reject, a fatal exception)
        self.retry_after_ms: dict[int, int] = {}  # failed srid -> its delay (ctx.fail(retry_after_ms=...))

    def __len__(self) -> int:
        return len(self.srids) + len(self.failed) + len(self.rejected)


def _by_partition(srids: np.ndarray, partitions: int, *columns: np.ndarray) -> dict[int, list[np.ndarray]]:
    """``columns`` (aligned with ``srids``), split by the ledger partition of their srid
    (``ids.ledger_partition``: srid mod P); each part in its original order."""
    if not len(srids):
        return {}
    lps = srids % partitions
    order = np.argsort(lps, kind="stable")
    lps = lps[order]
    columns = tuple(c[order] for c in columns)
    starts = np.flatnonzero(np.concatenate(([True], lps[1:] != lps[:-1]))).tolist()
    ends = [*starts[1:], len(lps)]
    return {int(lps[b]): [c[b:e] for c in columns] for b, e in zip(starts, ends, strict=True)}


class Counts(Protocol):
    """The counters of ``broker.task.TaskCounters`` that the writer keeps."""

    acked: int
    undeliverable: int
    dropped: int
    touches: int


class TaskAcks:
    """The task's writer to ``ns.acks``; ``ledger_partitions`` gives P when first needed."""

    __slots__ = ("acks", "beat_scope", "counters", "ledger_partitions", "name", "outputs")

    def __init__(
        self, outputs: Outputs, acks: str, name: str, counters: Counts, ledger_partitions: Callable[[], int],
        beat_scope: tuple[str, ...] | None = None,
    ) -> None:
        self.outputs = outputs
        self.acks = acks
        self.name = name
        self.counters = counters
        self.ledger_partitions = ledger_partitions
        # The source topics whose records wait behind the task in an outage (None: any,
        # broker.task.outage.beat_scope): what its beats hold.
        self.beat_scope = beat_scope

    def send(self, events: Events) -> None:
        """One ``XorBatch`` per ledger partition with the batch's events and fail marks."""
        if not len(events):
            return
        partitions = self.ledger_partitions()
        srids = np.array(events.srids, dtype=np.int64)
        acked = _by_partition(srids, partitions, srids, np.array(events.xors, dtype=np.int64))
        failed = np.array(events.failed, dtype=np.int64)
        fails = _by_partition(failed, partitions, failed)
        rejects: dict[int, list[np.ndarray]] = {}
        reasons: list[str] = []
        if events.rejected:
            rejected = np.array(list(events.rejected), dtype=np.int64)
            reasons = list(events.rejected.values())
            rejects = _by_partition(rejected, partitions, rejected, np.arange(rejected.size))
        for lp in sorted(acked.keys() | fails.keys() | rejects.keys()):
            lp_srids, lp_xors = acked.get(lp, (_EMPTY, _EMPTY))
            lp_failed, = fails.get(lp, (_EMPTY,))
            lp_rejected, at = rejects.get(lp, (_EMPTY, _EMPTY))
            value = XorBatch(
                lp, lp_srids, lp_xors, lp_failed, self.name,
                rejected=lp_rejected, rejected_reasons=tuple(reasons[i] for i in at.tolist()),
                retry_after_ms=self._retry_after(lp_failed, events.retry_after_ms),
            ).encode()
            self.outputs.produce(self.acks, value=value, partition=lp)

    @staticmethod
    def _retry_after(failed: np.ndarray, asked: dict[int, int]) -> np.ndarray:
        """The retry-after column of ``failed`` (-1: the back-off's), empty when none asked
        for one: such a batch keeps its shorter encoding."""
        if not asked or not any(s in asked for s in failed.tolist()):
            return _EMPTY
        return np.array([asked.get(s, -1) for s in failed.tolist()], dtype=np.int64)

    def touch(self, srid: int, deadline_ms: int) -> None:
        """One touch, sent now: the handler is still running. Its delivery is not waited
        for: a touch that is lost costs at most a replay (the record times out as before)."""
        lp = ids.ledger_partition(srid, self.ledger_partitions())
        value = XorBatch(lp, _EMPTY, _EMPTY, _EMPTY, self.name, np.array([srid], dtype=np.int64),
                         np.array([deadline_ms], dtype=np.int64)).encode()
        self.outputs.produce(self.acks, value=value, partition=lp)
        self.outputs.producer.poll(0)
        self.counters.touches += 1

    def outage_beat(self, since_ms: int, until_ms: int) -> None:
        """The task is in an outage since ``since_ms``: to every ledger partition, stop the
        timeout clock of what is pending there up to ``until_ms`` (broker.ledger.outages) -
        every partition, because the records queued unread behind the task are unknown to it;
        of the records of the source topics ``beat_scope`` (``rb-scope``; None: of every record).
        Not waited for, and not sent again: a lost beat stops the clock less, as if the
        outage were shorter (the records time out as they would without it)."""
        value = OutageBeat(self.name, since_ms, until_ms).encode()
        headers = None if self.beat_scope is None else [scope_header(self.beat_scope)]
        for lp in range(self.ledger_partitions()):
            kafka_io.produce(self.outputs.producer, self.acks, key=OUTAGE_BEAT_KEY, value=value, partition=lp,
                             headers=headers)
        self.outputs.producer.poll(0)

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
        keep = [i for i, s in enumerate(events.srids) if s not in srids]
        self.counters.acked -= len(events.srids) - len(keep)
        events.srids[:], events.xors[:] = [events.srids[i] for i in keep], [events.xors[i] for i in keep]
        events.failed += [s for s in srids if s not in events.failed]

    def _send_fail_marks(self, srids: set[int]) -> None:
        failed = np.array(sorted(srids), dtype=np.int64)
        for lp, (lp_failed,) in _by_partition(failed, self.ledger_partitions(), failed).items():
            value = XorBatch(lp, _EMPTY, _EMPTY, lp_failed, self.name).encode()
            self.outputs.produce(self.acks, value=value, partition=lp)
        self.outputs.producer.flush()
        if marks_lost := self.outputs.take_failed():
            # Still safe: a source record whose event or fail mark never arrives times out
            # at the acker and is replayed (its persist record is the root of truth).
            log.error(
                "%d fail marks not delivered (%s); their records will time out",
                len(marks_lost), marks_lost[0].error,
            )
