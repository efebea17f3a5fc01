"""A task whose outputs cannot be delivered (a child over the topic's max.message.bytes, a child
to a topic that does not exist, a sink output - ``ctx.output`` - over the limit) must not stall: after a bounded number of retries the inputs
of those outputs are failed explicitly - the acker replays them and, after max_attempts,
dead-letters them - while the other inputs of the same batches complete. Real Kafka, real
acker, two real tasks (the leaf acks the good children)."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable

import pytest

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.dev.testing import create_topics, unique_name
from broker.dlq import read_entries
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from tests.integration.ground_truth import Services

pytestmark = pytest.mark.integration

MAX_ATTEMPTS = 2
WAIT_S = 60.0  # far below the records' timeout: only explicit failures can decide them
TIMEOUT_MS = 300_000


@pytest.mark.parametrize("cause", ["too_large", "missing_topic", "sink_too_large"])
def test_undeliverable_outputs_fail_their_inputs_into_the_dlq_and_the_rest_completes(
    bootstrap: str, cause: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="broker.task")
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("undeliverable"))
    orders, out = f"{ns.name}.orders", f"{ns.name}.out"
    topics.create(settings, ns, 2, {orders: 2})
    create_topics(bootstrap, {out: 2}, {"max.message.bytes": "2000"})
    missing = f"{ns.name}.missing"  # never created

    def fan_out(record: TaskRecord, ctx: TaskContext) -> None:
        if not (record.value or b"").startswith(b"bad"):
            ctx.emit(out, record.key, b"child of " + (record.value or b""))
        elif cause == "too_large":
            ctx.emit(out, record.key, os.urandom(5000))  # incompressible: over the limit
        elif cause == "sink_too_large":
            ctx.output(out, record.key, os.urandom(5000))  # a sink output: acked only once out
        else:
            ctx.emit(missing, record.key, b"child")

    def leaf(record: TaskRecord, ctx: TaskContext) -> None:
        pass  # the ack is the child's own id

    # Fail fast on the missing topic (librdkafka's default waits 30 s for it to appear), and
    # never let this producer create it (a cluster may allow auto-creation).
    producer = {"allow.auto.create.topics": False, "topic.metadata.propagation.max.ms": 1000}
    config = TaskConfig(poll_timeout_ms=50, producer=producer)  # default retries and back-off
    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))
    task = Task(settings, ns, [orders, topics.replay_topic(orders)], unique_name("fan-out"), fan_out, config)
    leaf_task = Task(settings, ns, [out], unique_name("leaf"), leaf, TaskConfig(poll_timeout_ms=50))
    services = Services(settings, ns, acker, task, leaf_task)
    tail = services.tail

    def wait(done: Callable[[], bool], what: str) -> None:
        services.wait(done, what, WAIT_S, lambda: f"; task {task.counters}")

    try:
        with Source(settings, ns, SourceConfig(timeout_ms=TIMEOUT_MS, max_attempts=MAX_ATTEMPTS)) as source:
            sent = [
                (source.send(orders, f"k{i % 5}", b"bad %d" % i if i % 10 == 3 else b"good %d" % i).origin,
                 i % 10 == 3)
                for i in range(60)
            ]
        bad = {origin for origin, is_bad in sent if is_bad}
        good = {origin for origin, is_bad in sent if not is_bad}
        wait(lambda: good <= tail.log.completed_origins().keys(), "the good records to complete")
        wait(lambda: bad <= tail.log.dlq_origins(), "the undeliverable records in the DLQ")

        assert not bad & tail.log.completed_origins().keys()
        entries = [e for e in read_entries(settings, ns) if e.origin in bad]
        assert sorted(e.origin for e in entries) == sorted(bad)
        assert all(e.reason == "failed" and e.attempts == MAX_ATTEMPTS for e in entries)
        # Every attempt of a bad record was failed by the task; the first one through the
        # delivery path (later ones may fail at once in emit: librdkafka then knows the
        # topic is missing, which the task handles as a handler exception).
        counters = task.counters
        assert counters.undeliverable >= 1
        assert counters.undeliverable + counters.errors == len(bad) * MAX_ATTEMPTS
        assert any("not deliverable" in r.getMessage() for r in caplog.records)
    finally:
        services.stop()
        gc.collect()
