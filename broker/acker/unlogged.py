"""Restoring the entries the changelog leaves out, from ``ns.persist`` (docs/design.md §5).

The changelog holds what ``ns.persist`` does not: an entry whose persist record is all of it
(registered with the record's deadline, no event, mark, touch or decision yet) has no
changelog record, and none when it leaves. The counters record of each transaction carries
the partition's *restore floor*, at or below the persist offset of every such entry
(broker.acker.commit.restore_floor). After
its changelog is read, a partition being restored (a takeover, a rewind, a warm or standby
state taken) gets them back from ``ns.persist[lp]``:

1. read from the floor **to the end** of the log (``read_committed``; the end as the read
   began, after the committed offsets were fetched - so every tombstone the transactions
   behind those offsets wrote is in it), keeping the first record of each srid below the
   committed persist offset and dropping a srid at its tombstone (it left: completed,
   replayed, dead-lettered);
2. register what is left and not in the table already, through ``Ingest.register`` (with
   the records' deadlines: an entry with an adaptive deadline is logged, never left out, so
   it comes back from the changelog), counting nothing again: the restored counters hold
   them, and a bad record was quarantined when it was first read;
3. make them DIRTY, so the first commit of the restored state logs them. An entry may stay
   out of the changelog for ``AckerConfig.unlogged_ms`` of the acker's clock from the commit
   that first passed its persist record (docs/design.md §6, *Durable*), and only the state
   this one replaces knew when that was (``PartitionState.commit_positions``): after a
   takeover, or a rewind after failed commits, the time may be up already. They are few
   (what was registered since the last commit that logged the older ones), so logging them
   at once costs little.

Records at and after the committed offset are the main consumer's, as ever. The main
consumer is not sought back to the floor instead: the lag gate moves on with the records
ahead of a re-registered entry, which could then time out before its tombstone is read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from broker.acker.changelog import ChangelogReader
from broker.acker.state import PartitionState
from broker.topics import Namespace

log = logging.getLogger(__name__)

# Registers persist records read again (``Ingest.register`` with ``again``).
Register = Callable[[PartitionState, int, list[Message]], None]


@dataclass
class UnloggedJob:
    """One partition's read of ``ns.persist`` from its floor ``start`` to ``end``."""

    lp: int
    state: PartitionState
    start: int
    committed: int
    end: int
    # persist key -> its first record below ``committed`` not tombstoned after it
    records: dict[bytes, Message] = field(default_factory=dict)
    read: int = 0
    reading: bool = False
    done: bool = False


class Unlogged:
    """Reads the restore floor's suffix of ``ns.persist`` with the changelog's restorer."""

    def __init__(self, ns: Namespace, changelog: ChangelogReader, register: Register) -> None:
        self.ns = ns
        self.changelog = changelog
        self.register = register

    def begin(
        self, lp: int, st: PartitionState, committed: int, marks: tuple[int, int] | None = None
    ) -> UnloggedJob | None:
        """The read for ``lp`` restored into ``st``, whose persist input resumes at
        ``committed``; None when nothing below it is left out of the changelog. ``marks``:
        the watermarks of ``ns.persist[lp]``, asked after ``committed`` was."""
        if st.floor is None or st.floor >= committed:
            return None
        low, high = marks if marks is not None else self.changelog.watermarks(lp, self.ns.persist)
        if low > st.floor:
            # Deleted (DeleteRecords, a retention policy) before their entries were logged: a
            # clean hand-over logs every entry first, a crash does not (docs/design.md, Known gaps).
            log.error(
                "%s[%d] starts at %d, above the restore floor %d: the records registered from "
                "offsets %d..%d and not logged yet are lost, without a dead letter",
                self.ns.persist, lp, low, st.floor, st.floor, low - 1,
            )
        return UnloggedJob(lp, st, max(st.floor, low), committed, high)

    def start(self, job: UnloggedJob) -> None:
        """Begin the read (the changelog's restorer adds the partition); an empty one is
        finished at once."""
        if job.done or job.reading:
            return
        if job.end <= job.start:
            self._finish(job)
            return
        job.records.clear()  # from the floor again if the read was cancelled meanwhile
        self.changelog.read_for(job, TopicPartition(self.ns.persist, job.lp, job.start), lambda msgs: self._read(job, msgs))

    def advance(self, job: UnloggedJob, budget_s: float | None) -> bool:
        """Read for about ``budget_s`` (None: to the end); once at the end, register what
        is left out. True once done."""
        self.start(job)
        return self.changelog.drive(job, budget_s)

    def _read(self, job: UnloggedJob, msgs: list[Message]) -> None:
        at_end = False
        for msg in msgs:
            err = msg.error()
            if err is None:
                job.read += 1
                key = msg.key() or b""
                if msg.value() is None:
                    job.records.pop(key, None)  # the srid left
                elif msg.offset() < job.committed:
                    job.records.setdefault(key, msg)
            elif err.code() == KafkaError._PARTITION_EOF:
                # read_committed stops at the last stable offset: the end is reached once
                # transactions open before it are decided
                at_end = at_end or msg.offset() >= job.end
            else:
                raise KafkaException(err)
        if at_end:
            self._finish(job)

    def _finish(self, job: UnloggedJob) -> bool:
        self.changelog.cancel(job)
        job.done = True
        msgs = sorted(job.records.values(), key=lambda m: m.offset())
        job.records = {}
        if msgs:
            # Not the srids the changelog holds (a bad key is left to ``register``: it drops it)
            keys = b"".join(k if len(k) == 8 else bytes(8) for k in (m.key() or b"" for m in msgs))
            srids = np.frombuffer(keys, ">i8").astype(np.int64)
            absent = np.ones(srids.size, dtype=bool)
            known = np.flatnonzero(srids != 0)
            order = known[np.argsort(srids[known])]
            absent[order] = job.state.table.hashtable.lookup(srids[order]) < 0
            msgs = [m for m, a in zip(msgs, absent.tolist(), strict=True) if a]
        if msgs:
            self.register(job.state, job.lp, msgs)
            job.state.table.log_older(job.committed)
        log.info(
            "ledger partition %d: %d entries left out of its changelog registered again from %s[%d] "
            "(offsets %d..%d read, %d records)", job.lp, len(msgs), self.ns.persist, job.lp, job.start, job.end, job.read,
        )
        return True

    def cancel(self, job: UnloggedJob) -> None:
        self.changelog.cancel(job)
