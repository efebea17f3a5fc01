"""Replay decisions (broker.acker.replay, docs/design.md §6): pure functions of the failed attempt's
PersistedRecord - no Kafka. A replay is a fresh attempt on ``<topic>.replay`` at the same
key-hash partition; after ``max_attempts`` the record is dead-lettered with its history."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from broker import ids
from broker.acker.fate import Outcome, Reason
from broker.acker.payloads import PayloadCache
from broker.acker.replay import Decision, decide, quarantine_record
from broker.headers import (
    H_ATTEMPTS,
    H_HISTORY,
    H_KEY_HASH_PARTITION,
    H_PARTITIONER,
    H_REASON,
    H_SOURCE,
    H_TOPIC,
    Tracking,
)
from broker.schemas import Failure, PersistedRecord
from broker.topics import Namespace

NS = Namespace("unit-ns")
NOW = 1_700_000_123_456
FIRST = PersistedRecord(
    srid=0x1F3A_5C7E_9B2D_4E61,
    origin=0x1F3A_5C7E_9B2D_4E61,
    attempt=1,
    root_xor=0x2B7E_1516_28AE_D2A6,
    record_id=0x2B7E_1516_28AE_D2A6,
    topic="orders",
    key_hash_partition=5,
    key=b"customer-7",
    value=b'{"order": 7}',
    created_ms=1_700_000_000_000,
    partitioner="spark",
    headers=(("trace", b"abc"), ("nullable", None)),
    timeout_ms=30_000,
    max_attempts=3,
)


def _headers(decision_headers: tuple[tuple[str, bytes | None], ...]) -> dict[str, bytes | None]:
    keys = [k for k, _ in decision_headers]
    assert len(keys) == len(set(keys)), f"duplicate headers: {keys}"
    return dict(decision_headers)


def _replay(
    record: PersistedRecord, reason: Reason = Reason.TIMEOUT, P: int = 8, now: int = NOW
) -> tuple[Decision, PersistedRecord]:
    decision = decide(NS, record, reason, now, P)
    assert decision.outcome is Outcome.REPLAY
    persist, _data = decision.records
    return decision, PersistedRecord.decode(persist.value)


# --------------------------------------------------------------------------- replay


def test_replay_is_a_new_attempt_of_the_same_origin() -> None:
    decision, again = _replay(FIRST, Reason.TIMEOUT)
    assert decision.new_srid is not None and decision.new_srid not in (0, FIRST.srid)
    assert again.srid == decision.new_srid
    assert again.attempt == FIRST.attempt + 1
    assert again.origin == FIRST.origin
    assert again.key_hash_partition == FIRST.key_hash_partition
    assert again.record_id not in (0, FIRST.record_id)
    assert again.root_xor == again.record_id  # the replayed data record is the new root
    assert again.created_ms == NOW  # the new deadline counts from the replay
    # the payload and its routing are unchanged
    for name in ("topic", "key", "value", "headers", "partitioner", "timeout_ms", "max_attempts"):
        assert getattr(again, name) == getattr(FIRST, name), name
    assert again.history == (Failure(FIRST.srid, 1, "timeout", NOW),)


@pytest.mark.parametrize("P", [1, 2, 3, 4, 7, 16, 64])
def test_a_replay_lives_in_its_originals_ledger_partition(P: int) -> None:
    """Every attempt of an origin lives in one ledger partition (docs/design.md §6): the
    replay's new srid is random within its original's, whichever that is."""
    for original in {FIRST.srid, FIRST.srid + 1, -FIRST.srid, 1, -(2**63), 2**63 - 1}:
        record = dataclasses.replace(FIRST, srid=original)
        srids = set()
        for _ in range(200):
            decision = decide(NS, record, Reason.FAILED, NOW, P)
            persist = decision.records[0]
            assert decision.new_srid is not None and decision.new_srid != 0
            assert persist.topic == NS.persist
            assert persist.key == ids.encode_id(decision.new_srid)
            assert persist.partition == decision.new_srid % P == original % P
            assert PersistedRecord.decode(persist.value).srid == decision.new_srid
            srids.add(decision.new_srid)
        assert len(srids) == 200  # random within the partition


def test_replayed_data_record_goes_to_the_replay_topic_at_the_key_hash_partition() -> None:
    decision, again = _replay(FIRST, Reason.FAILED, P=4)
    data = decision.records[1]
    assert data.topic == "orders.replay"
    assert data.partition == FIRST.key_hash_partition
    assert (data.key, data.value) == (FIRST.key, FIRST.value)
    headers = _headers(data.headers)
    assert headers["trace"] == b"abc" and headers["nullable"] is None  # user headers kept
    tracking = Tracking.from_headers(data.headers)
    assert tracking == Tracking(
        srid=again.srid, record_id=again.record_id, origin=FIRST.origin, attempt=2
    )
    assert len(headers["rb-t"] or b"") == 28  # one header: srid, record id, origin, attempt


@pytest.mark.parametrize(("partition", "count"), [(-1, 8), (-5, 8), (-5, -1), (8, 8)])
def test_a_key_hash_partition_outside_the_replay_topic_is_dead_lettered_not_produced(partition: int, count: int) -> None:
    """The acker quarantines such a record at registration; one registered before (an older
    version) is dead-lettered with the reason when it fails. Produced to partition -5 it
    aborted every commit; to -1 it went to any partition."""
    record = dataclasses.replace(FIRST, key_hash_partition=partition)
    decision = decide(NS, record, Reason.TIMEOUT, NOW, 8, count)
    assert decision.outcome is Outcome.DLQ
    assert (_headers(decision.records[0].headers)[H_REASON] or b"").startswith(b"timeout; cannot replay: orders.replay")


def test_replays_chain_until_max_attempts_then_dead_letter() -> None:
    record = FIRST
    srids = [record.srid]
    for attempt, reason in ((2, Reason.FAILED), (3, Reason.TIMEOUT)):
        _, record = _replay(record, reason, now=NOW + attempt)
        assert record.attempt == attempt and record.origin == FIRST.origin
        srids.append(record.srid)
    assert len(set(srids)) == 3
    assert [f.attempt for f in record.history] == [1, 2]
    assert [f.srid for f in record.history] == srids[:2]

    final = decide(NS, record, Reason.TIMEOUT, NOW + 9, 4)
    assert final.outcome is Outcome.DLQ and final.new_srid is None
    (dlq,) = final.records
    assert dlq.topic == NS.dlq and dlq.partition == 0
    assert (dlq.key, dlq.value) == (FIRST.key, FIRST.value)
    headers = _headers(dlq.headers)
    assert headers[H_REASON] == b"timeout"
    assert headers[H_ATTEMPTS] == b"3"
    assert headers[H_TOPIC] == b"orders"
    assert headers[H_KEY_HASH_PARTITION] == b"5"
    assert headers[H_PARTITIONER] == b"spark"
    assert headers["rb-origin"] == ids.encode_id(FIRST.origin)
    assert headers["trace"] == b"abc" and headers["nullable"] is None
    history = orjson.loads(headers[H_HISTORY] or b"")
    assert history == [
        {"srid": srids[0], "attempt": 1, "reason": "failed", "at_ms": NOW + 2},
        {"srid": srids[1], "attempt": 2, "reason": "timeout", "at_ms": NOW + 3},
        {"srid": srids[2], "attempt": 3, "reason": "timeout", "at_ms": NOW + 9},
    ]


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "kind"),
    [(1, 1, Outcome.DLQ), (1, 2, Outcome.REPLAY), (2, 2, Outcome.DLQ), (5, 3, Outcome.DLQ), (4, 5, Outcome.REPLAY)],
)
def test_dead_letter_exactly_from_max_attempts_on(
    attempt: int, max_attempts: int, kind: Outcome
) -> None:
    record = dataclasses.replace(FIRST, attempt=attempt, max_attempts=max_attempts)
    decision = decide(NS, record, Reason.FAILED, NOW, 4)
    assert decision.outcome is kind
    assert len(decision.records) == (1 if kind is Outcome.DLQ else 2)


def test_decide_is_pure() -> None:
    """The failed attempt itself is not changed; two decisions draw different srids."""
    before = dataclasses.replace(FIRST)
    a, b = decide(NS, FIRST, Reason.TIMEOUT, NOW, 4), decide(NS, FIRST, Reason.TIMEOUT, NOW, 4)
    assert before == FIRST
    assert a.new_srid != b.new_srid


def test_null_key_and_value_replay() -> None:
    record = dataclasses.replace(FIRST, key=None, value=None, headers=())
    decision, again = _replay(record)
    data = decision.records[1]
    assert data.key is None and data.value is None
    assert again.key is None and again.value is None
    assert {k for k, _ in data.headers} == {"rb-t"}


# --------------------------------------------------------------------------- quarantine


def test_quarantine_keeps_the_message_byte_for_byte_with_the_reason() -> None:
    out = quarantine_record(NS, NS.acks, 3, 1234, None, b"\xff\x00garbage", "empty XorBatch")
    assert out.topic == NS.dlq and out.partition == 0
    assert out.key is None and out.value == b"\xff\x00garbage"
    headers = _headers(out.headers)
    assert headers[H_REASON] == b"quarantine: empty XorBatch"
    assert headers[H_SOURCE] == f"{NS.acks}/3/1234".encode()

    out = quarantine_record(NS, NS.persist, 0, 0, b"\x01" * 8, None, "x")
    assert (out.key, out.value) == (b"\x01" * 8, None)


# --------------------------------------------------------------------------- payload cache


def _record(srid: int) -> PersistedRecord:
    return dataclasses.replace(FIRST, srid=srid)


def test_payload_cache_is_bounded_and_evicts_the_oldest() -> None:
    cache = PayloadCache(max_entries=3)
    for srid in range(1, 6):
        cache.put(srid, _record(srid).encode())
        assert len(cache) == min(srid, 3)
    assert cache.pop(1) is None and cache.pop(2) is None  # evicted, oldest first
    assert cache.pop(4) == _record(4).encode()
    assert cache.pop(4) is None  # pop removes
    assert len(cache) == 2


def test_payload_cache_discard_many() -> None:
    cache = PayloadCache(max_entries=10)
    for srid in range(1, 8):
        cache.put(srid, _record(srid).encode())
    cache.discard_many([2, 3, 99])
    assert len(cache) == 5
    assert cache.pop(2) is None and cache.pop(3) is None
    assert cache.pop(7) == _record(7).encode()


def test_payload_cache_of_size_zero_keeps_nothing() -> None:
    cache = PayloadCache(max_entries=0)
    cache.put(1, _record(1).encode())
    assert len(cache) == 0 and cache.pop(1) is None
    cache.discard_many([1])


def test_payload_cache_bound_holds_under_many_puts() -> None:
    cache = PayloadCache(max_entries=100)
    for srid in range(1, 10_001):
        cache.put(srid, _record(srid).encode())
    assert len(cache) == 100
    assert cache.pop(9_900) is None
    assert all(cache.pop(s) is not None for s in range(9_901, 10_001))


@pytest.mark.parametrize(
    ("replay_partitions", "expected"),
    [(None, "does not exist"), (5, "has 5 partitions, the record's is 5"), (2, "has 2 partitions")],
)
def test_unusable_replay_topic_dead_letters_at_once(replay_partitions: int | None, expected: str) -> None:
    decision = decide(NS, FIRST, Reason.TIMEOUT, NOW, 8, replay_partitions)
    assert decision.outcome is Outcome.DLQ
    [record] = decision.records
    reason = _headers(record.headers)[H_REASON]
    assert reason is not None
    assert reason.decode().startswith("timeout; cannot replay: orders.replay ")
    assert expected in reason.decode()


def test_usable_replay_topic_replays() -> None:
    assert decide(NS, FIRST, Reason.TIMEOUT, NOW, 8, 6).outcome is Outcome.REPLAY
