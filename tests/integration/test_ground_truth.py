"""The ground truth of the ledger tests (tests/integration/ground_truth.py) holds only events
whose delivery to ``ns.acks`` was confirmed: an event the broker refused is no event."""

from __future__ import annotations

import threading
import time

import pytest

from broker import topics
from broker.dev.testing import unique_name
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import TaskConfig, TaskContext, TaskRecord
from tests.integration.ground_truth import GroundTruth, TruthTask

pytestmark = pytest.mark.integration

RECORDS = 20


def run_leaf(settings: KafkaSettings, acks_config: dict[str, str]) -> tuple[GroundTruth, TruthTask, set[int]]:
    """RECORDS source records through a leaf task that stages each input's event."""
    ns = topics.Namespace(unique_name("truth"))
    orders = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {orders: 2}, overrides={ns.acks: acks_config})
    truth = GroundTruth()

    def leaf(record: TaskRecord, ctx: TaskContext) -> None:
        assert record.tracking is not None
        truth.stage(record.tracking.srid, record.tracking.record_id)

    task = TruthTask(truth, settings, ns, [orders], unique_name("leaf"), leaf, TaskConfig(poll_timeout_ms=50))
    thread = threading.Thread(target=task.run, daemon=True)
    thread.start()
    try:
        with Source(settings, ns, SourceConfig(timeout_ms=600_000)) as source:
            srids = {source.send(orders, f"k{i}", b"v").srid for i in range(RECORDS)}
        deadline = time.monotonic() + 60
        while task.counters.processed < RECORDS:
            assert time.monotonic() < deadline, f"the task processed {task.counters}"
            time.sleep(0.1)
    finally:
        task.stop()
        thread.join(60)  # the batch in progress finishes: delivered, or failed
    return truth, task, srids


def test_events_that_were_not_delivered_are_not_in_the_ground_truth(bootstrap: str) -> None:
    settings = KafkaSettings.from_env(bootstrap)
    # Every event batch is larger than this: ns.acks refuses them all.
    truth, task, _ = run_leaf(settings, {"max.message.bytes": "64"})
    assert task.counters.undeliverable == RECORDS
    assert not truth.events, f"{len(truth.events)} srids have events in the ground truth that never reached ns.acks"


def test_delivered_events_are_in_the_ground_truth(bootstrap: str) -> None:
    truth, task, srids = run_leaf(KafkaSettings.from_env(bootstrap), {})
    assert task.counters.undeliverable == 0
    assert truth.events.keys() == srids and all(len(v) == 1 for v in truth.events.values())
