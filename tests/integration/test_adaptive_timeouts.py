"""Adaptive timeouts on a real Kafka: a source with ``timeout_ms="auto"``, a task that acks
everything except one dropped record. The acker learns the topic's completion latency from
the first records; the dropped one is then replayed long before the ceiling (the timeout it
would have had without an estimate), and after the task slows down 5x the completed records
are not replayed (the timeout follows with a safety factor). The truth is read from the topics:
persist tombstones and the replay topic. Speed is judged in bench (``replay.adaptive_*``), not
here: the bounds are loose."""

from __future__ import annotations

import time

import pytest

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.dev.faults import skip_ack
from broker.dev.testing import unique_name
from broker.kafka_io import read_to_end
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from broker.trace import render, trace
from tests.integration.ground_truth import Services

pytestmark = pytest.mark.integration

CEILING_MS = 120_000
FLOOR_MS = 5_000  # well above what a loaded machine stalls: a spurious replay is a real one
WARM, SLOW = 300, 200
RATE = 100.0  # records/s: latency, not a queue behind a burst


def send_paced(source: Source, topic: str, prefix: str, n: int) -> set[int]:
    origins, start = set(), time.monotonic()
    for i in range(n):
        time.sleep(max(0.0, start + i / RATE - time.monotonic()))
        origins.add(source.send(topic, f"k{i}", f"{prefix} {i}").origin)
        source.poll()
    source.flush()
    return origins


def test_a_dropped_record_is_replayed_long_before_the_ceiling_and_a_slow_down_replays_nothing(
    bootstrap: str,
) -> None:
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("adaptive"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {topic: 2})
    work_s = [0.002]  # per record; 5x when the task slows down
    dropped: list[bytes] = []

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        assert record.tracking is not None
        if record.value in dropped and record.tracking.attempt == 1:
            skip_ack(ctx)
            return
        time.sleep(work_s[0])

    config = AckerConfig(
        instance_id=unique_name("acker"), stats_interval_ms=3_600_000, adaptive_floor_ms=FLOOR_MS,
        adaptive_ceiling_ms=CEILING_MS, adaptive_min_samples=100, adaptive_window_ms=60_000,
    )
    acker = Acker(settings, ns, config)
    task = Task(settings, ns, [topic, topics.replay_topic(topic)], unique_name("task"), handler,
                TaskConfig(poll_timeout_ms=50))
    services = Services(settings, ns, acker, task)
    source = Source(settings, ns, SourceConfig(timeout_ms="auto"))
    log = services.tail.log
    try:
        warm = send_paced(source, topic, "warm", WARM)
        services.wait(lambda: warm <= log.completed_origins().keys(), "the warm-up records completed", limit_s=90)

        work_s[0] = 0.010  # the task slows down 5x
        dropped.append(b"dropped")
        sent_at = time.time()
        lost = source.send(topic, "k-dropped", "dropped").origin
        slow = send_paced(source, topic, "slow", SLOW)
        services.wait(lambda: (slow | {lost}) <= log.completed_origins().keys(),
                      "the slow records and the dropped one's replay completed", limit_s=CEILING_MS / 1000 / 2)
        est = acker.adaptive.estimates(int(time.time() * 1000))
    finally:
        services.stop()
        source.close()

    replay_ms = next(ts for _, outcome, ts in log.outcomes[lost] if outcome == "replay")
    assert replay_ms / 1000 - sent_at < CEILING_MS / 1000 / 4  # the estimate, not the ceiling
    # One dropped record in 500 is not slowness: the estimate stays at the completions'.
    assert est[topic].timeout_ms < 3 * FLOOR_MS
    # Every record completed exactly once; none but the dropped one was replayed.
    assert set(log.completed_origins().values()) == {1}
    replayed = [o for o, events in log.outcomes.items() if any(e[1] == "replay" for e in events)]
    assert replayed == [lost]
    assert len(read_to_end(settings, topics.replay_topic(topic), 2)) == 1
    # trace says whose deadline it is: the acker's, for both attempts.
    attempts = trace(settings, ns.name, lost)["attempts"]
    assert [a["persisted"]["timeout_ms"] for a in attempts] == ["auto", "auto"]
    assert "timeout auto " in render(trace(settings, ns.name, lost))
    # Every registration of the auto source got an adaptive deadline, the replay's too.
    assert acker.counters()["adaptive"] == WARM + SLOW + 2
    assert est[topic].samples >= 100 and est[topic].quantile_ms is not None
    assert config.adaptive_floor_ms <= est[topic].timeout_ms < CEILING_MS
