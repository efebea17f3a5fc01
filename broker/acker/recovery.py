"""What the acker does when a commit or its group membership fails (docs/design.md §5, the
commit protocol's step 5): fenced, fenced by a timed-out transaction, a fatal producer error,
an abortable error (abort and rewind what the transaction touched), and a group consumer that
failed fatally (rejoin, waiting out a static member's instance id still in use).

A mixin of ``Acker`` (broker.acker.service), like broker.acker.assignment.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from broker.acker.changelog import Changelog
from broker.acker.clients import AckerClients
from broker.acker.commit import Transactions, is_fatal, is_fenced
from broker.acker.config import AckerConfig
from broker.acker.decisions import Decider
from broker.acker.lag import ExpiryGate
from broker.acker.membership import Rejoins, classic, consumer_protocol_refused
from broker.acker.refusals import Refusals
from broker.acker.restoring import Restores
from broker.acker.state import PartitionState
from broker.errors import ReplayBrokerError
from broker.kafka_io import is_transient
from broker.topics import Namespace

log = logging.getLogger("broker.acker")

REJOIN_BACKOFF_S = 1.0
"""Pause before a group consumer that failed fatally is replaced by a new one."""
INIT_TRANSACTIONS_TIMEOUT_S = 30.0
"""One wait for the transaction coordinator; a transient failure is retried."""


class Recovery:
    """Commit errors and rejoins of ``Acker`` (see the module doc)."""

    ns: Namespace
    config: AckerConfig
    clients: AckerClients
    group_id: str
    P: int
    states: dict[int, PartitionState]
    totals: dict[str, int]
    _committed_totals: dict[str, int]
    changelog: Changelog
    restores: Restores
    expiry: ExpiryGate
    transactions: Transactions
    refusals: Refusals
    decider: Decider
    membership: Rejoins
    rejoins: int
    fenced_by_timeout: int
    _producer: Producer
    _producer_config: dict[str, object]
    _producer_stale: bool
    _consumer: Consumer
    _consumer_config: dict[str, object]
    _incremental: bool
    _stop: threading.Event

    def stop(self) -> None:
        raise NotImplementedError

    def _make_consumer(self, conf: dict[str, object]) -> Consumer:
        raise NotImplementedError

    def _make_producer(self, conf: dict[str, object]) -> Producer:
        raise NotImplementedError

    def _subscribe(self) -> None:
        raise NotImplementedError

    def _owned(self) -> set[int]:
        raise NotImplementedError

    def _drop(self, lps: set[int]) -> None:
        raise NotImplementedError

    def _rejoin(self, err: KafkaError | None) -> None:
        """The group consumer hit a fatal error (``err``), or the producer was fenced by its
        coordinator (None): out of the group for good. Seen: a static member restarted after
        a kill is refused (UNRELEASED_INSTANCE_ID) until its predecessor's session expires:
        waited out with back-off, one log line per wait period (broker.acker.membership).
        Whatever it owned is someone else's now (as if lost); a new consumer joins again,
        after a pause so a refusal is not a busy loop."""
        refused = err is not None and self.config.group_protocol == "consumer" and consumer_protocol_refused(err)
        if refused and err is not None:  # a cluster of Kafka >= 4.0 with the consumer protocol off
            self.config = self.clients.config = classic(
                self.config, self.group_id, f"the cluster refused the consumer group protocol ({err.str()})")
            self._consumer_config = self.clients.group()
            self._incremental = False
        wait_s = self.membership.wait_after(None if refused else err, owned=bool(self._owned()))  # logs, once per period
        if err is not None:
            self.transactions.abort()
        self.restores.cancel(self._owned())
        self._drop(set(self.states))
        self.totals.clear()  # what was folded since the last commit is dropped with them
        self.totals.update(self._committed_totals)
        self.changelog.assign_standby(self.P, self.states)
        with contextlib.suppress(KafkaException, RuntimeError):
            self._consumer.close()
        self._stop.wait(wait_s)
        self._consumer = self._make_consumer(self._consumer_config)
        self.transactions.consumer = self.expiry.consumer = self._consumer
        self.rejoins += 1
        self._subscribe()

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
        self._producer = self._make_producer(self._producer_config)
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
