"""The acker service: one loop per process serving many ledger partitions (docs/design.md §5).

Inputs ``ns.persist[i]`` and ``ns.acks[i]`` are read ``read_committed`` in one consumer group;
each owned partition has a ``PartitionState`` backed by the compacted changelog
``ns.ledger[i]``. The rooms:

- ``changelog``: restore on assignment, warm states, standby tailing;
- ``ingest``: persist records and XOR batches folded into the tables, bad input quarantined;
- ``decisions``: timeouts and explicit failures turned into replays and dead letters;
- ``commit``: the transaction that writes all of it with the input offsets.

Partition assignment uses the ``range`` assignor: it gives partition i of persist and of acks
to the same member (cooperative-sticky balances each topic on its own and would split them).
On assignment, committed offsets are fetched first (``require_stable``: this waits out any
transaction a dead owner left open), then the changelog is read to its end, then input
consumption resumes - so restored state and input positions come from the same commit.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from broker.acker import superseding
from broker.acker.changelog import Changelog
from broker.acker.commit import Batch, Transactions, is_fatal, is_fenced, positions_of, take_changes
from broker.acker.config import AckerConfig
from broker.acker.decisions import Decided, Decider, collect_failures
from broker.acker.ingest import Ingest
from broker.acker.lag import ExpiryGate
from broker.acker.payloads import PayloadCache, PersistFetcher
from broker.acker.refusals import Refusals
from broker.acker.restoring import Pending, Restores
from broker.acker.state import COUNTERS, PartitionState
from broker.errors import ConfigurationError, ReplayBrokerError
from broker.kafka_io import (
    delete_retention_ms,
    is_transient,
    partition_counts,
    retrying,
    set_group_timeouts,
)
from broker.ledger.adaptive import AdaptiveTimeouts
from broker.ledger.clock import Clock, SystemClock, Ticker
from broker.metrics import (
    AckerMetrics,
    AckerSnapshot,
    MetricsServer,
    PartitionFigures,
    TopicEstimate,
    serve,
)
from broker.replay import Outgoing
from broker.settings import KafkaSettings
from broker.topics import Namespace, check

log = logging.getLogger("broker.acker")

RESTORE_SLICE_S = 0.05
"""Changelog reading per loop iteration while partitions restore: the owned ones fold between."""
REJOIN_BACKOFF_S = 1.0
# How long a restored partition's seek may keep failing (its fetcher still starting) before
# the acker gives up.
SEEK_RETRY_S = 30.0
"""Pause before a group consumer that failed fatally is replaced by a new one."""
INIT_TRANSACTIONS_TIMEOUT_S = 30.0
"""One wait for the transaction coordinator; a transient failure is retried."""

# Client settings librdkafka refuses with the consumer group protocol, and what sets them.
_GROUP_SIDE = {
    "session.timeout.ms": "use AckerConfig.session_timeout_ms (--session-timeout-ms), set on the group",
    "heartbeat.interval.ms": "use AckerConfig.heartbeat_interval_ms, set on the group",
    "partition.assignment.strategy": "the broker's range assignor is used",
}


class Acker:
    def __init__(
        self,
        settings: KafkaSettings,
        namespace: str | Namespace,
        config: AckerConfig | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.ns = namespace if isinstance(namespace, Namespace) else Namespace(namespace)
        self.config = config or AckerConfig()
        self.settings = settings
        self.clock = clock or SystemClock()
        self.ticker = Ticker.starting_at(self.clock, self.config.tick_ms)
        self.group_id = f"{self.ns.name}.acker"
        self.P = 0  # ledger partitions, checked against the cluster by start()
        self.markers = False  # ns.superseded exists with P partitions (checked by start())
        self.states: dict[int, PartitionState] = {}
        self.last_assignment: dict[str, object] = {}
        self.totals: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        # ``totals`` as of the last committed transaction: an aborted one's counts are undone
        # with its state by the rewind, or the inputs read again would be counted twice.
        self._committed_totals = dict(self.totals)
        self.commits = 0
        self.rejoins = 0  # group consumers replaced after a fatal error
        # Commits fenced because their transaction outlived its timeout (the coordinator
        # aborted it); the producer is replaced once partitions are owned again.
        self.fenced_by_timeout = 0
        self._producer_stale = False
        # Restored partitions whose inputs are still to be sought and resumed (_resume_restored).
        self._to_resume: list[TopicPartition] = []
        self._seek_failing_since: float | None = None
        # The input position of EVERY owned partition, committed with every transaction, even
        # where nothing new was read: offsets are what the group coordinator checks against
        # the member's generation, so a member that lost its partitions (stalled past
        # max.poll.interval.ms, or its session expired) cannot commit anything any more.
        self._positions: dict[tuple[str, int], int] = {}
        self._read: set[int] = set()  # ledger partitions whose input was consumed since the last commit
        # Records due in the next transaction, with the ledger partition they belong to: they
        # are dropped with the partition when it is revoked or lost.
        self._outgoing: list[tuple[int, Outgoing]] = []
        self._stop = threading.Event()
        self._started = False
        self._last_commit = time.monotonic()
        self._last_stats = time.monotonic()
        # Clients are created here but talk to Kafka only from start(): building an Acker
        # needs no live cluster.
        # Each client: what the acker's guarantee depends on (``required``: a user override
        # that contradicts it is refused) and tunables (``defaults``: KafkaSettings.extra
        # and AckerConfig.consumer win over them).
        ns, consumer_config = self.ns, settings.consumer_config
        # Records of aborted transactions (persist records, acks, the changelog) never count.
        committed = {"isolation.level": "read_committed"}
        producer_required: dict[str, object] = {
            # A replay topic checked before producing (broker.acker.commit) must not be
            # created by that very look-up, with the broker's default partition count.
            "allow.auto.create.topics": False,
        }
        producer_defaults: dict[str, object] = {"linger.ms": 1, "partitioner": "murmur2_random"}
        if self.config.exactly_once:
            producer_required["transactional.id"] = f"{ns.name}.acker.{self.config.instance_id}"
            producer_defaults["transaction.timeout.ms"] = self.config.transaction_timeout_ms
        self._producer_config = settings.producer_config(required=producer_required, defaults=producer_defaults)
        self._producer = Producer(self._producer_config)
        self._consumer_config = self._group_consumer_config(consumer_config, committed)
        self._consumer = Consumer(self._consumer_config)
        # The consumer protocol hands out and takes back only what changes owner.
        self._incremental = self.config.group_protocol == "consumer"
        self._rebalanced = False  # a rebalance callback ran since the last poll
        restorer = Consumer(
            consumer_config(
                f"{ns.name}.acker.restore",
                required={**committed, "enable.partition.eof": True},
                # EOF is only seen when a fetch comes back empty, and the broker holds
                # an empty fetch (and the requests queued behind it) for this long.
                defaults={
                    "fetch.wait.max.ms": 10,
                    # A restore reads whole partitions: big fetches, few round trips.
                    "max.partition.fetch.bytes": 16 * 1024 * 1024,
                    "fetch.max.bytes": 64 * 1024 * 1024,
                },
            )
        )
        standby = None
        if self.config.standby:
            standby = Consumer(consumer_config(f"{ns.name}.acker.standby", required=committed))
        fetcher = PersistFetcher(
            ns,
            Consumer(
                consumer_config(
                    f"{ns.name}.acker.fetch",
                    required={**committed, "enable.auto.offset.store": False, "enable.partition.eof": True},
                    defaults={"fetch.wait.max.ms": 10},
                )
            ),
        )
        cache = PayloadCache(self.config.replay_cache_entries)
        self.changelog = Changelog(ns, self.ticker, self.totals, restorer, standby, self.clock)
        # One latency estimate per source topic for the whole process (timeout "auto").
        self.adaptive = AdaptiveTimeouts(self.config.adaptive)
        self.ingest = Ingest(
            ns, self.clock, self.ticker, self.config.orphan_ttl_ms, cache, self._outgoing, self.adaptive
        )
        self.decider = Decider(
            ns, self.clock, self.ticker, cache, fetcher, lambda names: partition_counts(settings, names), self.config
        )
        self.restores = Restores(self.changelog, self._committed_starts)
        self.refusals = Refusals(ns.dlq)
        self.decider.refused = self.refusals.replay
        self.transactions = Transactions(
            ns, self._producer, self._consumer, self.refusals, exactly_once=self.config.exactly_once
        )
        self.expiry = ExpiryGate(ns, self._consumer, slack=self.config.expiry_lag_slack)
        # Its own registry (tests run many ackers in one process); served from start() when
        # config.metrics_port is set.
        self.metrics = AckerMetrics(self.clock.now_ms)
        self.metrics_server: MetricsServer | None = None

    @property
    def standby(self) -> dict[int, tuple[PartitionState, int]]:
        return self.changelog.standby

    def _group_consumer_config(self, consumer_config: Callable[..., dict[str, object]], committed: dict[str, str]) -> dict[str, object]:
        """The group consumer's librdkafka settings for the configured group protocol."""
        cfg = self.config
        required: dict[str, object] = {
            **committed,
            # Offsets are stored with the transaction that folded them.
            "enable.auto.offset.store": False,
            # A new group that skipped persist records would never track them.
            "auto.offset.reset": "earliest",
        }
        defaults: dict[str, object] = {
            # Names the member in the group's description and the broker's logs.
            "client.id": f"{self.ns.name}.acker.{cfg.instance_id}",
            "fetch.wait.max.ms": 20,
            "fetch.min.bytes": 262_144,
            "max.poll.interval.ms": 60_000,
        }
        if cfg.group_protocol == "consumer":
            # Partition i of ns.persist, ns.acks and ns.ledger is one ledger partition: the
            # broker-side range assignor gives equal-sized topics' partition i to one member,
            # and moves only what changes owner. Session and heartbeat are the group's
            # (set in start()); librdkafka refuses them here.
            required["group.protocol"] = "consumer"
            required["group.remote.assignor"] = "range"
            for key, instead in _GROUP_SIDE.items():
                if key in cfg.consumer or key in self.settings.extra:
                    raise ConfigurationError(f"{key} cannot be set on the acker's consumer with group_protocol='consumer': {instead}")
        else:
            required["partition.assignment.strategy"] = "range"
            defaults["session.timeout.ms"] = cfg.session_timeout_ms
            defaults["heartbeat.interval.ms"] = cfg.heartbeat_interval_ms
        if cfg.static:
            required["group.instance.id"] = f"{self.ns.name}.acker.{cfg.instance_id}"
        conf = consumer_config(self.group_id, required=required, user=cfg.consumer, defaults=defaults)
        if cfg.group_protocol == "consumer":
            for key in _GROUP_SIDE:  # the common consumer defaults' (a user's were refused above)
                conf.pop(key, None)
        return conf

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Check the namespace's topics and initialise transactions (once)."""
        if self._started:
            return
        self.P = check(self.settings, self.ns)
        self.ingest.partitions = self.decider.partitions = self.P
        # Markers for tasks need ns.superseded (created with the namespace since it exists);
        # without it, superseded replays are still settled, but tasks do not skip them.
        markers = partition_counts(self.settings, [self.ns.superseded])[self.ns.superseded]
        self.markers = markers == self.P
        if not self.markers:
            log.warning(
                "%s %s: tasks cannot skip superseded replays (replaybroker topics create adds it)",
                self.ns.superseded, "does not exist" if markers is None else f"has {markers} partitions, not {self.P}",
            )
        # How long compaction keeps the changelog's tombstones bounds how old a kept
        # (warm/standby) state may be and still be caught up by a suffix read.
        self.changelog.tombstone_retention_ms = delete_retention_ms(self.settings, self.ns.ledger)
        if self.config.group_protocol == "consumer":
            cfg = self.config
            why = set_group_timeouts(self.settings, self.group_id, cfg.session_timeout_ms, cfg.heartbeat_interval_ms)
            if why is not None:
                log.warning(
                    "cannot set session timeout %d ms of group %s (%s): the broker's "
                    "group.consumer.session.timeout.ms applies - a dead acker's partitions wait that long",
                    cfg.session_timeout_ms, self.group_id, why,
                )
        if self.config.exactly_once:
            if self.config.instance_id_generated:
                log.warning(
                    "no --instance-id: using %s; a restart gets a new id, so it does not fence this "
                    "instance's open transaction at once (that waits for transaction_timeout_ms)",
                    self.config.instance_id,
                )
            self._init_transactions()
        self.metrics_server = serve(self.metrics.registry, self.config.metrics_port)
        self._started = True

    def stop(self) -> None:
        self._stop.set()

    def run(
        self,
        *,
        install_signals: bool = False,
        until: Callable[[Acker], bool] | None = None,
    ) -> None:
        """Serve until ``stop()``/SIGTERM/SIGINT (or ``until(self)`` is true); then commit what
        was folded and leave the group cleanly."""
        if install_signals:
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())
        self.start()
        self.changelog.assign_standby(self.P, self.states)
        self._subscribe()
        log.info("acker %s serving %s (P=%d)", self.config.instance_id, self.ns.name, self.P)
        try:
            while not self._stop.is_set():
                self.step()
                if until is not None and until(self):
                    break
            self.commit()
        finally:
            self.close()

    def _subscribe(self) -> None:
        self._consumer.subscribe(
            [self.ns.persist, self.ns.acks],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _rejoin(self, err: KafkaError | None) -> None:
        """The group consumer hit a fatal error (``err``), or the producer was fenced by its
        coordinator (None): out of the group for good. Seen: a static member restarted after
        a kill is refused (UNRELEASED_INSTANCE_ID) until its predecessor's session expires.
        Whatever it owned is someone else's now (as if lost); a new consumer joins again,
        after a pause so a refusal is not a busy loop."""
        if err is not None:
            log.error(
                "group consumer failed (%s); everything it owned is dropped, joining again in %.1fs",
                err.str(), REJOIN_BACKOFF_S,
            )
            self.transactions.abort()
        self.restores.cancel(self._owned())
        self._drop(set(self.states))
        self.totals.clear()  # what was folded since the last commit is dropped with them
        self.totals.update(self._committed_totals)
        self.changelog.assign_standby(self.P, self.states)
        with contextlib.suppress(KafkaException, RuntimeError):
            self._consumer.close()
        self._stop.wait(REJOIN_BACKOFF_S)
        self._consumer = Consumer(self._consumer_config)
        self.transactions.consumer = self.expiry.consumer = self._consumer
        self.rejoins += 1
        self._subscribe()

    def close(self) -> None:
        with contextlib.suppress(KafkaException, RuntimeError):
            self._consumer.close()  # revokes: _on_revoke commits what is left
        with contextlib.suppress(KafkaException, RuntimeError):
            self.changelog.close()
        with contextlib.suppress(KafkaException, RuntimeError):
            self.decider.fetcher.close()
        with contextlib.suppress(KafkaException, RuntimeError):
            self._producer.flush(10)
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None
        self._log_stats()

    # ------------------------------------------------------------------ assignment

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._rebalanced = True
        lps = sorted({tp.partition for tp in partitions if tp.topic == self.ns.persist})
        acks = sorted({tp.partition for tp in partitions if tp.topic == self.ns.acks})
        if lps != acks:
            log.error("assignment is not co-partitioned: persist %s acks %s", lps, acks)
        # Restored here if it takes less than a slice (a warm or standby state, a small
        # changelog, no transaction of a dead owner to wait out), else in the poll loop
        # (broker.acker.restoring): the inputs wait, paused, and the partitions already owned
        # go on folding meanwhile.
        pending = self.restores.add(lps, partitions)
        deadline = time.monotonic() + RESTORE_SLICE_S
        done = None
        while done is None and time.monotonic() < deadline:
            done = self.restores.step(max(deadline - time.monotonic(), 0.001))
        assigned = pending.starts or partitions
        if self._incremental:
            consumer.incremental_assign(assigned)
        else:
            consumer.assign(assigned)
        if done is pending:
            self._restored(pending, resume=False)
        else:
            consumer.pause(assigned)
        self.changelog.assign_standby(self.P, self._owned())

    def _committed_starts(self, tps: list[TopicPartition], timeout_s: float) -> list[TopicPartition] | None:
        """Where the inputs resume: their stable committed offsets. Asking for them waits
        for any transaction a dead owner left open, so the changelog read after them ends
        past everything they reflect. None while that is not settled yet (asked again)."""
        try:
            committed = self._consumer.committed(tps, timeout=timeout_s)
        except KafkaException as exc:
            log.debug("committed offsets not known yet (%s)", exc)
            return None
        return self._start_positions(committed)

    def _restored(self, done: Pending, *, resume: bool = True) -> None:
        """A callback's partitions are restored: install them and let their inputs flow."""
        starts = done.starts
        assert starts is not None
        lps = sorted(done.states)
        owned = sorted(set(self.states) | set(lps))
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
        self.expiry.assigned(starts)
        self._read.difference_update(lps)
        self._positions.update(((tp.topic, tp.partition), tp.offset) for tp in starts)
        self.states.update(done.states)
        if resume:
            self._to_resume = [*self._to_resume, *starts]
            self._resume_restored()
        log.info(
            "assigned ledger partitions %s (owning %s): %d from standby/warm state, %d changelog records read, "
            "%d entries, %.3fs",
            lps, owned, done.warm, done.read, self.last_assignment["entries"], seconds,
        )

    def _resume_restored(self) -> None:
        """Seek the restored partitions' inputs to their starts (anything fetched before the
        pause is read again) and resume them. Seen on a loaded machine: a seek right after a
        takeover's assignment fails with "Erroneous state" while the partition's fetcher is
        still starting; such a partition stays paused and is sought again at the next step
        (for up to ``SEEK_RETRY_S``), instead of the acker exiting."""
        waiting: list[TopicPartition] = []
        for tp in self._to_resume:
            if tp.partition not in self.states:
                continue  # revoked or lost meanwhile
            try:
                self._consumer.seek(tp)
            except KafkaException as exc:
                if self._seek_failing_since is None:
                    self._seek_failing_since = time.monotonic()
                elif time.monotonic() - self._seek_failing_since > SEEK_RETRY_S:
                    raise
                log.debug("seek of %s[%d] to %d failed (%s): tried again", tp.topic, tp.partition, tp.offset, exc)
                waiting.append(tp)
                continue
            self._consumer.resume([tp])
            self._rebalanced = True  # resumed fetchers need waking too
        self._to_resume = waiting
        if not waiting:
            self._seek_failing_since = None

    def _owned(self) -> set[int]:
        """Ledger partitions owned: restored, or restoring."""
        return set(self.states) | self.restores.lps

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._rebalanced = True
        lps = {tp.partition for tp in partitions if tp.topic == self.ns.persist}
        self.restores.cancel(lps)
        clean = True
        try:
            self.commit()
        except ReplayBrokerError:
            clean = False
        self.restores.cancel(lps)  # a failed commit schedules a rewind of what it touched
        # After a successful commit a partition's table equals its changelog: keep it as a
        # warm standby, so getting the partition back (range rebalances are eager) costs a
        # catch-up read, not a restore. A table ahead of its changelog is dropped instead.
        clean = clean and not self._outgoing
        for lp in lps:
            st = self.states.pop(lp, None)
            if st is not None and clean and not st.failures and not st.tombstones:
                self.changelog.keep_warm(lp, st)
        self._drop(lps)
        self.changelog.assign_standby(self.P, self._owned())
        if self._incremental:
            consumer.incremental_unassign(partitions)
        log.info("revoked ledger partitions %s (owning %s)", sorted(lps), sorted(self.states))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._rebalanced = True
        # Someone else owns them now: nothing of ours may be committed for them, and the
        # tables may be ahead of their changelogs.
        self.transactions.abort()
        # Lost after the group stopped hearing from us (a network partition): the producer
        # came through the same outage, and once partitions are owned again its
        # send_offsets_to_transaction was seen to block for good (librdkafka #5456). A new
        # one (the same transactional id) aborts whatever is open and finds its coordinators.
        self._producer_stale = True
        lps = {tp.partition for tp in partitions if tp.topic == self.ns.persist}
        self.restores.cancel(lps)
        self._drop(lps)
        self.changelog.assign_standby(self.P, self._owned())
        if self._incremental:
            consumer.incremental_unassign(partitions)
        log.warning("lost ledger partitions %s (owning %s)", sorted(lps), sorted(self.states))

    def _drop(self, lps: set[int]) -> None:
        for lp in lps:
            self.states.pop(lp, None)
        self._positions = {tp: o for tp, o in self._positions.items() if tp[1] not in lps}
        self._read -= lps
        self._to_resume = [tp for tp in self._to_resume if tp.partition not in lps]
        self.expiry.forget(lps)
        # Outputs not committed yet go with the partition: its next owner re-derives them
        # from the changelog and the inputs after the committed offsets (quarantines too).
        self._outgoing[:] = [(lp, rec) for lp, rec in self._outgoing if lp not in lps]

    def _wake_fetchers(self) -> None:
        """librdkafka pauses every partition's fetcher while a rebalance callback runs; the
        partitions that stay are resumed afterwards, but a fetcher with nothing else to do
        notices only at its next wake-up, up to a second later - every membership change
        stalled the partitions that did not move for about a second. A request to each
        leader wakes their fetchers now (one ListOffsets per leader, once per rebalance)."""
        if not self._incremental or not self.states:
            return
        now_ms = int(time.time() * 1000)
        owned = [TopicPartition(t, lp, now_ms) for lp in self.states for t in (self.ns.persist, self.ns.acks)]
        with contextlib.suppress(KafkaException, RuntimeError):
            self._consumer.offsets_for_times(owned, timeout=5)

    def _start_positions(self, committed: list[TopicPartition]) -> list[TopicPartition]:
        """Where each input partition resumes: its committed offset, or its first offset when
        none was committed yet - explicit, so every transaction can commit it."""
        out = []
        for tp in committed:
            offset = tp.offset
            if offset < 0:
                first = TopicPartition(tp.topic, tp.partition)
                offset, _ = retrying(
                    functools.partial(self._consumer.get_watermark_offsets, first, timeout=30),
                    f"watermarks of {tp.topic}[{tp.partition}]",
                )
            out.append(TopicPartition(tp.topic, tp.partition, offset))
        return out

    # ------------------------------------------------------------------ folding

    def step(self) -> int:
        """Poll once, fold what came, commit when the interval is due. Returns messages read."""
        # poll() returns as soon as one message is there; consume(n, timeout) would wait the
        # whole timeout unless n messages arrive, adding up to poll_timeout_ms to every event.
        first = self._consumer.poll(self.config.poll_timeout_ms / 1000)
        msgs: list[Message] = []
        if first is not None:
            msgs.append(first)
            if self.config.batch_size > 1:
                msgs.extend(self._consumer.consume(self.config.batch_size - 1, 0))
        if self.restores.pending:
            done = self.restores.step(RESTORE_SLICE_S)
            if done is not None:
                self._restored(done)
        if self._to_resume:
            self._resume_restored()
        if self._rebalanced:
            self._rebalanced = False
            self._wake_fetchers()
        if msgs:
            fatal = next((m.error() for m in msgs if m.error() is not None and m.error().code() == KafkaError._FATAL), None)
            if fatal is not None:
                self._rejoin(fatal)
                return 0
            self._fold_messages(msgs)
        now = time.monotonic()
        if (now - self._last_commit) * 1000 >= self.config.commit_interval_ms:
            self.commit()
            self.changelog.poll_standby()
        if now - self._last_stats >= self.config.stats_interval_ms / 1000:
            self._log_stats()
        return len(msgs)

    def _fold_messages(self, msgs: list[Message]) -> None:
        persist: dict[int, list[Message]] = defaultdict(list)
        acks: dict[int, list[Message]] = defaultdict(list)
        states, persist_topic = self.states, self.ns.persist
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", err)
                continue
            partition = msg.partition()
            if partition not in states:
                continue  # revoked while in flight
            (persist if msg.topic() == persist_topic else acks)[partition].append(msg)
        # A partition's messages come in offset order: its position is after the last one.
        self._read.update(persist, acks)
        for lp, batch in persist.items():
            self._positions[(persist_topic, lp)] = batch[-1].offset() + 1
            self.ingest.register(states[lp], lp, batch)
        for lp, batch in acks.items():
            self._positions[(self.ns.acks, lp)] = batch[-1].offset() + 1
            self.ingest.fold(states[lp], lp, batch)

    # ------------------------------------------------------------------ commit

    def commit(self) -> None:
        """One transaction: expiry decisions, tombstones, replays/DLQ, changelog, offsets
        (broker.acker.commit has the order and why); then the metrics' snapshot."""
        began = time.perf_counter()
        if self._commit():
            self.metrics.commit_seconds.observe(time.perf_counter() - began)
        self._publish_metrics()

    def _commit(self) -> bool:
        """``commit`` without the metrics. Returns whether a transaction was committed."""
        self._last_commit = time.monotonic()
        if not self.states:
            return False  # owning nothing, nothing may be written (what was due left with the partitions)
        if self._producer_stale:
            self._new_producer()  # fenced by a timed-out transaction, and a member again
        now_ms = self.clock.now_ms()
        # Every decision that ends a record - expiry, orphans, deferred and held decisions -
        # only as far as the partition's inputs have been read: a backlog of acks is no
        # timeout. Per ledger partition: one lagging input holds back only its own partition.
        expiry_ticks = self.expiry.ticks(self.states, self.ticker, now_ms)
        collect_failures(self.states, now_ms, expiry_ticks, self.config.fail_hold_ms, self.adaptive)
        out = list(self._outgoing)
        self._outgoing.clear()
        decided: list[Decided] = []
        self.decider.decide(self.states, decided, expiry_ticks)
        # Failures come out of the table in srid / slot order. Produce the replays in the
        # order the originals were persisted instead, so the failures of one key decided in
        # one commit keep the key's order on <topic>.replay.
        decided.sort(key=lambda d: (d[0], d[1]))
        for _, _, lp, records in decided:
            out.extend((lp, rec) for rec in records)
        # Late completions of watched replays: markers and superseded marks; superseded
        # replays that timed out or failed: settled.
        out.extend(superseding.take(self.states.items(), self.ns, self.P, self.markers, self.decider.cache))
        # Every failure is decided now or deferred in its table (an unreadable payload):
        # nothing makes the commit wait.
        batch = Batch()
        for lp, rec in out:
            smaller = self.refusals.degrade(rec)  # a dead letter the DLQ refused before
            if smaller is not None:
                self.states[lp].count("refused")
            batch.records.append(smaller or rec)
        take_changes(self.states.items(), self.ticker, self.clock.now_ms(), batch)
        if not batch and not self._read:
            return False
        batch.positions = list(positions_of(self._positions))
        # What this transaction changes: the partitions read, and those it writes for.
        touched = self._read | {lp for lp, *_ in batch.changelog} | {lp for lp, *_ in batch.tombstones}
        self._read = set()
        try:
            self.transactions.write(batch)
        except KafkaException as exc:
            self._on_commit_error(exc, touched)
            return False
        self.refusals.settle(batch.records)
        self.commits += 1
        self._committed_totals = dict(self.totals)
        return True

    def _publish_metrics(self) -> None:
        """The figures of every owned partition as of this commit, for the next scrapes: a
        copy per partition per commit, so nothing is counted twice on the hot path and the
        server's thread never reads a dict the loop is changing."""
        for st in self.states.values():
            if st.pending is None:  # restored from an older counters record: once
                st.summarize()
        self.metrics.publish(AckerSnapshot(
            {
                lp: PartitionFigures(dict(st.counters), st.pending, st.oldest_pending_ms)
                for lp, st in self.states.items()
            },
            {key: inp.lag for key, inp in self.expiry.inputs.items()},
            {
                topic: TopicEstimate(e.timeout_ms, e.quantile_ms, e.samples)
                for topic, e in self.adaptive.estimates(self.clock.now_ms()).items()
            },
        ))

    def _on_commit_error(self, exc: KafkaException, touched: set[int]) -> None:
        err = exc.args[0] if exc.args else None
        if is_fenced(exc) and self.transactions.outlived(self.config.transaction_timeout_ms):
            # Seen after a broker outage longer than the transaction timeout: the coordinator
            # came back, aborted the transaction it found expired and bumped our epoch. No
            # other instance is involved - but one may be (a paused zombie fenced by its
            # successor looks the same), so this instance does not simply start a new producer,
            # which would fence a successor: it leaves the group, drops what it owned and joins
            # again; a new producer is started only once it owns partitions again (a successor
            # holding our instance id keeps it out of the group).
            log.warning(
                "commit failed (%s): the transaction outlived transaction.timeout.ms (%d ms), its "
                "coordinator aborted it; everything owned is dropped, joining the group again in %.1fs "
                "(a new producer once partitions are owned again)",
                err, self.config.transaction_timeout_ms, REJOIN_BACKOFF_S,
            )
            self.fenced_by_timeout += 1
            self._producer_stale = True
            self._rejoin(None)
            return
        if is_fenced(exc):
            # Another instance took over with our transactional id: stop, and never write
            # again with this producer.
            log.error("commit failed (%s); fenced, stopping", err)
            self.stop()
            raise ReplayBrokerError(f"acker fenced: {err}") from exc
        if is_fatal(exc):
            # A fatal producer error that is not fencing (seen: INVALID_TXN_STATE after an
            # abort while the transaction coordinator moved): this producer is unusable, but
            # a new one with the same transactional id aborts whatever is open and goes on.
            log.error("commit failed (%s); fatal for this producer: a new one takes over", err)
            self._new_producer()
        else:
            log.error("commit failed (%s); aborting and rewinding", err)
            self.transactions.abort()
        refused = self.refusals.take_noted()
        if refused:
            log.warning(
                "%d outputs refused for good, decided again after the rewind: %s", len(refused), "; ".join(refused)
            )
        for name in self.refusals.take_unknown_topics():
            self.decider.forget(name)
        self._rewind(touched)

    def _new_producer(self) -> None:
        with contextlib.suppress(KafkaException, RuntimeError):
            self._producer.flush(0)
        self._producer = Producer(self._producer_config)
        if self.config.exactly_once:
            try:
                self._init_transactions()
            except KafkaException as exc:
                self.stop()
                raise ReplayBrokerError(f"acker cannot start a new transactional producer: {exc}") from exc
        self.transactions.replace_producer(self._producer)
        self._producer_stale = False

    def _init_transactions(self) -> None:
        """``init_transactions``, tried again while it fails transiently: a transaction
        coordinator that is moving or a cluster missing a node is waited for (the acker's
        inputs wait anyway), not a reason for the service to exit."""
        while True:
            try:
                self._producer.init_transactions(INIT_TRANSACTIONS_TIMEOUT_S)
                return
            except KafkaException as exc:
                if not is_transient(exc) or self._stop.is_set():
                    raise
                log.warning("initialising transactions failed transiently (%s); trying again", exc.args[0])

    def _rewind(self, touched: set[int]) -> None:
        """After an aborted commit the partitions it touched are ahead of Kafka: they are
        restored from their changelogs like a new assignment - their inputs paused, a slice
        per loop iteration (broker.acker.restoring), then sought back to the committed
        offsets - while the partitions it did not touch go on as they are. Nothing of it runs
        inside one poll: a large changelog costs no membership."""
        lps = sorted(touched & set(self.states))
        self.totals.clear()  # the same dict the states and the changelog count into
        self.totals.update(self._committed_totals)
        if not lps:
            return
        tps = [TopicPartition(t, lp) for lp in lps for t in (self.ns.persist, self.ns.acks)]
        with contextlib.suppress(KafkaException, RuntimeError):
            self._consumer.pause(tps)
        self._drop(set(lps))
        self.restores.add(lps, tps)
        log.info("rewinding ledger partitions %s to their changelogs (owning %s)", lps, sorted(self.states))

    # ------------------------------------------------------------------ stats

    def counters(self) -> dict[str, int]:
        """This instance's decisions since it started, plus ``pending`` in what it owns now.

        (The cumulative per-partition counters, over every owner, are in the changelog:
        ``replaybroker status`` reads them.)"""
        return {
            **self.totals,
            # (watches of replayed timeouts are no pending records)
            "pending": sum(len(st.table) - st.table.watching() for st in self.states.values()),
            # (partition, commit) pairs with due entries held back because the acker was
            # behind on the partition's inputs, and the entries held back at the last commit
            "expiry_holds": self.expiry.holds,
            "expiry_held": self.expiry.held,
            "rejoins": self.rejoins,
            "fenced_by_timeout": self.fenced_by_timeout,
        }

    def _log_stats(self) -> None:
        self._last_stats = time.monotonic()
        c = self.counters()
        adaptive = self.adaptive.summary(self.clock.now_ms())
        log.info(
            "acker %s partitions=%s %s%s",
            self.config.instance_id,
            sorted(self.states),
            " ".join(f"{k}={v}" for k, v in c.items()),
            f" adaptive {adaptive}" if adaptive else "",
        )
