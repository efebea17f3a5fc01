"""``Task``: a consume loop that processes tracked records and acks each input with one XOR
event (docs/design.md §4, §8).

The XOR ledger: every record id is XORed into its srid exactly twice - once by its creator
(the source's persist record, or the parent's task event) and once by its consumer's task
event. A task's event for input r is ONE value ``r.id ^ child_1.id ^ ...``: the ack of r and
the anchoring of its children together.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from broker import ids, kafka_io
from broker.headers import (
    Headers,
    Tracking,
    as_bytes,
    child_path_header,
    tracking_headers,
    user_headers,
)
from broker.schemas import XorBatch
from broker.settings import KafkaSettings
from broker.topics import Namespace, check

log = logging.getLogger(__name__)

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
        user = list(user_headers(headers))
        tracking = self.record.tracking
        child_id = 0
        if tracking is not None:
            child_id = ids.new_id()
            self.children_xor ^= child_id
            user += tracking_headers(tracking.srid, child_id, tracking.origin, tracking.attempt)
            # rb-path: its emit index, the same child on every attempt, different per sibling.
            user.append(child_path_header(self.record.headers, self.children))
        kwargs: dict[str, Any] = {"key": as_bytes(key), "value": as_bytes(value), "headers": user}
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
    only delay completion (docs/design.md §4), never complete a tree early.
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
        self.settings = settings
        self._ledger_partitions = 0  # checked against the cluster by run() or the first batch
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

    @property
    def ledger_partitions(self) -> int:
        if not self._ledger_partitions:
            self._ledger_partitions = check(self.settings, self.ns)
        return self._ledger_partitions

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self._delivery_errors.append(str(err))

    def _produce(self, topic: str, **kwargs: Any) -> None:
        kafka_io.produce(self._producer, topic, on_delivery=self._on_delivery, **kwargs)

    def stop(self) -> None:
        self._stop.set()

    def run(self, *, max_idle_s: float | None = None, install_signals: bool = False) -> TaskCounters:
        """Process until ``stop()`` (or SIGTERM with ``install_signals``), or until no input
        arrived for ``max_idle_s``. Shuts down cleanly: flush, commit, close."""
        if install_signals:
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
        _ = self.ledger_partitions  # refuse to start on a namespace that is not usable
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
