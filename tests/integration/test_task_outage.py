"""A dependency that is down for longer than a record's timeout (issue 43 item 3, the task's
part): with ``TaskConfig(outage=...)`` the records arriving meanwhile are not dead-lettered
and the service is not hammered - the task puts the input back, pauses, touches what it holds
and tries one call per back-off. Real Kafka, the public API; ground truth is the completions
and the DLQ on the broker."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.dev.faults import skip_ack
from broker.dev.testing import unique_name
from broker.headers import Tracking
from broker.kafka_io import read_to_end
from broker.retry import RetryPolicy
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.status import status
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from tests.integration.ground_truth import Services
from tests.integration.test_task_rebalance import RecordingTask

pytestmark = pytest.mark.integration


class ServiceDown(ConnectionError):
    pass


def test_records_arriving_during_an_outage_longer_than_their_timeout_all_complete(bootstrap: str) -> None:
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("outage"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {topic: 2})
    down = threading.Event()
    calls_while_down = 0

    def enrich(record: TaskRecord, ctx: TaskContext) -> None:
        nonlocal calls_while_down
        if down.is_set():
            calls_while_down += 1
            raise ServiceDown("connection refused")

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))
    task = Task(
        settings, ns, [topic, topics.replay_topic(topic)], unique_name("task"), enrich,
        TaskConfig(poll_timeout_ms=50, outage=(ServiceDown,), outage_max_ms=60_000,
                   outage_retry=RetryPolicy(200, 2.0, 1_000, 0.1), touch_timeout_ms=4_000),
    )
    services = Services(settings, ns, acker, task)
    source = Source(settings, ns, SourceConfig(timeout_ms=3_000, max_attempts=3))
    try:
        origins = [source.send(topic, f"k{i}", b"order").origin for i in range(20)]
        source.flush()
        log = services.tail.log
        services.wait(lambda: set(origins) <= set(log.completed_origins()), "the records before the outage")
        down.set()  # the service goes down for 8 s: well past the records' 3 s timeout
        began = time.monotonic()
        during = []
        while time.monotonic() - began < 8:
            during.append(source.send(topic, f"k{len(during) % 7}", b"order").origin)
            source.flush()
            time.sleep(0.05)
        down.clear()
        services.wait(lambda: set(during) <= set(log.completed_origins()), "the records sent during the outage",
                      limit_s=90)
        assert not read_to_end(settings, ns.dlq, 1), "records dead-lettered because a dependency was down"
        assert len(during) > 100 and calls_while_down < 40, (len(during), calls_while_down)
        assert task.counters.outages >= 1 and task.counters.failed == 0
        completed = log.completed_origins()
        assert all(completed[o] == 1 for o in [*origins, *during])  # each completed once
    finally:
        services.stop()
        source.close()
        del acker, task, source
        gc.collect()
    assert not services.errors


def test_records_queued_unread_behind_a_task_in_an_outage_do_not_time_out(bootstrap: str) -> None:
    """The task's part keeps alive only what it has read; the records queued behind its paused
    partitions are kept alive by its outage beats: the acker stops their timeout clock while
    the outage lasts (docs/design.md §6, "Outages"). An 8 s outage, a 3 s timeout, records
    queued meanwhile: none is replayed, each completes in its first attempt."""
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("outage"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {topic: 2})
    down = threading.Event()

    def enrich(record: TaskRecord, ctx: TaskContext) -> None:
        if down.is_set():
            raise ServiceDown("connection refused")

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))
    task = Task(
        settings, ns, [topic, topics.replay_topic(topic)], unique_name("task"), enrich,
        # Five inputs per poll: a try reads five records, the others stay queued unread behind them.
        TaskConfig(poll_timeout_ms=50, batch_size=5, outage=(ServiceDown,), outage_max_ms=60_000,
                   outage_retry=RetryPolicy(500, 2.0, 1_000, 0.1), touch_timeout_ms=4_000),
    )
    services = Services(settings, ns, acker, task)
    source = Source(settings, ns, SourceConfig(timeout_ms=3_000, max_attempts=3))
    try:
        warm = [source.send(topic, f"k{i}", b"order").origin for i in range(10)]
        source.flush()
        log = services.tail.log
        services.wait(lambda: set(warm) <= set(log.completed_origins()), "the records before the outage")
        down.set()
        began = time.monotonic()
        queued = []
        seen = {}
        while time.monotonic() - began < 8:
            queued.append(source.send(topic, f"k{len(queued) % 7}", b"order").origin)
            source.flush()
            time.sleep(0.05)
            if not seen and time.monotonic() - began > 3:
                seen = status(settings, ns.name)["outages"]  # which tasks are in an outage, since when
        down.clear()
        assert list(seen) == [task.name] and 2 < seen[task.name]["for_s"] < 8, seen
        services.wait(lambda: set(queued) <= set(log.completed_origins()), "the records queued in the outage",
                      limit_s=90)
        replays = read_to_end(settings, topics.replay_topic(topic), 2)
        replayed = {t.origin for t in (Tracking.from_headers(list(m.headers() or ())) for m in replays) if t}
        assert not replays, (f"{len(replays)} records queued behind the outage were replayed (timed out): "
                             f"{sorted(queued.index(o) for o in replayed if o in queued)} of {len(queued)}")
        assert not read_to_end(settings, ns.dlq, 1)
        assert task.counters.outages >= 1 and task.counters.failed == 0
        completed = log.completed_origins()
        assert all(completed[o] == 1 for o in [*warm, *queued])
        assert sum(st.counters.get("outage_stopped_ms", 0) for st in acker.states.values()) >= 6_000
    finally:
        services.stop()
        source.close()
        del acker, task, source
        gc.collect()
    assert not services.errors


def test_an_outage_holds_the_records_behind_its_task_not_another_pipelines(bootstrap: str) -> None:
    """Two independent pipelines in one namespace (issue 57 item 3): orders -> enrich, payments
    -> settle. Enrich's dependency is down for 10 s: its records are held (none replayed), but
    payments' records that settle drops still time out on time - replayed within their 3 s
    timeout + ``slack_s`` of being sent, by the replay topic's own timestamps - because the
    beats of enrich name the topic they hold (docs/design.md §6, "Outages")."""
    slack_s = 2.0  # a tick, a commit interval and the acker's read of its inputs, on a busy machine
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("outage"))
    orders, payments = f"{ns.name}.orders", f"{ns.name}.payments"
    topics.create(settings, ns, 2, {orders: 2, payments: 2})
    down = threading.Event()

    def enrich(record: TaskRecord, ctx: TaskContext) -> None:
        if down.is_set():
            raise ServiceDown("connection refused")

    def settle(record: TaskRecord, ctx: TaskContext) -> None:
        assert record.tracking is not None
        if record.value == b"drop" and record.tracking.attempt == 1:
            skip_ack(ctx)  # its event is lost: only its timeout and a replay complete it

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))
    config = TaskConfig(poll_timeout_ms=50, batch_size=5, outage=(ServiceDown,), outage_max_ms=60_000,
                        outage_retry=RetryPolicy(500, 2.0, 1_000, 0.1), touch_timeout_ms=4_000)
    enricher = Task(settings, ns, [orders, topics.replay_topic(orders)], unique_name("enrich"), enrich, config)
    settler = Task(settings, ns, [payments, topics.replay_topic(payments)], unique_name("settle"), settle, config)
    services = Services(settings, ns, acker, enricher, settler)
    source = Source(settings, ns, SourceConfig(timeout_ms=3_000, max_attempts=3))
    try:
        warm = [source.send(t, f"k{i}", b"warm").origin for i in range(5) for t in (orders, payments)]
        source.flush()
        log = services.tail.log
        services.wait(lambda: set(warm) <= set(log.completed_origins()), "the records before the outage")
        down.set()
        began = time.monotonic()
        queued: list[int] = []
        dropped: dict[int, float] = {}  # origin -> when it was sent (epoch s)
        while time.monotonic() - began < 10:
            queued.append(source.send(orders, f"k{len(queued) % 7}", b"order").origin)
            if len(queued) % 4 == 0 and time.monotonic() - began < 6:
                sent = time.time()
                dropped[source.send(payments, f"p{len(dropped)}", b"drop").origin] = sent
            source.flush()
            time.sleep(0.05)
        held = read_to_end(settings, topics.replay_topic(orders), 2)  # still in the outage
        down.clear()
        services.wait(lambda: set(queued) | set(dropped) <= set(log.completed_origins()),
                      "the held orders and the dropped payments' replays", limit_s=90)
        replays = read_to_end(settings, topics.replay_topic(payments), 2)
        outages = (enricher.counters.outages, settler.counters.outages)
    finally:
        services.stop()
        source.close()
        del acker, enricher, settler, source
        gc.collect()
    assert not services.errors
    assert not held and not read_to_end(settings, topics.replay_topic(orders), 2), "orders held by the outage replayed"
    replayed_at = {}
    for m in replays:
        tracking = Tracking.from_headers(list(m.headers() or ()))
        assert tracking is not None
        replayed_at.setdefault(tracking.origin, m.timestamp()[1] / 1000)
    assert set(replayed_at) == set(dropped)
    late = sorted(round(replayed_at[o] - sent, 1) for o, sent in dropped.items() if replayed_at[o] - sent > 3.0 + slack_s)
    assert not late, f"{len(late)} of {len(dropped)} payments replayed later than 3 s + {slack_s} s: {late} s"
    assert len(dropped) >= 20 and outages[0] >= 1 and outages[1] == 0
    assert not read_to_end(settings, ns.dlq, 1)


class PausedAtRevoke(RecordingTask):
    """Records whether the task was paused for an outage at each revocation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.paused_at_revoke: list[bool] = []

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.paused_at_revoke.append(self._outage.paused)
        super()._on_revoke(consumer, partitions)


def test_partitions_revoked_during_an_outage_are_read_again_when_they_come_back(bootstrap: str) -> None:
    """librdkafka keeps a partition's pause across its revocation and a later assignment: a
    task that paused everything for an outage, lost half of it to a task that joined, resumed
    what it held when the outage ended and then got the rest back when the other left, would
    never read those partitions again. Each record sent after that completes (no replay by
    timeout hides it: the timeout is ten minutes)."""
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("outage"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {topic: 4})
    down = threading.Event()
    group = unique_name("task")

    def enrich(record: TaskRecord, ctx: TaskContext) -> None:
        if down.is_set():
            raise ServiceDown("connection refused")

    def task(name: str) -> PausedAtRevoke:
        return PausedAtRevoke(
            settings, ns, [topic, topics.replay_topic(topic)], group, enrich,
            TaskConfig(poll_timeout_ms=50, outage=(ServiceDown,), outage_max_ms=60_000,
                       # a try every 3 s: the join and its revocation come while paused
                       outage_retry=RetryPolicy(3_000, 1.0, 3_000, 0.0), touch_timeout_ms=4_000,
                       consumer={"client.id": name}),
        )

    def held(t: RecordingTask) -> set[int]:  # from its rebalance callbacks (its consumer is its thread's)
        return {p for tp, p in t.owned() if tp == topic}

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))
    a = task("a")
    services = Services(settings, ns, acker, a)
    source = Source(settings, ns, SourceConfig(timeout_ms=600_000))

    def send(n: int) -> list[int]:
        out = [source.send(topic, f"k{i}", b"order").origin for i in range(n)]
        source.flush()
        return out

    try:
        log = services.tail.log
        warm = send(40)
        services.wait(lambda: set(warm) <= set(log.completed_origins()), "the records before the outage")
        down.set()
        during = send(40)
        services.wait(lambda: a.counters.outages >= 1, "a's outage")
        b = task("b")
        joined = Services(settings, ns, b)
        try:
            services.wait(lambda: held(a) and held(b) and held(a) | held(b) == {0, 1, 2, 3},
                          "b takes some of a's partitions", limit_s=90)
            assert a.paused_at_revoke == [True], "the case under test: a revocation while paused"
            down.clear()
            services.wait(lambda: set(during) <= set(log.completed_origins()), "the records of the outage",
                          limit_s=90)
        finally:
            joined.stop()
        services.wait(lambda: held(a) == {0, 1, 2, 3}, "a holds every partition again", limit_s=90)
        after = send(40)
        services.wait(lambda: set(after) <= set(log.completed_origins()), "the records after b left",
                      detail=lambda: f": a holds {sorted(held(a))}, "
                                     f"{len(set(after) - set(log.completed_origins()))} of 40 not completed")
        assert not read_to_end(settings, ns.dlq, 1)
    finally:
        services.stop()
        source.close()
        gc.collect()
    assert not services.errors
