"""Replays at a governed rate (issue 43 item 4, the acker's part): a hundred records failed at
once are replayed at most ``replay_rate_per_s`` a second - their replays spread over the time
that takes, each key's in the order sent - and every one completes once. Real Kafka, the public
API; ground truth is the replay topic as written and the completions."""

from __future__ import annotations

import gc
from collections import defaultdict

import pytest

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.dev.testing import unique_name
from broker.headers import Tracking
from broker.kafka_io import read_to_end
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from tests.integration.ground_truth import Services

pytestmark = pytest.mark.integration


def test_replays_go_out_at_the_rate_in_order(bootstrap: str) -> None:
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("rate"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {topic: 2})

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        if record.tracking is not None and record.tracking.attempt == 1:
            ctx.fail("downstream rejected the batch")

    rate, n = 20.0, 100
    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000,
                                            replay_rate_per_s=rate))
    task = Task(settings, ns, [topic, topics.replay_topic(topic)], unique_name("task"), handler,
                TaskConfig(poll_timeout_ms=50))
    services = Services(settings, ns, acker, task)
    source = Source(settings, ns, SourceConfig(timeout_ms=120_000, max_attempts=3, retry=None))  # the rate alone
    try:
        sent = [source.send(topic, f"k{i % 5}", f"{i}".encode()).origin for i in range(n)]
        source.flush()
        log = services.tail.log
        services.wait(lambda: set(sent) <= set(log.completed_origins()), "every record, replayed once", limit_s=90)
        assert all(log.completed_origins()[o] == 1 for o in sent)
        replays = read_to_end(settings, topics.replay_topic(topic), 2)
        assert len(replays) == n
        stamps = sorted(m.timestamp()[1] for m in replays)
        # n replays at `rate` a second, a second's worth at once: they take (n - rate) / rate s at least.
        assert stamps[-1] - stamps[0] >= 1000 * (n - rate) / rate - 250, stamps[-1] - stamps[0]
        order: dict[bytes, list[int]] = defaultdict(list)
        for m in sorted(replays, key=lambda m: (m.partition(), m.offset())):
            tracking = Tracking.from_headers(m.headers())
            assert tracking is not None
            order[m.key() or b""].append(sent.index(tracking.origin))
        assert all(seq == sorted(seq) for seq in order.values()), order  # each key's in the order sent
        assert acker.totals.get("replays_waited", 0) >= n - rate - 1
    finally:
        services.stop()
        source.close()
        del acker, task, source
        gc.collect()
    assert not services.errors
