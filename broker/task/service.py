"""``Task``: a consume loop that processes tracked records and acks each input with one XOR
event (docs/design.md §4, §8).

The XOR ledger: every record id is XORed into its srid exactly twice - once by its creator
(the source's persist record, or the parent's task event) and once by its consumer's task
event. A task's event for input r is ONE value ``r.id ^ child_1.id ^ ...``: the ack of r and
the anchoring of its children together.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, Self

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from broker.background import running
from broker.delivery import Outputs
from broker.errors import ConfigurationError, KafkaClientError
from broker.headers import tracking_of
from broker.kafka_errors import Meaning, kafka_error, means
from broker.kafka_io import (
    CONSUMER_PROTOCOL,
    GROUP_SIDE,
    consumer_protocol_refused,
    kafka_errors,
    retrying,
)
from broker.kafka_port import KafkaClients, KafkaPort, setup_consumer_group
from broker.markers import SupersededMarkers
from broker.metrics import MetricsServer, TaskMetrics, serve
from broker.serde import Serde
from broker.settings import KafkaSettings
from broker.task.acks import Events, TaskAcks
from broker.task.config import TaskConfig, TaskCounters, without_replay_topics
from broker.task.outage import Outage, OutageHold, beat_scope
from broker.task.records import (
    BatchHandler,
    Handler,
    Offsets,
    PutBack,
    TaskContext,
    TaskRecord,
    _no_handler,
    fail_all,
    settle,
)
from broker.task.superseded import SupersededSkip
from broker.topics import Namespace, replay_topic

log = logging.getLogger(__name__)

# A NamedTuple's ``_make`` without its Python frame: a task builds a TaskRecord per input.
_new_tuple = tuple.__new__

# How long a revocation waits for a coordinator that cannot take the commit of the partitions
# that go: well inside max.poll.interval.ms (the rebalance waits for the callback meanwhile).
_REVOKE_COMMIT_S = 10.0


class Task:
    """A consume loop that acks every input with one XOR event.

    Per poll batch:
    1. for each input, user code runs and emits children (fresh ids, inherited srid/origin);
    2. ONE event per input, ``input.id ^ children``, is queued by ledger partition, or a fail
       mark when the input was failed;
    3. one ``XorBatch`` per ledger partition goes to ``ns.acks[partition]`` - after the
       batch's sink outputs (``TaskContext.output``) are delivered, if it wrote any;
    4. outputs that failed to deliver are sent again (``delivery_retries`` rounds, with
       back-off); the source records of those that still fail are failed explicitly (a fail
       mark: the acker replays or dead-letters them), the other inputs proceed. An input
       whose sink output stays undeliverable gets a fail mark instead of its event;
    5. the input offsets are committed.
    Steps 1-3 run per batch (``handle_batch``); 4 and 5 (``finish``) once per
    ``commit_interval_ms`` for every batch handled since, and before partitions are revoked.
    A crash before 5 reprocesses those batches: their events are folded twice, which can
    only delay completion (docs/design.md §4), never complete a tree early.
    """

    batch_handler: BatchHandler | None = None  # set: called instead of ``handler``, per batch

    @kafka_errors("building a Task")
    def __init__(
        self,
        settings: KafkaSettings,
        namespace: str | Namespace,
        topics: Iterable[str],
        group_id: str,
        handler: Handler | None = None,
        config: TaskConfig | None = None,
        *,
        batch_handler: BatchHandler | None = None,
        kafka: KafkaPort | None = None,
    ) -> None:
        """What Kafka refuses - here a client setting, later in ``run``, ``handle_batch`` or
        ``finish`` a commit or a look-up - is raised as ``KafkaClientError``, its
        ``KafkaException`` the cause. ``kafka``: the task's clients and look-ups (default:
        the real clients of ``settings``)."""
        if (handler is None) == (batch_handler is None):
            raise ConfigurationError("a Task takes a handler or a batch_handler (one of them)")
        self.ns = namespace if isinstance(namespace, Namespace) else Namespace(namespace)
        self.config = config or TaskConfig()
        self.topics = list(topics)
        self.group_id = group_id
        self.settings = settings
        self.kafka: KafkaPort = kafka or KafkaClients(settings)
        self._ledger_partitions = 0  # checked against the cluster by run() or the first batch
        self.handler: Handler = handler or _no_handler
        self.batch_handler = batch_handler
        self.counters = TaskCounters()
        # Its own registry (many tasks run in one process), read at scrape time; served by
        # run() when config.metrics_port is set.
        self.metrics = TaskMetrics(lambda: self.counters, lambda: self._outage.seconds())
        self.metrics_server: MetricsServer | None = None
        # Only failed deliveries matter (they are sent again): no callback per success.
        self._producer = self.kafka.producer(
            settings.producer_config(
                required={"delivery.report.only.error": True}, user=self.config.producer, defaults={"linger.ms": 10}
            )
        )
        self._outputs = Outputs(self._producer, self.config.delivery_retries, self.config.retry_backoff_ms / 1000)
        self._group_protocol = self.config.group_protocol  # "classic" after a fallback
        self._consumer = self.kafka.consumer(self._consumer_config())
        self._outputs_pending = False
        # Input offsets handled but not committed yet, and when the next commit is due
        self._uncommitted: Offsets = {}
        self._commit_due = 0.0
        # Data topics read together with their replay topic: these must stay co-partitioned.
        self._pairs = [t for t in self.topics if replay_topic(t) in self.topics]
        self._owned: frozenset[tuple[str, int]] = frozenset()  # kept by the rebalance callbacks
        self._revoked: set[tuple[str, int]] = set()  # since the batch's first message
        self._stop = threading.Event()
        self.name = f"{group_id}@{os.getpid()}"
        self._acks = TaskAcks(self._outputs, self.ns.acks, self.name, self.counters, lambda: self.ledger_partitions,
                              beat_scope(self.topics))
        # A dependency that is down (broker.task.outage): puts inputs back instead of failing them.
        self._hold = OutageHold(
            Outage(self.config.outage_retry, self.config.outage_max_ms, max(100, self.config.touch_timeout_ms // 3)),
            self._acks, self.counters, lambda: self._consumer, self.config.touch_timeout_ms,
        )
        # The superseded skip (broker.task.superseded), with the markers read while run() runs;
        # None: no skip (off, or batches handled outside run()).
        self._skip: SupersededSkip | None = None

    @property
    def _outage(self) -> Outage:
        return self._hold.outage

    def _consumer_config(self) -> dict[str, Any]:
        """The group consumer's settings for the group protocol in use.

        Partition i of a data topic and of its replay topic is one key range (a replay goes
        to its key's partition index): processed by one member, a key's replays are handled
        where its originals are. The consumer protocol's range assignor (broker side) gives
        partition i of every subscribed topic of one partition count to one member;
        cooperative-sticky, the classic fallback, balances partitions over all topics and may
        split them (checked in _on_assign). Both hand over only what changes owner."""
        user = self.config.consumer
        required: dict[str, Any] = {"isolation.level": "read_committed"}
        if self._group_protocol == "classic":
            required["partition.assignment.strategy"] = "cooperative-sticky"
        else:
            required.update(CONSUMER_PROTOCOL)
            if "partition.assignment.strategy" in user or "partition.assignment.strategy" in self.settings.extra:
                raise ConfigurationError(
                    "partition.assignment.strategy cannot be set on a Task's consumer with group_protocol='consumer': "
                    "the broker's range assignor keeps a data topic and its replay topic together"
                )
        conf = self.settings.consumer_config(
            self.group_id, required=required, user=user, defaults={"fetch.wait.max.ms": 10, "fetch.min.bytes": 262_144}
        )
        if self._group_protocol == "consumer":
            for key in GROUP_SIDE:  # the group's (set by _join_group), not the client's
                conf.pop(key, None)
        return conf

    def _join_group(self) -> None:
        """Before subscribing: fall back to the classic protocol on a cluster without the
        consumer protocol; with it, set the session and heartbeat given in
        ``TaskConfig.consumer`` on the group."""
        if self._group_protocol != "consumer":
            return
        user = {**self.settings.extra, **self.config.consumer}
        session, heartbeat = user.get("session.timeout.ms"), user.get("heartbeat.interval.ms")
        setup = setup_consumer_group(
            self.kafka, self.group_id, None if session is None else int(session), None if heartbeat is None else int(heartbeat)
        )
        if setup.fall_back is not None:
            self._fall_back(setup.fall_back)
        elif setup.timeouts_refused is not None:
            log.warning("group %s keeps the broker's session timeout and heartbeat interval: %s",
                        self.group_id, setup.timeouts_refused)

    def _fall_back(self, why: str) -> None:
        """Replace the consumer by one of the classic protocol (not subscribed yet)."""
        log.warning(
            "%s: task %s joins %s with the classic group protocol and cooperative-sticky, which may split "
            "a data topic from its replay topic (TaskConfig.group_protocol='classic' says so and skips this check)",
            why, self.name, self.group_id,
        )
        self._group_protocol = "classic"
        old, self._consumer = self._consumer, self.kafka.consumer(self._consumer_config())
        with contextlib.suppress(KafkaException, RuntimeError):
            old.close()
        self._owned = frozenset()

    def _subscribe(self) -> None:
        self._consumer.subscribe(
            self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )

    @property
    def ledger_partitions(self) -> int:
        if not self._ledger_partitions:
            self._ledger_partitions = self.kafka.check(self.ns)
        return self._ledger_partitions

    def _produce(self, topic: str, srid: int | None = None, **kwargs: Any) -> None:
        self._outputs.produce(topic, srid, **kwargs)

    def emit_record(self, topic: str, record: dict[str, Any]) -> None:
        """A context's child (``TaskContext.emit``)."""
        self._outputs.produce(topic, None, **record)

    def output_record(self, topic: str, srid: int | None, record: dict[str, Any]) -> None:
        """A context's sink output (``TaskContext.output``): delivered before the batch's events."""
        self._outputs.produce(topic, srid, **record)
        self._outputs_pending = True
        self.counters.sink_outputs += 1

    def touch_input(self, srid: int, deadline_ms: int) -> None:
        """A context's touch (``TaskContext.touch``): out at once, ahead of the input's event."""
        self._acks.touch(srid, deadline_ms)

    def serde(self, topic: str) -> Serde:
        """The serde of ``topic``'s values: its own (``TaskConfig.serdes``), else the task's."""
        return self.config.serdes.get(topic, self.config.serde)

    @kafka_errors("checking a Task's topics")
    def check_topics(self) -> None:
        """Refuse a data topic read with a replay topic of another partition count (replay
        index i would be another key range than data index i, and range could not pair them);
        warn, in one line, about data topics read without their replay topics: their replays
        wait for another task, or for none - then every record that fails or times out ends in
        the DLQ after its last attempt."""
        self._ledger_partitions = self.kafka.check(self.ns, self._pairs)
        alone = without_replay_topics(self.topics)
        if alone:
            log.warning(
                "task %s consumes %s without %s: their replays are processed only by a task that consumes "
                "those; with none, every record that fails or times out ends in %s after its last attempt",
                self.group_id, ", ".join(alone), ", ".join(map(replay_topic, alone)), self.ns.dlq,
            )

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Incremental: ``partitions`` are the ones added (confluent-kafka assigns them after
        # this returns, incremental_assign for a cooperative protocol).
        self._owned = self._owned | {(tp.topic, tp.partition) for tp in partitions}
        self._hold.assigned(consumer, partitions)
        for topic in self._pairs:
            data = {p for t, p in self._owned if t == topic}
            replay = {p for t, p in self._owned if t == replay_topic(topic)}
            if data != replay:  # range never splits them; cooperative-sticky (the fallback) may
                log.warning(
                    "%s holds %s %s but %s %s: not co-partitioned",
                    self.name, topic, sorted(data), replay_topic(topic), sorted(replay),
                )

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Only the partitions that change owner; the others stay assigned. Still their
        # owner: what was handled (of every partition) is delivered and committed before they
        # go, so the next owner does not redo it.
        gone = {(tp.topic, tp.partition) for tp in partitions}
        if self._uncommitted:
            try:
                self.finish()
                # A commit the coordinator could not take yet (deferred): the partitions
                # that go are still ours until this returns - try again, bounded.
                left = [TopicPartition(t, p, o) for (t, p), o in self._uncommitted.items() if (t, p) in gone]
                if left:
                    retrying(functools.partial(self._consumer.commit, offsets=left, asynchronous=False),
                             "committing before a revocation", retry_for_s=_REVOKE_COMMIT_S)
            except (KafkaClientError, KafkaException) as exc:
                log.warning("could not commit before the partitions were revoked (their next owner redoes "
                            "what was handled since the last commit): %s", exc)
        self._forget(partitions)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # No longer the owner: these offsets cannot be committed; the new owner redoes them.
        self._forget(partitions)

    def _forget(self, partitions: list[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self._owned = self._owned - gone
        self._revoked |= gone
        for tp in gone:
            self._uncommitted.pop(tp, None)

    def stop(self) -> None:
        self._stop.set()

    @kafka_errors("running a Task")
    def run(self, *, max_idle_ms: int | None = None, install_signals: bool = False) -> TaskCounters:
        """Process until ``stop()`` (or SIGTERM with ``install_signals``), or until no input
        arrived for ``max_idle_ms``. Shuts down cleanly: flush, commit, close."""
        if install_signals:
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
        self.check_topics()  # refuse to start on a namespace or topics that are not usable
        if self.config.skip_superseded and self._skip is None:
            self._skip = SupersededSkip(
                SupersededMarkers(self.settings, self.ns, group_id=self.group_id, kafka=self.kafka),
                self.counters, self._producer.flush,
                slow_batch_ms=self.config.slow_batch_ms, superseded_wait_ms=self.config.superseded_wait_ms,
            )
        self._join_group()
        self._subscribe()
        idle_since = time.monotonic()
        self.metrics_server = serve(self.metrics.registry, self.config.metrics_port)
        try:
            while not self._stop.is_set():
                if self._outage.paused:
                    self._hold.wait_out()
                # poll() returns as soon as one message is there (consume(n, timeout) would
                # wait the whole timeout unless n messages arrive); then take what is ready.
                first = self._consumer.poll(self.config.poll_timeout_ms / 1000)
                if first is not None and self._protocol_refused(first):
                    continue
                batch: list[Message] = [] if first is None else [first]
                self._revoked.clear()
                if first is not None and self.config.batch_size > 1:
                    batch.extend(self._consumer.consume(self.config.batch_size - 1, 0))
                    if batch and (batch[0].topic(), batch[0].partition()) in self._revoked:
                        # Revoked while the rest was taken: `first` belongs to the old assignment, and its
                        # owner reads it again from the committed offset - processing it
                        # here would ack it twice. librdkafka already drops such messages
                        # within one consume() call; `first` came from the poll before.
                        batch.pop(0)
                        self.counters.dropped_revoked += 1
                if batch:
                    idle_since = time.monotonic()
                    self.handle_batch(batch)
                if self._uncommitted and time.monotonic() >= self._commit_due:
                    self.finish()
                if not batch and max_idle_ms is not None and time.monotonic() - idle_since > max_idle_ms / 1000:
                    break
        finally:
            self.close()
        return self.counters

    def _protocol_refused(self, msg: Message) -> bool:
        """A cluster of Kafka >= 4.0 with the consumer protocol switched off refuses the
        heartbeat with a fatal error: join again with the classic protocol."""
        err = msg.error()
        if err is None or self._group_protocol != "consumer" or not consumer_protocol_refused(err):
            return False
        self._fall_back(f"the group refused the consumer protocol ({err.str()})")
        self._subscribe()
        return True

    def check_before_run(self) -> None:
        self.check_topics()  # run_in_background(): unusable topics raise at once

    def run_in_background(self) -> contextlib.AbstractContextManager[Self]:
        """``run()`` on a thread of this process while a ``with`` block runs, then a clean
        stop (broker.background)."""
        return running(self)

    @kafka_errors("processing a batch")
    def process_batch(self, batch: list[Message]) -> set[int]:
        """Process, deliver, commit one batch (``handle_batch``, then ``finish``). Returns the
        srids failed because an output of theirs could not be delivered (empty when
        everything was delivered)."""
        undeliverable = self.handle_batch(batch)
        return undeliverable | self.finish()

    @kafka_errors("handling a batch")
    def handle_batch(self, batch: list[Message]) -> set[int]:
        """Steps 1-3: run the handler on each input, send the batch's events (after its sink
        outputs are delivered). Returns the srids failed because a sink output of theirs
        could not be delivered; ``finish`` confirms the rest. Empties ``batch`` (``_records``)."""
        events = Events()
        offsets: Offsets = {}
        skip = self._skip
        records = self._records(batch, events, offsets, None if skip is None else skip.begin_batch())
        try:
            if self.batch_handler is None:
                self._handle_each(records, events)
            else:
                self._handle_all(self.batch_handler, list(records), events)
        except PutBack as back:
            self._hold.put_back(back.records, batch, offsets)
        if skip is not None:
            skip.end_batch()  # a slow batch: its inputs' replays may wait for their markers
        undeliverable: set[int] = set()
        if self._outputs_pending:
            # Sink outputs first: an input is acked only after its outputs are delivered - one
            # whose output stays undeliverable is failed in its event batch instead.
            self._outputs_pending = False
            undeliverable = self._deliver(events)
        self._acks.send(events)
        self._uncommitted.update(offsets)
        return undeliverable

    @kafka_errors("committing a Task's batches")
    def finish(self) -> set[int]:
        """Steps 4-5 for every batch handled since the last finish: wait for their outputs and
        events (sending again what failed, failing the source records of what stays
        undeliverable), then commit their input offsets. Returns the srids failed."""
        undeliverable = self._deliver()
        offsets, self._uncommitted = self._uncommitted, {}
        self._commit_due = time.monotonic() + self.config.commit_interval_ms / 1000
        if offsets:
            self._commit(offsets)
        return undeliverable

    def _commit(self, offsets: Offsets) -> None:
        try:
            self._consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False
            )
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and (means(err, Meaning.COORDINATOR_AWAY) or (err.retriable() and not err.fatal())):
                # Not committed yet, and still ours: the offsets go with the next commit (newer
                # offsets of a partition read since win). A crash before that redoes the
                # batches, whose events arrive twice - that only delays their completion.
                for tp, offset in offsets.items():
                    self._uncommitted.setdefault(tp, offset)
                self.counters.commits_deferred += 1
                log.warning("offsets not committed yet (%s): committed with the next batch", err)
                return
            if not means(err, Meaning.LOST_MEMBERSHIP):
                raise
            # The group moved on while this batch ran (UNKNOWN_MEMBER_ID and the like: not the
            # task's fault, and no reason to die). The new owner resumes from the last committed offsets and
            # runs the batch again: its events arrive twice, which only delays completion.
            self.counters.commits_lost += 1
            log.warning("offsets not committed (%s): the partitions moved; their new owner redoes the batch", err)

    def _deliver(self, events: Events | None = None) -> set[int]:
        """Wait for the outputs produced so far. Only what failed is sent again (the user code
        does not run twice); what cannot be delivered fails its source record - in ``events``
        when they are still to be sent, else with fail marks of its own - so the batch is
        committed either way. Returns the srids failed."""
        self._producer.flush()
        if not self._outputs.failed:
            return set()
        self.counters.retried_batches += 1
        return self._acks.fail_undeliverable(self._outputs.redeliver(), events)

    def _records(self, batch: list[Message], events: Events, offsets: Offsets, origins: list[int] | None = None) -> Iterator[TaskRecord]:
        """The handler's inputs of ``batch``, in order, as it takes them; a superseded replay is
        acked here, as a leaf, without the handler (broker.task.superseded). The offsets to
        commit go to ``offsets``, once per run of a partition; the tracked inputs' origins to
        ``origins`` (the skip's, for a slow batch). Empties ``batch``, letting go of each
        message once read: kept to the batch's end, its messages (GC-tracked, with their
        header lists) reach the oldest generation."""
        serde, skip = self.config.serde, self._skip
        default, serdes = serde, self.config.serdes
        run_topic, run_partition, last, take = None, -1, 0, batch.pop
        batch.reverse()
        while batch:
            msg = take()
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", msg.error())
                continue
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            if partition != run_partition or topic != run_topic:
                if run_topic is not None:
                    offsets[(run_topic, run_partition)] = last + 1
                run_topic, run_partition = topic, partition
                if serdes:
                    serde = serdes.get(topic, default)
            last = offset
            headers = tuple(msg.headers() or ())
            tracking = tracking_of(headers)
            if tracking is not None and origins is not None:
                origins.append(tracking.origin)
            if tracking is not None and tracking.attempt > 1 and skip is not None and skip.skip(tracking, events):
                continue  # its original attempt completed after all: acked as a leaf
            yield _new_tuple(TaskRecord, (topic, partition, offset, msg.key(), msg.value(), headers, tracking, serde))
        if run_topic is not None:
            offsets[(run_topic, run_partition)] = last + 1

    def _handle_each(self, records: Iterable[TaskRecord], events: Events) -> None:
        """The per-record handler's path. Each input is settled at once, not kept for the batch:
        the garbage collector would scan what is kept; the usual input, a
        leaf acked, without a call of ``settle``."""
        handler, counters, srids, xors = self.handler, self.counters, events.srids, events.xors
        acked = processed = 0
        try:
            for record in records:
                processed += 1
                ctx = TaskContext(self, record)
                try:
                    handler(record, ctx)
                except self.config.outage as exc:
                    if self._outage.holds_on():
                        processed -= 1
                        raise PutBack([record]) from None
                    if not self._failed_by(exc, [ctx] if ctx.failed is None else []):
                        raise
                except Exception as exc:
                    if not self._failed_by(exc, [ctx] if ctx.failed is None else []):
                        raise
                else:
                    if self._outage.since is not None:
                        self._outage.over()
                tracking = record.tracking
                if tracking is not None and ctx.failed is None and not ctx.children:
                    srids.append(tracking.srid)
                    xors.append(tracking.record_id)
                    acked += 1
                else:
                    settle(ctx, events, counters)
        finally:
            counters.processed += processed
            counters.acked += acked

    def _handle_all(self, batch_handler: BatchHandler, records: list[TaskRecord], events: Events) -> None:
        """The batch handler's path: every input to one call; an exception fails every input
        not failed already."""
        if not records:
            return
        self.counters.processed += len(records)
        contexts = [TaskContext(self, r) for r in records]
        try:
            batch_handler(records, contexts)
        except self.config.outage as exc:
            if self._outage.holds_on():
                self.counters.processed -= len(records)
                raise PutBack(records) from None
            if not self._failed_by(exc, [c for c in contexts if c.failed is None]):
                raise
        except Exception as exc:
            if not self._failed_by(exc, [c for c in contexts if c.failed is None]):
                raise
        else:
            if self._outage.since is not None:
                self._outage.over()
        for ctx in contexts:
            settle(ctx, events, self.counters)

    def _failed_by(self, exc: Exception, contexts: list[TaskContext]) -> bool:
        """User code raised: fail its inputs (replay). False with ``fail_on_exception`` off:
        the exception stops the task instead."""
        self.counters.errors += 1
        fatal = isinstance(exc, self.config.fatal)
        if self.config.fail_on_exception or fatal:
            fail_all(exc, contexts, fatal)
        return self.config.fail_on_exception or fatal

    def close(self) -> None:
        if self._uncommitted:
            try:
                self.finish()
            except (KafkaClientError, RuntimeError) as exc:
                log.warning("could not commit the last inputs at close: %s", exc)
        with contextlib.suppress(KafkaException, RuntimeError):
            self._producer.flush(30)
        with contextlib.suppress(KafkaException, RuntimeError):
            self._consumer.close()
        if self._skip is not None:
            self._skip.close()
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None
