"""The acker's group consumer and transactional producer as they are now.

Either is replaced while the acker runs: the producer after a fatal error or a fencing by a
timed-out transaction (broker.acker.recovery) and once ``message.max.bytes`` is known
(``Acker.start``); the consumer after a rejoin and on the fall-back to the classic group
protocol. Every part that uses one (the rebalance callbacks, the transactions, the expiry
gate, the rejoin) reads it here at each use and keeps no reference of its own, so a
replacement reaches all of them at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, Producer

from broker.acker.clients import AckerClients
from broker.acker.membership import classic
from broker.kafka_io import is_transient

log = logging.getLogger("broker.acker")

INIT_TRANSACTIONS_TIMEOUT_S = 30.0
"""One wait for the transaction coordinator; a transient failure is retried."""


class LiveClients:
    """Holds the group consumer and the transactional producer, with the settings each was
    made with, and replaces them (module doc)."""

    __slots__ = (
        "_make_consumer",
        "_make_producer",
        "_stop",
        "configs",
        "consumer",
        "consumer_config",
        "producer",
        "producer_config",
        "producer_stale",
    )

    def __init__(
        self,
        configs: AckerClients,
        *,
        make_consumer: Callable[[dict[str, object]], Consumer],
        make_producer: Callable[[dict[str, object]], Producer],
        stop: threading.Event,
    ) -> None:
        self.configs = configs
        self._make_consumer = make_consumer
        self._make_producer = make_producer
        self._stop = stop  # ends a wait between two consumers, and retries of init_transactions
        self.producer_config = configs.producer()
        self.producer = make_producer(self.producer_config)
        self.consumer_config = configs.group()
        self.consumer = make_consumer(self.consumer_config)
        # The producer came through a group outage, a fencing by a timed-out transaction or a
        # commit cut off from its coordinators: it is replaced before its next transaction
        # (Acker.commit).
        self.producer_stale = False

    @property
    def incremental(self) -> bool:
        """The consumer protocol hands out and takes back only what changes owner."""
        return self.configs.config.group_protocol == "consumer"

    def fall_back_to_classic(self, why: str) -> None:
        """The classic group protocol from the next consumer on (broker.acker.membership)."""
        self.configs.config = classic(self.configs.config, self.configs.group_id, why)
        self.consumer_config = self.configs.group()

    def replace_consumer(self, wait_s: float | None = None) -> None:
        """Close the consumer (it leaves the group), wait ``wait_s`` if given (a stop ends the
        wait), and make a new one; it joins when subscribed."""
        with contextlib.suppress(KafkaException, RuntimeError):
            self.consumer.close()
        if wait_s is not None:
            self._stop.wait(wait_s)
        self.consumer = self._make_consumer(self.consumer_config)

    def replace_producer(self, config: dict[str, object] | None = None) -> None:
        """A new producer with the same transactional id (and ``config`` if given): its
        ``init_transactions`` aborts whatever the old one left open."""
        with contextlib.suppress(KafkaException, RuntimeError):
            self.producer.flush(0)
        if config is not None:
            self.producer_config = config
        self.producer = self._make_producer(self.producer_config)
        self.producer_stale = False

    def init_transactions(self) -> None:
        """``init_transactions``, tried again while it fails transiently: a transaction
        coordinator that is moving or a cluster missing a node is waited for (the acker's
        inputs wait anyway), not a reason for the service to exit."""
        while True:
            try:
                self.producer.init_transactions(INIT_TRANSACTIONS_TIMEOUT_S)
                return
            except KafkaException as exc:
                if not is_transient(exc) or self._stop.is_set():
                    raise
                log.warning("initialising transactions failed transiently (%s); trying again", exc.args[0])
