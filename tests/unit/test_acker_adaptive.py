"""Adaptive deadlines given by the real ``Acker`` on a ``ManualClock`` with in-memory Kafka
clients (as in test_acker_timeouts): the initial timeout before enough samples, the estimate
after, never a shorter deadline for an entry registered already, replays of auto records
auto too, timeouts raising the estimate, and the counters."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from prometheus_client import generate_latest

from broker import ids
from broker.acker import Acker, AckerConfig
from broker.headers import AUTO_TIMEOUT_MS
from broker.ledger.clock import ManualClock
from broker.schemas import PERSIST_ADAPTIVE, PersistedRecord, read_persist_prefixes
from broker.settings import KafkaSettings
from tests.unit.fakes import WHOLE_RESTORE, FakeConsumer, FakeKafka, FakeMessage, FakeProducer
from tests.unit.test_acker_timeouts import (
    NS,
    T0,
    acks_msg,
    fake_kafka,  # noqa: F401 - the fixture
    outcomes,
    persisted,
    run_steps,
)

pytestmark = pytest.mark.usefixtures("fake_kafka")

FLOOR, CEILING, INITIAL = 1_000, 60_000, 20_000


def make_acker(clock: ManualClock) -> tuple[Acker, FakeConsumer, FakeProducer]:
    config = AckerConfig(
        commit_interval_ms=0, instance_id="unit", stats_interval_ms=10**12, fail_hold_ms=0,
        adaptive_floor_ms=FLOOR, adaptive_ceiling_ms=CEILING, adaptive_initial_ms=INITIAL,
        adaptive_safety_factor=3.0, adaptive_min_samples=50, adaptive_window_ms=10_000, **WHOLE_RESTORE,
    )
    acker = Acker(KafkaSettings("fake:9092"), NS, config, clock=clock, kafka=FakeKafka())
    assert FakeConsumer.last is not None and isinstance(acker.live.producer, FakeProducer)
    return acker, FakeConsumer.last, acker.live.producer


class Feed:
    """Persist records with an adaptive timeout, as a Source writes them, and their
    acks; offsets counted per ledger partition."""

    def __init__(self, consumer: FakeConsumer) -> None:
        self.consumer = consumer
        self.offsets = {(t, p): itertools.count() for t in (NS.persist, NS.acks) for p in range(2)}

    def persist(self, n: int, created_ms: int, *, topic: str = "orders", auto: bool = True) -> list[PersistedRecord]:
        records = []
        for srid, rid in zip(ids.new_ids(n).tolist(), ids.new_ids(n).tolist(), strict=True):
            r = persisted(srid, rid, created_ms, timeout_ms=AUTO_TIMEOUT_MS if auto else 30_000)
            records.append(PersistedRecord(**{**r.__dict__, "topic": topic}))
        msgs: list[FakeMessage] = []
        for r in records:
            lp = ids.ledger_partition(r.srid, 2)
            msgs.append(FakeMessage(NS.persist, lp, next(self.offsets[(NS.persist, lp)]),
                                    ids.encode_id(r.srid), r.encode()))
        self.consumer.batches.append(msgs)
        return records

    def ack(self, records: list[PersistedRecord]) -> None:
        msgs = []
        for lp in range(2):
            mine = [r for r in records if ids.ledger_partition(r.srid, 2) == lp]
            if mine:
                msgs.append(acks_msg(lp, next(self.offsets[(NS.acks, lp)]),
                                     [r.srid for r in mine], [r.root_xor for r in mine]))
        self.consumer.batches.append(msgs)


def deadline_ms(acker: Acker, srid: int) -> int:
    entry = acker.states[ids.ledger_partition(srid, 2)].table.get(srid)
    assert entry is not None
    return int(acker.ticker.ms_of_ticks(np.array([entry.deadline], np.int32))[0])


def learn(acker: Acker, feed: Feed, clock: ManualClock, latency_ms: int, rounds: int = 3, n: int = 40) -> None:
    """``rounds`` batches of ``n`` auto records, each completed ``latency_ms`` after it registered."""
    for _ in range(rounds):
        batch = feed.persist(n, clock.now_ms())
        run_steps(acker)
        clock.advance(latency_ms)
        feed.ack(batch)
        run_steps(acker)


def test_auto_records_get_the_initial_timeout_then_the_estimate() -> None:
    clock = ManualClock(T0)
    acker, consumer, _ = make_acker(clock)
    feed = Feed(consumer)
    (first,) = feed.persist(1, T0)
    run_steps(acker)
    assert deadline_ms(acker, first.srid) - T0 in range(INITIAL, INITIAL + 100)  # rounded up to a tick
    feed.ack([first])
    run_steps(acker)
    learn(acker, feed, clock, latency_ms=800)  # 120 completions of 800 ms
    now = clock.now_ms()
    (later,) = feed.persist(1, now)
    run_steps(acker)
    given = deadline_ms(acker, later.srid) - now
    assert 3 * 800 <= given <= 3 * 800 * 1.1 + 100  # p99.9 x 3: ~2.4 s, not the 20 s initial
    c = acker.counters()
    assert (c["adaptive"], c["completed"], c["timed_out"]) == (122, 121, 0)
    est = acker.adaptive.estimates(now)["orders"]
    assert (est.given, est.samples) == (122, 121) and given - 100 < est.timeout_ms <= given
    assert "orders:p99.9=" in acker.adaptive.summary(now)


def test_fixed_timeouts_are_untouched_and_give_no_samples() -> None:
    clock = ManualClock(T0)
    acker, consumer, _ = make_acker(clock)
    feed = Feed(consumer)
    batch = feed.persist(60, T0, auto=False)
    run_steps(acker)
    assert {deadline_ms(acker, r.srid) - T0 for r in batch} == {30_000}
    clock.advance(500)
    feed.ack(batch)
    run_steps(acker)
    assert acker.counters()["adaptive"] == 0 and acker.adaptive.names == []


def test_an_estimate_that_falls_never_shortens_a_deadline_already_given() -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    feed = Feed(consumer)
    (early,) = feed.persist(1, T0)  # registered with the initial 20 s
    run_steps(acker)
    given = deadline_ms(acker, early.srid)
    learn(acker, feed, clock, latency_ms=100)  # now the estimate is the 1 s floor
    (late,) = feed.persist(1, clock.now_ms())
    run_steps(acker)
    assert deadline_ms(acker, late.srid) - clock.now_ms() <= FLOOR + 100
    assert deadline_ms(acker, early.srid) == given
    clock.advance(FLOOR + 200)  # the new timeout has passed for both; only the late one expires
    run_steps(acker, 2)
    assert outcomes(producer).get(late.srid) == b"replay" and early.srid not in outcomes(producer)
    assert early.srid in acker.states[ids.ledger_partition(early.srid, 2)].table
    clock.advance(given - clock.now_ms() + 100)
    run_steps(acker, 2)
    assert outcomes(producer).get(early.srid) == b"replay"


def test_a_replay_of_an_auto_record_is_auto() -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    feed = Feed(consumer)
    (r,) = feed.persist(1, T0, topic="payments")
    run_steps(acker)
    clock.advance(INITIAL + 200)
    run_steps(acker, 2)
    assert outcomes(producer) == {r.srid: b"replay"}
    (again,) = [p for p in producer.committed if p.topic == NS.persist and p.value is not None]
    prefix = read_persist_prefixes([again.value or b""])
    assert int(prefix.flags[0]) == PERSIST_ADAPTIVE and not again.headers
    assert PersistedRecord.decode(again.value).timeout_ms == AUTO_TIMEOUT_MS
    assert int(prefix.deadlines_ms[0]) == clock.now_ms() + 300_000  # the fallback
    # Registered again (by this acker: its ledger partition is owned here too), auto again.
    key = again.key or b""
    lp = ids.ledger_partition(ids.decode_id(key), 2)
    consumer.batches.append([FakeMessage(NS.persist, lp, 100, key, again.value)])
    run_steps(acker)
    assert acker.counters()["adaptive"] == 2
    assert deadline_ms(acker, ids.decode_id(key)) - clock.now_ms() in range(INITIAL, INITIAL + 100)


def test_an_auto_record_without_headers_is_auto_from_its_value() -> None:
    clock = ManualClock(T0)
    acker, consumer, _ = make_acker(clock)
    r = persisted(ids.new_id(), ids.new_id(), T0, timeout_ms=AUTO_TIMEOUT_MS)
    consumer.batches.append([FakeMessage(NS.persist, ids.ledger_partition(r.srid, 2), 0, ids.encode_id(r.srid), r.encode())])
    run_steps(acker)
    assert acker.counters()["adaptive"] == 1
    assert deadline_ms(acker, r.srid) - T0 in range(INITIAL, INITIAL + 100)


def test_timeouts_raise_an_estimate_that_a_slow_down_outran() -> None:
    """Completions at 400 ms give the 1.2 s floor-ish timeout; then the task takes 5 s: the
    records time out, and their censored latencies (>= their timeout) raise the estimate, so
    the next records get a longer timeout instead of timing out forever."""
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    feed = Feed(consumer)
    learn(acker, feed, clock, latency_ms=400)
    before = acker.adaptive.timeout_ms(0, clock.now_ms())
    assert before < 1_500
    slow = feed.persist(40, clock.now_ms())
    run_steps(acker)
    clock.advance(before + 200)
    run_steps(acker, 2)
    assert acker.counters()["timed_out"] == 40
    after = acker.adaptive.timeout_ms(0, clock.now_ms())
    assert after >= 3 * before
    assert {outcomes(producer)[r.srid] for r in slow} == {b"replay"}


def test_the_estimate_and_the_deadlines_given_are_metrics() -> None:
    clock = ManualClock(T0)
    acker, consumer, _ = make_acker(clock)
    feed = Feed(consumer)
    learn(acker, feed, clock, latency_ms=800)
    run_steps(acker)  # a commit publishes the figures
    text = generate_latest(acker.metrics.partitions_registry).decode()
    given = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("replaybroker_acker_adaptive_deadlines_total{"))
    assert given == 120
    timeout = next(line for line in text.splitlines() if line.startswith("replaybroker_acker_adaptive_timeout_seconds{"))
    assert 'topic="orders"' in timeout and 2.4 <= float(timeout.rsplit(" ", 1)[1]) <= 2.7
    assert 'replaybroker_acker_adaptive_latency_samples{topic="orders"} 120.0' in text


def test_an_auto_record_whose_fallback_deadline_is_past_64_bits_is_quarantined() -> None:
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    r = persisted(ids.new_id(), ids.new_id(), 2**63 - 1, timeout_ms=AUTO_TIMEOUT_MS)
    consumer.batches.append([FakeMessage(NS.persist, ids.ledger_partition(r.srid, 2), 0, ids.encode_id(r.srid), r.encode())])
    run_steps(acker, 2)
    c = acker.counters()
    assert (c["quarantined"], c["registered"], c["adaptive"]) == (1, 0, 0)
    assert [p.topic for p in producer.committed if p.topic == NS.dlq] == [NS.dlq]
