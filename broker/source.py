"""``Source``: puts records under the broker's guarantee (docs/design.md §8).

For each record, ``send`` writes the ``PersistedRecord`` to ``ns.persist[srid mod P]`` -
persisting IS registering: it carries the root's creation event (``rb-root``) - and then
the data record, with its tracking headers (broker.headers), to the key's partition of the
data topic.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from broker import ids, kafka_io
from broker.errors import ConfigurationError, DeliveryError
from broker.headers import (
    H_ATTEMPT,
    H_ID,
    H_ORIGIN,
    H_SRID,
    Headers,
    as_bytes,
    persist_headers,
    user_headers,
)
from broker.kafka_io import partition_counts
from broker.partitioning import get_partitioner
from broker.schemas import Failure, encode_persisted
from broker.settings import KafkaSettings
from broker.topics import Namespace, check, replay_topic

log = logging.getLogger(__name__)

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
        self._ledger_partitions = 0  # checked against the cluster on first use
        # Only failed deliveries matter (they raise): no Python callback per delivered record.
        overrides: dict[str, Any] = {"linger.ms": 5, "delivery.report.only.error": True, **self.config.producer}
        if transactional_id:
            overrides["transactional.id"] = transactional_id
        self._producer = Producer(settings.producer_config(**overrides))
        self._transactional = transactional_id is not None
        self._in_transaction = False
        self._transactions_ready = False
        self._partitions: dict[str, int] = {}
        self._failures: list[DeliveryError] = []
        self._on_persist = self._persist_callback(self._failures)
        self.sent = 0

    @property
    def ledger_partitions(self) -> int:
        """P of the namespace, checked once, on first use: building a Source needs no cluster."""
        if not self._ledger_partitions:
            self._ledger_partitions = check(self.settings, self.ns)
        return self._ledger_partitions

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
        key_b = as_bytes(key)
        return self._send_first_attempt(
            topic, key_b, as_bytes(value), headers, None, self.key_hash_partition(topic, key_b),
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
        own_headers = user_headers(headers)
        srid, record_id = ids.new_id(), ids.new_id()
        origin = srid if origin is None else origin
        created_ms = int(time.time() * 1000)
        timeout_ms = timeout_ms or self.config.timeout_ms
        # The PersistedRecord, encoded straight from its fields; the rb-root / rb-deadline
        # headers let the acker register it without decoding the value.
        value = encode_persisted(
            srid, origin, 1, record_id, record_id, topic, partition, partitioner, key_b, value_b,
            own_headers, created_ms, timeout_ms, max_attempts or self.config.max_attempts, history,
        )
        srid_b = srid.to_bytes(8, "big", signed=True)
        persist_kwargs: dict[str, Any] = {
            "key": srid_b,
            "value": value,
            "partition": srid % self.ledger_partitions,
            "headers": persist_headers(record_id, created_ms + timeout_ms),
            "on_delivery": self._on_persist,
        }
        self._produce(self.ns.persist, **persist_kwargs)
        self._produce(
            topic,
            key=key_b,
            value=value_b,
            partition=partition,
            headers=[
                *own_headers,
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
        kafka_io.produce(self._producer, topic, **kwargs)

    def flush(self, timeout: float = 60.0) -> None:
        remaining = self._producer.flush(timeout)
        self._raise_failures()
        if remaining:
            raise DeliveryError(f"{remaining} records not delivered within {timeout}s")

    @contextlib.contextmanager
    def transaction(self) -> Any:
        if not self._transactional:
            raise ConfigurationError("Source.transaction() needs a transactional_id")
        if not self._transactions_ready:
            self._producer.init_transactions(30)
            self._transactions_ready = True
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


