"""``ctx.touch()`` on a real Kafka: a handler whose work takes 3x its record's timeout gets
the record replayed; touching periodically during that work keeps the record pending until
its ack, so it completes exactly once with no replay. The truth is read from the topics: the
replay topic and the persist tombstones."""

from __future__ import annotations

import threading
import time

import pytest

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.dev.testing import unique_name
from broker.headers import outcome_of
from broker.ids import encode_id
from broker.kafka_io import read_to_end
from broker.schemas import LedgerEntry
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from tests.integration.ground_truth import Services

pytestmark = pytest.mark.integration

TIMEOUT_MS = 2_000
WORK_S = 3 * TIMEOUT_MS / 1000
RESTART_TIMEOUT_MS = 6_000  # test_a_restarted_acker_keeps_the_deadline_a_touch_pushed


@pytest.mark.parametrize("touch", [False, True], ids=["no-touch", "touch"])
def test_long_work_is_replayed_unless_the_task_touches_its_record(bootstrap: str, touch: bool) -> None:
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("touch"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {topic: 1})
    handled: list[int] = []  # attempts that started

    def slow(record: TaskRecord, ctx: TaskContext) -> None:
        assert record.tracking is not None
        handled.append(record.tracking.attempt)
        if record.tracking.attempt > 1:
            return  # a replay is acked at once: what counts is that it happened
        end = time.monotonic() + WORK_S
        while time.monotonic() < end:
            if touch:
                ctx.touch(TIMEOUT_MS)
            time.sleep(0.4)

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))
    task = Task(settings, ns, [topic, topics.replay_topic(topic)], unique_name("task"), slow,
                TaskConfig(poll_timeout_ms=50))
    services = Services(settings, ns, acker, task)
    source = Source(settings, ns, SourceConfig(timeout_ms=TIMEOUT_MS, max_attempts=3))
    try:
        origin = source.send(topic, "k", "slow work").origin
        source.flush()
        log = services.tail.log

        def detail() -> str:  # what a failure needs to be understood
            c = acker.counters()
            acked = {k: c[k] for k in ("timed_out", "replayed", "dlq", "dlq_held", "superseded",
                                       "superseded_marks", "superseded_settled", "watch_skipped", "unwatched")}
            return f": handled {handled}, acker {acked}, task skipped {task.counters.skipped}"

        services.wait(lambda: origin in log.completed_origins(), "the record completed", limit_s=90, detail=detail)
    finally:
        services.stop()
        source.close()
    outcomes = sorted(outcome_of(m.headers()).decode()
                      for m in read_to_end(settings, ns.persist, 2) if m.value() is None)
    replayed = read_to_end(settings, topics.replay_topic(topic), 1)
    if touch:
        assert outcomes == ["completed"]
        assert replayed == [] and handled == [1]
        assert task.counters.touches >= WORK_S / 0.4 - 2
    else:
        assert "replay" in outcomes and outcomes.count("completed") == 1
        # The first attempt completes late (after two timeouts): its replays are superseded -
        # each one the task reads is worked on or skipped - and none is dead-lettered.
        assert replayed and handled[0] == 1
        assert len(handled) - 1 + task.counters.skipped >= 1, (handled, task.counters)
        assert read_to_end(settings, ns.dlq, 1) == []


def test_a_restarted_acker_keeps_the_deadline_a_touch_pushed(bootstrap: str) -> None:
    """The touched deadline is in the changelog: an acker that takes over after the record's
    first deadline has passed restores the pushed one and does not replay the record.

    The record's own timeout is longer here than ``TIMEOUT_MS``: the touch must reach the first
    acker before it, and under a loaded CI run 2 s was once not enough (the first acker
    replayed the record before the touch was folded: outcomes ``replay, completed``)."""
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("touch-restart"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {topic: 1})
    touched, go = threading.Event(), threading.Event()
    handled: list[int] = []

    def held(record: TaskRecord, ctx: TaskContext) -> None:
        assert record.tracking is not None
        handled.append(record.tracking.attempt)
        if record.tracking.attempt == 1:
            ctx.touch(60_000)
            touched.set()
            go.wait(60)

    def acker() -> Acker:
        return Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))

    first = acker()
    task = Task(settings, ns, [topic, topics.replay_topic(topic)], unique_name("task"), held,
                TaskConfig(poll_timeout_ms=50))
    services = Services(settings, ns, first, task)
    source = Source(settings, ns, SourceConfig(timeout_ms=RESTART_TIMEOUT_MS, max_attempts=3))
    second: Services | None = None
    try:
        sent = source.send(topic, "k", "held work")
        source.flush()
        created_ms = int(time.time() * 1000)
        assert touched.wait(60)

        def pushed() -> bool:  # the changelog entry of the srid carries the pushed deadline
            latest = {m.key(): m.value() for m in read_to_end(settings, ns.ledger, 2)}
            value = latest.get(encode_id(sent.srid))
            return value is not None and LedgerEntry.decode(value).deadline_ms > created_ms + 30_000

        services.wait(pushed, "the pushed deadline in the changelog")
        early = first.counters()["replayed"]
        assert early == 0, f"the first acker replayed the record before its touch was folded ({early})"
        first.stop()
        services.threads[0].join(60)
        time.sleep(max(0.0, (created_ms + 2 * RESTART_TIMEOUT_MS) / 1000 - time.time()))  # first deadline long past
        second = Services(settings, ns, acker())
        time.sleep(3)  # the new acker restores the partitions and runs its expiry
        go.set()
        log = services.tail.log
        services.wait(lambda: sent.origin in log.completed_origins(), "the record completed", limit_s=90)
    finally:
        go.set()
        services.stop()
        if second is not None:
            second.stop()
        source.close()
    outcomes = [outcome_of(m.headers()).decode()
                for m in read_to_end(settings, ns.persist, 2) if m.value() is None]
    assert outcomes == ["completed"]
    assert read_to_end(settings, topics.replay_topic(topic), 1) == [] and handled == [1]
