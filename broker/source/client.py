"""``Source``: puts records under the broker's guarantee (docs/design.md §8).

For each record, ``send`` writes the ``PersistedRecord`` to ``ns.persist[srid mod P]`` -
persisting IS registering: its value's prefix holds the root's creation event - and then,
once that is confirmed, the data record, with its tracking header (``rb-t``, broker.headers), to the
key's partition of the data topic (broker.delivery holds the records waiting).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from broker import kafka_io
from broker.delivery import PendingData, SendFailure
from broker.errors import ConfigurationError, DeliveryError
from broker.headers import Headers
from broker.kafka_io import client_error, kafka_errors
from broker.kafka_port import KafkaClients, KafkaPort
from broker.retry import RetryPolicy
from broker.schemas import Failure
from broker.serde import Serde
from broker.settings import KafkaSettings
from broker.source.backpressure import Backpressure
from broker.source.config import SourceConfig, Timeout, check_max_attempts, check_timeout
from broker.source.placement import Placements
from broker.source.sending import Again, BatchRecord, RecordSender, SendResult
from broker.topics import Namespace, replay_topic

log = logging.getLogger(__name__)


__all__ = ["SendFailure", "SendResult", "Source", "SourceConfig", "Timeout"]


class Source:
    """Puts records under the broker's guarantee.

    ``send`` produces the ``PersistedRecord`` to ``ns.persist[srid mod P]`` (persisting IS
    registering: it carries the root's creation event); the data record goes to the key's
    partition of the data topic only once its persist record is confirmed, and data records
    are released in ``send`` order (key order holds across ledger partitions). So a data
    record is never out for a srid the acker does not know.

    Persist records that fail to deliver raise ONE ``DeliveryError`` from a later ``send``
    (that call sent nothing) or from ``flush``; its ``failures`` lists every one of them
    (``SendFailure``), each reported once: none of them was published, send them again.

    With ``transactional_id`` the persist and data records of a batch commit atomically (the
    data records go out at once, in the same transaction); a commit that fails aborts the
    batch and raises ``DeliveryError`` listing the persist records that failed - nothing of
    the batch was delivered.

    What Kafka itself refuses (a producer setting, a fenced transactional id, a topic look-up
    that timed out) leaves every method as ``KafkaClientError``; every error is a
    ``ReplayBrokerError``::

        with source.transaction():
            for key, value in batch:
                source.send("orders", key, value)
    """

    @kafka_errors("building a Source")  # e.g. a producer setting librdkafka refuses
    def __init__(
        self,
        settings: KafkaSettings,
        namespace: str | Namespace,
        config: SourceConfig | None = None,
        *,
        transactional_id: str | None = None,
        kafka: KafkaPort | None = None,
    ) -> None:
        """``kafka``: the source's clients and look-ups (default: the real clients of
        ``settings``)."""
        self.ns = namespace if isinstance(namespace, Namespace) else Namespace(namespace)
        self.config = config or SourceConfig()
        self.settings = settings
        self.kafka: KafkaPort = kafka or KafkaClients(settings)
        self._ledger_partitions = 0  # checked against the cluster on first use
        self._transactional = transactional_id is not None
        # Delivery reports of failures only: a data record waits for its persist record, but
        # the wait is settled per batch (broker.delivery.PendingData), not by a Python call per
        # record. In a transaction only failures matter too (the commit covers the rest).
        required: dict[str, Any] = {"delivery.report.only.error": True}
        if transactional_id:
            required["transactional.id"] = transactional_id
        self._producer_config = settings.producer_config(
            required=required, user=self.config.producer, defaults={"linger.ms": 10}
        )
        self._producer = self.kafka.producer(self._producer_config)
        self._in_transaction = False
        self._transactions_ready = False
        self._placements = Placements(self.ns, self.config.partitioners, self.kafka.partition_counts)
        # Without a transaction, persist records go out in epochs alternating between this
        # producer and a second one (broker.delivery.PendingData); data records, plain records
        # and transactions use this one.
        linger_ms = self._producer_config.get("linger.ms", self._producer_config.get("queue.buffering.max.ms", 10))
        self._pending = PendingData(
            self._producer, None if self._transactional else self.kafka.producer(self._producer_config),
            epoch_s=max(float(linger_ms), 1.0) / 1000,
        )
        check_timeout(self.config.timeout_ms)
        check_max_attempts(self.config.max_attempts)
        if self.config.retry is not None and not isinstance(self.config.retry, RetryPolicy):
            raise ConfigurationError(f"SourceConfig.retry must be a RetryPolicy or None, not {self.config.retry!r}")
        if self.config.max_pending is not None and self.config.max_pending < 1:
            raise ConfigurationError(f"max_pending must be at least 1 or None (got {self.config.max_pending})")
        self._backpressure = Backpressure(
            settings, self.ns, self.config.max_pending, self.config.max_pending_timeout_ms,
            lambda: self.ledger_partitions, self._serve_waiting, kafka=self.kafka,
        )
        self._sender = RecordSender(
            self.ns.persist, self.config, self._placements, self._pending, self._backpressure,
            lambda: self.ledger_partitions, transactional=self._transactional,
        )

    @property
    def ledger_partitions(self) -> int:
        """P of the namespace, checked once, on first use: building a Source needs no cluster
        (``topics.check``: its errors are ``ReplayBrokerError``s)."""
        if not self._ledger_partitions:
            self._ledger_partitions = self.kafka.check(self.ns)
        return self._ledger_partitions

    @property
    def sent(self) -> int:
        """The records this source has sent."""
        return self._sender.sent

    @property
    def pending(self) -> int | None:
        """This source's records pending as last read from ``ns.persist`` (None without
        ``max_pending``)."""
        window = self._backpressure.window
        return None if window is None else len(window)

    @property
    def blocked(self) -> int:
        """Sends that had to wait for a slot (``max_pending``)."""
        return self._backpressure.blocked

    @property
    def blocked_s(self) -> float:
        """The seconds those sends waited."""
        return self._backpressure.blocked_s

    @property
    def backpressure_timeouts(self) -> int:
        """Sends that gave up waiting for a slot (``BackpressureTimeout``)."""
        return self._backpressure.timeouts

    def _raise_failures(self) -> None:
        if failures := self._pending.take_failures():
            self._backpressure.not_persisted(failure.srid for failure in failures)
            raise DeliveryError(
                f"persist record not delivered for {len(failures)} source record(s) "
                f"({failures[0].error}); none of them was published: `failures` lists them",
                failures=failures,
            )

    def poll(self, timeout: float = 0.0) -> None:
        """Serve delivery reports and release the data records whose persist records are
        decided (``send`` does this too; a caller that pauses between sends may call it to
        keep records moving)."""
        self._pending.producer.poll(timeout)
        self._pending.settle()

    def _before_send(self) -> None:
        self._pending.producer.poll(0)
        self._pending.settle()
        if self._pending.failures and not self._transactional:  # a transaction reports at commit
            self._raise_failures()
        if self._transactional and not self._in_transaction:
            raise ConfigurationError("a transactional Source sends inside `with source.transaction():`")

    def _serve_waiting(self) -> None:
        """While a send waits for a slot: serve delivery reports, raise those that failed."""
        self.poll(0)
        if self._pending.failures and not self._transactional:
            self._raise_failures()

    def serde(self, topic: str) -> Serde:
        """The serde of ``topic``'s values: its own (``SourceConfig.serdes``), else the source's."""
        return self.config.serdes.get(topic, self.config.serde)

    def key_hash_partition(self, topic: str, key: bytes | None) -> int:
        """The partition of ``topic`` that ``key`` goes to (random without a key)."""
        return self._placements.key_hash_partition(topic, key)

    def prepare_keys(self, topic: str, keys: Iterable[bytes | str | None]) -> None:
        """Hash the new ones of ``keys`` together (``placement.BATCH_KEYS`` or more), for the
        ``send``s of their records to ``topic`` that follow: a key hashed in a batch costs a
        fraction of one hashed alone (``send_many`` does this itself)."""
        self._placements.learn(topic, keys, self.ledger_partitions)

    def send(
        self,
        topic: str,
        key: bytes | str | None,
        value: Any,
        headers: Headers | None = None,
        *,
        timeout_ms: Timeout | None = None,
        max_attempts: int | None = None,
    ) -> SendResult:
        """Put one record under the guarantee: its persist record, then its data record to
        the key's partition of ``topic``. ``value``: bytes as they are, anything else through
        ``SourceConfig.serde``."""
        # A try costs nothing until it catches (3.11): the whole call is wrapped, not a record.
        try:
            self._before_send()
            return self._sender.send(topic, ((key, value, headers),), timeout_ms, max_attempts)[0]
        except KafkaException as exc:
            raise client_error(exc, f"sending to {topic}") from exc

    def send_many(
        self,
        topic: str,
        records: Iterable[BatchRecord],
        *,
        timeout_ms: Timeout | None = None,
        max_attempts: int | None = None,
    ) -> list[SendResult]:
        """``send`` for a batch: ``records`` are ``(key, value)`` or ``(key, value, headers)``,
        all to ``topic``, with the same guarantee and order; one ``SendResult`` each. Cheaper
        per record: the clock, the deadline and the delivery bookkeeping are done once per
        batch. A record the producer refuses at once stops the batch (``DeliveryError``: its
        ``failures`` names it, its ``sent`` holds the results of the records before it)."""
        try:
            self._before_send()
            return self._sender.send(topic, records, timeout_ms, max_attempts)
        except KafkaException as exc:
            raise client_error(exc, f"sending to {topic}") from exc

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
        timeout_ms: Timeout | None = None,
        max_attempts: int | None = None,
        replay: bool = False,
    ) -> SendResult:
        """Send a record again as a FRESH source record that keeps its ``origin`` (DLQ
        redrive): new srid and record id, attempt 1, to ``topic`` (``replay``: to its replay
        topic, beside the replays, not into live traffic) at the ``key_hash_partition`` stored
        the first time - not recomputed, so key order and locality hold even if the partitioner
        setting changed. ``history`` (the earlier rounds) is carried into the new persist
        record, so a later DLQ entry shows it all."""
        try:
            self._before_send()
            if not 0 <= key_hash_partition < self.data_partitions(topic):
                raise ConfigurationError(
                    f"{topic} has {self.data_partitions(topic)} partitions; cannot resend to {key_hash_partition}"
                )
            again = Again(origin, key_hash_partition, partitioner, tuple(history),
                          replay_topic(topic) if replay else topic)
            return self._sender.send(topic, ((key, value, headers),), timeout_ms, max_attempts, again)[0]
        except KafkaException as exc:
            raise client_error(exc, f"resending to {topic}") from exc

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
        try:
            self._produce(topic, key=key, value=value, partition=partition, headers=list(headers or ()))
        except KafkaException as exc:
            raise client_error(exc, f"producing to {topic}") from exc

    def _produce(self, topic: str, **kwargs: Any) -> None:
        kafka_io.produce(self._producer, topic, **kwargs)

    @kafka_errors("flushing a Source")
    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every record sent is delivered - or reported in the ``DeliveryError``
        this raises."""
        remaining = self._pending.drain(timeout)
        self._raise_failures()
        if remaining or self._pending:
            raise DeliveryError(
                f"{remaining} records not delivered within {timeout}s "
                f"({len(self._pending)} data records still wait for their persist records)"
            )

    def init_transactions(self) -> None:
        """Register the transactional id now (once): this fences every earlier producer with
        the same id and aborts what it left open. ``transaction()`` does it when needed; call
        it first when what you read next must include everything those producers committed."""
        if not self._transactional:
            raise ConfigurationError("init_transactions() needs a transactional_id")
        if not self._transactions_ready:
            try:
                self._producer.init_transactions(30)
            except KafkaException as exc:
                raise client_error(exc, "init_transactions") from exc
            self._transactions_ready = True

    def send_offsets(self, offsets: Sequence[TopicPartition], group_metadata: Any, timeout: float = 30.0) -> None:
        """Commit a consumer's input offsets in the open transaction (``group_metadata`` is
        its ``consumer_group_metadata()``): the records sent and the input they came from
        commit together, so a crash neither skips nor repeats the input (the ingest bridge).
        The group coordinator checks the metadata's generation: a member that lost its
        partitions has its offsets refused, and the transaction fails."""
        if not self._in_transaction:
            raise ConfigurationError("send_offsets() belongs inside `with source.transaction():`")
        try:
            self._producer.send_offsets_to_transaction(list(offsets), group_metadata, timeout)
        except KafkaException as exc:
            raise client_error(exc, "send_offsets") from exc

    def data_partitions(self, topic: str) -> int:
        """The partition count of data topic ``topic``, checked once: it and its replay topic
        exist with the same count (``ConfigurationError`` otherwise). A service calls it at
        start to refuse a topic it could not send to."""
        with kafka_errors(f"the partitions of {topic}"):
            return self._placements.data_partitions(topic)

    @contextlib.contextmanager
    def transaction(self) -> Any:
        if not self._transactional:
            raise ConfigurationError("Source.transaction() needs a transactional_id")
        self.init_transactions()
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            raise client_error(exc, "begin_transaction") from exc
        self._in_transaction = True
        self._sender.new_transaction()
        try:
            try:
                yield self
            except BaseException:
                self._abort()  # the caller's own abort (or a send that raised): not failures
                raise
            try:
                self._producer.commit_transaction(60)
            except KafkaException as exc:
                sent = self._sender.transaction_sent
                failures = self._abort()
                raise DeliveryError(
                    f"transaction aborted, none of its {sent} records was "
                    f"delivered ({exc}); `failures` lists the {len(failures)} persist records "
                    "that failed",
                    failures=failures,
                ) from exc
        finally:
            self._in_transaction = False
            self._sender.new_transaction()

    def _abort(self) -> list[SendFailure]:
        """Abort the transaction; returns the persist records reported failed in it."""
        with contextlib.suppress(KafkaException):
            self._producer.abort_transaction(30)
            self._producer.poll(0)  # the reports of the records the abort purged
        failures = self._pending.take_failures()
        self._backpressure.not_persisted(self._sender.transaction_srids)  # nothing of it was persisted
        self._sender.new_transaction()
        # A record the broker refused leaves librdkafka's idempotence state behind (the next
        # transaction fails with skipped sequence numbers), and an abort can fail - even
        # fatally (INVALID_TXN_STATE on Kafka 4): a fresh producer with the same
        # transactional.id starts clean; its init_transactions (at the next transaction())
        # fences this one and aborts whatever it left open. Aborts are rare.
        self._producer = self.kafka.producer(self._producer_config)
        self._pending.use(self._producer)
        self._transactions_ready = False
        return failures

    @kafka_errors("closing a Source")
    def close(self) -> None:
        try:
            if not self._transactional:
                self.flush()
        finally:
            self._backpressure.close()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


