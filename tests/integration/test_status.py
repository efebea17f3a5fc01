"""``replaybroker status`` reports what Kafka holds: pending from live persist records, decisions
from the acker's exactly-once counters in the changelog, the DLQ by reading it."""

from __future__ import annotations

import logging
import subprocess
import sys

import orjson
import pytest

from broker.dev.demo import run_demo
from broker.dev.faults import skip_ack

pytestmark = pytest.mark.integration


def test_status_after_a_demo_run_matches_the_demo(bootstrap: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="broker.task"):
        summary = run_demo(bootstrap, 1500, fail_rate=0.1, timeout_ms=10_000, partitions=3)
    assert summary["lost"] == 0 and summary["completed"] == 1500
    # The demo's tasks read each data topic with its replay topic, as the README asks.
    assert not [r.getMessage() for r in caplog.records if "without" in r.getMessage()]
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
    # Idempotent: a retried first batch (the topic's leader just elected) keeps its place.
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
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


def test_latest_key_far_back_is_found_in_later_windows_of_every_partition(bootstrap: str) -> None:
    """A key further back than the first window is found by the doubled windows that follow -
    in a partition that reached its window's end (and was paused) in an earlier round too."""
    import uuid

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from broker.settings import KafkaSettings
    from broker.status import FIRST_WINDOW, latest_with_key

    topic = f"status-far-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    behind = {0: 5 * FIRST_WINDOW, 1: 0, 2: FIRST_WINDOW + 3}  # messages after the key
    for p, after in behind.items():
        producer.produce(topic, f"v{p}".encode(), key=b"__counters__", partition=p)
        for i in range(after):
            producer.produce(topic, b"x", key=str(i).encode(), partition=p)
    producer.flush(30)
    found, read = latest_with_key(KafkaSettings(bootstrap_servers=bootstrap), topic, 3, b"__counters__", timeout_s=60)
    assert found == {0: b"v0", 1: b"v1", 2: b"v2"}
    # windows of 32, 64, 128, 256 from the end: each partition reads back no further than it must
    assert read <= (5 * FIRST_WINDOW + 1) + 1 + (FIRST_WINDOW + 4)
    admin.delete_topics([topic])


def test_status_reads_one_counters_record_per_partition_and_its_pending_matches_persist(bootstrap: str) -> None:
    """Thousands of records, a third of them never acked: status finds the pending ones from
    one counters record per ledger partition - a bounded number of messages, not the length
    of ns.persist or ns.ledger - and its figures are those of the live persist records."""
    import time
    import uuid

    from broker import topics
    from broker.acker import Acker, AckerConfig
    from broker.kafka_io import read_to_end
    from broker.schemas import PersistedRecord
    from broker.settings import KafkaSettings
    from broker.source import Source, SourceConfig
    from broker.status import FIRST_WINDOW, status
    from broker.task import Task, TaskConfig, TaskContext, TaskRecord
    from tests.integration.ground_truth import Services

    P, records = 3, 6_000
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(f"status-big-{uuid.uuid4().hex[:8]}")
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, P, {topic: 2})

    def third_unacked(record: TaskRecord, ctx: TaskContext) -> None:
        assert record.tracking is not None
        if record.tracking.origin % 3 == 0:
            skip_ack(ctx)

    acker = Acker(settings, ns, AckerConfig(instance_id=f"a-{uuid.uuid4().hex[:6]}", stats_interval_ms=3_600_000))
    task = Task(settings, ns, [topic], f"task-{uuid.uuid4().hex[:6]}", third_unacked, TaskConfig(poll_timeout_ms=50))
    services = Services(settings, ns, acker, task)
    source = Source(settings, ns, SourceConfig(timeout_ms=600_000))
    try:
        origins = [source.send(topic, f"k{i}", "v").origin for i in range(records)]
        source.flush()
        acked = {o for o in origins if o % 3}
        log = services.tail.log
        services.wait(lambda: acked <= set(log.completed_origins()), "every acked record completed", limit_s=120)
        services.wait(lambda: acker.counters()["registered"] == records, "every persist record registered")
    finally:
        services.stop()  # a clean stop commits what was folded
        source.close()

    before = time.time()
    result = status(settings, ns.name)
    after = time.time()
    # Ground truth: the live (not tombstoned) records of ns.persist, and their created_ms.
    live: dict[bytes, tuple[int, int]] = {}
    persist = read_to_end(settings, ns.persist, P)
    for m in persist:
        if m.value() is None:
            live.pop(m.key() or b"", None)
        else:
            live[m.key() or b""] = (m.partition(), PersistedRecord.decode(m.value()).created_ms)
    per_partition = [sum(1 for p, _ in live.values() if p == lp) for lp in range(P)]
    assert result["pending"] == len(live) == records - len(acked)
    assert result["pending_per_partition"] == per_partition and result["pending_unknown_partitions"] == []
    assert result["completed"] == len(acked) and result["dlq"] == 0
    oldest_s = min(created for _, created in live.values()) / 1000
    # Registered at or before its created_ms (the batch's first record's time), by a poll at most.
    assert result["oldest_pending_age_s"] is not None
    assert before - oldest_s - 0.5 <= result["oldest_pending_age_s"] <= after - oldest_s + 2
    # What it read: one window per partition at most (the acker's last commit ends with the
    # counters record), against ~10^4 messages in ns.persist and ns.ledger.
    ledger = read_to_end(settings, ns.ledger, P)
    assert result["messages_read"] <= P * FIRST_WINDOW
    assert len(persist) + len(ledger) > 10 * result["messages_read"]
