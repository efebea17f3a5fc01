"""Replays end to end on a real Kafka: source -> task -> acker -> ``<topic>.replay``.

Every test has its own namespace. Waits poll the outcome feed (persist tombstones) with a
generous limit; nothing asserts on time. Replay latencies are MEASURED and printed
(``-s`` shows them), never asserted - timing targets live in broker/bench/.
"""

from __future__ import annotations

import gc
import hashlib
import json
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from broker import ids, topics
from broker.acker import Acker, AckerConfig
from broker.completions import OutcomeTail
from broker.dev.faults import skip_ack
from broker.dev.testing import unique_name
from broker.headers import Tracking, outcome_of
from broker.kafka_io import read_to_end
from broker.ledger.clock import Clock, ManualClock
from broker.schemas import PersistedRecord, XorBatch
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord

pytestmark = pytest.mark.integration


# --------------------------------------------------------------------------- harness


@dataclass(frozen=True)
class Seen:
    """One input as the task saw it, and what the task did with it."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    tracking: Tracking
    action: str  # "ack" | "fail" | "drop"
    at: float  # time.time() when handled


def draw(origin: int, salt: bytes = b"inject") -> float:
    """A deterministic number in [0, 1) per origin: one injection decision per record."""
    digest = hashlib.blake2b(ids.encode_id(origin) + salt, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


Decide = Callable[[TaskRecord, Tracking], str]


@dataclass
class Pipeline:
    """A namespace with one data topic (and its replay topic), a Source, an in-process acker
    and a task consuming the data and replay topics, all torn down by ``close``."""

    bootstrap: str
    ledger_partitions: int = 4
    data_partitions: int = 4
    timeout_ms: int = 30_000
    max_attempts: int = 5
    settings: KafkaSettings = field(init=False)
    ns: topics.Namespace = field(init=False)
    topic: str = field(init=False)
    seen: list[Seen] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.settings = KafkaSettings.from_env(self.bootstrap)
        self.ns = topics.Namespace(unique_name("rb"))
        self.topic = f"{self.ns.name}.orders"
        topics.create(self.settings, self.ns, self.ledger_partitions, {self.topic: self.data_partitions})
        self.source = Source(
            self.settings, self.ns, SourceConfig(timeout_ms=self.timeout_ms, max_attempts=self.max_attempts)
        )
        self.tail = OutcomeTail(self.settings, self.ns)
        self.acker: Acker | None = None
        self.task: Task | None = None
        self._threads: list[threading.Thread] = []

    @property
    def replay(self) -> str:
        return topics.replay_topic(self.topic)

    def _spawn(self, target: Callable[[], Any], name: str) -> None:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # noqa: BLE001 - surfaced by wait() and close()
                self.errors.append(exc)

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def start_acker(self, clock: Clock | None = None) -> Acker:
        config = AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000)
        self.acker = Acker(self.settings, self.ns, config, clock=clock)
        self._spawn(self.acker.run, "acker")
        return self.acker

    def start_task(self, decide: Decide) -> Task:
        def handler(record: TaskRecord, ctx: TaskContext) -> None:
            tracking = record.tracking
            assert tracking is not None, "every input of this pipeline is tracked"
            action = decide(record, tracking)
            if action == "fail":
                ctx.fail(f"injected failure of attempt {tracking.attempt}")
            elif action == "drop":
                skip_ack(ctx)
            self.seen.append(
                Seen(record.topic, record.partition, record.key, record.value, tracking, action, time.time())
            )

        self.task = Task(
            self.settings, self.ns, [self.topic, self.replay], unique_name("task"), handler,
            TaskConfig(poll_timeout_ms=50),
        )
        self._spawn(self.task.run, "task")
        return self.task

    def wait(self, done: Callable[[], bool], what: str, limit_s: float = 75.0) -> None:
        """Poll the outcome feed until ``done()``; fail (not hang) after ``limit_s``."""
        deadline = time.monotonic() + limit_s
        while not done():
            if self.errors:
                raise AssertionError(f"a pipeline thread died: {self.errors[0]!r}") from self.errors[0]
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            self.tail.poll(0.2)

    def completed(self, origins: set[int]) -> Callable[[], bool]:
        return lambda: origins <= self.tail.log.completed_origins().keys()

    def warm_up(self) -> int:
        """One record through the whole pipeline: the acker and the task have their partitions."""
        origin = self.source.send(self.topic, b"warm-up", b"warm-up").origin
        self.source.flush()
        self.wait(self.completed({origin}), "the warm-up record")
        return origin

    def read(self, topic: str, partitions: int | None = None) -> list[Any]:
        n = partitions if partitions is not None else self.data_partitions
        return read_to_end(self.settings, topic, n)

    def close(self) -> None:
        for service in (self.task, self.acker):
            if service is not None:
                service.stop()
        for thread in self._threads:
            thread.join(60)
        self.tail.close()
        self.source.close()
        # Let the Kafka clients go now, not at interpreter exit (after the broker stopped).
        self.acker = self.task = None
        self._threads.clear()
        if self.errors:
            raise AssertionError(f"a pipeline thread died: {self.errors[0]!r}") from self.errors[0]


@pytest.fixture
def pipelines(bootstrap: str) -> Any:
    made: list[Pipeline] = []

    def make(**kwargs: Any) -> Pipeline:
        p = Pipeline(bootstrap, **kwargs)
        made.append(p)
        return p

    yield make
    try:
        for p in made:
            p.close()
    finally:
        made.clear()
        gc.collect()  # Kafka clients sit in reference cycles (delivery callbacks)


def headers_of(msg: Any) -> dict[str, bytes | None]:
    return dict(msg.headers() or ())


def tracking_of(msg: Any) -> Tracking:
    t = Tracking.from_headers(msg.headers())
    assert t is not None
    return t


def percentiles(values: list[float]) -> str:
    if not values:
        return "n=0"
    a = np.asarray(values, dtype=float)
    return f"n={a.size} p50={np.percentile(a, 50):.0f}ms p99={np.percentile(a, 99):.0f}ms max={a.max():.0f}ms"


# --------------------------------------------------------------------------- tests


FAIL_RATE, DROP_RATE = 0.10, 0.02


def test_failures_and_drops_all_complete_once_replayed_on_their_key_partition(pipelines: Any) -> None:
    """10 000 records; the task fails 10 % of first attempts and silently drops 2 %: every
    record completes exactly once, replays = failures + drops, each replay on the partition
    index its original's key hashed to."""
    p: Pipeline = pipelines(ledger_partitions=4, data_partitions=6, timeout_ms=4_000)

    def inject(record: TaskRecord, t: Tracking) -> str:
        if t.attempt == 1 and record.key != b"warm-up":
            d = draw(t.origin)
            if d < FAIL_RATE:
                return "fail"
            if d < FAIL_RATE + DROP_RATE:
                return "drop"
        return "ack"

    acker = p.start_acker()
    p.start_task(inject)
    warm = p.warm_up()

    n, chunk = 10_000, 1_000
    sent: dict[int, tuple[bytes, int]] = {}  # origin -> key, key-hash partition (from send)
    for start in range(0, n, chunk):
        batch = set()
        for i in range(start, start + chunk):
            key = f"customer-{i % 997}".encode()
            result = p.source.send(p.topic, key, b'{"order": %d}' % i)
            sent[result.origin] = (key, result.key_hash_partition)
            batch.add(result.origin)
        p.source.flush()
        # Back-pressure, not timing: the next chunk goes once the acker has completed this
        # one (all but the injected records), so no record of a healthy pipeline waits
        # for its ack longer than the short timeout, however slow the machine.
        healthy = {o for o in batch if draw(o) >= FAIL_RATE + DROP_RATE}
        p.wait(p.completed(healthy), "the chunk to complete")
    origins = set(sent) | {warm}
    p.wait(p.completed(origins), "every record to complete", limit_s=80)
    p.tail.poll(0.5)

    firsts = {s.tracking.origin: s for s in p.seen if s.tracking.attempt == 1}
    failed = {o for o, s in firsts.items() if s.action == "fail"}
    dropped = {o for o, s in firsts.items() if s.action == "drop"}
    assert set(firsts) == origins
    assert 0.08 * n < len(failed) < 0.12 * n and 0.01 * n < len(dropped) < 0.03 * n

    # each origin completes exactly once, and only the injected ones were replayed
    completions = p.tail.log.completed_origins()
    assert set(completions) == origins
    assert set(completions.values()) == {1}
    assert p.tail.log.replays() == len(failed) + len(dropped), acker.counters()
    assert not p.tail.log.dlq_origins()
    replays = p.read(p.replay)
    assert len(replays) == len(failed) + len(dropped)
    replayed = Counter(tracking_of(m).origin for m in replays)
    assert set(replayed) == failed | dropped and set(replayed.values()) == {1}

    # replays sit at the partition index the source returned for the key at send time
    for msg in replays:
        t = tracking_of(msg)
        key, key_hash_partition = sent[t.origin]
        assert (msg.key(), msg.partition(), t.attempt) == (key, key_hash_partition, 2)
        assert firsts[t.origin].partition == key_hash_partition
        assert t.srid != firsts[t.origin].tracking.srid

    counters = acker.counters()
    assert counters["failed"] == len(failed)
    assert counters["timed_out"] == len(dropped)
    assert counters["replayed"] == len(failed) + len(dropped)
    assert counters["dlq"] == 0

    _report_latencies(p, replays, failed, dropped)


def _report_latencies(p: Pipeline, replays: list[Any], failed: set[int], dropped: set[int]) -> None:
    """Measured, not asserted.

    - after an explicit failure: Kafka timestamp of the task's XorBatch holding the fail
      mark -> Kafka timestamp of the replay record on ``<topic>.replay``;
    - after a timeout: the original's ``created_ms + timeout_ms`` -> the replay's timestamp.
    """
    fail_ms: dict[int, int] = {}
    for msg in p.read(p.ns.acks, p.ledger_partitions):
        batch = XorBatch.decode(msg.value())
        for srid in batch.failed.tolist():
            fail_ms.setdefault(srid, msg.timestamp()[1])
    deadline_ms: dict[int, int] = {}
    for msg in p.read(p.ns.persist, p.ledger_partitions):
        if msg.value() is not None:
            record = PersistedRecord.decode(msg.value())
            deadline_ms[record.srid] = record.created_ms + record.timeout_ms
    first_srid = {s.tracking.origin: s.tracking.srid for s in p.seen if s.tracking.attempt == 1}
    handled = {(s.tracking.origin, s.tracking.attempt): s.at for s in p.seen}
    after_fail, after_timeout, fail_to_task = [], [], []
    for msg in replays:
        origin, at = tracking_of(msg).origin, msg.timestamp()[1]
        srid = first_srid[origin]
        if origin in failed:
            after_fail.append(at - fail_ms[srid])
            fail_to_task.append((handled[(origin, 2)] - handled[(origin, 1)]) * 1000)
        elif origin in dropped:
            after_timeout.append(at - deadline_ms[srid])
    print(
        f"\nREPLAY LATENCY after explicit fail (acks ts -> replay ts): {percentiles(after_fail)}"
        f"\nREPLAY LATENCY after explicit fail (task fail -> task sees replay): {percentiles(fail_to_task)}"
        f"\nREPLAY LATENCY after timeout (created+timeout -> replay ts): {percentiles(after_timeout)}"
    )


@pytest.mark.parametrize(
    ("failure", "ledger_partitions"),
    [
        # Explicit fail marks travel in one XorBatch per ledger partition, and Kafka orders
        # nothing across partitions: the acker holds fresh marks (fail_hold_ms) and decides
        # them together, in the order of their records.
        ("fail", 1),
        ("fail", 4),
        # Timeouts expire by deadline tick, all ledger partitions in the same commit: exact
        # across partitions too (ordered by created_ms, then persist offset).
        ("drop", 4),
    ],
)
def test_replays_of_a_key_keep_their_partition_and_failure_order(
    pipelines: Any, failure: str, ledger_partitions: int
) -> None:
    """Several records of each key fail one after another: all their replays land in the
    partition index of the originals, in the order of the failures."""
    p: Pipeline = pipelines(ledger_partitions=ledger_partitions, data_partitions=3, timeout_ms=2_000)
    keys = [b"alpha", b"bravo", b"charlie", b"delta"]
    per_key = 30

    def inject(record: TaskRecord, t: Tracking) -> str:
        if t.attempt > 1 or record.key == b"warm-up":
            return "ack"
        seq = int((record.value or b"0").split(b":")[1])
        return "ack" if seq % 4 == 3 else failure

    p.start_acker()
    p.start_task(inject)
    p.warm_up()
    partition_of: dict[bytes, int] = {}
    origins = set()
    for seq in range(per_key):
        for key in keys:
            result = p.source.send(p.topic, key, key + b":%d" % seq)
            partition_of[key] = result.key_hash_partition
            origins.add(result.origin)
        # Records of one key are persisted in distinct milliseconds: created_ms (ms
        # resolution) is what orders the replays decided in one commit across ledger
        # partitions. 2 ms, as the source's int(time.time() * 1000) may round down.
        next_ms = time.time_ns() // 1_000_000 + 2
        while time.time_ns() // 1_000_000 < next_ms:
            time.sleep(0.0002)
    p.source.flush()
    p.wait(p.completed(origins), "every record to complete")

    failed_seq: dict[bytes, list[int]] = defaultdict(list)
    for s in p.seen:  # the task's order per key = the order of the failures
        if s.tracking.attempt == 1 and s.key in partition_of and s.action != "ack":
            failed_seq[s.key].append(int((s.value or b"").split(b":")[1]))
    replayed: dict[bytes, list[tuple[int, int]]] = defaultdict(list)  # key -> (partition, seq)
    for msg in sorted(p.read(p.replay), key=lambda m: (m.partition(), m.offset())):
        if msg.key() in partition_of:  # not the warm-up's: it times out when the task joins late
            replayed[msg.key()].append((msg.partition(), int(msg.value().split(b":")[1])))
    assert sum(len(v) for v in replayed.values()) == sum(len(v) for v in failed_seq.values())
    for key in keys:
        assert len(failed_seq[key]) == per_key - per_key // 4
        partitions = {partition for partition, _ in replayed[key]}
        assert partitions == {partition_of[key]}, f"replays of {key!r} left their partition"
        order = [seq for _, seq in replayed[key]]
        if order != failed_seq[key]:
            firsts = {
                int((s.value or b"").split(b":")[1]): s
                for s in p.seen if s.key == key and s.tracking.attempt == 1
            }
            shown = [
                (seq, ids.ledger_partition(firsts[seq].tracking.srid, ledger_partitions), round(firsts[seq].at % 100, 3))
                for seq in order
            ]
            raise AssertionError(f"replays of {key!r} out of order: (seq, lp, handled at) {shown}")


def test_a_record_never_acked_is_replayed_after_its_timeout(pipelines: Any) -> None:
    """A short real timeout: the first attempt is never acked; the acker replays it after
    the timeout (counted as timed_out) and the second attempt completes."""
    p: Pipeline = pipelines(ledger_partitions=2, data_partitions=2, timeout_ms=2_000)
    acker = p.start_acker()
    p.start_task(lambda record, t: "drop" if t.attempt == 1 and record.key == b"lost" else "ack")
    p.warm_up()
    # The warm-up record itself may time out once if the task joined slowly: counted apart.
    before = acker.counters()
    result = p.source.send(p.topic, b"lost", b"never acked the first time")
    p.source.flush()
    p.wait(p.completed({result.origin}), "the replay to complete")
    p.tail.poll(0.5)

    outcomes = [outcome for _, outcome, _ in p.tail.log.outcomes[result.origin]]
    assert outcomes == ["replay", "completed"]
    counters = acker.counters()
    assert tuple(counters[n] - before[n] for n in ("timed_out", "failed", "replayed")) == (1, 0, 1)
    (msg,) = [m for m in p.read(p.replay) if tracking_of(m).origin == result.origin]
    t = tracking_of(msg)
    assert (t.origin, t.attempt, msg.partition()) == (result.origin, 2, result.key_hash_partition)
    created = next(
        PersistedRecord.decode(m.value()).created_ms
        for m in p.read(p.ns.persist, p.ledger_partitions)
        if m.key() == ids.encode_id(result.srid) and m.value() is not None
    )
    print(f"\nREPLAY LATENCY after a 2 s timeout: {msg.timestamp()[1] - created - 2_000} ms past the deadline")


def test_manual_clock_stepped_past_the_deadline_replays_without_waiting(pipelines: Any) -> None:
    """A real acker on a ManualClock: a never-acked record with a 10-minute timeout is
    replayed as soon as the clock is stepped past its deadline - no sleeping for the timeout."""
    p: Pipeline = pipelines(ledger_partitions=2, data_partitions=2, timeout_ms=600_000)
    clock = ManualClock(time.time_ns() // 1_000_000)
    acker = p.start_acker(clock=clock)
    p.start_task(lambda record, t: "drop" if t.attempt == 1 else "ack")  # no warm-up: all drop
    result = p.source.send(p.topic, b"k", b"v")
    p.source.flush()
    p.wait(lambda: acker.counters()["registered"] >= 1 and bool(p.seen), "registration and the drop")
    clock.advance(300_000)  # half-way: nothing expires
    # Two commit rounds begin after the step, so the first one (which expires with the new
    # time) has finished. (_last_commit: when the acker's latest commit round began.)
    for _ in range(2):
        mark = time.monotonic()

        def committed_since(mark: float = mark) -> bool:
            return acker._last_commit > mark

        p.wait(committed_since, "a commit round", limit_s=30)
    assert acker.counters()["timed_out"] == 0 and not p.tail.log.replays()

    # Past the deadline: created_ms is the wall time of the send, a moment after the clock's
    # start, so step well beyond start + timeout.
    clock.advance(360_000)
    # It times out, then waits its back-off (DEFAULT_RETRY: 0.5 s +-20 %) on the same clock.
    p.wait(lambda: acker.counters()["timed_out"] == 1, "the timeout")
    assert acker.counters()["replayed"] == 0
    clock.advance(1_000)
    p.wait(p.completed({result.origin}), "the replay to complete")
    counters = acker.counters()
    assert (counters["timed_out"], counters["replayed"], counters["completed"]) == (1, 1, 1)
    (msg,) = p.read(p.replay)
    assert (tracking_of(msg).origin, msg.partition()) == (result.origin, result.key_hash_partition)
    assert tracking_of(msg).attempt == 2
    outcome_headers = [
        outcome_of(m.headers()) for m in p.read(p.ns.persist, p.ledger_partitions) if m.value() is None
    ]
    assert sorted(outcome_headers) == [b"completed", b"replay"]


def test_demo_cli_loses_nothing_with_failures_and_drops(bootstrap: str) -> None:
    proc = subprocess.run(
        [
            sys.executable, "-m", "broker.cli", "demo", "--bootstrap", bootstrap, "--records", "3000",
            "--fail-rate", "0.1", "--drop-rate", "0.02", "--timeout-ms", "3000", "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["lost"] == 0
    assert summary["completed"] == 3000
    assert summary["completed_twice"] == 0
    assert summary["acker_exit_code"] == 0
    # ~10 % failed + ~2 % dropped first attempts, each replayed once
    assert 0.08 * 3000 < summary["replayed"] < 0.16 * 3000
