"""``Bridge``: turns a topic written by producers we do not control into source records
(docs/design.md §8, *Bridge*; README, *Bridging an existing topic*).

One transactional ``Source`` (``transactional.id`` = ``ns.bridge.<instance-id>``) and one
consumer group on the input topic (``read_committed``, no automatic commits). Per batch of
up to ``batch_records`` records or ``batch_ms``, one Kafka transaction holds:

1. for each input record, what ``Source.send`` writes: its persist record and its data record
   at the key's partition of the target topic, with the input's headers plus ``rb-input``
   (``topic/partition/offset`` read) and ``rb-input-ts`` (the input's timestamp);
2. the input offsets after the last record read of each partition
   (``Source.send_offsets``: ``send_offsets_to_transaction`` with the consumer's group
   metadata);
3. the commit. Persist records, data records and input offsets become visible together, or
   not at all.

So a crash neither skips nor repeats an input record. Killed before 3: the open transaction is
aborted - by the restarted instance's ``init_transactions`` (same instance id), else after
``transaction_timeout_ms`` - and the group's offsets still point at the batch's first record,
which is bridged again: once, as nothing of the first try is visible to ``read_committed``
readers (the acker, tasks). Killed after 3: the next instance resumes after the batch.

A rebalance that takes partitions (revoke, lost) aborts the open transaction as soon as the
poll that ran the callback returns, before anything more is produced; the partitions this
member keeps are sought back to their committed offsets, so what was read and not committed is
read again. Offsets sent by a member that lost its partitions without noticing are refused by
the group coordinator (its generation is old): that transaction fails and is aborted too.

A record the broker refuses for what it is (too large for the target topic's
``max.message.bytes``, invalid, against a policy - ``broker.kafka_errors.Meaning.REFUSED_RECORD``) is
often refused only at the commit, after its persist record was accepted: the whole
transaction fails, and read again it would fail again, forever, holding up every partition of
this bridge. So a batch whose commit failed with such a refusal is *suspect*: its records are
read again and bridged one per transaction up to where the batch ended; one that fails alone
is the refused record, and is quarantined the next time it is read - kept in ``ns.dlq`` with
``rb-source`` (where it is in the input), in a transaction with its input offset, counted in
``quarantined`` - then batching resumes. A dead letter the DLQ refuses as well is written
again without its value.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Self

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from broker.background import running
from broker.errors import (
    BridgeFenced,
    ConfigurationError,
    DeliveryError,
    KafkaClientError,
    ReplayBrokerError,
)
from broker.headers import H_INPUT, H_INPUT_TS, H_REASON, H_SOURCE, QUARANTINE_PREFIX
from broker.kafka_errors import Meaning, kafka_errors_in, means
from broker.kafka_io import kafka_errors, retrying
from broker.kafka_port import KafkaClients, KafkaPort
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.topics import Namespace

log = logging.getLogger(__name__)

TARGET_SUFFIX = ".guaranteed"

def default_target(input_topic: str) -> str:
    """The target topic when none is given: ``<input>.guaranteed``."""
    return f"{input_topic}{TARGET_SUFFIX}"


def default_instance_id() -> str:
    """Host name, process id and a random suffix: two bridges never share a transactional id
    by accident (each would fence the other). Not stable across restarts: a stable
    ``instance_id`` lets a restart abort its predecessor's open transaction at once."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class _Rebalanced(Exception):
    """Raised inside the open transaction when partitions were taken from this member: the
    ``with source.transaction()`` block aborts on it."""


@dataclass(frozen=True)
class BridgeConfig:
    input_topic: str
    # Empty: default_target(input_topic). It and its replay topic must exist.
    target_topic: str = ""
    # Empty: "<ns>.bridge.<input_topic>".
    group_id: str = ""
    # Stable per instance: transactional.id "<ns>.bridge.<instance_id>" (a restart fences its
    # predecessor at once) and a static group member of that name (a restart gets its
    # partitions back without a rebalance). Empty: default_instance_id(), dynamic member.
    instance_id: str = ""
    batch_records: int = 1000
    batch_ms: int = 100
    poll_timeout_ms: int = 50
    session_timeout_ms: int = 10_000
    # How long a killed instance's open transaction holds back read_committed readers of the
    # target and the persist topic, when it is not restarted with the same instance id.
    transaction_timeout_ms: int = 10_000
    # The source records' own settings (Source.send).
    timeout_ms: int = 30_000
    max_attempts: int = 5
    partitioner: str = "kafka"
    # False (--unsafe-commit): no transaction - a plain Source, flushed, then the offsets
    # committed. Only to show, in a test, that a crash then repeats input records.
    exactly_once: bool = True
    # Where a group without committed offsets starts reading the input: "earliest" (every
    # record the topic still holds) or "latest" (only what is written after it first joins:
    # what was there before is never bridged). A group with committed offsets resumes there.
    start: str = "earliest"
    consumer: Mapping[str, Any] = field(default_factory=dict)
    producer: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.batch_records < 1 or self.batch_ms < 1:
            raise ConfigurationError("batch_records and batch_ms must be at least 1")
        if self.start not in ("earliest", "latest"):
            raise ConfigurationError(f"start must be 'earliest' or 'latest', not {self.start!r}")


@dataclass
class BridgeCounters:
    read: int = 0  # input records taken from the consumer (again after an abort)
    bridged: int = 0  # input records committed as source records
    transactions: int = 0  # committed batches
    aborts: int = 0  # batches aborted (rebalance, commit failure); their records are read again
    reread: int = 0  # records read, then dropped by an abort, to be read again
    rebalances: int = 0  # revocations and losses of partitions
    quarantined: int = 0  # input records the broker refused as source records, kept in ns.dlq

    def summary(self) -> str:
        return " ".join(f"{k}={v}" for k, v in asdict(self).items())


class Bridge:
    """Bridges ``config.input_topic`` into ``config.target_topic`` as source records, one
    transaction per batch (module docstring). ``run()`` until ``stop()`` or SIGTERM."""

    @kafka_errors("building a Bridge")
    def __init__(
        self, settings: KafkaSettings, namespace: str | Namespace, config: BridgeConfig, *, kafka: KafkaPort | None = None
    ) -> None:
        """``kafka``: the bridge's clients and look-ups, its source's too (default: the real
        clients of ``settings``)."""
        self.ns = namespace if isinstance(namespace, Namespace) else Namespace(namespace)
        self.config = config
        self.settings = settings
        self.kafka: KafkaPort = kafka or KafkaClients(settings)
        self.input = config.input_topic
        self.target = config.target_topic or default_target(self.input)
        self.group_id = config.group_id or f"{self.ns.name}.bridge.{self.input}"
        self.instance_id = config.instance_id or default_instance_id()
        self.transactional_id = f"{self.ns.name}.bridge.{self.instance_id}"
        self.counters = BridgeCounters()
        producer = dict(config.producer)
        if config.exactly_once:
            producer.setdefault("transaction.timeout.ms", config.transaction_timeout_ms)
        self.source = Source(
            settings, self.ns,
            SourceConfig(timeout_ms=config.timeout_ms, max_attempts=config.max_attempts,
                         partitioners={self.target: config.partitioner}, producer=producer),
            transactional_id=self.transactional_id if config.exactly_once else None, kafka=self.kafka,
        )
        required: dict[str, Any] = {"isolation.level": "read_committed", "auto.offset.reset": config.start}
        if config.instance_id:
            required["group.instance.id"] = self.transactional_id
        self._consumer = self.kafka.consumer(settings.consumer_config(
            self.group_id, required=required, user=config.consumer,
            defaults={"session.timeout.ms": config.session_timeout_ms, "fetch.wait.max.ms": 10},
        ))
        self._owned: set[tuple[str, int]] = set()
        self._taken = False  # partitions revoked or lost since the last poll
        # Per input partition read since the last commit: (first offset, next offset).
        self._read: dict[tuple[str, int], tuple[int, int]] = {}
        # After a commit refused for a record (module doc): per input partition, the offset up
        # to which records are bridged one per transaction; and the records refused alone:
        # (topic, partition, offset) -> (why, whether the DLQ refused its value as well).
        self._suspect: dict[tuple[str, int], int] = {}
        self._sent = 0  # input records in the open transaction
        self._refused: dict[tuple[str, int, int], tuple[str, bool]] = {}
        self._stop = threading.Event()

    # ------------------------------------------------------------------ life cycle

    @kafka_errors("checking the Bridge's topics")
    def check_topics(self) -> None:
        """Refuse to start on topics it could not use; the bridge creates nothing: the
        namespace (``topics.check``), the input topic, the target topic and its replay topic
        (same partition count)."""
        _ = self.source.ledger_partitions  # TopologyError when the namespace is off
        if self.input == self.target:
            raise ConfigurationError(f"the bridge cannot write into the topic it reads ({self.input})")
        counts = self.kafka.partition_counts([self.input, self.target])
        if counts[self.input] is None:
            raise ConfigurationError(f"input topic {self.input} does not exist")
        if counts[self.target] is None:
            raise ConfigurationError(
                f"target topic {self.target} does not exist (the bridge creates nothing): replaybroker topics "
                f"create --namespace {self.ns.name} --data-topic {self.target}:{counts[self.input]}"
            )
        self.source.data_partitions(self.target)  # its replay topic, same partition count

    def check_before_run(self) -> None:
        self.check_topics()  # run_in_background(): unusable topics raise at once

    def run_in_background(self) -> contextlib.AbstractContextManager[Self]:
        """``run()`` on a thread of this process while a ``with`` block runs, then a clean
        stop (broker.background)."""
        return running(self)

    @kafka_errors("starting a Bridge")
    def start(self) -> None:
        self.check_topics()
        if self.config.exactly_once:
            # Before the group's offsets are read: fences the predecessor with our
            # transactional id and aborts what it left open, so they are final.
            self.source.init_transactions()
        self._consumer.subscribe(
            [self.input], on_assign=self._on_assign, on_revoke=self._on_taken, on_lost=self._on_taken
        )

    def stop(self) -> None:
        self._stop.set()

    @kafka_errors("running a Bridge")
    def run(self, *, install_signals: bool = False) -> BridgeCounters:
        """Bridge until ``stop()`` (or SIGTERM/SIGINT with ``install_signals``); the batch
        open then is committed, and the summary logged."""
        if install_signals:
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())
        self.start()
        log.info(
            "bridge %s: %s -> %s (namespace %s, group %s, %s)", self.instance_id, self.input, self.target,
            self.ns.name, self.group_id,
            f"transactional id {self.transactional_id}" if self.config.exactly_once else "UNSAFE: no transactions",
        )
        try:
            while not self._stop.is_set():
                self.step()
        finally:
            self.close()
        return self.counters

    def close(self) -> None:
        with contextlib.suppress(KafkaException, RuntimeError):
            self._consumer.close()  # a dynamic member leaves the group: its partitions move at once
        with contextlib.suppress(KafkaException, ReplayBrokerError, RuntimeError):
            self.source.close()
        log.info("bridge %s stopped: %s", self.instance_id, self.counters.summary())

    # ------------------------------------------------------------------ one batch

    @kafka_errors("bridging a batch")
    def step(self) -> int:
        """One batch, read, sent and committed with its input offsets (one transaction).
        Returns the records bridged; 0 when the batch was aborted (they are read again)."""
        self._read.clear()
        self._sent = 0
        try:
            if self.config.exactly_once:
                with self.source.transaction():
                    n = self._fill()
                    if n:
                        self.source.send_offsets(self._offsets(), self._group_metadata())
            else:
                n = self._fill()
                if n:  # the naive way: records first, offsets after - a crash between repeats them
                    self.source.flush()
                    self._consumer.commit(offsets=self._offsets(), asynchronous=False)
        except _Rebalanced:
            self._abandon("partitions were revoked or lost")
            return 0
        except (KafkaException, KafkaClientError, DeliveryError) as exc:
            if _fenced(exc):
                raise BridgeFenced(f"bridge {self.instance_id} was fenced by a newer instance: {exc}") from exc
            self._suspect_refusal(exc)
            self._abandon(f"the transaction failed: {exc}")
            return 0
        if n:
            self.counters.transactions += 1
            self.counters.bridged += n
            for tp, (_, end) in self._read.items():
                for where in [w for w in self._refused if w[:2] == tp and w[2] < end]:
                    del self._refused[where]  # quarantined and committed
                suspect = self._suspect.get(tp)
                if suspect is not None and suspect <= end:
                    del self._suspect[tp]
                    log.info("bridge %s: %s[%d] past the refused batch, batches again", self.instance_id, *tp)
        return n

    def _suspect_refusal(self, exc: BaseException) -> None:
        """A commit that failed for what a record is (REFUSED_RECORD): with one record in the
        transaction, that record is refused; with more, the batch is read again record by
        record (module doc)."""
        err = _kafka_error(exc)
        if err is None or not means(err, Meaning.REFUSED_RECORD):
            return
        if self._sent == 1 and len(self._read) == 1:
            (topic, partition), (_, end) = next(iter(self._read.items()))
            where = (topic, partition, end - 1)
            before = self._refused.get(where)  # quarantined, and the DLQ refused that too
            self._refused[where] = (err.str(), False) if before is None else (before[0], True)
            log.warning("bridge %s: %s[%d]@%d refused alone (%s): quarantined when read again",
                        self.instance_id, topic, partition, end - 1, err.str())
        else:
            for tp, (_, end) in self._read.items():
                self._suspect[tp] = max(end, self._suspect.get(tp, end))
            log.warning("bridge %s: a record of the batch was refused (%s): its records are bridged one per "
                        "transaction", self.instance_id, err.str())

    def _fill(self) -> int:
        """Read and send until the batch is full, its time is up, or the bridge stops. Records
        are sent as they are read: the transaction holds them until the commit."""
        n = 0
        until = time.monotonic() + self.config.batch_ms / 1000
        limit = 1 if self._suspect else self.config.batch_records
        while n < limit and not self._stop.is_set():
            left = until - time.monotonic()
            if left <= 0:
                break
            msgs = self._take(limit - n, min(left, self.config.poll_timeout_ms / 1000))
            self.source.prepare_keys(self.target, [m.key() for m in msgs if m.error() is None])
            for msg in msgs:
                n += self._bridge(msg)
        return n

    def _take(self, limit: int, timeout: float) -> list[Message]:
        """Up to ``limit`` input records. A poll that revoked or lost partitions raises
        ``_Rebalanced`` once anything was read since the last commit: its records were read
        under the old assignment (noted, so the rewind covers them)."""
        self._taken = False
        # poll() returns as soon as one record is there (consume(n, t) waits for n or t).
        first = self._consumer.poll(timeout)
        msgs = [] if first is None else [first]
        if first is not None and limit > 1:
            msgs.extend(self._consumer.consume(limit - 1, 0))
        if self._taken:
            for msg in msgs:
                if msg.error() is None:
                    self._note(msg)
            if self._read:
                raise _Rebalanced
        return msgs

    def _bridge(self, msg: Message) -> int:
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return 0
            if err.fatal():
                raise KafkaException(err)
            log.warning("consume error on %s: %s", self.input, err.str())
            return 0
        self._note(msg)
        self.counters.read += 1
        self._sent += 1
        where = f"{msg.topic()}/{msg.partition()}/{msg.offset()}".encode()
        refused = self._refused.get((msg.topic(), msg.partition(), msg.offset()))
        if refused is not None:
            why, dlq_refused_too = refused
            self._quarantine(msg, where, f"the broker refused it: {why}", with_value=not dlq_refused_too)
            return 1
        headers = [(k, v) for k, v in msg.headers() or () if k not in (H_INPUT, H_INPUT_TS)]
        headers.append((H_INPUT, where))
        ts_type, ts = msg.timestamp()
        if ts_type != TIMESTAMP_NOT_AVAILABLE:
            headers.append((H_INPUT_TS, str(ts).encode()))
        try:
            self.source.send(self.target, msg.key(), msg.value(), headers)
        except DeliveryError as exc:
            if not exc.failures:  # not this record's fault (Kafka is not taking records)
                raise
            self._quarantine(msg, where, str(exc))
        return 1

    def _quarantine(self, msg: Message, where: bytes, why: str, *, with_value: bool = True) -> None:
        """An input record the broker refused at once as a source record (a persist record
        over ``message.max.bytes``): kept byte for byte in ``ns.dlq``, in the same
        transaction, so the bridge goes on - bad input never stops it. Too large for the DLQ
        as well: kept without its value (``rb-source`` says where to find it)."""
        reason = f"{QUARANTINE_PREFIX}bridge: {why}"
        if not with_value:
            reason += f"; value dropped: {self.ns.dlq} refused it too"
        try:
            self.source.produce(self.ns.dlq, msg.key(), msg.value() if with_value else None,
                                headers=[(H_REASON, reason.encode()), (H_SOURCE, where)])
        except KafkaClientError as exc:  # refused at once: nothing was added to the transaction
            reason += f"; value dropped: {exc.reason}"
            self.source.produce(self.ns.dlq, msg.key(), None, headers=[(H_REASON, reason.encode()), (H_SOURCE, where)])
        self.counters.quarantined += 1
        log.warning("input %s quarantined in %s: %s", where.decode(), self.ns.dlq, reason)

    def _note(self, msg: Message) -> None:
        tp = (msg.topic(), msg.partition())
        first, _ = self._read.get(tp, (msg.offset(), 0))
        self._read[tp] = (min(first, msg.offset()), msg.offset() + 1)

    def _offsets(self) -> list[TopicPartition]:
        return [TopicPartition(t, p, end) for (t, p), (_, end) in self._read.items()]

    def _group_metadata(self) -> Any:
        try:
            return self._consumer.consumer_group_metadata()
        except RuntimeError as exc:  # not a member (left the group, or timed out): no commit
            raise KafkaException(KafkaError(KafkaError._STATE, f"not a group member: {exc}")) from exc

    # ------------------------------------------------------------------ aborts

    def _abandon(self, why: str) -> None:
        """After an abort: read again, from the committed offsets, every partition still owned
        that was read since the last commit."""
        read = sum(end - first for first, end in self._read.values())
        self.counters.aborts += 1
        self.counters.reread += read
        log.warning("batch aborted (%s); up to %d records read since the last commit are read again", why, read)
        if self.config.exactly_once:
            # The aborted producer's successor fences it first: the group's offsets are final.
            self.source.init_transactions()
        self._rewind()
        self._read.clear()

    def _rewind(self) -> None:
        """Seek back to the committed offsets - asked from the group, not assumed: a commit
        reported failed may have landed, and then its records must not be read again."""
        owned = [TopicPartition(t, p) for (t, p) in self._read if (t, p) in self._owned]
        if not owned:
            return
        committed = retrying(lambda: self._consumer.committed(owned, timeout=30), "reading committed offsets")
        for tp in committed:
            first, _ = self._read[(tp.topic, tp.partition)]
            offset = tp.offset if tp.offset >= 0 else first  # nothing committed yet: where it started
            self._consumer.seek(TopicPartition(tp.topic, tp.partition, offset))

    # ------------------------------------------------------------------ rebalance callbacks

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._owned |= {(tp.topic, tp.partition) for tp in partitions}
        log.info("bridge %s assigned %s", self.instance_id, sorted(tp.partition for tp in partitions))

    def _on_taken(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Revoked or lost: nothing read from them may be committed by us now. The open
        # transaction is aborted when the poll running this returns (_take).
        self._owned -= {(tp.topic, tp.partition) for tp in partitions}
        for tp in partitions:
            self._suspect.pop((tp.topic, tp.partition), None)
        self._taken = True
        if not self._stop.is_set():  # closing the consumer revokes too: not a rebalance
            self.counters.rebalances += 1
        log.info("bridge %s gave up %s", self.instance_id, sorted(tp.partition for tp in partitions))


def _kafka_error(exc: BaseException) -> KafkaError | None:
    """The first KafkaError in the chain of ``exc``."""
    return next(kafka_errors_in(exc), None)


def _fenced(exc: BaseException) -> bool:
    """A newer instance holds our transactional id or group instance id (anywhere in the
    chain)."""
    return any(means(err, Meaning.PRODUCER_FENCED | Meaning.INSTANCE_FENCED) for err in kafka_errors_in(exc))

