"""``replaybroker status`` reports what Kafka holds: pending from live persist records, decisions
from the acker's exactly-once counters in the changelog, the DLQ by reading it."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from broker.dev.demo import run_demo

pytestmark = pytest.mark.integration


def test_status_after_a_demo_run_matches_the_demo(bootstrap: str) -> None:
    summary = run_demo(bootstrap, 1500, fail_rate=0.1, timeout_s=10.0, partitions=3)
    assert summary["lost"] == 0 and summary["completed"] == 1500
    out = subprocess.run(
        [sys.executable, "-m", "broker.cli", "status", "--bootstrap", bootstrap,
         "--namespace", summary["namespace"], "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    status = orjson.loads(out.stdout)
    assert status["ledger_partitions"] == 3
    assert status["pending"] == 0 and status["pending_per_partition"] == [0, 0, 0]
    assert status["oldest_pending_age_s"] is None
    assert status["completed"] == 1500
    assert status["replayed"] == summary["replayed"] > 0
    assert status["counters"]["failed"] == summary["replayed"]
    assert status["counters"]["registered"] == 1500 + summary["replayed"]
    assert status["dlq"] == 0
    assert set(status["sources"]) >= {"pending", "completed", "replayed", "dlq"}
    human = subprocess.run(
        [sys.executable, "-m", "broker.cli", "status", "--bootstrap", bootstrap,
         "--namespace", summary["namespace"]],
        capture_output=True, text=True, timeout=120, check=True,
    )
    assert "acker counters in" in human.stdout and "completed: 1500" in human.stdout


def test_latest_counters_read_is_bounded_by_window_not_partition_length(bootstrap: str) -> None:
    """The last keyed message of each partition is found by reading back from the end in
    growing windows: with 5000 messages after an old key, far fewer than 5000 are read."""
    import uuid

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from broker.settings import KafkaSettings
    from broker.status import FIRST_WINDOW, latest_with_key

    topic = f"status-window-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"old", key=b"__counters__", partition=0)
    for i in range(5000):
        producer.produce(topic, b"x", key=str(i).encode(), partition=0)
    producer.produce(topic, b"new", key=b"__counters__", partition=0)
    for i in range(10):
        producer.produce(topic, b"y", key=str(i).encode(), partition=0)
    producer.produce(topic, b"only", key=b"__counters__", partition=1)
    producer.flush(30)
    found, read = latest_with_key(KafkaSettings(bootstrap_servers=bootstrap), topic, 2, b"__counters__")
    assert found == {0: b"new", 1: b"only"}
    assert read <= 2 * FIRST_WINDOW
    admin.delete_topics([topic])
