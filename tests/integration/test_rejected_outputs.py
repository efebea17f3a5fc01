"""An output the broker refuses for good must not stop the acker: a replay record larger
than its replay topic's ``max.message.bytes`` makes the transaction fail, and deciding the
same replay after the rewind would fail the same way, forever, with every other record of
those commits stalled behind it. The refused record's srid is dead-lettered instead, with
the reason; a dead letter the DLQ refuses for size is written without its value."""

from __future__ import annotations

import os
import threading
import time

import pytest
from confluent_kafka.admin import AdminClient

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.completions import OutcomeTail
from broker.dev.faults import skip_ack
from broker.dev.testing import unique_name
from broker.headers import H_ORIGIN, H_REASON
from broker.kafka_io import read_to_end
from broker.schemas import COUNTERS_KEY, decode_counters
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskContext, TaskRecord

pytestmark = pytest.mark.integration

REPLAY_MAX = 4_096  # max.message.bytes of the replay topic
DLQ_MAX = 16_384  # ... and of the DLQ
BIG = 8_000  # replay refused, dead letter accepted
HUGE = 40_000  # replay refused, dead letter refused too: written without the value


def test_outputs_the_broker_refuses_are_dead_lettered_and_nothing_stalls(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("refused"))
    data = f"{ns.name}.orders"
    topics.create(
        settings, ns, 2, {data: 2},
        overrides={
            topics.replay_topic(data): {"max.message.bytes": str(REPLAY_MAX)},
            ns.dlq: {"max.message.bytes": str(DLQ_MAX)},
        },
    )
    # Incompressible values: the producer compresses (lz4), the broker limits what it gets.
    big = {f"big{i}": b"F" + os.urandom(BIG) for i in range(3)}  # failed by the task
    huge = {f"huge{i}": b"F" + os.urandom(HUGE) for i in range(2)}
    # Long timeouts: the rounds that find out what is refused must not turn explicit
    # failures into timeouts. One big record is never acked and times out early.
    source = Source(settings, ns, SourceConfig(timeout_ms=120_000))
    small_fail_once = {source.send(data, f"s{i}", b"fail-once").origin for i in range(30)}
    small = {source.send(data, f"k{i}", b"ok").origin for i in range(200)} | small_fail_once
    oversize = {source.send(data, key, value).origin: (key, value) for key, value in (big | huge).items()}
    timeout_value = b"T" + os.urandom(BIG)
    oversize[source.send(data, "big-timeout", timeout_value, timeout_ms=3_000).origin] = ("big-timeout", timeout_value)
    source.close()

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        value = record.value or b""
        attempt = record.tracking.attempt if record.tracking else 1
        if value.startswith(b"F") or (value == b"fail-once" and attempt == 1):
            ctx.fail("rejected by the task")
        elif value.startswith(b"T"):
            skip_ack(ctx)

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("a"), stats_interval_ms=3_600_000))
    task = Task(settings, ns, [data, topics.replay_topic(data)], unique_name("t"), handler)
    tail = OutcomeTail(settings, ns)
    stop = threading.Event()
    threads = [threading.Thread(target=acker.run, kwargs={"until": lambda _a: stop.is_set()}, daemon=True),
               threading.Thread(target=task.run, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 90
        while not (small <= set(tail.log.completed_origins()) and set(oversize) <= tail.log.dlq_origins()):
            assert time.monotonic() < deadline, (
                f"stalled: {len(small - set(tail.log.completed_origins()))} of {len(small)} small records "
                f"not completed, {len(set(oversize) - tail.log.dlq_origins())} of {len(oversize)} oversize "
                "records not dead-lettered"
            )
            tail.poll(0.2)
    finally:
        stop.set()
        task.stop()
        for thread in threads:
            thread.join(30)
        tail.close()

    assert all(n == 1 for n in tail.log.completed_origins().values())
    dead = {int.from_bytes(dict(m.headers())[H_ORIGIN] or b"", "big", signed=True): m
            for m in read_to_end(settings, ns.dlq, 1)}
    assert set(dead) == set(oversize)  # nothing else went to the DLQ
    for origin, (key, value) in oversize.items():
        msg = dead[origin]
        reason = (dict(msg.headers())[H_REASON] or b"").decode()
        first = "timeout" if key == "big-timeout" else "failed"
        assert reason.startswith(f"{first}; cannot replay: {topics.replay_topic(data)} rejected the record: "), reason
        assert msg.key() == key.encode()
        if key.startswith("huge"):
            assert msg.value() is None and f"value dropped: {ns.dlq} rejected the record: " in reason, reason
        else:
            assert msg.value() == value
    counters: dict[int, dict[str, int]] = {}
    for msg in read_to_end(settings, ns.ledger, 2):
        if msg.key() == COUNTERS_KEY and msg.value() is not None:
            counters[msg.partition()] = decode_counters(msg.value())[0]
    total = {name: sum(c.get(name, 0) for c in counters.values()) for name in ("refused", "dlq", "replayed")}
    # Exactly-once counters: each refused output decided again once - 4 replays dead-lettered
    # instead, 2 replays and 2 dead letters (written without the value) of the huge ones.
    assert total == {"refused": 8, "dlq": 6, "replayed": len(small_fail_once)}, total


def test_a_replay_topic_deleted_after_its_first_lookup_sends_its_records_to_the_dlq(bootstrap: str) -> None:
    """The acker looked the replay topic up (and cached it) for an earlier replay; then the
    topic is deleted. Producing into it would fail the transaction and its abort: instead the
    commit checks it first, and the records go to the DLQ with the reason."""
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("gone"))
    data = f"{ns.name}.orders"
    replay = topics.replay_topic(data)
    topics.create(settings, ns, 2, {data: 2})
    source = Source(settings, ns, SourceConfig(timeout_ms=120_000))
    first = source.send(data, "first", b"bad").origin
    source.flush()  # a data record goes out once its persist record is confirmed: flush

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        if record.value == b"bad":
            ctx.fail("rejected by the task")

    group = unique_name("t")
    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("a"), stats_interval_ms=3_600_000))
    errors: list[BaseException] = []

    def run_acker() -> None:
        try:
            acker.run(until=lambda _a: stop.is_set())
        except BaseException as exc:  # the test reports it
            errors.append(exc)
            raise

    stop = threading.Event()
    acker_thread = threading.Thread(target=run_acker, daemon=True)
    acker_thread.start()
    tail = OutcomeTail(settings, ns)
    # The task reads only the data topic: it must not be subscribed to a topic being deleted.
    task = Task(settings, ns, [data], group, handler)
    task_thread = threading.Thread(target=task.run, daemon=True)
    task_thread.start()
    try:
        deadline = time.monotonic() + 60
        while tail.log.replays() < 1:
            assert time.monotonic() < deadline, "the first record was not replayed"
            tail.poll(0.2)
        task.stop()
        task_thread.join(30)
        bad = {source.send(data, f"bad{i}", b"bad").origin for i in range(3)}
        good = {source.send(data, f"k{i}", b"ok").origin for i in range(100)}
        source.close()
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.delete_topics([replay], operation_timeout=30)[replay].result(30)
        task = Task(settings, ns, [data], group, handler)  # the same group: it goes on from there
        task_thread = threading.Thread(target=task.run, daemon=True)
        task_thread.start()
        deadline = time.monotonic() + 60
        while not (good <= set(tail.log.completed_origins()) and bad <= tail.log.dlq_origins()):
            assert not errors, f"the acker stopped: {errors[0]!r}"
            assert time.monotonic() < deadline, (
                f"stalled: {len(good - set(tail.log.completed_origins()))} of {len(good)} records not completed, "
                f"{len(bad - tail.log.dlq_origins())} of {len(bad)} failed records not dead-lettered"
            )
            tail.poll(0.2)
    finally:
        stop.set()
        task.stop()
        task_thread.join(30)
        acker_thread.join(30)
        tail.close()
    assert first not in tail.log.dlq_origins()
    for msg in read_to_end(settings, ns.dlq, 1):
        reason = (dict(msg.headers())[H_REASON] or b"").decode()
        assert reason.startswith(f"failed; cannot replay: {replay}") and "does not exist" in reason, reason
    assert not errors


def test_a_near_max_record_dead_lettered_keeps_its_value(bootstrap: str) -> None:
    """ns.dlq takes records up to Kafka's default max.message.bytes (1 048 588 B). A record of
    ~1 020 000 B that times out at its last attempt is dead-lettered with its value: the
    acker's producer limit follows the topics' (broker.acker.limits) instead of librdkafka's
    default 1 000 000 B, under which the client refused the dead letter and it went to the DLQ
    without its value."""
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("nearmax"))
    data = f"{ns.name}.orders"
    topics.create(settings, ns, 1, {data: 1})
    value = os.urandom(1_020_000)  # incompressible
    # The source's producer takes it with a limit of its own (its default is librdkafka's too).
    big_settings = KafkaSettings(bootstrap, extra={"message.max.bytes": 1_048_588})
    with Source(big_settings, ns, SourceConfig(timeout_ms=2_000, max_attempts=1)) as source:
        origin = source.send(data, "big", value).origin  # nobody acks it: it times out

    # A last attempt's dead letter is held while late events could still complete it: 1 s.
    config = AckerConfig(instance_id=unique_name("a"), stats_interval_ms=3_600_000, watch_ms=1_000)
    acker = Acker(settings, ns, config)
    tail = OutcomeTail(settings, ns)
    stop = threading.Event()
    thread = threading.Thread(target=acker.run, kwargs={"until": lambda _a: stop.is_set()}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while origin not in tail.log.dlq_origins():
            assert time.monotonic() < deadline, "the record was not dead-lettered"
            tail.poll(0.2)
    finally:
        stop.set()
        thread.join(30)
        tail.close()
    (dead,) = read_to_end(settings, ns.dlq, 1)
    reason = (dict(dead.headers())[H_REASON] or b"").decode()
    assert reason.startswith("timeout"), reason
    assert "value dropped" not in reason
    assert dead.key() == b"big" and dead.value() == value
