"""Back-off between attempts (issue 43 item 1; ``SourceConfig(retry=RetryPolicy(...))``): a
record failed twice is tried again only once each back-off has passed - measured by when the
task saw each attempt - every key's attempts keep their order, and each record completes once.
Real Kafka, the public API."""

from __future__ import annotations

import gc
import time
from collections import defaultdict

import pytest

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.dev.testing import unique_name
from broker.retry import RetryPolicy
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from tests.integration.ground_truth import Services

pytestmark = pytest.mark.integration

POLICY = RetryPolicy(initial_ms=1_000, multiplier=2.0, max_ms=10_000, jitter=0.0)


def test_attempts_wait_their_back_off_and_keep_their_order(bootstrap: str) -> None:
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("backoff"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {topic: 2})
    seen: dict[int, list[tuple[int, float]]] = defaultdict(list)  # origin -> (attempt, when the task saw it)

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        assert record.tracking is not None
        seen[record.tracking.origin].append((record.tracking.attempt, time.monotonic()))
        if record.tracking.attempt < 3:
            ctx.fail("the service said try later")

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))
    task = Task(settings, ns, [topic, topics.replay_topic(topic)], unique_name("task"), handler,
                TaskConfig(poll_timeout_ms=50))
    services = Services(settings, ns, acker, task)
    source = Source(settings, ns, SourceConfig(timeout_ms=60_000, max_attempts=5, retry=POLICY))
    try:
        sent = [source.send(topic, f"k{i % 3}", f"{i}".encode()).origin for i in range(30)]
        source.flush()
        log = services.tail.log
        services.wait(lambda: set(sent) <= set(log.completed_origins()), "every record after two back-offs",
                      limit_s=90)
        assert all(log.completed_origins()[o] == 1 for o in sent)
        for origin in sent:
            (a1, t1), (a2, t2), (a3, t3) = seen[origin][:3]
            assert (a1, a2, a3) == (1, 2, 3)
            # 1 s after the first failure, 2 s after the second (what the task saw: a little later)
            assert t2 - t1 >= 0.95 and t3 - t2 >= 1.95, (t2 - t1, t3 - t2)
        # each key's third attempts came in the order its records were sent
        for k in range(3):
            keyed = [o for i, o in enumerate(sent) if i % 3 == k]
            thirds = [seen[o][2][1] for o in keyed]
            assert thirds == sorted(thirds)
        assert acker.totals.get("replays_backed_off", 0) >= 2 * len(sent) - 2
    finally:
        services.stop()
        source.close()
        del acker, task, source
        gc.collect()
    assert not services.errors


def test_a_retry_after_overrides_the_back_off_of_its_failure(bootstrap: str) -> None:
    """``ctx.fail(retry_after_ms=...)``: the replay of that failure comes no sooner than asked,
    longer than the policy's 1 s or without a policy at all; the next failure has the policy."""
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("retryafter"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {topic: 2})
    seen: dict[int, list[tuple[int, float]]] = defaultdict(list)  # origin -> (attempt, when the task saw it)

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        assert record.tracking is not None
        seen[record.tracking.origin].append((record.tracking.attempt, time.monotonic()))
        if record.tracking.attempt == 1:
            ctx.fail("429 Too Many Requests", retry_after_ms=3_000)

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))
    task = Task(settings, ns, [topic, topics.replay_topic(topic)], unique_name("task"), handler,
                TaskConfig(poll_timeout_ms=50))
    services = Services(settings, ns, acker, task)
    with_policy = Source(settings, ns, SourceConfig(timeout_ms=60_000, max_attempts=5, retry=POLICY))
    without = Source(settings, ns, SourceConfig(timeout_ms=60_000, max_attempts=5))
    try:
        sent = [source.send(topic, f"k{i % 4}", f"{i}".encode()).origin
                for i, source in enumerate([with_policy, without] * 5)]
        with_policy.flush()
        without.flush()
        log = services.tail.log
        services.wait(lambda: set(sent) <= set(log.completed_origins()), "every record after its retry-after",
                      limit_s=60)
        assert all(log.completed_origins()[o] == 1 for o in sent)
        for origin in sent:
            (a1, t1), (a2, t2) = seen[origin][:2]
            assert (a1, a2) == (1, 2)
            assert t2 - t1 >= 2.95, t2 - t1
        assert acker.totals.get("retry_afters", 0) >= len(sent)
    finally:
        services.stop()
        with_policy.close()
        without.close()
        del acker, task, with_policy, without
        gc.collect()
    assert not services.errors
