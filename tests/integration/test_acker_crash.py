"""kill -9 the acker process again and again during a run; nothing may be lost, completed
twice or completed early (issue #3, docs/design.md §4-§5).

The acker runs as ``replaybroker acker --instance-id <fixed>`` and is killed with SIGKILL at
random moments (after it has visibly resumed serving) at least ``KILLS`` times while a
source streams 20 000 records through fan-out -> leaf; each time it is restarted with the
same instance id. The record timeout is 600 s, so no timeout and no replay can hide a
folding error: every record must complete through correct folding alone.

Checked against the test's own ground truth (see test_ledger_pipeline.py for the method):
the tasks record every event they send, ``ns.acks`` / ``ns.persist`` carry broker append
times, and each completion tombstone must come after the last event of its tree with all
of the tree's events in ``ns.acks``. Also: exactly one ``completed`` tombstone per origin
and no other outcome, no live entry left in the changelog, and the acker's exactly-once
counters (``ns.ledger``) equal the ground truth - ``folded`` equals the pairs in ``ns.acks``.

The test must be able to fail. The same scenario with ``--unsafe-no-transactions`` (input
offsets committed after, not with, the outputs and the changelog) is expected to FAIL; it
is not part of the suite. Show it with either::

    REPLAYBROKER_SHOW_UNSAFE=1 pytest tests/integration/test_acker_crash.py   # adds [unsafe]
    python -m tests.integration.test_acker_crash --bootstrap HOST:PORT [--unsafe] [--kills N]

A kill between the unsafe acker's flush and its offset commit makes the restarted acker
fold the same input again on top of a changelog that already holds it: seen so far as
records that never complete (their events cancelled out), origins completed twice, and
``folded`` / ``registered`` / ``duplicate_roots`` counters above the ground truth.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Message,
    Producer,
)

from broker import topics
from broker.dev.testing import create_topics, unique_name
from broker.kafka_io import read_to_end
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import TaskContext, TaskRecord
from tests.integration.ground_truth import (
    LOG_APPEND_TIME,
    GroundTruth,
    PersistWatch,
    TruthTask,
    fan_out_of,
    read_changelog,
    read_events,
)

pytestmark = pytest.mark.integration

RECORDS = 20_000
KILLS = 5
P = 4
TIMEOUT_MS = 600_000
# A killed member holds its partitions until its session times out (the acker's
# session.timeout.ms, 10 s): one kill cycle is ~10.5 s. The source spreads the records over
# the kill phase so records are always in flight when the acker dies.
CYCLE_S = 10.5
# When to kill: a random moment in the first half second after the restarted acker is seen
# completing again - while it works through the backlog its downtime left, i.e. while its
# commits are biggest and most of its time is spent inside them.
KILL_WINDOW_S = (0.0, 0.5)
SERVE_DEADLINE_S = 60.0  # a restarted acker must resume serving within this
DRAIN_DEADLINE_S = 60.0
STALL_S = 20.0  # no completion for this long after the last kill: the rest never will


class BrokerClock:
    """The broker's time: the append time of a probe record (a LogAppendTime topic)."""

    def __init__(self, settings: KafkaSettings, topic: str) -> None:
        self.topic = topic
        self._producer = Producer(settings.producer_config())

    def now_ms(self) -> int:
        stamps: list[tuple[int, int]] = []
        self._producer.produce(self.topic, value=b"", on_delivery=lambda err, msg: stamps.append(msg.timestamp()))
        assert self._producer.flush(30) == 0 and stamps
        ts_type, ts = stamps[0]
        assert ts_type == TIMESTAMP_LOG_APPEND_TIME
        return ts

    def close(self) -> None:
        self._producer.flush(10)


def read_all(settings: KafkaSettings, topic: str, partitions: int = P) -> list[Message]:
    """Every committed message of ``topic``, read from the beginning to the end."""
    return read_to_end(settings, topic, partitions)


@dataclass
class CrashReport:
    transactional: bool
    seed: int
    records: int
    kills: int = 0
    kill_after_s: list[float] = field(default_factory=list)  # after the acker resumed serving
    completed: int = 0
    completed_twice: int = 0
    not_completed: int = 0
    other_outcomes: dict[str, int] = field(default_factory=dict)  # replay / dlq tombstones
    early: int = 0  # completed before the last event of the tree, or with events missing
    live_changelog_entries: int = 0
    pairs_in_acks: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    examples: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        c = self.counters
        found = []
        if self.not_completed:
            found.append(f"{self.not_completed} of {self.records} records never completed")
        if self.completed_twice:
            found.append(f"{self.completed_twice} origins completed more than once")
        if self.early:
            found.append(f"{self.early} records completed before their tree was acked")
        if self.other_outcomes:
            found.append(f"tombstones other than 'completed': {self.other_outcomes}")
        if self.live_changelog_entries:
            found.append(f"{self.live_changelog_entries} entries left in the changelog")
        if c.get("folded") != self.pairs_in_acks:
            found.append(f"acker folded {c.get('folded')} pairs, ns.acks holds {self.pairs_in_acks}")
        for name, want in (("registered", self.records), ("completed", self.records)):
            if c.get(name) != want:
                found.append(f"counter {name}={c.get(name)}, want {want}")
        for name in ("duplicate_roots", "timed_out", "failed", "replayed", "dlq", "orphans", "quarantined"):
            if c.get(name, 0):
                found.append(f"counter {name}={c[name]}, want 0")
        return found


def _start_acker(bootstrap: str, ns: topics.Namespace, log_path: Path, transactional: bool) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "broker.cli", "acker", "--bootstrap", bootstrap,
            "--namespace", ns.name, "--instance-id", f"{ns.name}-acker"]
    if not transactional:
        args.append("--unsafe-no-transactions")
    with log_path.open("ab") as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)


def run_crash_scenario(
    bootstrap: str,
    workdir: Path,
    *,
    transactional: bool = True,
    records: int = RECORDS,
    kills: int = KILLS,
    seed: int | None = None,
    kill_window_s: tuple[float, float] = KILL_WINDOW_S,
) -> CrashReport:
    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    report = CrashReport(transactional, seed, records)
    started = time.monotonic()
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("crash"))
    orders, enriched = f"{ns.name}.orders", f"{ns.name}.enriched"
    topics.create(
        settings, ns, P, {orders: P, enriched: P},
        overrides={ns.persist: LOG_APPEND_TIME, ns.acks: LOG_APPEND_TIME},
    )
    clock_topic = f"{ns.name}.clock"
    create_topics(bootstrap, {clock_topic: 1}, LOG_APPEND_TIME)
    clock = BrokerClock(settings, clock_topic)
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

    sent: dict[int, int] = {}
    source_error: list[BaseException] = []
    stop = threading.Event()

    def stream() -> None:
        """Send ``records`` at a steady pace that spans the kill phase."""
        per_tick, tick_s = max(1, int(records / (kills * CYCLE_S) * 0.1)), 0.1
        try:
            with Source(settings, ns, SourceConfig(timeout_ms=TIMEOUT_MS)) as source:
                next_at = time.monotonic()
                while len(sent) < records and not stop.is_set():
                    for _ in range(min(per_tick, records - len(sent))):
                        result = source.send(orders, f"customer-{len(sent) % 997}", b"order-%d" % len(sent))
                        sent[result.srid] = result.origin
                    next_at += tick_s
                    time.sleep(max(0.0, next_at - time.monotonic()))  # pacing, not synchronisation
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            source_error.append(exc)

    tasks = [
        TruthTask(truth, settings, ns, [orders, topics.replay_topic(orders)], unique_name("fan-out"), fan_out),
        TruthTask(truth, settings, ns, [enriched], unique_name("leaf"), leaf),
    ]
    threads = [threading.Thread(target=t.run, daemon=True) for t in tasks]
    source_thread = threading.Thread(target=stream, daemon=True)
    log_path = workdir / f"acker-{ns.name}.log"
    watch = PersistWatch(settings, ns, P)
    acker = _start_acker(bootstrap, ns, log_path, transactional)

    def fail(why: str) -> None:
        lines = log_path.read_text(errors="replace").splitlines()[-25:]
        raise AssertionError(
            f"{why} (seed {seed}; sent {len(sent)}, source error {source_error}, "
            f"tasks {[t.counters for t in tasks]}); acker log {log_path}:\n" + "\n".join(lines)
        )

    try:
        for thread in [*threads, source_thread]:
            thread.start()
        for _ in range(kills):
            # The acker serves again once a completion is appended after it started: the
            # killed instance can append nothing after its death (and its open transaction
            # is aborted).
            started_ms = clock.now_ms()
            deadline = time.monotonic() + SERVE_DEADLINE_S
            while watch.last_completion_ms <= started_ms:
                if not source_thread.is_alive() and watch.completed >= sent.keys():
                    break  # everything sent completed before this instance started: nothing to serve
                if acker.poll() is not None:
                    fail(f"the acker exited with {acker.returncode}")
                if time.monotonic() > deadline:
                    fail("the acker did not resume serving")
                watch.poll(0.1)
            after = rng.uniform(*kill_window_s)
            until = time.monotonic() + after
            while (left := until - time.monotonic()) > 0:
                watch.poll(min(0.1, left))
            acker.kill()  # SIGKILL: no revoke, no commit, no flush
            acker.wait()
            report.kills += 1
            report.kill_after_s.append(round(after, 3))
            acker = _start_acker(bootstrap, ns, log_path, transactional)

        source_thread.join(DRAIN_DEADLINE_S)
        if source_thread.is_alive():
            fail("the source did not finish sending")
        if source_error:
            raise source_error[0]
        last_progress, deadline = time.monotonic(), time.monotonic() + DRAIN_DEADLINE_S
        while not watch.completed >= sent.keys():
            if acker.poll() is not None:
                fail(f"the acker exited with {acker.returncode}")
            if watch.poll(0.2):
                last_progress = time.monotonic()
            if time.monotonic() > min(deadline, last_progress + STALL_S):
                break
    finally:
        stop.set()
        for task in tasks:
            task.stop()
        for thread in threads:
            thread.join(30)
        if acker.poll() is None:
            acker.terminate()
            try:
                acker.wait(30)
            except subprocess.TimeoutExpired:
                acker.kill()
                acker.wait()
        watch.drain()
        watch.close()
        clock.close()

    events = read_events(settings, ns, P)
    report.pairs_in_acks = sum(len(v) for v in events.values())
    report.live_changelog_entries, report.counters = read_changelog(settings, ns)
    other: Counter[str] = Counter()
    for srid, origin in sent.items():
        outcomes = watch.tombstones.get(srid, [])
        other.update(o for o, _ in outcomes if o != "completed")
        done = [ts for o, ts in outcomes if o == "completed"]
        report.completed += bool(done)
        report.completed_twice += len(done) > 1
        report.not_completed += not done
        expected = truth.events.get(srid, [])
        seen = events.get(srid, [])
        if done and len(expected) != 1 + fan_out_of(origin):
            report.early += 1
            report.examples.append(f"{srid}: completed, but the tasks sent only {len(expected)} events")
            continue
        if done:
            last = max((ts for _, ts in seen), default=None)
            missing = Counter(expected) - Counter(x for x, ts in seen if ts <= done[0])
            if last is None or done[0] < last or missing:
                report.early += 1
                report.examples.append(
                    f"{srid}: completed at {done[0]}, last event {last}, {sum(missing.values())} events missing"
                )
    report.other_outcomes = dict(other)
    report.seconds = round(time.monotonic() - started, 1)
    return report


MODES = [True] + ([False] if os.environ.get("REPLAYBROKER_SHOW_UNSAFE") == "1" else [])


@pytest.mark.parametrize("transactional", MODES, ids=lambda t: "transactional" if t else "unsafe")
def test_kill_9_acker_loses_nothing_and_completes_nothing_early(
    bootstrap: str, tmp_path: Path, transactional: bool
) -> None:
    report = run_crash_scenario(bootstrap, tmp_path, transactional=transactional)
    assert report.kills >= KILLS
    problems = report.problems()
    assert not problems, (
        "\n".join(problems) + "\n" + json.dumps(asdict(report), indent=1)[:3000]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"), required=False)
    parser.add_argument("--unsafe", action="store_true", help="acker with --unsafe-no-transactions")
    parser.add_argument("--records", type=int, default=RECORDS)
    parser.add_argument("--kills", type=int, default=KILLS)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--kill-window", type=float, nargs=2, default=KILL_WINDOW_S, metavar=("FROM", "TO"))
    args = parser.parse_args()
    if not args.bootstrap:
        parser.error("--bootstrap (or KAFKA_BOOTSTRAP_SERVERS) is required")
    workdir = Path(tempfile.mkdtemp(prefix="replaybroker-crash-"))
    report = run_crash_scenario(
        args.bootstrap, workdir, transactional=not args.unsafe,
        records=args.records, kills=args.kills, seed=args.seed,
        kill_window_s=tuple(args.kill_window),
    )
    problems = report.problems()
    print(json.dumps({**asdict(report), "examples": report.examples[:5], "problems": problems}, indent=1))
    print(f"acker log in {workdir}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
