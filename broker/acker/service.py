"""The acker service: one loop per process serving many ledger partitions (docs/design.md §5).

Inputs ``ns.persist[i]`` and ``ns.acks[i]`` are read ``read_committed`` in one consumer group;
each owned partition has a ``PartitionState`` backed by the compacted changelog
``ns.ledger[i]``. The rooms:

- ``changelog``: restore on assignment, warm states, standby tailing;
- ``ingest``: persist records and XOR batches folded into the tables, bad input quarantined;
- ``decisions``: timeouts and explicit failures turned into replays and dead letters;
- ``commit``: the transaction that writes all of it with the input offsets;
- ``assignment``: the rebalance callbacks and the restores they start;
- ``recovery``: commit errors and rejoins;
- ``live``: the group consumer and the producer as they are now (either may be replaced);
- ``owned``: what the parts share - the owned partitions' states, the input positions, the
  inputs read and the outputs due since the last commit, and the totals - with its only writer.

``Acker`` builds each part with its collaborators and runs the loop.

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
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Self

from confluent_kafka import KafkaError, KafkaException, Message

from broker.acker import superseding
from broker.acker.assignment import Assignment, committed_starts, restore_slice
from broker.acker.changelog import ChangelogReader
from broker.acker.clients import AckerClients
from broker.acker.commit import Batch, Transactions, positions_of, take_changes
from broker.acker.config import AckerConfig
from broker.acker.decisions import Decided, Decider, collect_failures
from broker.acker.ingest import Ingest
from broker.acker.lag import ExpiryGate
from broker.acker.live import LiveClients
from broker.acker.membership import Rejoins
from broker.acker.owned import OwnedPartitions
from broker.acker.payloads import PayloadCache, PersistFetcher
from broker.acker.reading import ReadingOrder
from broker.acker.recovery import Recovery
from broker.acker.refusals import Refusals
from broker.acker.restoring import Restores
from broker.acker.state import PartitionState
from broker.background import running
from broker.headers import OUTCOME_COMPLETED
from broker.kafka_io import kafka_errors
from broker.kafka_port import KafkaClients, KafkaPort, setup_consumer_group
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
from broker.ranges import ranges
from broker.settings import KafkaSettings
from broker.topics import Namespace

log = logging.getLogger("broker.acker")

EARLY_COMMIT = 0.5
"""An acker whose poll waited for input commits waiting completions after this share of
``commit_interval_ms`` (``Acker._commit_due``)."""
IDLE_POLL_S = 0.001
"""A poll that took this long found nothing fetched: the acker had caught up with its input."""
LONG_POLL_MAX_S = 0.1
"""The longest poll (``Acker._poll_timeout_s``): a rebalance callback runs inside a poll, and
what it leaves for the loop (resuming the partitions it restored, waking fetchers) waits
for the poll to return."""



class Due(Enum):
    """Why a commit is due (``Acker._commit_due``)."""

    INTERVAL = "interval"  # ``commit_interval_ms`` has passed
    EARLY = "early"  # completions wait and the acker has time


class Acker:
    @kafka_errors("building an Acker")
    def __init__(
        self,
        settings: KafkaSettings,
        namespace: str | Namespace,
        config: AckerConfig | None = None,
        *,
        clock: Clock | None = None,
        kafka: KafkaPort | None = None,
    ) -> None:
        """``kafka``: every client and look-up of the acker (default: the real clients of
        ``settings``; a test hands in an in-memory cluster)."""
        self.ns = namespace if isinstance(namespace, Namespace) else Namespace(namespace)
        self.settings = settings
        self.kafka: KafkaPort = kafka or KafkaClients(settings)
        # The clients' settings, and the acker's configuration (``config``): it may change once,
        # the fall-back to the classic group protocol (broker.acker.membership).
        self.clients = AckerClients(settings, self.ns, config or AckerConfig())
        self.clock = clock or SystemClock()
        self.ticker = Ticker.starting_at(self.clock, self.config.tick_ms)
        self.group_id = f"{self.ns.name}.acker"
        self.P = 0  # ledger partitions, checked against the cluster by start()
        self.markers = False  # ns.superseded exists with P partitions (checked by start())
        self.commits = 0
        # Pauses before rejoining; refusals of a static member whose instance id is still in
        # use (a killed predecessor's session) counted in membership.in_use.
        self.membership = Rejoins(
            self.config.rejoin_backoff_ms / 1000, self.config.session_timeout_ms, f"{self.ns.name}.acker.{self.config.instance_id}"
        )
        # The figures last published per partition, with the state they are of; the partitions
        # the last commit looked at (their figures are made again, the others' kept).
        self._figures: dict[int, tuple[PartitionState, PartitionFigures]] = {}
        self._changed: set[int] = set()
        self._stop = threading.Event()
        self._started = False
        self._last_commit = time.monotonic()
        self._commit_s = 0.0  # how long the last transaction took (the restore's slice follows it)
        # (monotonic time, assignment.changes) of the last commit that found every owned
        # partition idle and nothing read: the next ones are skipped while that holds
        self._quiet: tuple[float, int] | None = None
        self._last_stats = time.monotonic()
        # Clients are created here but talk to Kafka only from start(): building an Acker
        # needs no live cluster (broker.acker.clients: what each is configured with, and why).
        # Every client of the acker is made by its port (``kafka``).
        ns, kafka = self.ns, self.kafka
        self.live = LiveClients(self.clients, make_consumer=kafka.consumer, make_producer=kafka.producer, stop=self._stop)
        restorer = kafka.consumer(self.clients.restorer())
        standby = kafka.consumer(self.clients.standby()) if self.config.standby else None
        fetcher = PersistFetcher(ns, kafka.consumer(self.clients.fetcher()))
        cache = PayloadCache(self.config.replay_cache_entries)
        # Watermarks of many partitions in one admin request (a restore or a revoke of 1 000
        # partitions asks them all at once).
        marks = functools.partial(kafka.watermarks, committed=False)
        self.expiry = ExpiryGate(ns, self.live, slack=self.config.expiry_lag_slack)
        self.reading = ReadingOrder(ns, self.expiry)
        # The owned partitions' states, input positions, reads, outputs due and totals: their
        # only writer (broker.acker.owned).
        self.owned = OwnedPartitions(self.expiry, self.reading)
        self.changelog = ChangelogReader(ns, self.ticker, self.owned.new_state, restorer, standby, self.clock, marks)
        # One latency estimate per source topic for the whole process (timeout "auto").
        self.adaptive = AdaptiveTimeouts(self.config.adaptive)
        self.decider = Decider(
            ns, self.clock, self.ticker, cache, fetcher, kafka.partition_counts, self.config
        )
        self.ingest = Ingest(
            ns, self.clock, self.ticker, self.config.orphan_ttl_ms, cache, self.owned, self.adaptive,
            self.decider.replay_partitions,
        )
        self.restores = Restores(
            self.changelog, functools.partial(committed_starts, self.live), functools.partial(self.ingest.register, again=True)
        )
        self.refusals = Refusals(ns.dlq)
        self.decider.refused = self.refusals.replay
        self.transactions = Transactions(ns, self.live, self.refusals, exactly_once=self.config.exactly_once)
        self.assignment = Assignment(
            ns=ns, live=self.live, owned=self.owned, restores=self.restores, transactions=self.transactions,
            commit=self.commit,
        )
        self.recovery = Recovery(
            live=self.live, assignment=self.assignment, refusals=self.refusals, decider=self.decider,
            membership=self.membership, stop=self._stop,
        )
        # Its own registry (tests run many ackers in one process); served from start() when
        # config.metrics_port is set.
        self.metrics = AckerMetrics(self.clock.now_ms)
        self.metrics_server: MetricsServer | None = None

    @property
    def config(self) -> AckerConfig:
        return self.clients.config

    @config.setter
    def config(self, config: AckerConfig) -> None:
        self.clients.config = config

    @property
    def states(self) -> Mapping[int, PartitionState]:
        """The owned ledger partitions' states (broker.acker.owned)."""
        return self.owned.states

    @property
    def totals(self) -> dict[str, int]:
        """This instance's decisions since it started (broker.acker.owned)."""
        return self.owned.totals

    @property
    def last_assignment(self) -> dict[str, object]:
        return self.assignment.last_assignment

    @property
    def rejoins(self) -> int:
        """Group consumers replaced after a fatal error."""
        return self.recovery.rejoins

    @property
    def fenced_by_timeout(self) -> int:
        """Commits fenced because their transaction outlived its timeout."""
        return self.recovery.fenced_by_timeout

    @property
    def standby(self) -> dict[int, tuple[PartitionState, int]]:
        return self.changelog.standby

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Check the namespace's topics and initialise transactions (once)."""
        if self._started:
            return
        self.P = self.kafka.check(self.ns)
        self.ingest.partitions = self.decider.partitions = self.assignment.partitions = self.P
        # Markers for tasks need ns.superseded (created with the namespace since it exists);
        # without it, superseded replays are still settled, but tasks do not skip them.
        markers = self.kafka.partition_counts([self.ns.superseded])[self.ns.superseded]
        self.markers = markers == self.P
        if not self.markers:
            log.warning(
                "%s %s: tasks cannot skip superseded replays (replaybroker topics create adds it)",
                self.ns.superseded, "does not exist" if markers is None else f"has {markers} partitions, not {self.P}",
            )
        # How long compaction keeps the changelog's tombstones bounds how old a kept
        # (warm/standby) state may be and still be caught up by a suffix read.
        self.changelog.tombstone_retention_ms = self.kafka.delete_retention_ms(self.ns.ledger)
        # The producer's message.max.bytes from what ns.persist takes (broker.acker.limits;
        # the constructor assumed Kafka's default): a new producer if that differs (none has
        # written yet). A limit the user set stays.
        config = self.clients.producer(self.kafka.max_message_bytes(self.ns.persist))
        if config != self.live.producer_config:
            self.live.replace_producer(config)
        # The group consumer's fetch wait follows P (broker.acker.clients.fetch_wait_ms): a new
        # consumer if that differs (none has joined yet). A wait the user set stays.
        self.clients.partitions = self.P
        config = self.clients.group()
        if config != self.live.consumer_config:
            self.live.consumer_config = config
            self.live.replace_consumer()
        if self.config.group_protocol == "consumer":
            cfg = self.config
            setup = setup_consumer_group(self.kafka, self.group_id, cfg.session_timeout_ms, cfg.heartbeat_interval_ms)
            if setup.fall_back is not None:  # a 4.x cluster with the protocol off: Recovery.rejoin
                self.live.fall_back_to_classic(setup.fall_back)
                self.live.replace_consumer()
            elif setup.timeouts_refused is not None:
                log.warning(
                    "cannot set session timeout %d ms of group %s (%s): the broker's "
                    "group.consumer.session.timeout.ms applies - a dead acker's partitions wait that long",
                    cfg.session_timeout_ms, self.group_id, setup.timeouts_refused,
                )
        if self.config.exactly_once:
            if self.config.instance_id_generated:
                log.warning(
                    "no --instance-id: using %s; a restart gets a new id, so it does not fence this "
                    "instance's open transaction at once (that waits for transaction_timeout_ms)",
                    self.config.instance_id,
                )
            self.live.init_transactions()
        self.metrics_server = serve(self.metrics.registry, self.config.metrics_port, self.metrics.partitions_registry)
        self._started = True

    def stop(self) -> None:
        self._stop.set()

    @kafka_errors("running an Acker")
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
        self.assignment.subscribe()
        log.info("acker %s serving %s (P=%d)", self.config.instance_id, self.ns.name, self.P)
        try:
            while not self._stop.is_set():
                self.step()
                if until is not None and until(self):
                    break
            self.commit()
        finally:
            self.close()

    @kafka_errors("starting an Acker")
    def check_before_run(self) -> None:
        self.start()  # run_in_background(): a namespace that is not usable raises at once

    def run_in_background(self) -> contextlib.AbstractContextManager[Self]:
        """``run()`` on a thread of this process while a ``with`` block runs, then a clean
        stop (broker.background)."""
        return running(self)

    def close(self) -> None:
        with contextlib.suppress(KafkaException, RuntimeError):
            self.live.consumer.close()  # revokes: Assignment.on_revoke commits what is left
        with contextlib.suppress(KafkaException, RuntimeError):
            self.changelog.close()
        with contextlib.suppress(KafkaException, RuntimeError):
            self.decider.fetcher.close()
        with contextlib.suppress(KafkaException, RuntimeError):
            self.live.producer.flush(10)
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None
        self._log_stats()

    # ------------------------------------------------------------------ folding

    def step(self) -> int:
        """Poll once, fold what came, commit when the interval is due - or, when the poll
        waited for input, half of it (``_commit_due``). Returns messages read."""
        # poll() returns as soon as one message is there; consume(n, timeout) would wait the
        # whole timeout unless n messages arrive, adding up to poll_timeout_ms to every event.
        polled = time.monotonic()
        consumer = self.live.consumer
        first = consumer.poll(self._poll_timeout_s(polled))
        idle = first is None or time.monotonic() - polled >= IDLE_POLL_S
        msgs: list[Message] = []
        if first is not None:
            msgs.append(first)
            if self.config.batch_size > 1:
                msgs.extend(consumer.consume(self.config.batch_size - 1, 0))
        assignment = self.assignment
        if self.restores.pending:
            done = self.restores.step(restore_slice(
                self._commit_s, self.config.restore_slice_ms / 1000, self.config.restore_slice_max_ms / 1000))
            if done is not None:
                assignment.restored(done)
        if assignment.to_resume:
            assignment.resume_restored()
        assignment.wake_fetchers()
        if msgs:
            fatal = next((m.error() for m in msgs if m.error() is not None and m.error().code() == KafkaError._FATAL), None)
            if fatal is not None:
                self.recovery.rejoin(fatal)
                return 0
            self._fold_messages(msgs)
        seeking = {tp.partition for tp in assignment.to_resume}  # paused by a restore, not sought yet
        owned = self.owned.states.keys()
        self.reading.apply(self.live.consumer, owned - seeking if seeking else owned, self.owned.positions)
        now = time.monotonic()
        due = self._commit_due(now, idle)
        if due is not None:
            self.commit()
            self.changelog.poll_standby()
        if now - self._last_stats >= self.config.stats_interval_ms / 1000:
            self._log_stats()
        return len(msgs)

    def _poll_timeout_s(self, now: float) -> float:
        """How long the next poll may wait for input: ``poll_timeout_ms`` while something moves
        without input (a restore in slices, restored partitions to resume, acks paused behind
        their persist partition, whose position moves with transaction markers); otherwise
        until the next commit may be due - early if anything was read since the last one
        (``_commit_due``) - and at most ``LONG_POLL_MAX_S``. A poll returns as soon as a
        message is there, so only an acker with nothing to read waits longer: each wake-up
        costs a pass through librdkafka's poll, which is most of an idle acker's CPU."""
        short = self.config.poll_timeout_ms / 1000
        if self.restores.pending or self.assignment.to_resume or self.reading.paused:
            return short
        share = EARLY_COMMIT if self.owned.read else 1.0
        due = self._last_commit + share * self.config.commit_interval_ms / 1000 - now
        return max(short, min(due, LONG_POLL_MAX_S))

    def _commit_due(self, now: float, idle: bool) -> Due | None:
        """Whether to commit now: ``INTERVAL`` when ``commit_interval_ms`` has passed since the
        last commit; ``EARLY`` when half of it has, the last poll waited for input and completed
        trees wait for their tombstones (an acker with time to spare spends it on latency, one
        that is behind keeps to the interval); None otherwise."""
        since_ms = (now - self._last_commit) * 1000
        if since_ms >= self.config.commit_interval_ms:
            return Due.INTERVAL
        # (trees complete as their events are folded: in the partitions read since the last commit)
        if idle and since_ms >= self.config.commit_interval_ms * EARLY_COMMIT and any(
            outcome == OUTCOME_COMPLETED for lp in self.owned.read for _, outcome in self.states[lp].tombstones
        ):
            return Due.EARLY
        return None

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
        owned = self.owned
        self.reading.admit(self.live.consumer, persist, acks, owned.positions)
        for lp, batch in persist.items():
            owned.consumed(persist_topic, lp, batch[-1].offset() + 1)
            self.ingest.register(states[lp], lp, batch)
        for lp, batch in acks.items():
            owned.consumed(self.ns.acks, lp, batch[-1].offset() + 1)
            self.ingest.fold(states[lp], lp, batch)

    # ------------------------------------------------------------------ commit

    def commit(self) -> None:
        """One transaction: expiry decisions, tombstones, replays/DLQ, changelog, offsets
        (broker.acker.commit has the order and why); then the metrics' snapshot."""
        if self._still_quiet():
            self._last_commit = time.monotonic()
            return
        self._quiet = None
        began = time.perf_counter()
        if self._commit():
            self._commit_s = time.perf_counter() - began
            self.metrics.commit_seconds.observe(self._commit_s)
        self._publish_metrics()

    def _still_quiet(self) -> bool:
        """Whether this commit has nothing to look at: the last one found every owned
        partition idle (``PartitionState.idle``: no entry - nothing can fall due with time -
        and nothing to write), nothing was read since, no partition came or went and nothing
        waits to be written - for at most ``quiet_recheck_ms`` (the lag gate samples every
        input once a second, broker.acker.lag, and the figures follow). At a large P an idle
        acker's commits were most of its CPU: each one looks at every partition three times."""
        quiet = self._quiet
        return (
            quiet is not None and not self.owned.read and not self.owned.outgoing and not self.live.producer_stale
            and quiet[1] == self.assignment.changes and time.monotonic() - quiet[0] < self.config.quiet_recheck_ms / 1000
        )

    def _commit(self) -> bool:
        """``commit`` without the metrics. Returns whether a transaction was committed."""
        self._last_commit = time.monotonic()
        if not self.states:
            return False  # owning nothing, nothing may be written (what was due left with the partitions)
        if self.live.producer_stale:
            self.recovery.new_producer()  # fenced by a timed-out transaction, and a member again
        now_ms = self.clock.now_ms()
        # The partitions this commit has anything to do with: those read since the last one
        # and those with entries or output pending. At a large P most are neither, and every
        # step below would cost a few microseconds for each of them at every commit.
        read = self.owned.read
        busy = {lp: st for lp, st in self.states.items() if lp in read or not st.idle()}
        # Every decision that ends a record - expiry, orphans, deferred and held decisions -
        # only as far as the partition's inputs have been read: a backlog of acks is no
        # timeout. Each partition at its own tick: a key's records all live in one.
        expiry_ticks = self.expiry.ticks(busy, self.ticker, now_ms)
        # Late completions folded in this step first: a completion read in the same step as
        # the end of a window wins over the dead letter it holds (broker.acker.superseding).
        late = superseding.hand_on(self.states, self.P, self.ingest.orphan_tick(), busy)
        collect_failures(busy, now_ms, expiry_ticks, self.config.fail_hold_ms, self.adaptive)
        out = self.owned.take_outgoing()
        decided: list[Decided] = []
        self.decider.decide(busy, decided, expiry_ticks)
        # Failures come out of the table in srid / slot order. Produce the replays in the
        # order the originals were sent instead - (created_ms, persist offset) within a ledger
        # partition, which holds all of a key's records - so the failures of one key decided
        # in one commit keep the key's order on <topic>.replay.
        decided.sort(key=lambda d: (d[0], d[1]))
        for _, _, lp, records in decided:
            out.extend((lp, rec) for rec in records)
        # Late completions of watched replays (with the watches this commit made that were
        # complete at once): markers and superseded marks; superseded replays that timed out
        # or failed: settled.
        late += superseding.hand_on(self.states, self.P, self.ingest.orphan_tick(), busy)
        out.extend(superseding.take(busy.items(), late, self.ns, self.P, self.markers, self.decider.cache, self.states))
        # Every failure is decided now or deferred in its table (an unreadable payload):
        # nothing makes the commit wait.
        batch = Batch()
        for lp, rec in out:
            smaller = self.refusals.degrade(rec)  # a dead letter the DLQ refused before
            if smaller is not None:
                self.states[lp].count("refused")
            batch.records.append(smaller or rec)
        # (again: a decision may have counted in a partition that was idle before it)
        changing = [(lp, st) for lp, st in self.states.items() if lp in busy or not st.idle()]
        self._changed.update(lp for lp, _ in changing)
        take_changes(changing, self.ticker, self.clock.now_ms(), batch, self.owned.positions, self.ns.persist,
                     self.config.unlogged_ms)
        if not batch and not read:
            if not busy and not changing and not any(st.stops.tasks for st in self.states.values()):
                # (a partition in an outage is not: its figures change with the clock)
                self._quiet = (time.monotonic(), self.assignment.changes)
            return False
        # What this transaction changes: the partitions read, and those it writes for.
        touched = self.owned.take_read() | {lp for lp, *_ in batch.changelog} | {lp for lp, *_ in batch.tombstones}
        moved = self.owned.moved_positions(touched)
        batch.positions = list(positions_of(moved))
        try:
            self.transactions.write(batch)
        except KafkaException as exc:
            self.recovery.on_commit_error(exc, touched)
            return False
        self.owned.committed(moved)
        self.ingest.given.clear()  # every entry registered so far is logged now
        self.refusals.settle(batch.records)
        self.commits += 1
        return True

    def _publish_metrics(self) -> None:
        """The figures of every owned partition as of this commit, for the next scrapes: a
        copy of a partition's figures whenever a commit looked at it, so nothing is counted
        twice on the hot path and the server's thread never reads a dict the loop is
        changing. The others' copies are kept (at a large P, most partitions at every commit);
        those in an outage's count change with the clock alone."""
        now_ms = self.clock.now_ms()
        changed, kept = self._changed, self._figures
        self._changed = set()
        figures: dict[int, tuple[PartitionState, PartitionFigures]] = {}
        for lp, st in self.states.items():
            last = kept.get(lp)
            if last is None or last[0] is not st or lp in changed or st.pending is None or st.stops.tasks:
                if st.pending is None:  # restored from an older counters record: once
                    st.summarize()
                last = (st, PartitionFigures(dict(st.counters), st.pending, st.oldest_pending_ms,
                                             len(st.replay_turns) - st.backing_off, st.backing_off,
                                             len(st.stops.in_outage(now_ms))))
            figures[lp] = last
        self._figures = figures
        self.metrics.publish(AckerSnapshot(
            {lp: f for lp, (_, f) in figures.items()},
            {key: inp.lag for key, inp in self.expiry.inputs.items()},
            {
                topic: TopicEstimate(e.timeout_ms, e.quantile_ms, e.samples)
                for topic, e in self.adaptive.estimates(now_ms).items()
            },
            self.owned.committed_totals(),
        ))

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
            "acks_paused": self.reading.pauses,  # ns.acks read ahead of ns.persist (broker.acker.reading)
        }

    def _log_stats(self) -> None:
        self._last_stats = time.monotonic()
        c = self.counters()
        adaptive = self.adaptive.summary(self.clock.now_ms())
        log.info(
            "acker %s partitions=%s %s%s",
            self.config.instance_id,
            ranges(self.states),
            " ".join(f"{k}={v}" for k, v in c.items()),
            f" adaptive {adaptive}" if adaptive else "",
        )
