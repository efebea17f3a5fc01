"""An acker that comes back to a backlog longer than the timeout (an outage, a slow restore,
ack lag): the completing acks are still unread in ns.acks when the deadlines are long past.
Expiry must wait for the backlog to be read (broker.acker.lag), or every such record is
timed out and replayed although its tree completed."""

from __future__ import annotations

import time

import numpy as np
import pytest
from confluent_kafka import Producer

from broker import kafka_io, topics
from broker.acker import Acker, AckerConfig
from broker.dev.testing import unique_name
from broker.schemas import XorBatch
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from tests.integration.ground_truth import outcomes_under

pytestmark = pytest.mark.integration

P = 2
RECORDS = 200
TIMEOUT_MS = 2_000
# Empty XorBatches ahead of the completing acks: more than one consume batch (20 000) and
# several fetches per partition, so the acker registers the persist records commits before
# it reaches the acks.
FILLER_PER_PARTITION = 60_000


def test_acks_waiting_in_a_backlog_past_the_timeout_complete_and_nothing_is_replayed(bootstrap: str) -> None:
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("backlog"))
    data = f"{ns.name}.orders"
    topics.create(settings, ns, P, {data: 2})

    # While no acker runs: the records are persisted and their trees complete (the task's
    # acks are in ns.acks, behind a backlog of other events).
    source = Source(settings, ns, SourceConfig(timeout_ms=TIMEOUT_MS))
    sent = [source.send(data, b"k%d" % i, b"v%d" % i) for i in range(RECORDS)]
    source.flush()
    source.close()
    producer = Producer(settings.producer_config(defaults={"linger.ms": 20}))
    none = np.empty(0, np.int64)
    for lp in range(P):
        empty = XorBatch(lp, none, none, none, "filler").encode()
        for _ in range(FILLER_PER_PARTITION):
            kafka_io.produce(producer, ns.acks, value=empty, partition=lp)
    for lp in range(P):
        mine = [r for r in sent if r.srid % P == lp]
        batch = XorBatch(
            lp, np.array([r.srid for r in mine], np.int64), np.array([r.record_id for r in mine], np.int64),
            none, "task",
        )
        kafka_io.produce(producer, ns.acks, value=batch.encode(), partition=lp)  # the queue may be full
    assert producer.flush(60) == 0

    # The outage outlasts the timeout.
    time.sleep(TIMEOUT_MS / 1000 + 0.5)

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))
    outcomes = outcomes_under(settings, ns, acker, {r.origin for r in sent})
    replayed = sorted(o for o, seen in outcomes.items() if seen != ["completed"])
    print(f"backlog: {len(replayed)} of {RECORDS} completed records were replayed; counters {acker.counters()}")
    assert not replayed, f"{len(replayed)} completed records were timed out and replayed"
    assert acker.counters()["timed_out"] == 0
    assert acker.counters()["completed"] == RECORDS
