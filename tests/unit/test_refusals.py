"""Outputs the broker refuses for good (broker.acker.refusals): which refusals count, what the
next decision becomes, and how a refused dead letter is made smaller. No Kafka."""

from __future__ import annotations

import dataclasses

import pytest
from confluent_kafka import KafkaError

from broker.acker.fate import Outcome, Reason
from broker.acker.refusals import Refusals
from broker.acker.replay import Decision, decide
from broker.errors import ReplayBrokerError
from broker.headers import H_HISTORY, H_ORIGIN, H_REASON
from broker.schemas import PersistedRecord
from broker.topics import Namespace

NS = Namespace("unit-ns")
NOW = 1_700_000_123_456
RECORD = PersistedRecord(
    srid=0x1F3A_5C7E_9B2D_4E61, origin=0x1F3A_5C7E_9B2D_4E61, attempt=1, root_xor=7, record_id=7,
    topic="orders", key_hash_partition=1, key=b"customer-7", value=b"x" * 100, created_ms=NOW - 1_000,
    timeout_ms=30_000, max_attempts=5, headers=(("trace", b"abc"),),
)
SIZE = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)


def replay_of(record: PersistedRecord = RECORD, refused: str | None = None) -> Decision:
    return decide(NS, record, Reason.FAILED, NOW, 4, 2, refused)


def test_a_size_refusal_in_a_batch_only_makes_the_record_travel_alone() -> None:
    refusals = Refusals(NS.dlq)
    _, data = replay_of().records
    assert data.topic == "orders.replay" and data.subject == RECORD.srid
    refusals.delivered(data, False, SIZE, None)  # its batch was refused: maybe not its fault
    assert refusals.alone == {RECORD.srid} and not refusals.replay and not refusals.take_noted()
    refusals.delivered(data, True, SIZE, None)  # refused alone: its own verdict
    assert refusals.replay == {RECORD.srid: "orders.replay rejected the record: Broker: Message size too large"}
    assert len(refusals.take_noted()) == 1


@pytest.mark.parametrize("code", [KafkaError._MSG_TIMED_OUT, KafkaError._PURGE_QUEUE, KafkaError.NOT_LEADER_FOR_PARTITION])
def test_transient_errors_are_not_remembered(code: int) -> None:
    refusals = Refusals(NS.dlq)
    _, data = replay_of().records
    assert not refusals.refuse(data, KafkaError(code), alone=True)
    assert not refusals.replay and not refusals.alone and not refusals.unknown_topics


def test_an_unknown_topic_counts_at_once_and_is_looked_up_again() -> None:
    refusals = Refusals(NS.dlq)
    _, data = replay_of().records
    assert refusals.refuse(data, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), alone=False)
    assert RECORD.srid in refusals.replay and refusals.take_unknown_topics() == {"orders.replay"}


def test_a_refused_replay_is_decided_as_a_dead_letter_with_the_reason() -> None:
    why = "orders.replay rejected the record: Broker: Message size too large"
    decision = replay_of(refused=why)
    (dead,) = decision.records
    assert decision.outcome is Outcome.DLQ and (dead.topic, dead.key, dead.value) == (NS.dlq, RECORD.key, RECORD.value)
    assert dict(dead.headers)[H_REASON] == f"failed; cannot replay: {why}".encode()
    # After max attempts it is a dead letter anyway, for that reason.
    last = dataclasses.replace(RECORD, attempt=5)
    assert dict(replay_of(last, why).records[0].headers)[H_REASON] == b"failed"


def test_a_refused_dead_letter_loses_its_value_then_everything_but_the_facts_then_the_acker_stops() -> None:
    refusals = Refusals(NS.dlq)
    (dead,) = replay_of(refused="orders.replay rejected the record: too large").records
    assert refusals.degrade(dead) is None
    refusals.delivered(dead, True, SIZE, None)
    smaller = refusals.degrade(dead)
    assert smaller is not None and smaller.value is None and smaller.key == RECORD.key
    headers = dict(smaller.headers)
    assert headers[H_REASON] == (
        b"failed; cannot replay: orders.replay rejected the record: too large; "
        b"value dropped: unit-ns.dlq rejected the record: Broker: Message size too large"
    )
    assert H_HISTORY in headers and headers["trace"] == b"abc"
    refusals.delivered(smaller, True, SIZE, None)
    bare = refusals.degrade(dead)
    assert bare is not None and bare.key is None and bare.value is None
    headers = dict(bare.headers)
    assert H_HISTORY not in headers and "trace" not in headers and headers[H_ORIGIN] is not None
    assert (headers[H_REASON] or b"").endswith(b"key, value, headers and history dropped: "
                                                b"unit-ns.dlq rejected the record: Broker: Message size too large")
    refusals.delivered(bare, True, SIZE, None)
    with pytest.raises(ReplayBrokerError, match="refuses even a dead letter"):
        refusals.degrade(dead)
    refusals.settle([dead])  # committed (or decided elsewhere): forgotten
    assert refusals.degrade(dead) is None and not refusals.dlq
