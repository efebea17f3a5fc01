"""The reference topology end to end on a real Kafka (issue #3):

    Source -> orders -> fan-out task (1-3 children) -> enriched -> leaf task
                 \\______________ ns.persist / ns.acks ______________/ -> acker (subprocess)

Checked against a ground truth the test keeps itself, never against the acker's word:

- the tasks record every event they send (srid, xor), so the test knows each tree's events;
- ``ns.acks`` and ``ns.persist`` use ``LogAppendTime``: every event and every completion
  tombstone carries the BROKER's append time, one clock for both;
- a completion is early if its tombstone was appended before the last event of its tree, or
  if any event of the tree is missing from ``ns.acks`` up to that moment (docs/design.md §4: the
  value can only reach 0 when the whole tree has been folded).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Message,
    Producer,
)

from broker import ids, topics
from broker.dev.testing import unique_name
from broker.kafka_io import read_to_end
from broker.schemas import COUNTERS_KEY, decode_counters
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskContext, TaskRecord
from tests.integration.ground_truth import (
    LOG_APPEND_TIME,
    GroundTruth,
    PersistWatch,
    TruthTask,
    fan_out_of,
    read_events,
)

pytestmark = pytest.mark.integration

RECORDS = 10_000
P = 4
TIMEOUT_MS = 600_000  # no timeout may fire during the test: completion is folding alone
RUN_DEADLINE_S = 60.0
COMPACTION_DEADLINE_S = 60.0
# Compaction within seconds: small segments, clean at any dirty ratio. Tombstones stay long
# (the test reads them after the run); values shadowed by a tombstone go at the first clean.
PERSIST_OVERRIDES = {
    **LOG_APPEND_TIME,
    "segment.ms": "500",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "600000",
}


def read_all(settings: KafkaSettings, topic: str, partitions: int = P) -> list[Message]:
    """Every committed message of ``topic``, read from the beginning to the end."""
    return read_to_end(settings, topic, partitions)


def read_counters(settings: KafkaSettings, ns: topics.Namespace) -> dict[str, int]:
    """The acker's exactly-once counters: the last ``__counters__`` of each changelog partition."""
    latest = {m.partition(): m.value() for m in read_all(settings, ns.ledger) if m.key() == COUNTERS_KEY}
    total: Counter[str] = Counter()
    for value in latest.values():
        if value is not None:
            total.update(decode_counters(value)[0])
    return dict(total)


def early_or_missing_completions(
    sent: dict[int, int],
    truth: GroundTruth,
    tombstones: dict[int, list[tuple[str, int]]],
    events: dict[int, list[tuple[int, int]]],
) -> list[str]:
    """Every sent srid completed exactly once, and not before its whole tree was acked."""
    problems = []
    for srid, origin in sent.items():
        expected = truth.events.get(srid, [])
        if len(expected) != 1 + fan_out_of(origin):
            problems.append(f"{srid}: the tasks sent {len(expected)} events, tree has {1 + fan_out_of(origin)}")
        outcomes = tombstones.get(srid, [])
        done = [ts for outcome, ts in outcomes if outcome == "completed"]
        if len(done) != 1 or len(outcomes) != 1:
            problems.append(f"{srid}: tombstones {outcomes} (want exactly one 'completed')")
        if not done:
            continue
        seen = events.get(srid, [])
        last = max((ts for _, ts in seen), default=None)
        if last is None or done[0] < last:
            problems.append(f"{srid}: completed at {done[0]}, its last event was appended at {last}")
        missing = Counter(expected) - Counter(x for x, ts in seen if ts <= done[0])
        if missing:
            problems.append(f"{srid}: completed at {done[0]} before {sum(missing.values())} of its events")
    return problems


def start_acker(bootstrap: str, ns: topics.Namespace, log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "acker", "--bootstrap", bootstrap,
             "--namespace", ns.name, "--instance-id", f"{ns.name}-acker"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def stop_acker(acker: subprocess.Popen[bytes]) -> int:
    if acker.poll() is None:
        acker.terminate()
        try:
            acker.wait(30)
        except subprocess.TimeoutExpired:
            acker.kill()
            acker.wait()
    return acker.returncode


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Pipeline:
    settings: KafkaSettings
    ns: topics.Namespace
    orders: str
    truth: GroundTruth
    tasks: list[Task]
    acker: subprocess.Popen[bytes]
    watch: PersistWatch
    log: Path


@pytest.fixture
def pipeline(bootstrap: str, tmp_path: Path) -> Iterator[Pipeline]:
    """Topics, both tasks running in threads, the acker as its own process."""
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("pipeline"))
    orders, enriched = f"{ns.name}.orders", f"{ns.name}.enriched"
    topics.create(
        settings, ns, P, {orders: P, enriched: P},
        overrides={ns.persist: PERSIST_OVERRIDES, ns.acks: LOG_APPEND_TIME},
    )
    truth = GroundTruth()

    def fan_out(record: TaskRecord, ctx: TaskContext) -> None:
        tracking = record.tracking
        assert tracking is not None
        event = tracking.record_id
        for i in range(fan_out_of(tracking.origin)):
            event ^= ctx.emit(enriched, record.key, (record.value or b"") + b"|%d" % i)
        truth.stage(tracking.srid, event)

    def leaf(record: TaskRecord, ctx: TaskContext) -> None:
        assert record.tracking is not None
        truth.stage(record.tracking.srid, record.tracking.record_id)

    tasks = [
        TruthTask(truth, settings, ns, [orders, topics.replay_topic(orders)], unique_name("fan-out"), fan_out),
        TruthTask(truth, settings, ns, [enriched], unique_name("leaf"), leaf),
    ]
    threads = [threading.Thread(target=t.run, daemon=True) for t in tasks]
    for thread in threads:
        thread.start()
    log_path = tmp_path / "acker.log"
    acker = start_acker(bootstrap, ns, log_path)
    watch = PersistWatch(settings, ns, P)
    try:
        yield Pipeline(settings, ns, orders, truth, tasks, acker, watch, log_path)
    finally:
        for task in tasks:
            task.stop()
        for thread in threads:
            thread.join(30)
        stop_acker(acker)
        watch.close()


def test_every_record_completes_once_never_early_and_persist_compacts_empty(
    pipeline: Pipeline,
) -> None:
    settings, ns, watch, acker = pipeline.settings, pipeline.ns, pipeline.watch, pipeline.acker

    sent: dict[int, int] = {}  # srid -> origin
    with Source(settings, ns, SourceConfig(timeout_ms=TIMEOUT_MS)) as source:
        for i in range(RECORDS):
            result = source.send(pipeline.orders, f"customer-{i % 997}", b"order-%d" % i)
            sent[result.srid] = result.origin
            if i % 1000 == 0:
                watch.poll(0)
    assert len(sent) == RECORDS

    deadline = time.monotonic() + RUN_DEADLINE_S
    while not watch.completed >= sent.keys():
        assert acker.poll() is None, f"the acker died:\n{tail(pipeline.log)}"
        assert time.monotonic() < deadline, (
            f"{len(sent.keys() - watch.completed)} of {RECORDS} records did not complete:\n"
            + tail(pipeline.log)
        )
        watch.poll(0.2)
    for task in pipeline.tasks:
        task.stop()
    assert stop_acker(acker) == 0, tail(pipeline.log)
    watch.drain()  # a second completion of any srid would show up here

    # Ground truth: each tree completed once, after its last event, with all its events in.
    events = read_events(settings, ns, P)
    problems = early_or_missing_completions(sent, pipeline.truth, watch.tombstones, events)
    assert not problems, f"{len(problems)} problems, e.g.:\n" + "\n".join(problems[:10])
    assert watch.tombstones.keys() == sent.keys()

    # The acker's own counters (exactly-once, in the changelog) agree with the ground truth.
    counters = read_counters(settings, ns)
    assert counters.get("registered") == RECORDS
    assert counters.get("completed") == RECORDS
    assert counters.get("folded") == sum(len(v) for v in events.values())
    for name in ("duplicate_roots", "timed_out", "failed", "replayed", "dlq", "orphans", "quarantined"):
        assert counters.get(name, 0) == 0, (name, counters)

    # After the cleaner ran, ns.persist holds no live value: every record was released.
    assert_persist_compacts_to_tombstones(settings, ns)


def assert_persist_compacts_to_tombstones(settings: KafkaSettings, ns: topics.Namespace) -> None:
    """Poll until a read of ``ns.persist`` from the beginning finds no non-null value.

    The cleaner never touches the active segment, so each round appends one tombstone of an
    unused srid per partition (the acker ignores tombstones): once ``segment.ms`` has passed
    that append rolls the segment, and the values and their tombstones become cleanable."""
    producer = Producer(settings.producer_config())
    deadline = time.monotonic() + COMPACTION_DEADLINE_S
    try:
        while True:
            for p in range(P):
                producer.produce(ns.persist, key=ids.encode_id(P * 2**40 + p), value=None, partition=p)
            assert producer.flush(30) == 0
            live = [m for m in read_all(settings, ns.persist) if m.value() is not None]
            if not live:
                return
            assert time.monotonic() < deadline, f"{len(live)} values still in {ns.persist} after compaction"
            time.sleep(0.5)  # give the cleaner a turn (poll interval, not synchronisation)
    finally:
        producer.flush(10)


def test_read_events_sees_the_broker_clock(bootstrap: str) -> None:
    """LogAppendTime overrides really reach the namespace's topics (the ground truth relies
    on one clock for events and tombstones)."""
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("clock"))
    topics.create(settings, ns, P, overrides={ns.persist: PERSIST_OVERRIDES, ns.acks: LOG_APPEND_TIME})
    producer = Producer(settings.producer_config())
    producer.produce(ns.acks, value=b"x", partition=0, timestamp=1_000)
    assert producer.flush(30) == 0
    (msg,) = read_all(settings, ns.acks)
    ts_type, ts = msg.timestamp()
    assert ts_type == TIMESTAMP_LOG_APPEND_TIME and ts > 1_000


def test_the_ground_truth_check_catches_early_double_and_missing_completions() -> None:
    """The check above must be able to fail: fed made-up logs, it names each fault."""
    origin = 3  # fan-out 1: the tree is the root's fan-out event and one leaf event
    truth = GroundTruth()
    for srid in (3, 6, 9, 12):
        truth.record(srid, 0xA)
        truth.record(srid, 0xB)
    events = {s: [(0xA, 100), (0xB, 200)] for s in (3, 6, 9, 12)}
    tombstones = {
        3: [("completed", 200)],  # right: after the last event (same ms is allowed)
        6: [("completed", 150)],  # early: before the leaf's event
        9: [("completed", 300), ("completed", 400)],  # completed twice
        # 12: never completed
    }
    events[3].append((0xC, 100))  # an extra event is not a fault of the completion
    sent = {3: origin, 6: 6, 9: 9, 12: 12}
    problems = early_or_missing_completions(sent, truth, tombstones, events)
    assert not [p for p in problems if p.startswith("3:")], problems
    assert any(p.startswith("6:") and "last event" in p for p in problems), problems
    assert any(p.startswith("6:") and "before 1 of its events" in p for p in problems), problems
    assert any(p.startswith("9:") and "exactly one" in p for p in problems), problems
    assert any(p.startswith("12:") and "exactly one" in p for p in problems), problems
