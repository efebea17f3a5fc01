"""What the acker does when a commit or its group membership fails (docs/design.md §5, the
commit protocol's step 5): fenced, fenced by a timed-out transaction, a fatal producer error,
an abortable error (abort and rewind what the transaction touched), and a group consumer that
failed fatally (rejoin, waiting out a static member's instance id still in use).

Owned by ``Acker`` (broker.acker.service), like broker.acker.assignment.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from broker.acker.assignment import Assignment
from broker.acker.commit import is_cut_off, is_fenced
from broker.acker.decisions import Decider
from broker.acker.live import LiveClients
from broker.acker.membership import Rejoins, consumer_protocol_refused
from broker.acker.refusals import Refusals
from broker.errors import ReplayBrokerError
from broker.kafka_errors import is_fatal, kafka_error
from broker.ranges import counted

log = logging.getLogger("broker.acker")


class Recovery:
    """Commit errors and rejoins of an ``Acker`` (see the module doc). It owns the counts of
    what it did (rejoins, fencings by a timed-out transaction); the clients are replaced
    through ``LiveClients``, the partitions dropped through ``Assignment``, and the counts of
    what was folded since the last commit put back by their owner (broker.acker.owned)."""

    def __init__(
        self,
        *,
        live: LiveClients,
        assignment: Assignment,
        refusals: Refusals,
        decider: Decider,
        membership: Rejoins,
        stop: threading.Event,
    ) -> None:
        self.live = live
        self.assignment = assignment
        self.owned = assignment.owned
        self.restores = assignment.restores
        self.transactions = assignment.transactions
        self.refusals = refusals
        self.decider = decider
        self.membership = membership
        self._stop = stop  # set when fenced; ends the pause before a rejoin
        self.rejoins = 0  # group consumers replaced after a fatal error
        # Commits fenced because their transaction outlived its timeout (the coordinator
        # aborted it); the producer is replaced once partitions are owned again.
        self.fenced_by_timeout = 0

    def rejoin(self, err: KafkaError | None) -> None:
        """The group consumer hit a fatal error (``err``), or the producer was fenced by its
        coordinator (None): out of the group for good. Seen: a static member restarted after
        a kill is refused (UNRELEASED_INSTANCE_ID) until its predecessor's session expires:
        waited out with back-off, one log line per wait period (broker.acker.membership).
        Whatever it owned is someone else's now (as if lost); a new consumer joins again,
        after a pause so a refusal is not a busy loop."""
        config = self.live.configs.config
        refused = err is not None and config.group_protocol == "consumer" and consumer_protocol_refused(err)
        if refused and err is not None:  # a cluster of Kafka >= 4.0 with the consumer protocol off
            self.live.fall_back_to_classic(f"the cluster refused the consumer group protocol ({err.str()})")
        owned = self.assignment.owned_lps()
        wait_s = self.membership.wait_after(None if refused else err, owned=bool(owned))  # logs, once per period
        if err is not None:
            self.transactions.abort()
        self.restores.cancel(owned)
        self.assignment.drop(set(self.owned.states))
        self.owned.rewind_totals()  # what was folded since the last commit is dropped with them
        self.assignment.changelog.assign_standby(self.assignment.partitions, self.owned.states)
        self.live.replace_consumer(wait_s)
        self.rejoins += 1
        self.assignment.subscribe()

    def on_commit_error(self, exc: KafkaException, touched: set[int]) -> None:
        err = kafka_error(exc)
        if is_fenced(exc) and self.transactions.outlived(self.live.configs.config.transaction_timeout_ms):
            # After a broker outage longer than the transaction timeout: the coordinator
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
                err, self.live.configs.config.transaction_timeout_ms, self.live.configs.config.rejoin_backoff_ms / 1000,
            )
            self.fenced_by_timeout += 1
            self.live.producer_stale = True
            self.rejoin(None)
            return
        if is_fenced(exc):
            # Another instance took over with our transactional id: stop, and never write
            # again with this producer.
            log.error("commit failed (%s); fenced, stopping", err)
            self._stop.set()
            raise ReplayBrokerError(f"acker fenced: {err}") from exc
        if is_fatal(exc):
            # A fatal producer error that is not fencing (seen: INVALID_TXN_STATE after an
            # abort while the transaction coordinator moved): this producer is unusable, but
            # a new one with the same transactional id aborts whatever is open and goes on.
            log.error("commit failed (%s); fatal for this producer: a new one takes over", err)
            self.new_producer()
        else:
            cut_off = is_cut_off(exc)
            log.error("commit failed (%s); aborting and rewinding%s", err,
                      " (a new producer for the next transaction)" if cut_off else "")
            self.transactions.abort()
            if cut_off:
                # The producer came through an outage of its coordinators: once the cluster is
                # back, its next send_offsets_to_transaction can block for good (librdkafka
                # #5456: coordinator requests ignore their timeout), and the acker with it. A new one (the same transactional id) starts the next transaction.
                self.live.producer_stale = True
        refused = self.refusals.take_noted()
        if refused:
            log.warning(
                "%d outputs refused for good, decided again after the rewind: %s", len(refused), "; ".join(refused)
            )
        for name in self.refusals.take_unknown_topics():
            self.decider.forget(name)
        self.rewind(touched)

    def new_producer(self) -> None:
        """A new producer with the same transactional id: whatever the old one left open is
        aborted by its ``init_transactions``."""
        self.live.replace_producer()
        if self.live.configs.config.exactly_once:
            try:
                self.live.init_transactions()
            except KafkaException as exc:
                self._stop.set()
                raise ReplayBrokerError(f"acker cannot start a new transactional producer: {exc}") from exc
        self.transactions.new_producer()

    def rewind(self, touched: set[int]) -> None:
        """After an aborted commit the partitions it touched are ahead of Kafka: they are
        restored from their changelogs like a new assignment - their inputs paused, a slice
        per loop iteration (broker.acker.restoring), then sought back to the committed
        offsets - while the partitions it did not touch go on as they are. Nothing of it runs
        inside one poll: a large changelog costs no membership."""
        lps = sorted(touched & set(self.owned.states))
        self.owned.rewind_totals()
        if not lps:
            return
        ns = self.assignment.ns
        tps = [TopicPartition(t, lp) for lp in lps for t in (ns.persist, ns.acks)]
        with contextlib.suppress(KafkaException, RuntimeError):
            self.live.consumer.pause(tps)
        self.assignment.drop(set(lps))
        self.restores.add(lps, tps)
        log.info("rewinding ledger partitions %s to their changelogs (owning %s)", counted(lps),
                 counted(self.owned.states))
