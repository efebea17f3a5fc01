"""``SourceConfig.max_pending`` on a real Kafka: with nothing completing records the send past
the limit waits, then raises ``BackpressureTimeout`` having sent nothing; once an acker and a
task run, sends unblock as records complete or dead-letter, and the number of the source's
records pending - read from ``ns.persist``: persisted minus finally tombstoned - never exceeds
the limit."""

from __future__ import annotations

import pytest

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.dev.testing import unique_name
from broker.errors import BackpressureTimeout
from broker.headers import outcome_of
from broker.kafka_io import read_to_end
from broker.schemas import PersistedRecord
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from tests.integration.ground_truth import Services

pytestmark = pytest.mark.integration

LIMIT = 3
POISON = b"poison"


def max_pending_seen(
    settings: KafkaSettings, ns: topics.Namespace, partitions: int, origins: set[int]
) -> tuple[int, dict[str, int]]:
    """The most records of ``origins`` pending at once, from the broker's append times on ``ns.persist``:
    an origin is pending from its first persist record to its final tombstone (``completed``
    or ``dlq``; a ``replay`` tombstone is followed by the next attempt). At equal times the
    freeing comes first: a send that a completion unblocked is appended after it."""
    origin_of: dict[int, int] = {}
    events: list[tuple[int, int, int]] = []  # (time ms, +1 take / -1 free, origin)
    outcomes: dict[str, int] = {}
    first_seen: set[int] = set()
    for msg in read_to_end(settings, ns.persist, partitions):
        srid = int.from_bytes(msg.key() or b"", "big", signed=True)
        ts = msg.timestamp()[1]
        if msg.value() is not None:
            origin = PersistedRecord.decode(msg.value()).origin
            origin_of[srid] = origin
            if origin not in first_seen and origin in origins:
                first_seen.add(origin)
                events.append((ts, 1, origin))
            continue
        outcome = outcome_of(msg.headers()).decode()
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if outcome in ("completed", "dlq") and origin_of[srid] in origins:
            events.append((ts, -1, origin_of[srid]))
    pending = most = 0
    for _, delta, _ in sorted(events):
        pending += delta
        most = max(most, pending)
    return most, outcomes


def test_sends_past_max_pending_wait_then_fail_with_nothing_sent_and_unblock_as_records_complete(
    bootstrap: str,
) -> None:
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("backpressure"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {topic: 2})
    source = Source(settings, ns, SourceConfig(max_pending=LIMIT, max_pending_timeout_ms=2000, max_attempts=2))
    try:
        # ---- nothing completes records: LIMIT sends pass, the next one times out, unsent
        sent = [source.send(topic, f"k{i}", f"v{i}").origin for i in range(LIMIT)]
        source.flush()
        with pytest.raises(BackpressureTimeout) as raised:
            source.send(topic, "over", "the limit")
        err = raised.value
        assert (err.limit, err.pending) == (LIMIT, LIMIT)
        assert err.waited_s >= 2.0
        assert f"max_pending={LIMIT}" in str(err) and "nothing of this send was sent" in str(err)
        source.flush()
        assert len(read_to_end(settings, topic, 2)) == LIMIT
        assert len(read_to_end(settings, ns.persist, 2)) == LIMIT
        assert (source.sent, source.blocked, source.backpressure_timeouts) == (LIMIT, 1, 1)

        # ---- an acker and a task complete records (a poison one dead-letters after a
        # replay): every send gets through, LIMIT at most pending at any time
        def handler(record: TaskRecord, ctx: TaskContext) -> None:
            if record.value == POISON:
                ctx.fail("poison")

        acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))
        task = Task(settings, ns, [topic, topics.replay_topic(topic)], unique_name("task"), handler,
                    TaskConfig(poll_timeout_ms=50))
        services = Services(settings, ns, acker, task)
        source.close()
        try:
            # a new source: the records of the one before are not its concern
            source = Source(settings, ns, SourceConfig(max_pending=LIMIT, max_pending_timeout_ms=120_000, max_attempts=2))
            second = [source.send(topic, "poison", POISON).origin]
            second += [source.send(topic, f"k{i}", f"v{i}").origin for i in range(LIMIT, 20)]
            sent += second
            source.flush()
            log = services.tail.log
            services.wait(lambda: set(sent) <= set(log.completed_origins()) | log.dlq_origins(),
                          "every record completed or dead-lettered")
        finally:
            services.stop()
        assert source.blocked > 0 and source.backpressure_timeouts == 0
        most, outcomes = max_pending_seen(settings, ns, 2, set(second))
        assert outcomes == {"completed": 20, "replay": 1, "dlq": 1}
        assert most <= LIMIT
        assert len(read_to_end(settings, topic, 2)) == 21
    finally:
        source.close()


def test_a_transaction_that_fills_the_window_alone_fails_at_once_and_its_abort_frees_the_slots(
    bootstrap: str,
) -> None:
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("backpressure-tx"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {topic: 2})
    source = Source(settings, ns, SourceConfig(max_pending=2, max_pending_timeout_ms=60_000),
                    transactional_id=unique_name("tx"))
    try:
        with pytest.raises(BackpressureTimeout, match="open transaction") as raised, source.transaction():
            for i in range(3):
                source.send(topic, f"k{i}", f"v{i}")
        assert (raised.value.pending, raised.value.waited_s) == (2, 0.0)
        assert source.pending == 0  # the aborted records were never persisted
        with source.transaction():
            source.send(topic, "a", "1")
            source.send(topic, "b", "2")
        assert source.pending == 2
        assert len(read_to_end(settings, ns.persist, 2)) == 2
        assert len(read_to_end(settings, topic, 2)) == 2
    finally:
        source.close()


def test_send_many_waits_for_slots_within_its_batch(bootstrap: str) -> None:
    """A batch larger than ``max_pending``: its first records must complete for the rest to
    get slots - they are out (released) while the batch waits, and the window holds."""
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("backpressure"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {topic: 2})
    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))
    task = Task(settings, ns, [topic, topics.replay_topic(topic)], unique_name("task"), lambda _r, _c: None,
                TaskConfig(poll_timeout_ms=50))
    services = Services(settings, ns, acker, task)
    source = Source(settings, ns, SourceConfig(max_pending=LIMIT, max_pending_timeout_ms=120_000))
    try:
        sent = {r.origin for r in source.send_many(topic, [(f"k{i}", f"v{i}") for i in range(20)])}
        source.flush()
        log = services.tail.log
        services.wait(lambda: sent <= set(log.completed_origins()), "every record completed")
    finally:
        services.stop()
        source.close()
    assert source.blocked > 0 and source.backpressure_timeouts == 0
    most, outcomes = max_pending_seen(settings, ns, 2, sent)
    assert outcomes == {"completed": 20} and most <= LIMIT
