"""Clients: ``Source`` puts records under the broker's guarantee, ``Task`` processes them.

Headers on every tracked data record (8-byte big-endian ids):
``rb-srid`` (this attempt), ``rb-id`` (this record), ``rb-origin`` (first attempt),
``rb-attempt`` (ASCII int).

The XOR ledger (DESIGN §4): every record id is XORed into its srid exactly twice - once by
its creator (the source's persist record, or the parent's task event) and once by its
consumer's task event. A task's event for input r is ONE value ``r.id ^ child_1.id ^ ...``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from broker import ids
from broker.errors import ConfigurationError, DeliveryError
from broker.partitioning import get_partitioner
from broker.schemas import Failure, XorBatch, encode_persisted, persist_headers
from broker.settings import KafkaSettings
from broker.topics import Namespace, check, partition_counts, replay_topic

log = logging.getLogger(__name__)

H_SRID, H_ID, H_ORIGIN, H_ATTEMPT = "rb-srid", "rb-id", "rb-origin", "rb-attempt"
RB_HEADERS = frozenset({H_SRID, H_ID, H_ORIGIN, H_ATTEMPT})
_ZERO_ID = bytes(8)

Headers = Sequence[tuple[str, bytes | None]]


def tracking_headers(srid: int, record_id: int, origin: int, attempt: int) -> list[tuple[str, bytes]]:
    srid_b = srid.to_bytes(8, "big", signed=True)
    return [
        (H_SRID, srid_b),
        (H_ID, record_id.to_bytes(8, "big", signed=True)),
        (H_ORIGIN, srid_b if origin == srid else origin.to_bytes(8, "big", signed=True)),
        (H_ATTEMPT, b"1" if attempt == 1 else str(attempt).encode()),
    ]


class Tracking(NamedTuple):
    """The rb-* headers of a data record, decoded."""

    srid: int
    record_id: int
    origin: int
    attempt: int

    @classmethod
    def from_headers(cls, headers: Headers | None) -> Tracking | None:
        """None when the record is not tracked (no or malformed rb-* headers). A repeated
        header: the last one wins."""
        if not headers:
            return None
        srid = record_id = origin = attempt = None
        for k, v in headers:  # one pass; ids are 8-byte big-endian two's complement
            if k == H_SRID:
                srid = v
            elif k == H_ID:
                record_id = v
            elif k == H_ORIGIN:
                origin = v
            elif k == H_ATTEMPT:
                attempt = v
        if not srid or not record_id or len(srid) != 8 or len(record_id) != 8:
            return None
        if srid == _ZERO_ID or record_id == _ZERO_ID:  # 0 is the XOR identity, never an id
            return None
        if not origin:
            origin = srid
        elif len(origin) != 8:
            return None
        if not attempt or attempt == b"1":
            n = 1
        else:
            try:
                n = int(attempt)
            except ValueError:
                return None
        return cls(
            int.from_bytes(srid, "big", signed=True),
            int.from_bytes(record_id, "big", signed=True),
            int.from_bytes(origin, "big", signed=True),
            n,
        )


def _to_bytes(value: bytes | str | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return value.encode()


# --------------------------------------------------------------------------- Source


class SendResult(NamedTuple):
    srid: int
    record_id: int
    key_hash_partition: int
    origin: int


@dataclass(frozen=True)
class SourceConfig:
    timeout_ms: int = 30_000
    max_attempts: int = 5
    # Data topic -> partitioner name ("kafka" or "spark"); unlisted topics use "kafka".
    partitioners: Mapping[str, str] = field(default_factory=dict)
    producer: Mapping[str, Any] = field(default_factory=dict)


class Source:
    """Puts records under the broker's guarantee.

    ``send`` produces the ``PersistedRecord`` to ``ns.persist[srid mod P]`` (persisting IS
    registering: it carries the root's creation event) and then the data record to the key's
    partition of the data topic. A persist record that fails to deliver raises
    ``DeliveryError`` from a later ``send`` or from ``flush`` (the data record may be out
    already: that is at-least-once, not loss).

    With ``transactional_id`` the persist and data records of a batch commit atomically::

        with source.transaction():
            for key, value in batch:
                source.send("orders", key, value)
    """

    def __init__(
        self,
        settings: KafkaSettings,
        namespace: str | Namespace,
        config: SourceConfig | None = None,
        *,
        transactional_id: str | None = None,
    ) -> None:
        self.ns = namespace if isinstance(namespace, Namespace) else Namespace(namespace)
        self.config = config or SourceConfig()
        self.settings = settings
        self.ledger_partitions = check(settings, self.ns)
        # Only failed deliveries matter (they raise): no Python callback per delivered record.
        overrides: dict[str, Any] = {"linger.ms": 5, "delivery.report.only.error": True, **self.config.producer}
        if transactional_id:
            overrides["transactional.id"] = transactional_id
        self._producer = Producer(settings.producer_config(**overrides))
        self._transactional = transactional_id is not None
        if self._transactional:
            self._producer.init_transactions(30)
        self._in_transaction = False
        self._partitions: dict[str, int] = {}
        self._failures: list[DeliveryError] = []
        self._on_persist = self._persist_callback(self._failures)
        self.sent = 0

    def _data_partitions(self, topic: str) -> int:
        n = self._partitions.get(topic)
        if n is None:
            replay = replay_topic(topic)
            counts = partition_counts(self.settings, [topic, replay])
            n = counts[topic]
            if n is None:
                raise ConfigurationError(f"data topic {topic} does not exist")
            if counts[replay] != n:
                raise ConfigurationError(
                    f"{replay} must exist with the {n} partitions of {topic} (it has "
                    f"{counts[replay]}): replaybroker topics create --namespace "
                    f"{self.ns.name} --data-topic {topic}:{n}"
                )
            self._partitions[topic] = n
        return n

    @staticmethod
    def _persist_callback(failures: list[DeliveryError]) -> Callable[[KafkaError | None, Message], None]:
        # A closure over the list, not a bound method: the producer must not hold the Source
        # (a reference cycle would keep its Kafka clients alive until garbage collection).
        def on_persist(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failures.append(DeliveryError(f"persist record not delivered: {err}", record=msg))

        return on_persist

    def _raise_failures(self) -> None:
        if self._failures:
            first = self._failures[0]
            self._failures.clear()
            raise first

    def key_hash_partition(self, topic: str, key: bytes | None) -> int:
        n = self._data_partitions(topic)
        if key is None:
            return random.randrange(n)
        return get_partitioner(self.config.partitioners.get(topic, "kafka")).partition(key, n)

    def send(
        self,
        topic: str,
        key: bytes | str | None,
        value: bytes | str | None,
        headers: Headers | None = None,
        *,
        timeout_ms: int | None = None,
        max_attempts: int | None = None,
    ) -> SendResult:
        self._producer.poll(0)
        self._raise_failures()
        if self._transactional and not self._in_transaction:
            raise ConfigurationError("a transactional Source sends inside `with source.transaction():`")
        key_b = _to_bytes(key)
        return self._send_first_attempt(
            topic, key_b, _to_bytes(value), headers, None, self.key_hash_partition(topic, key_b),
            self.config.partitioners.get(topic, "kafka"), (), timeout_ms, max_attempts,
        )

    def resend(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
        *,
        origin: int,
        key_hash_partition: int,
        partitioner: str = "kafka",
        history: Sequence[Failure] = (),
        timeout_ms: int | None = None,
        max_attempts: int | None = None,
    ) -> SendResult:
        """Send a record again as a FRESH source record that keeps its ``origin`` (DLQ
        redrive): new srid and record id, attempt 1, to ``topic`` (not its replay topic) at the
        ``key_hash_partition`` stored the first time - not recomputed, so key order and
        locality hold even if the partitioner setting changed. ``history`` (the earlier
        rounds) is carried into the new persist record, so a later DLQ entry shows it all."""
        self._producer.poll(0)
        self._raise_failures()
        if self._transactional and not self._in_transaction:
            raise ConfigurationError("a transactional Source sends inside `with source.transaction():`")
        if not 0 <= key_hash_partition < self._data_partitions(topic):
            raise ConfigurationError(
                f"{topic} has {self._data_partitions(topic)} partitions; cannot resend to {key_hash_partition}"
            )
        return self._send_first_attempt(
            topic, key, value, headers, origin, key_hash_partition, partitioner, tuple(history),
            timeout_ms, max_attempts,
        )

    def _send_first_attempt(
        self,
        topic: str,
        key_b: bytes | None,
        value_b: bytes | None,
        headers: Headers | None,
        origin: int | None,
        partition: int,
        partitioner: str,
        history: tuple[Failure, ...],
        timeout_ms: int | None,
        max_attempts: int | None,
    ) -> SendResult:
        user_headers = (
            tuple((k, _to_bytes(v)) for k, v in headers if k not in RB_HEADERS) if headers else ()
        )
        srid, record_id = ids.new_id(), ids.new_id()
        origin = srid if origin is None else origin
        created_ms = int(time.time() * 1000)
        timeout_ms = timeout_ms or self.config.timeout_ms
        # The PersistedRecord, encoded straight from its fields; the rb-root / rb-deadline
        # headers let the acker register it without decoding the value.
        value = encode_persisted(
            srid, origin, 1, record_id, record_id, topic, partition, partitioner, key_b, value_b,
            user_headers, created_ms, timeout_ms, max_attempts or self.config.max_attempts, history,
        )
        srid_b = srid.to_bytes(8, "big", signed=True)
        persist_kwargs: dict[str, Any] = {
            "key": srid_b,
            "value": value,
            "partition": srid % self.ledger_partitions,
            "headers": persist_headers(record_id, created_ms + timeout_ms),
            "on_delivery": self._on_persist,
        }
        try:
            self._producer.produce(self.ns.persist, **persist_kwargs)
        except BufferError:
            self._produce(self.ns.persist, **persist_kwargs)
        self._produce(
            topic,
            key=key_b,
            value=value_b,
            partition=partition,
            headers=[
                *user_headers,
                (H_SRID, srid_b),
                (H_ID, record_id.to_bytes(8, "big", signed=True)),
                (H_ORIGIN, srid_b if origin == srid else origin.to_bytes(8, "big", signed=True)),
                (H_ATTEMPT, b"1"),
            ],
        )
        self.sent += 1
        return SendResult(srid, record_id, partition, origin)

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        partition: int = 0,
        headers: Headers | None = None,
    ) -> None:
        """Produce a plain, untracked record with this source's producer - inside the current
        transaction when transactional, so bookkeeping (e.g. DLQ redrive markers) commits
        atomically with the records sent."""
        if self._transactional and not self._in_transaction:
            raise ConfigurationError("a transactional Source produces inside `with source.transaction():`")
        self._produce(topic, key=key, value=value, partition=partition, headers=list(headers or ()))

    def _produce(self, topic: str, **kwargs: Any) -> None:
        while True:
            try:
                self._producer.produce(topic, **kwargs)
                return
            except BufferError:
                self._producer.poll(0.05)

    def flush(self, timeout: float = 60.0) -> None:
        remaining = self._producer.flush(timeout)
        self._raise_failures()
        if remaining:
            raise DeliveryError(f"{remaining} records not delivered within {timeout}s")

    @contextlib.contextmanager
    def transaction(self) -> Any:
        if not self._transactional:
            raise ConfigurationError("Source.transaction() needs a transactional_id")
        self._producer.begin_transaction()
        self._in_transaction = True
        try:
            yield self
            self._producer.commit_transaction(60)
        except BaseException:
            with contextlib.suppress(KafkaException):
                self._producer.abort_transaction(30)
            raise
        finally:
            self._in_transaction = False
        self._raise_failures()

    def close(self) -> None:
        if not self._transactional:
            self.flush()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- Task


class TaskRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    tracking: Tracking | None


class TaskContext:
    """Handed to user code for one input record: ``emit`` children, or ``fail`` the input."""

    __slots__ = ("_task", "children", "children_xor", "failed", "record", "unacked")

    def __init__(self, task: Task, record: TaskRecord) -> None:
        self._task = task
        self.record = record
        self.children_xor = 0
        self.children = 0
        self.failed: str | None = None
        self.unacked = False

    def emit(
        self,
        topic: str,
        key: bytes | str | None,
        value: bytes | str | None,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> int:
        """Produce a child anchored to the input's tree; returns its record id.

        Untracked inputs produce untracked children (plain records)."""
        user = [(k, _to_bytes(v)) for k, v in headers if k not in RB_HEADERS] if headers else []
        tracking = self.record.tracking
        child_id = 0
        if tracking is not None:
            child_id = ids.new_id()
            self.children_xor ^= child_id
            user += tracking_headers(tracking.srid, child_id, tracking.origin, tracking.attempt)
        kwargs: dict[str, Any] = {"key": _to_bytes(key), "value": _to_bytes(value), "headers": user}
        if partition is not None:
            kwargs["partition"] = partition
        self._task._produce(topic, **kwargs)
        self.children += 1
        return child_id

    def skip_ack(self) -> None:
        """Send no event for this input (failure injection: as if the ack were lost). The
        source record then completes only through its timeout and a replay."""
        self.unacked = True

    def fail(self, reason: str = "failed") -> None:
        """Fail the input's source record now: the acker replays it (or sends it to the DLQ)."""
        self.failed = reason


Handler = Callable[[TaskRecord, TaskContext], None]


@dataclass(frozen=True)
class TaskConfig:
    batch_size: int = 1000
    poll_timeout_s: float = 0.1
    # An exception in user code fails the input (replay) instead of stopping the task.
    fail_on_exception: bool = True
    consumer: Mapping[str, Any] = field(default_factory=dict)
    producer: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class TaskCounters:
    processed: int = 0
    acked: int = 0
    failed: int = 0
    untracked: int = 0
    emitted: int = 0
    errors: int = 0
    unacked: int = 0
    retried_batches: int = 0


class Task:
    """A consume loop that acks every input with one XOR event.

    Per poll batch:
    1. for each input, user code runs and emits children (fresh ids, inherited srid/origin);
    2. ONE event per input, ``input.id ^ children``, is queued by ledger partition, or a fail
       mark when the input was failed;
    3. one ``XorBatch`` per ledger partition goes to ``ns.acks[partition]``;
    4. after the children and the events are delivered, the input offsets are committed.
    A crash between 3 and 4 reprocesses the batch: its events are folded twice, which can
    only delay completion (DESIGN §4), never complete a tree early.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        namespace: str | Namespace,
        topics: Iterable[str],
        group_id: str,
        handler: Handler,
        config: TaskConfig | None = None,
    ) -> None:
        self.ns = namespace if isinstance(namespace, Namespace) else Namespace(namespace)
        self.config = config or TaskConfig()
        self.topics = list(topics)
        self.ledger_partitions = check(settings, self.ns)
        self.handler = handler
        self.counters = TaskCounters()
        # Only failed deliveries matter (the batch is reprocessed): no callback per success.
        self._producer = Producer(
            settings.producer_config(
                **{"linger.ms": 2, "delivery.report.only.error": True, **self.config.producer}
            )
        )
        self._consumer = Consumer(
            settings.consumer_config(group_id, **{"isolation.level": "read_committed", **self.config.consumer})
        )
        self._delivery_errors: list[str] = []
        self._stop = threading.Event()
        self.name = f"{group_id}@{os.getpid()}"

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self._delivery_errors.append(str(err))

    def _produce(self, topic: str, **kwargs: Any) -> None:
        while True:
            try:
                self._producer.produce(topic, on_delivery=self._on_delivery, **kwargs)
                return
            except BufferError:
                self._producer.poll(0.05)

    def stop(self) -> None:
        self._stop.set()

    def run(self, *, max_idle_s: float | None = None, install_signals: bool = False) -> TaskCounters:
        """Process until ``stop()`` (or SIGTERM with ``install_signals``), or until no input
        arrived for ``max_idle_s``. Shuts down cleanly: flush, commit, close."""
        if install_signals:
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
        self._consumer.subscribe(self.topics)
        idle_since = time.monotonic()
        try:
            while not self._stop.is_set():
                # poll() returns as soon as one message is there (consume(n, timeout) would
                # wait the whole timeout unless n messages arrive); then take what is ready.
                first = self._consumer.poll(self.config.poll_timeout_s)
                batch: list[Message] = [] if first is None else [first]
                if first is not None and self.config.batch_size > 1:
                    batch.extend(self._consumer.consume(self.config.batch_size - 1, 0))
                if not batch:
                    if max_idle_s is not None and time.monotonic() - idle_since > max_idle_s:
                        break
                    continue
                idle_since = time.monotonic()
                self.process_batch(batch)
        finally:
            self.close()
        return self.counters

    def process_batch(self, batch: list[Message]) -> None:
        events: dict[int, tuple[list[int], list[int], list[int]]] = defaultdict(lambda: ([], [], []))
        offsets: dict[tuple[str, int], int] = {}
        first: dict[tuple[str, int], int] = {}
        for msg in batch:
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", msg.error())
                continue
            tp = (msg.topic(), msg.partition())
            first.setdefault(tp, msg.offset())
            offsets[tp] = msg.offset() + 1
            self._handle(msg, events)
        for lp, (srids, xors, failed) in events.items():
            value = XorBatch(
                lp,
                np.asarray(srids, dtype=np.int64),
                np.asarray(xors, dtype=np.int64),
                np.asarray(failed, dtype=np.int64),
                self.name,
            ).encode()
            self._produce(self.ns.acks, value=value, partition=lp)
        self._producer.flush()
        if self._delivery_errors:
            # Not delivered: do not commit; rewind so the whole batch runs again.
            errors, self._delivery_errors = self._delivery_errors, []
            log.warning("%d deliveries failed (%s); reprocessing the batch", len(errors), errors[0])
            self.counters.retried_batches += 1
            for (topic, partition), offset in first.items():
                self._consumer.seek(TopicPartition(topic, partition, offset))
            return
        if offsets:
            self._consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False
            )

    def _handle(self, msg: Message, events: dict[int, tuple[list[int], list[int], list[int]]]) -> None:
        headers = tuple(msg.headers() or ())
        record = TaskRecord(
            msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), headers,
            Tracking.from_headers(headers),
        )
        ctx = TaskContext(self, record)
        self.counters.processed += 1
        try:
            self.handler(record, ctx)
        except Exception as exc:
            self.counters.errors += 1
            if not self.config.fail_on_exception:
                raise
            log.warning("handler failed on %s[%d]@%d: %r", msg.topic(), msg.partition(), msg.offset(), exc)
            ctx.fail(f"exception: {type(exc).__name__}: {exc}")
        self.counters.emitted += ctx.children
        tracking = record.tracking
        if tracking is None:
            self.counters.untracked += 1
            return
        srids, xors, failed = events[ids.ledger_partition(tracking.srid, self.ledger_partitions)]
        if ctx.failed is not None:
            failed.append(tracking.srid)
            self.counters.failed += 1
        elif ctx.unacked:
            self.counters.unacked += 1
        else:
            srids.append(tracking.srid)
            xors.append(tracking.record_id ^ ctx.children_xor)
            self.counters.acked += 1

    def close(self) -> None:
        with contextlib.suppress(KafkaException, RuntimeError):
            self._producer.flush(30)
        with contextlib.suppress(KafkaException, RuntimeError):
            self._consumer.close()
