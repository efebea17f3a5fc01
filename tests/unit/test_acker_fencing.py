"""A zombie acker writes nothing: every transaction carries the input offsets of every
partition the acker owns (so the group coordinator fences a member that lost them), outputs
of partitions it lost are dropped, and ackers without an explicit instance id never share a
transactional id (they would fence each other in a loop)."""

from __future__ import annotations

import dataclasses
import socket
import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from broker.acker import Acker, AckerConfig
from broker.errors import ReplayBrokerError
from broker.ledger.clock import ManualClock
from broker.settings import KafkaSettings
from tests.unit.fakes import FakeConsumer, FakeKafka, FakeMessage, FakeProducer
from tests.unit.test_acker_timeouts import (
    NS,
    R1,
    R2,
    S1,
    T0,
    fake_kafka,
    make_acker,
    outcomes,
    persist_msg,
    persisted,
    run_steps,
)

__all__ = ["fake_kafka"]  # the fixture, used by name


def test_a_transaction_carries_the_offsets_that_moved_and_those_of_the_partitions_it_writes_for(
    fake_kafka: None,
) -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    consumer.batches.append([persist_msg(persisted(S1, R1, T0, timeout_ms=1_000))])  # persist[0]@0
    run_steps(acker)
    owned = {(NS.persist, 0): 1, (NS.persist, 1): 0, (NS.acks, 0): 0, (NS.acks, 1): 0}
    assert producer.offsets == [owned]  # the first commit: every owned partition's
    clock.advance(1_100)
    run_steps(acker)  # nothing new was read; the timeout's replay is committed all the same
    assert outcomes(producer) == {S1: b"replay"}
    # ... with the offsets of the partition it writes for: a zombie's would be fenced
    assert producer.offsets[1:] == [{(NS.persist, 0): 1, (NS.acks, 0): 0}]
    other = S1 + 1  # ledger partition 1 of 2
    consumer.batches.append([persist_msg(persisted(other, R2, clock.now_ms(), timeout_ms=60_000))])
    run_steps(acker)
    # Only the partition read: at P = 1 000 every owned one's would be 2 000 offsets a commit.
    assert producer.offsets[2:] == [{(NS.persist, 1): 1, (NS.acks, 1): 0}]


def test_outputs_of_lost_partitions_are_dropped_and_an_acker_owning_nothing_commits_nothing(
    fake_kafka: None,
) -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    run_steps(acker)  # owns both ledger partitions
    acker._fold_messages([FakeMessage(NS.acks, 0, 0, None, b"not an XorBatch")])
    assert acker.counters()["quarantined"] == 1  # a DLQ record is due for acks[0]@0
    acker.assignment.on_lost(consumer, [TopicPartition(t, p) for t in (NS.persist, NS.acks) for p in range(2)])
    acker.commit()
    # Whoever owns acks[0] now re-reads the message and quarantines it; we write nothing.
    assert producer.committed == [] and producer.transactions == 0


def test_ackers_without_an_instance_id_get_distinct_transactional_ids(fake_kafka: None) -> None:
    first, second = (Acker(KafkaSettings("fake:9092"), NS, AckerConfig(), kafka=FakeKafka()) for _ in range(2))
    ids = [a.live.producer.conf["transactional.id"] for a in (first, second) if isinstance(a.live.producer, FakeProducer)]
    assert len(ids) == 2 and ids[0] != ids[1]
    assert all(socket.gethostname() in i for i in ids)
    stable = Acker(KafkaSettings("fake:9092"), NS, AckerConfig(instance_id="acker-1"), kafka=FakeKafka())
    assert isinstance(stable.live.producer, FakeProducer)
    assert stable.live.producer.conf["transactional.id"] == f"{NS.name}.acker.acker-1"


class _SlowCoordinator(FakeProducer):
    """init_transactions times out twice (a transaction coordinator on a node that is down),
    then succeeds."""

    def __init__(self, conf: dict[str, Any]) -> None:
        super().__init__(conf)
        self.inits = 0

    def init_transactions(self, *_: Any) -> None:
        self.inits += 1
        if self.inits <= 2:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "coordinator not available", retriable=True))


def test_a_transient_init_transactions_failure_is_waited_out_not_an_exit(fake_kafka: None) -> None:
    acker = Acker(KafkaSettings("fake:9092"), NS, AckerConfig(instance_id="acker-1"), kafka=FakeKafka())
    slow = _SlowCoordinator({})
    acker.live.producer = slow  # type: ignore[assignment]
    acker.live.init_transactions()
    assert slow.inits == 3


def test_a_fatal_init_transactions_failure_is_raised(fake_kafka: None) -> None:
    class Fenced(FakeProducer):
        def init_transactions(self, *_: Any) -> None:
            raise KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))

    acker = Acker(KafkaSettings("fake:9092"), NS, AckerConfig(instance_id="acker-1"), kafka=FakeKafka())
    acker.live.producer = Fenced({})  # type: ignore[assignment]
    with pytest.raises(KafkaException):
        acker.live.init_transactions()


def _fence_commits(producer: FakeProducer) -> None:
    def fenced(*_: Any) -> None:
        raise KafkaException(KafkaError(KafkaError._FENCED, "Failed to end transaction: fenced", fatal=True))

    producer.commit_transaction = fenced  # type: ignore[method-assign]


def test_a_transaction_the_coordinator_aborted_on_timeout_costs_a_rejoin_not_the_service(
    fake_kafka: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in a chaos run: a broker outage longer than transaction.timeout.ms; the coordinator
    came back, aborted the expired transaction and bumped the epoch, and the acker stopped as
    if a newer instance had taken its transactional id."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock, rejoin_backoff_ms=0)
    acker.start()  # its producer made with the configured transaction timeout
    acker.config = dataclasses.replace(acker.config, transaction_timeout_ms=0)  # every transaction outlived it
    consumer.batches.append([persist_msg(persisted(S1, R1, T0))])
    _fence_commits(producer)
    run_steps(acker)
    assert acker.fenced_by_timeout == 1 and acker.rejoins == 1
    assert acker.live.producer is producer  # no new producer while it owns nothing: it could fence a successor
    rejoined = FakeConsumer.last
    assert rejoined is not None and rejoined is not consumer
    rejoined.batches.append([persist_msg(persisted(S1, R1, T0))])  # read again from the committed offsets
    run_steps(acker)
    fresh = acker.live.producer
    assert isinstance(fresh, FakeProducer) and fresh is not producer
    assert fresh.transactions == 1 and fresh.offsets[0][(NS.persist, 0)] == 1
    assert acker.counters()["registered"] == 1


def test_a_young_transaction_fenced_means_a_newer_instance_and_the_acker_stops(fake_kafka: None) -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)  # transaction timeout 10 s: a commit is far younger
    consumer.batches.append([persist_msg(persisted(S1, R1, T0))])
    _fence_commits(producer)
    with pytest.raises(ReplayBrokerError, match="fenced"):
        run_steps(acker)
    assert acker.fenced_by_timeout == 0


def test_a_seek_that_fails_while_the_fetcher_starts_is_tried_again_not_the_end_of_the_acker(
    fake_kafka: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in a takeover on a loaded machine: the survivor restored the victim's partition
    and its seek failed with "Erroneous state"; the acker exited."""
    clock = ManualClock(T0)
    acker, consumer, _producer = make_acker(clock, assign_restore_ms=0)  # restored in the loop, then sought
    failures = [2]

    def seek(tp: TopicPartition) -> None:
        if failures[0]:
            failures[0] -= 1
            raise KafkaException(KafkaError(KafkaError._STATE, f"Failed to seek to offset {tp.offset}: Erroneous state"))

    consumer.seek = seek  # type: ignore[method-assign]
    consumer.batches.append([persist_msg(persisted(S1, R1, T0))])
    run_steps(acker, 10)
    assert failures == [0] and not consumer.paused
    assert acker.counters()["registered"] == 1


def test_inputs_a_rewind_paused_then_lost_flow_again_when_the_partitions_come_back(fake_kafka: None) -> None:
    """librdkafka keeps a pause across an unassign and a new assignment. Seen in chaos: an acker
    cut off from the cluster rewound (pausing its inputs), lost its partitions, got them back,
    restored them in the callback and never read its inputs again."""
    clock = ManualClock(T0)
    acker, consumer, _producer = make_acker(clock)
    run_steps(acker)  # owns both ledger partitions
    acker.recovery.rewind({0, 1})
    assert consumer.paused  # the rewind's inputs wait for their restore
    tps = [TopicPartition(t, p) for t in (NS.persist, NS.acks) for p in range(2)]
    acker.assignment.on_lost(consumer, tps)
    acker.assignment.on_assign(consumer, tps)  # restored at once (an empty changelog)
    assert not consumer.paused
    consumer.batches.append([persist_msg(persisted(S1, R1, T0, timeout_ms=1_000))])
    run_steps(acker)
    assert acker.counters()["registered"] == 1


@pytest.mark.parametrize(("code", "replaced"), [
    (KafkaError._TIMED_OUT, True),  # its coordinator out of reach
    (KafkaError._TRANSPORT, True),
    (KafkaError.UNKNOWN_MEMBER_ID, False),  # the coordinator answered: a zombie's offsets refused
])
def test_a_commit_cut_off_from_its_coordinator_is_the_last_of_its_producer(
    fake_kafka: None, monkeypatch: pytest.MonkeyPatch, code: int, replaced: bool
) -> None:
    """Seen in chaos: an acker cut off from the cluster had a commit time out (adding the
    offsets); once the cluster was back, the same producer's next send_offsets_to_transaction
    blocked for good (librdkafka #5456), and the acker with it."""
    clock = ManualClock(T0)
    acker, consumer, _ = make_acker(clock, assign_restore_ms=0)  # the rewind restores in the loop
    acker.start()  # its producer made
    producer = acker.live.producer
    assert isinstance(producer, FakeProducer)
    failed = [0]
    answer = producer.send_offsets_to_transaction

    def cut_off_once(positions: list[TopicPartition], *args: Any) -> None:
        if not failed[0]:
            failed[0] += 1
            raise KafkaException(KafkaError(code, "Failed to add offsets to transaction on broker TxnCoordinator"))
        answer(positions, *args)

    producer.send_offsets_to_transaction = cut_off_once  # type: ignore[method-assign]
    record = persist_msg(persisted(S1, R1, T0))
    consumer.batches.append([record])
    run_steps(acker, 3)
    assert failed == [1] and producer.committed == []
    consumer.batches.append([record])  # read again after the rewind, from the committed offset
    run_steps(acker, 10)
    used = acker.live.producer
    assert isinstance(used, FakeProducer) and (used is not producer) == replaced
    assert any(o.get((NS.persist, 0)) == 1 for o in used.offsets)  # the record's offset, committed
    # (the cut-off producer never commits again; one the coordinator answered goes on)
    assert (producer.transactions == 0) == replaced
    assert acker.counters()["registered"] == 1


def test_a_send_offsets_that_never_returns_is_left_behind_with_its_producer(
    fake_kafka: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """librdkafka #5456: the request to the group coordinator ignores its timeout. Seen in
    chaos: an acker cut off from the cluster stayed blocked in send_offsets_to_transaction past
    the heal, for good."""
    clock = ManualClock(T0)
    acker, consumer, _ = make_acker(clock, assign_restore_ms=0, offsets_timeout_ms=50, left_behind_ms=50)
    acker.start()
    producer = acker.live.producer
    assert isinstance(producer, FakeProducer)
    release, aborted = threading.Event(), []

    def blocked(*_: Any) -> None:
        release.wait(30)
        raise KafkaException(KafkaError(KafkaError._FENCED, "fenced by the next producer", fatal=True))

    producer.send_offsets_to_transaction = blocked  # type: ignore[method-assign]
    producer.abort_transaction = lambda *_: aborted.append(1)  # type: ignore[method-assign]
    record = persist_msg(persisted(S1, R1, T0))
    consumer.batches.append([record])
    try:
        run_steps(acker, 3)
        consumer.batches.append([record])  # read again after the rewind
        run_steps(acker, 10)
    finally:
        release.set()
    used = acker.live.producer
    assert isinstance(used, FakeProducer) and used is not producer
    assert aborted == [] and producer.transactions == 0  # nothing more asked of the one left behind
    assert any(o.get((NS.persist, 0)) == 1 for o in used.offsets)
    assert acker.counters()["registered"] == 1
