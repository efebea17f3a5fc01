"""Replay payloads read from ``ns.persist``: the real ``Acker`` on a ``ManualClock``, its
clients in memory (tests/unit/test_acker_timeouts.py), and a fake ``ns.persist`` log behind
the fetch consumer - with compaction gaps, a log start offset and partitions that answer
nothing.

- an unreadable payload never stops the commits of other entries or partitions; it waits,
  durable in the changelog, retried with back-off, and is dead-lettered when it is provably
  gone or after ``payload_tries`` tries;
- payloads are read in bulk (one assign per partition, sequentially), at most
  ``max_fetches_per_commit`` per commit, the rest decided by later commits in persist order.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from broker import ids
from broker.acker import Acker, AckerConfig
from broker.acker.payloads import PersistFetcher, Unreadable
from broker.headers import H_REASON, H_SOURCE
from broker.ledger.clock import ManualClock
from broker.ledger.table import WATCH
from broker.schemas import COUNTERS_KEY, LedgerEntry, PersistedRecord
from broker.settings import KafkaSettings
from tests.unit.fakes import WHOLE_RESTORE, FakeConsumer, FakeKafka, FakeMessage, FakeProducer
from tests.unit.test_acker_timeouts import (
    NS,
    T0,
    outcomes,
    persist_msg,
    persisted,
)

TIMEOUT_MS = 1_000


class EofMessage(FakeMessage):
    def __init__(self, partition: int, offset: int) -> None:
        super().__init__(NS.persist, partition, offset, None, None)

    def error(self) -> KafkaError:  # type: ignore[override]
        return KafkaError(KafkaError._PARTITION_EOF)


class PersistLog:
    """``ns.persist`` as the fetch consumer sees it: offset -> message per partition (a
    missing offset is a compaction gap or a transaction marker), the log start offset, and
    partitions whose leader does not answer."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.records: dict[int, dict[int, FakeMessage]] = defaultdict(dict)
        self.low: dict[int, int] = defaultdict(int)
        self.down: set[int] = set()
        self.assigns: list[tuple[int, int]] = []  # (partition, offset) of every assign/seek
        self.attempts: dict[int, list[int]] = defaultdict(list)  # clock ms of reads per partition
        self.delivered = 0  # data messages handed out
        self.kafka = FakeKafka()  # the acker's port: its fetch consumer reads this log

    def high(self, lp: int) -> int:
        return max(self.records[lp], default=-1) + 1

    def attempt(self, lp: int) -> None:
        now = self.clock.now_ms()
        if not self.attempts[lp] or self.attempts[lp][-1] != now:
            self.attempts[lp].append(now)


class LogConsumer:
    """The fetch consumer over a ``PersistLog`` (librdkafka's behaviour where it matters:
    an out-of-range position resets to the end, EOF only with ``enable.partition.eof``)."""

    def __init__(self, conf: dict[str, Any], log: PersistLog) -> None:
        self.conf = conf
        self.log = log
        self.partition: int | None = None
        self.position = 0
        self.eof_sent = False

    def _move(self, tp: TopicPartition) -> None:
        assert tp.topic == NS.persist
        self.partition, self.position, self.eof_sent = tp.partition, tp.offset, False
        self.log.assigns.append((tp.partition, tp.offset))
        self.log.attempt(tp.partition)

    def assign(self, tps: list[TopicPartition]) -> None:
        assert len(tps) == 1
        self._move(tps[0])

    def seek(self, tp: TopicPartition) -> None:
        assert tp.partition == self.partition
        self._move(tp)

    def unassign(self) -> None:
        self.partition = None

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float | None = None, cached: bool = False) -> tuple[int, int]:
        self.log.attempt(tp.partition)
        if tp.partition in self.log.down:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return self.log.low[tp.partition], self.log.high(tp.partition)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[FakeMessage]:
        lp = self.partition
        assert lp is not None
        if lp in self.log.down:
            return []
        records, high = self.log.records[lp], self.log.high(lp)
        if self.position < self.log.low[lp] or self.position > high:
            self.position = self.log.low[lp]  # auto.offset.reset=earliest (the acker sets it)
        out: list[FakeMessage] = []
        while len(out) < num_messages and self.position < high:
            msg = records.get(self.position)
            self.position += 1
            if msg is not None:
                out.append(msg)
        self.log.delivered += len(out)
        eof_wanted = self.conf.get("enable.partition.eof") in (True, "true")
        if eof_wanted and len(out) < num_messages and self.position >= high and not self.eof_sent:
            out.append(EofMessage(lp, high))
            self.eof_sent = True
        return out

    def poll(self, timeout: float | None = None) -> FakeMessage | None:
        msgs = self.consume(1, timeout or 0)
        return msgs[0] if msgs else None

    def close(self) -> None:
        pass


@pytest.fixture
def persist_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[PersistLog]:
    log = PersistLog(ManualClock(T0))

    def consumer(conf: dict[str, Any]) -> Any:
        if str(conf.get("group.id", "")).endswith(".acker.fetch"):
            return LogConsumer(conf, log)
        return FakeConsumer(conf)

    log.kafka = FakeKafka(consumers=consumer)
    yield log


def make_acker(log: PersistLog, **config: Any) -> tuple[Acker, FakeConsumer, FakeProducer]:
    """An acker with NO payload cache: every replay reads its payload from ``log``."""
    conf: dict[str, Any] = {
        "commit_interval_ms": 0, "instance_id": "unit", "stats_interval_ms": 10**12, "fail_hold_ms": 0,
        "replay_cache_entries": 0, **WHOLE_RESTORE,
    }
    acker = Acker(KafkaSettings("fake:9092"), NS, AckerConfig(**{**conf, **config}), clock=log.clock, kafka=log.kafka)
    consumer = FakeConsumer.last
    assert consumer is not None and isinstance(acker.live.producer, FakeProducer)
    return acker, consumer, acker.live.producer


def run_steps(acker: Acker, n: int = 1) -> None:
    count = itertools.count(1)
    acker.run(until=lambda _: next(count) >= n)


def srids_of(lp: int, n: int, seed: int = 1) -> list[int]:
    """``n`` distinct srids of ledger partition ``lp`` (of 2)."""
    raw = np.random.default_rng(seed).choice(2**60, n, replace=False)
    return [int(s) * 2 + lp for s in raw]


def persist(log: PersistLog, consumer: FakeConsumer, records: list[tuple[PersistedRecord, int]]) -> None:
    """Persist records at offsets: in the log (for fetches) and to the acker (to register)."""
    msgs = [persist_msg(r, offset) for r, offset in records]
    for msg in msgs:
        log.records[msg.partition()][msg.offset()] = msg
    consumer.batches.append(msgs)


def record(srid: int, i: int) -> PersistedRecord:
    return persisted(srid, srid ^ 0x5555, T0 + i, timeout_ms=TIMEOUT_MS, value=b"order %d" % i)


def dlq(producer: FakeProducer) -> dict[int, dict[str, bytes | None]]:
    return {ids.decode_id(p.key or b""): p.headers for p in producer.committed if p.topic == NS.dlq}


def ledger_entry(producer: FakeProducer, srid: int) -> LedgerEntry | None:
    """The last committed changelog record of ``srid`` (None: a tombstone or none)."""
    last = [p for p in producer.committed if p.topic == NS.ledger and p.key == ids.encode_id(srid)]
    return LedgerEntry.decode(last[-1].value) if last and last[-1].value is not None else None


def replayed(producer: FakeProducer) -> list[bytes | None]:
    return [p.value for p in producer.committed if p.topic == "orders.replay"]


# --------------------------------------------------------------------------- item 5


@pytest.mark.parametrize("how", ["below log start", "compacted away", "another key", "tombstone"])
def test_a_lost_payload_is_dead_lettered_and_blocks_no_other_entry(persist_log: PersistLog, how: str) -> None:
    acker, consumer, producer = make_acker(persist_log)
    (a, c), (b,) = srids_of(0, 2), srids_of(1, 1)
    persist(persist_log, consumer, [(record(a, 0), 0), (record(c, 1), 1), (record(b, 2), 0)])
    run_steps(acker)
    assert acker.counters()["registered"] == 3
    if how == "below log start":
        persist_log.low[0] = 1
    elif how == "compacted away":
        del persist_log.records[0][0]
    elif how == "another key":  # offsets never move: only a broken log holds another key here
        persist_log.records[0][0] = persist_msg(record(c, 1), 0)
    else:
        persist_log.records[0][0] = FakeMessage(NS.persist, 0, 0, ids.encode_id(a), None)
    persist_log.clock.advance(TIMEOUT_MS + 100)
    run_steps(acker)
    # the other partition AND the other entry of the same partition are replayed; the lost
    # one is held while a window may be open (its history went with its payload, fate.LOST)
    assert outcomes(producer) == {b: b"replay", c: b"replay"}
    assert acker.counters()["dlq_held"] == 1
    persist_log.clock.advance(acker.config.watch_for_ms)
    run_steps(acker, 3)
    assert outcomes(producer) == {a: b"dlq", b: b"replay", c: b"replay"}
    assert sorted(replayed(producer)) == [b"order 1", b"order 2"]
    # the lost one: key = its srid, the reason, where it was; counted; nothing left pending
    lost = dlq(producer)[a]
    assert (lost[H_REASON] or b"").startswith(b"payload lost: ")
    assert lost[H_SOURCE] == f"{NS.persist}/0/0".encode()
    c_ = acker.counters()
    assert (c_["timed_out"], c_["replayed"], c_["payload_lost"], c_["pending"]) == (3, 2, 1, 0)
    assert ledger_entry(producer, a) is None


def test_an_unreadable_payload_waits_durably_and_is_replayed_when_readable(persist_log: PersistLog) -> None:
    acker, consumer, producer = make_acker(persist_log)
    (a,), (b,) = srids_of(0, 1), srids_of(1, 1)
    persist(persist_log, consumer, [(record(a, 0), 0), (record(b, 1), 0)])
    run_steps(acker)
    persist_log.down.add(0)  # partition 0's leader does not answer
    persist_log.clock.advance(TIMEOUT_MS + 100)
    run_steps(acker)
    assert outcomes(producer) == {b: b"replay"}  # b's partition commits
    assert acker.counters()["pending"] == 1
    # a is in the changelog (a restart retries it), not a tombstone
    entry = ledger_entry(producer, a)
    assert entry is not None and entry.persist_offset == 0 and entry.flags & 1
    persist_log.down.clear()
    persist_log.clock.advance(60_000)
    run_steps(acker)
    assert outcomes(producer) == {a: b"replay", b: b"replay"}
    assert sorted(replayed(producer)) == [b"order 0", b"order 1"]
    c = acker.counters()
    assert (c["timed_out"], c["replayed"], c["pending"]) == (2, 2, 0)
    # its value waited with it, so the replayed timeout is watched like any other
    entry = ledger_entry(producer, a)
    assert entry is not None and entry.flags == WATCH and c["watch_skipped"] == 0


def test_an_unreadable_payload_is_retried_with_back_off_then_dead_lettered(persist_log: PersistLog) -> None:
    acker, consumer, producer = make_acker(persist_log, payload_tries=5, payload_retry_ms=1_000,
                                           payload_retry_max_ms=4_000)
    (a,) = srids_of(0, 1)
    persist(persist_log, consumer, [(record(a, 0), 0)])
    run_steps(acker)
    persist_log.down.add(0)
    persist_log.clock.advance(TIMEOUT_MS + 100)
    start = persist_log.clock.now_ms()
    for _ in range(200):  # 20 s in commits of 100 ms
        run_steps(acker)
        persist_log.clock.advance(100)
    tries = [ms - start for ms in persist_log.attempts[0]]
    # 1 s, 2 s, 4 s, then bounded at 4 s (each rounded up to the next 100 ms tick at most)
    gaps = np.diff(tries).tolist()
    assert len(tries) == 5 and all(0 <= g - want <= 100 for g, want in zip(gaps, [1_000, 2_000, 4_000, 4_000], strict=True))
    assert outcomes(producer) == {}  # held until its window ended (fate.LOST)
    persist_log.clock.advance(acker.config.watch_for_ms)
    run_steps(acker, 3)
    assert outcomes(producer) == {a: b"dlq"}
    assert b"5 tries" in (dlq(producer)[a][H_REASON] or b"")
    c = acker.counters()
    assert (c["payload_lost"], c["payload_retries"], c["timed_out"], c["pending"]) == (1, 4, 1, 0)


def test_a_failed_entry_waiting_for_its_payload_keeps_its_reason(persist_log: PersistLog) -> None:
    from tests.unit.test_acker_timeouts import acks_msg

    acker, consumer, producer = make_acker(persist_log)
    (a,) = srids_of(0, 1)
    persist(persist_log, consumer, [(record(a, 0), 0)])
    consumer.batches.append([acks_msg(0, 0, [], [], failed=[a])])
    persist_log.down.add(0)
    run_steps(acker, 2)
    assert outcomes(producer) == {} and acker.counters()["failed"] == 1
    persist_log.down.clear()
    persist_log.clock.advance(60_000)
    run_steps(acker)
    assert outcomes(producer) == {a: b"replay"}
    (again,) = [PersistedRecord.decode(p.value) for p in producer.committed
                if p.topic == NS.persist and p.value is not None]
    assert [f.reason for f in again.history] == ["failed"]
    c = acker.counters()
    assert (c["failed"], c["timed_out"], c["replayed"]) == (1, 0, 1)


# --------------------------------------------------------------------------- item 6


def test_payloads_are_read_in_bulk_one_assign_per_partition(persist_log: PersistLog) -> None:
    acker, consumer, producer = make_acker(persist_log)
    n = 1_000
    srids = {lp: srids_of(lp, n, seed=lp) for lp in (0, 1)}
    # record j of a partition at offset 2j; between them a transaction marker or compacted
    # record (a gap: no message) or a record of another srid that is not failed
    records = [(record(srids[i % 2][i // 2], i), 2 * (i // 2)) for i in range(2 * n)]
    persist(persist_log, consumer, records)
    others = srids_of(0, n, seed=7) + srids_of(1, n, seed=8)
    for j, other in enumerate(others):
        lp, offset = other % 2, 2 * (j % n) + 1
        if j % 3:
            persist_log.records[lp][offset] = persist_msg(record(other, 10**6 + j), offset)
    run_steps(acker)
    persist_log.clock.advance(TIMEOUT_MS + 2 * n + 100)  # all timed out
    run_steps(acker)
    assert acker.counters()["replayed"] == 2 * n
    assert replayed(producer) == [r.value for r, _ in records]  # persist order
    assert len(persist_log.assigns) <= 2  # one per partition, not one per srid
    assert persist_log.delivered <= 4 * n  # read sequentially, once


def test_fetches_per_commit_are_bounded_and_the_rest_wait_durably_in_persist_order(persist_log: PersistLog) -> None:
    acker, consumer, producer = make_acker(persist_log, max_fetches_per_commit=100)
    n = 500
    srids = {lp: srids_of(lp, n, seed=lp) for lp in (0, 1)}
    records = [(record(srids[i % 2][i // 2], i), i // 2) for i in range(2 * n)]
    persist(persist_log, consumer, records)
    run_steps(acker)
    persist_log.clock.advance(TIMEOUT_MS + 2 * n + 100)  # all timed out
    per_commit = []
    for _ in range(20):
        before = persist_log.delivered
        run_steps(acker)
        per_commit.append(persist_log.delivered - before)
        if acker.counters()["pending"] == 0:
            break
        # what waits is in the changelog: a restart decides it (beside it: the watches of the
        # timeouts replayed already)
        latest = {p.key: p.value for p in producer.committed if p.topic == NS.ledger}
        waiting = [s for s in itertools.chain(*srids.values())
                   if (v := latest.get(ids.encode_id(s))) is not None and not LedgerEntry.decode(v).flags & WATCH]
        assert len(waiting) == acker.counters()["pending"]
    assert acker.counters()["pending"] == 0
    assert max(per_commit) <= 2 * 100  # each run_steps commits twice
    assert replayed(producer) == [r.value for r, _ in records]  # persist order, over commits
    c = acker.counters()
    assert (c["timed_out"], c["replayed"], c["payload_fetches"]) == (2 * n, 2 * n, 2 * n)
    # what waits is written once when it is deferred, not again at every commit it waits
    upserts = [p for p in producer.committed if p.topic == NS.ledger and p.value is not None and p.key != COUNTERS_KEY]
    # registration, deferral, the watch of the replayed timeout, held back for order
    assert len(upserts) <= 2 * n + 2 * n + 2 * n + 2 * 100


def test_a_partition_that_cannot_be_read_holds_up_no_other_partition(persist_log: PersistLog) -> None:
    """Under the per-commit bound too: partition 0 answers nothing, partition 1 drains."""
    acker, consumer, producer = make_acker(persist_log, max_fetches_per_commit=100, payload_tries=3,
                                           payload_retry_ms=10_000)
    n = 300
    srids = {lp: srids_of(lp, n, seed=lp) for lp in (0, 1)}
    records = [(record(srids[i % 2][i // 2], i), i // 2) for i in range(2 * n)]
    persist(persist_log, consumer, records)
    run_steps(acker)
    persist_log.down.add(0)
    persist_log.clock.advance(TIMEOUT_MS + 2 * n + 100)
    for _ in range(8):
        run_steps(acker)
        persist_log.clock.advance(100)
    done = outcomes(producer)
    assert {s for s in srids[1] if done.get(s) == b"replay"} == set(srids[1])
    assert not any(s in done for s in srids[0])
    assert acker.counters()["pending"] == n  # partition 0's, waiting in the table
    persist_log.down.clear()
    persist_log.clock.advance(10_000)
    for _ in range(8):
        run_steps(acker)
    assert outcomes(producer) == dict.fromkeys(srids[0] + srids[1], b"replay")
    c = acker.counters()
    assert (c["timed_out"], c["replayed"], c["payload_lost"], c["pending"]) == (2 * n, 2 * n, 0, 0)


# --------------------------------------------------------------------------- the reader alone


def fetcher_over(log: PersistLog, **kwargs: Any) -> PersistFetcher:
    return PersistFetcher(NS, LogConsumer({"enable.partition.eof": True}, log), **kwargs)  # type: ignore[arg-type]


def test_the_reader_starts_a_new_pass_only_across_a_long_gap(persist_log: PersistLog) -> None:
    (a, b, c) = srids_of(0, 3)
    for srid, offset in ((a, 10), (b, 20), (c, 5_000)):
        persist_log.records[0][offset] = persist_msg(record(srid, offset), offset)
    got = fetcher_over(persist_log, max_gap=100).fetch_many(0, {10: a, 20: b, 5_000: c}, time.monotonic() + 5)
    assert [PersistedRecord.decode(v).srid for v in got.values() if isinstance(v, bytes)] == [a, b, c]
    assert persist_log.assigns == [(0, 10), (0, 5_000)]


def test_the_reader_tells_gone_from_not_yet(persist_log: PersistLog) -> None:
    (a, b, c, d, e) = srids_of(0, 5)
    for srid, offset in ((a, 3), (c, 7)):
        persist_log.records[0][offset] = persist_msg(record(srid, offset), offset)
    persist_log.low[0] = 2
    fetcher = fetcher_over(persist_log)
    got = fetcher.fetch_many(0, {1: e, 3: a, 5: b, 7: d, 9: c}, time.monotonic() + 5)
    assert isinstance(got[3], bytes)
    gone = {o: v.gone for o, v in got.items() if isinstance(v, Unreadable)}
    # 1: below the log start; 5: read past (compacted); 7: another srid; 9: past the end
    assert gone == {1: True, 5: True, 7: True, 9: False}
    persist_log.down.add(0)
    got = fetcher.fetch_many(0, {3: a}, time.monotonic() + 5)
    assert isinstance(got[3], Unreadable) and not got[3].gone
    persist_log.down.clear()
    got = fetcher.fetch_many(0, {3: a}, time.monotonic() - 1)  # no time left
    assert isinstance(got[3], Unreadable) and not got[3].gone and "in time" in got[3].reason
