"""An acker that reads ``ns.persist`` behind its acks pauses ``ns.acks`` (broker.acker.reading)
- and nothing else changes: every record completes, none times out (the lag gate takes no
samples of a paused input), against a real broker.

The acker starts on a backlog of large persist records (many fetches per partition) and of a
task's acks for them, in small batches newer than every persist record. Its first fetches
bring all the acks and a little of persist: each event folded before its persist record would
be an unregistered entry the changelog must hold (an upsert now, a tombstone later). The
ground truth is what the broker holds: a completion tombstone in ``ns.persist`` for every
record, no replay, and the changelog's records."""

from __future__ import annotations

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from broker import kafka_io, topics
from broker.acker import Acker, AckerConfig
from broker.dev.testing import unique_name
from broker.schemas import LedgerEntry, XorBatch
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from tests.integration.ground_truth import outcomes_under

pytestmark = pytest.mark.integration

P = 2
RECORDS = 6_000
PAYLOAD = b"x" * 4_000  # 24 MB of persist records: many fetches of 1 MiB per partition
TIMEOUT_MS = 3_000
ACKS_PER_BATCH = 100
# Persist is written and fetched in small pieces, so the acker's first fetches bring all the acks
# (about 100 KB a partition) and no more than a few hundred persist records of 3 000, however
# late its acks partitions start fetching: with the defaults (1 MB producer batches, 1 MiB
# fetches, 64 MB prefetched) the persist backlog was all in once, behind a loaded CI machine.
PIECE = 32 * 1024


def _orphans_logged(settings: KafkaSettings, ns: topics.Namespace) -> int:
    """Changelog upserts of entries with an event and no persist record yet."""
    consumer = Consumer(settings.consumer_config(None, defaults={"group.id": unique_name("ledger"), "enable.partition.eof": True}))
    consumer.assign([TopicPartition(ns.ledger, lp, OFFSET_BEGINNING) for lp in range(P)])
    orphans, ends = 0, set()
    while len(ends) < P:
        for msg in consumer.consume(10_000, 1.0):
            if msg.error() is not None:
                ends.add(msg.partition())
            elif msg.value() is not None and len(msg.key() or b"") == 8 and LedgerEntry.decode(msg.value()).flags == 0:
                orphans += 1
    consumer.close()
    return orphans


def test_acks_read_ahead_of_persist_are_paused_and_every_record_completes(bootstrap: str) -> None:
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("order"))
    data = f"{ns.name}.orders"
    topics.create(settings, ns, P, {data: 2})
    source = Source(settings, ns, SourceConfig(timeout_ms=TIMEOUT_MS, producer={"batch.size": PIECE}))
    sent = [source.send(data, b"k%d" % i, PAYLOAD) for i in range(RECORDS)]
    source.flush()
    source.close()

    # The records' acks, a small batch per partition at a time, before the acker starts: its
    # first fetches bring all of them, and little of persist.
    producer = Producer(settings.producer_config(defaults={"linger.ms": 2}))
    none = np.empty(0, np.int64)
    by_lp = [[r for r in sent if r.srid % P == lp] for lp in range(P)]
    for start in range(0, max(map(len, by_lp)), ACKS_PER_BATCH):
        for lp, mine in enumerate(by_lp):
            chunk = mine[start : start + ACKS_PER_BATCH]
            if chunk:
                batch = XorBatch(lp, np.array([r.srid for r in chunk], np.int64),
                                 np.array([r.record_id for r in chunk], np.int64), none, "task")
                kafka_io.produce(producer, ns.acks, value=batch.encode(), partition=lp)
        producer.poll(0)
    assert producer.flush(30) == 0

    acker = Acker(settings, ns, AckerConfig(
        instance_id=unique_name("acker"), stats_interval_ms=3_600_000,
        consumer={"max.partition.fetch.bytes": PIECE, "queued.max.messages.kbytes": 256},
    ))
    acker.reading.behind = 100  # of the test's 3 000 records a partition (the default is 5 000): up to
    # 100 a partition are folded before their persist records, by the table
    # (a false timeout would have its outcome within the timeout after the last completion)
    outcomes = outcomes_under(settings, ns, acker, {r.origin for r in sent}, limit_s=120, settle_s=TIMEOUT_MS / 1000)
    not_completed = sorted(o for o, seen in outcomes.items() if seen != ["completed"])
    orphans = _orphans_logged(settings, ns)
    print(f"reading order: acks paused {acker.reading.pauses} times; {orphans} of {RECORDS} entries logged "
          f"before their persist record; counters {acker.counters()}")
    assert orphans < RECORDS // 10, f"{orphans} events were folded before their persist records"
    assert acker.reading.pauses > 0, "the acks were never read ahead: the test did not test the pause"
    assert not not_completed, f"{len(not_completed)} records did not complete once: {not_completed[:5]}"
    assert acker.counters()["timed_out"] == 0
    assert acker.counters()["completed"] == RECORDS
