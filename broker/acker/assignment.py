"""The acker's side of its consumer group (docs/design.md §5, "Assignment and restore"): the
rebalance callbacks, the restores they start, and where each input partition resumes.

Owned by ``Acker`` (broker.acker.service), which hands it the owner of the partitions'
states (broker.acker.owned), shared with the loop and the commit. On assignment the committed
offsets are fetched first (stable ones: this waits out a transaction a dead owner left open),
then the changelog is read (and ``ns.persist`` from the restore floor, broker.acker.unlogged),
then the inputs resume - so restored state and input positions come from the same commit.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, TopicPartition

from broker.acker.commit import Transactions
from broker.acker.config import AckerConfig
from broker.acker.live import LiveClients
from broker.acker.owned import OwnedPartitions
from broker.acker.restoring import Pending, Restores
from broker.acker.state import PartitionState
from broker.errors import ReplayBrokerError
from broker.kafka_io import retrying
from broker.ranges import counted
from broker.topics import Namespace

log = logging.getLogger("broker.acker")
_ALL_OFFSETS = 2**63 - 1  # above every persist offset

RESTORE_SLICE_S = AckerConfig.restore_slice_ms / 1000
"""Changelog reading per loop iteration while partitions restore, at least: the owned ones
fold between (``restore_slice``)."""
RESTORE_SLICE_MAX_S = AckerConfig.restore_slice_max_ms / 1000


def restore_slice(commit_s: float, low_s: float = RESTORE_SLICE_S, high_s: float = RESTORE_SLICE_MAX_S) -> float:
    """The restore's share of one loop iteration: as long as the last commit took (between
    ``low_s`` and ``high_s``), so a restore gets about half the loop however long a commit
    takes: a fixed slice would shrink the restore's share as commits grow with P, and a
    ``committed()`` against a loaded coordinator would time out within its slice and be asked
    again only one commit later."""
    return min(max(low_s, commit_s), high_s)


SEEK_RETRY_S = 30.0
"""How long a restored partition's seek may keep failing (its fetcher still starting) before
the acker gives up."""


class Assignment:
    """Rebalance callbacks and restores of an ``Acker`` (see the module doc). It owns what a
    restore leaves to do (inputs to seek and resume) and whether a rebalance ran since the
    last poll; the partitions come and go through their owner (broker.acker.owned)."""

    def __init__(
        self,
        *,
        ns: Namespace,
        live: LiveClients,
        owned: OwnedPartitions,
        restores: Restores,
        transactions: Transactions,
        commit: Callable[[], None],
    ) -> None:
        self.ns = ns
        self.live = live
        self.owned = owned
        self.restores = restores
        self.changelog = restores.changelog
        self.transactions = transactions
        self.commit = commit  # what a revocation commits before the partitions go
        self.partitions = 0  # ledger partitions, known from Acker.start()
        self.last_assignment: dict[str, object] = {}
        # Restored partitions whose inputs are still to be sought and resumed (resume_restored).
        self.to_resume: list[TopicPartition] = []
        self._seek_failing_since: float | None = None
        self.rebalanced = False  # a rebalance callback ran since the last poll
        self.changes = 0  # partitions installed or dropped so far (a quiet acker: Acker.commit)

    def subscribe(self) -> None:
        """Join the group with the current consumer, these callbacks handling its rebalances."""
        self.live.consumer.subscribe(
            [self.ns.persist, self.ns.acks],
            on_assign=self.on_assign,
            on_revoke=self.on_revoke,
            on_lost=self.on_lost,
        )

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.rebalanced = True
        lps = sorted({tp.partition for tp in partitions if tp.topic == self.ns.persist})
        acks = sorted({tp.partition for tp in partitions if tp.topic == self.ns.acks})
        if lps != acks:
            log.error("assignment is not co-partitioned: persist %s acks %s", lps, acks)
        # Restored here if it takes less than a slice (a warm or standby state, a small
        # changelog, no transaction of a dead owner to wait out), else in the poll loop
        # (broker.acker.restoring): the inputs wait, paused, and the partitions already owned
        # go on folding meanwhile.
        pending = self.restores.add(lps, partitions)
        deadline = time.monotonic() + self.live.configs.config.assign_restore_ms / 1000
        done = None
        while done is None and time.monotonic() < deadline:
            done = self.restores.step(max(deadline - time.monotonic(), 0.001))
        assigned = pending.starts or partitions
        if self.live.incremental:
            consumer.incremental_assign(assigned)
        else:
            consumer.assign(assigned)
        if done is pending:
            self.restored(pending, resume=False)
            # librdkafka keeps a partition's pause across an unassign and a new assignment: a
            # rewind that paused these inputs, then lost them, would leave them paused for good
            # (an acker cut off mid-rewind gets its partitions back, restores them here and
            # would never fetch again).
            consumer.resume(assigned)
        else:
            consumer.pause(assigned)
        self.changelog.assign_standby(self.partitions, self.owned_lps())

    def restored(self, done: Pending, *, resume: bool = True) -> None:
        """A callback's partitions are restored: install them and let their inputs flow."""
        starts = done.starts
        assert starts is not None
        lps = sorted(done.states)
        owned = sorted(set(self.owned.states) | set(lps))
        seconds = time.monotonic() - done.began
        # Before the states: whoever sees them owned (another thread) sees this too.
        self.last_assignment = {
            "partitions": lps,
            "owned": owned,
            "from_standby": done.warm,
            "changelog_records_read": done.read,
            "entries": sum(len(st.table) for st in done.states.values()),
            "seconds": seconds,
        }
        self.owned.install(done.states, starts)
        self.changes += 1
        if resume:
            self.to_resume = [*self.to_resume, *starts]
            self.resume_restored()
        log.info(
            "assigned ledger partitions %s (owning %s): %d from standby/warm state, %d changelog records read, "
            "%d entries, %.3fs",
            counted(lps), counted(owned), done.warm, done.read, self.last_assignment["entries"], seconds,
        )

    def resume_restored(self) -> None:
        """Seek the restored partitions' inputs to their starts (anything fetched before the
        pause is read again) and resume them. A seek right after a takeover's assignment can
        fail with "Erroneous state" while the partition's fetcher is still starting; such a
        partition stays paused and is sought again at the next step
        (for up to ``SEEK_RETRY_S``), instead of the acker exiting."""
        waiting: list[TopicPartition] = []
        for tp in self.to_resume:
            if tp.partition not in self.owned.states:
                continue  # revoked or lost meanwhile
            try:
                self.live.consumer.seek(tp)
            except KafkaException as exc:
                if self._seek_failing_since is None:
                    self._seek_failing_since = time.monotonic()
                elif time.monotonic() - self._seek_failing_since > SEEK_RETRY_S:
                    raise
                log.debug("seek of %s[%d] to %d failed (%s): tried again", tp.topic, tp.partition, tp.offset, exc)
                waiting.append(tp)
                continue
            self.live.consumer.resume([tp])
            self.rebalanced = True  # resumed fetchers need waking too
        self.to_resume = waiting
        if not waiting:
            self._seek_failing_since = None

    def owned_lps(self) -> set[int]:
        """Ledger partitions owned: restored, or restoring."""
        return set(self.owned.states) | self.restores.lps

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.rebalanced = True
        lps = {tp.partition for tp in partitions if tp.topic == self.ns.persist}
        self.restores.cancel(lps)
        # A hand-over logs every entry: the next owner then needs no ns.persist record of
        # them (one deleted meanwhile would leave no trace), and this table is all in the
        # changelog, to be kept warm.
        for lp in lps:
            if (st := self.owned.states.get(lp)) is not None:
                st.table.log_older(_ALL_OFFSETS)
        clean = True
        try:
            self.commit()
        except ReplayBrokerError:
            clean = False
        self.restores.cancel(lps)  # a failed commit schedules a rewind of what it touched
        # After a successful commit a partition's table equals its changelog: keep it as a
        # warm standby, so getting the partition back (range rebalances are eager) costs a
        # catch-up read, not a restore. A table ahead of its changelog is dropped instead.
        clean = clean and not self.owned.outgoing
        dropped = self.drop(lps)
        self.changelog.keep_warm({
            lp: st for lp, st in dropped.items() if clean and not st.failures and not st.tombstones
        })
        self.changelog.assign_standby(self.partitions, self.owned_lps())
        if self.live.incremental:
            consumer.incremental_unassign(partitions)
        log.info("revoked ledger partitions %s (owning %s)", counted(lps), counted(self.owned.states))

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.rebalanced = True
        # Someone else owns them now: nothing of ours may be committed for them, and the
        # tables may be ahead of their changelogs.
        self.transactions.abort()
        # Lost after the group stopped hearing from us (a network partition): the producer
        # came through the same outage, and once partitions are owned again its
        # send_offsets_to_transaction can block for good (librdkafka #5456). A new
        # one (the same transactional id) aborts whatever is open and finds its coordinators.
        self.live.producer_stale = True
        lps = {tp.partition for tp in partitions if tp.topic == self.ns.persist}
        self.restores.cancel(lps)
        self.drop(lps)
        self.changelog.assign_standby(self.partitions, self.owned_lps())
        if self.live.incremental:
            consumer.incremental_unassign(partitions)
        log.warning("lost ledger partitions %s (owning %s)", counted(lps), counted(self.owned.states))

    def drop(self, lps: set[int]) -> dict[int, PartitionState]:
        """Partitions leave (broker.acker.owned: ``drop``), and their inputs still to be
        resumed with them. Returns their states."""
        self.changes += 1
        self.to_resume = [tp for tp in self.to_resume if tp.partition not in lps]
        return self.owned.drop(lps)

    def wake_fetchers(self) -> None:
        """librdkafka pauses every partition's fetcher while a rebalance callback runs; the
        partitions that stay are resumed afterwards, but a fetcher with nothing else to do
        notices only at its next wake-up, up to a second later, so every membership change
        would stall the partitions that did not move. A request to each
        leader wakes their fetchers now (one ListOffsets per leader, once per rebalance: after
        the poll in which a callback ran)."""
        if not self.rebalanced:
            return
        self.rebalanced = False
        if not self.live.incremental or not self.owned.states:
            return
        now_ms = int(time.time() * 1000)
        owned = [TopicPartition(t, lp, now_ms) for lp in self.owned.states for t in (self.ns.persist, self.ns.acks)]
        with contextlib.suppress(KafkaException, RuntimeError):
            self.live.consumer.offsets_for_times(owned, timeout=5)


def committed_starts(live: LiveClients, tps: list[TopicPartition], timeout_s: float) -> list[TopicPartition] | None:
    """Where the inputs resume: their stable committed offsets. Asking for them waits
    for any transaction a dead owner left open, so the changelog read after them ends
    past everything they reflect. None while that is not settled yet (asked again)."""
    try:
        committed = live.consumer.committed(tps, timeout=timeout_s)
    except KafkaException as exc:
        log.debug("committed offsets not known yet (%s)", exc)
        return None
    return start_positions(live.consumer, committed)


def start_positions(consumer: Consumer, committed: list[TopicPartition]) -> list[TopicPartition]:
    """Where each input partition resumes: its committed offset, or its first offset when
    none was committed yet - explicit, so every transaction can commit it."""
    out = []
    for tp in committed:
        offset = tp.offset
        if offset < 0:
            first = TopicPartition(tp.topic, tp.partition)
            offset, _ = retrying(
                functools.partial(consumer.get_watermark_offsets, first, timeout=30),
                f"watermarks of {tp.topic}[{tp.partition}]",
            )
        out.append(TopicPartition(tp.topic, tp.partition, offset))
    return out
