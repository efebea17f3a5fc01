"""The example order job on bad values: each bad order fails alone (replay, then DLQ), and
no fact carries a value the job could not read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from broker.dev.testing import unique_name
from broker.kafka_io import read_to_end
from broker.schemas import XorBatch
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.topics import Namespace, create
from spark_jobs import Acking, OriginParquetSink, read_with_replay
from spark_jobs.orders import Order, customer_frame, customers, order_job

pytestmark = pytest.mark.e2e

BAD = {
    "amount not a number": {"order_id": 1, "customer": "c001", "amount": "abc", "items": 1},
    "amount a string number": {"order_id": 2, "customer": "c001", "amount": "12.5", "items": 1},
    "amount out of range": '{"order_id": 3, "customer": "c001", "amount": 1e999, "items": 1}',
    "items not an int": {"order_id": 4, "customer": "c001", "amount": 3.5, "items": 99999999999},
    "not json": "{order",
    "unknown customer": {"order_id": 6, "customer": "nobody", "amount": 3.5, "items": 1},
}


def test_bad_orders_fail_alone(spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    settings, ns = KafkaSettings(bootstrap), Namespace(unique_name("badorders"))
    topic, P = f"{ns.name}-orders", 2
    create(settings, ns, P, {topic: 2})
    good = [Order(100 + i, f"c{i:03d}", 10.0 + i, 1 + i % 3) for i in range(20)]
    with Source(settings, ns, SourceConfig(timeout_ms=120_000)) as source:
        good_srids = {source.send(topic, o.key(), o.value()).srid for o in good}
        bad_srids = {
            source.send(topic, "c001", v if isinstance(v, str) else json.dumps(v)).srid: why
            for why, v in BAD.items()
        }

    sink = OriginParquetSink(str(tmp_path / "facts"))
    job = order_job(sink, customer_frame(spark, customers()))
    with Acking(bootstrap, ns, job) as acking:
        acking.process(read_with_replay(spark, bootstrap, topic, stream=False), 0)

    acked: set[int] = set()
    failed: set[int] = set()
    for msg in read_to_end(settings, ns.acks, P):
        xb = XorBatch.decode(msg.value())
        acked.update(xb.srids.tolist())
        failed.update(xb.failed.tolist())
    assert {bad_srids[s] for s in failed} == set(BAD)  # every bad order failed, and only those
    assert acked == good_srids
    facts = sink.read(spark).collect()
    assert sorted(r["order_id"] for r in facts) == sorted(o.order_id for o in good)
    assert all(r["amount"] is not None and r["items"] is not None for r in facts)
