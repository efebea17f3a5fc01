"""Chaos: SIGKILLs of ackers and tasks at random moments and a crash of the broker itself,
while records flow source -> fan-out (1-3) -> leaf (5 % explicit fails, 1 % silent drops,
outputs to a sink topic). Afterwards, from what the topics hold (never from what the code
under test believes):

- every record the source confirmed is either completed - once - with ALL of its outputs in
  the sink (so no tree completed before its leaves wrote), or dead-lettered in ``ns.dlq``;
- no origin completed twice, none both completed and dead-lettered;
- the acker's exactly-once counters (``ns.ledger``) equal what the topics show: completed
  and replay tombstones in ``ns.persist``, records in ``ns.dlq``, persist records folded.

The sources keep the default back-off (``DEFAULT_RETRY``): a failed attempt waits in the ledger
for its turn - in the changelog, across the kills and takeovers - before its replay.

Two ackers run (one ``--standby``); the scenario has its own embedded broker, so that it can
kill -9 it mid-run and bring it back on the same data and ports. The same checks run on:

- the cycle pipeline (``kind="cycle"``: a task feeding records back into its own input until
  they converge), where a completion must follow the result of its attempt's last iteration;
- a network partition: acker-1 behind a TCP proxy (tests.integration.partition) that is cut
  for longer than the session timeout, then healed;
- the fates of failed attempts across takeovers (``run_fates``, on the shared broker): kill -9
  of the ackers must not turn explicit failures into timeouts.

The default is sized for CI; the long run is::

    python -m tests.integration.test_chaos run --records 20000 --kills 100

``--lose-outputs`` plants a bug (the leaf acks 1 % of its inputs without writing their output;
with ``--kind cycle``, 0.2 % of the iterations end their loop early) to show the checks fail;
``--unsafe`` runs the ackers without transactions.

Workers (the task stages) run as ``python -m tests.integration.test_chaos fanout|leaf|step``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from broker import ids, topics
from broker.completions import OutcomeLog, OutcomeTail
from broker.dev.faults import skip_ack
from broker.dev.kafka_cluster import LocalCluster
from broker.dev.kafka_local import LocalKafka
from broker.dev.testing import create_topics, unique_name
from broker.headers import H_ORIGIN, H_REASON
from broker.kafka_io import read_to_end
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from tests.integration.ground_truth import (
    LOG_APPEND_TIME,
    Attempts,
    fan_out_of,
    group_owners,
    read_changelog,
    read_fail_marks,
    wait_assigned,
)
from tests.integration.partition import PartitionProxy, ProxiedKafka
from tests.integration.test_cycles import collatz_steps

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
P = 4
FAIL_RATE, DROP_RATE = 0.05, 0.01
TIMEOUT_MS = 20_000
MAX_ATTEMPTS = 5
# Task members must be replaced quickly after a kill (the broker's minimum session timeout).
TASK_CONSUMER = {"session.timeout.ms": 6_000, "heartbeat.interval.ms": 1_000}


def _draw(record_id: int, salt: bytes) -> float:
    digest = hashlib.blake2b(record_id.to_bytes(8, "big", signed=True) + salt, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _names(ns: str) -> tuple[str, str, str]:
    return f"{ns}.orders", f"{ns}.enriched", f"{ns}.sink"


def _cycle_names(ns: str) -> tuple[str, str]:
    return f"{ns}.loop", f"{ns}.results"


CYCLE_BOUND = 50
"""The iteration bound of the cycle pipeline (the user's code bounds its loop)."""
CYCLE_DROP_RATE = 0.002  # per iteration: about 5 % of the records lose one and are replayed


def _cycle_start(k: int) -> int:
    return 1 + k % 200


# Early: the completed origins whose outputs show they completed too soon; from the sink
# topic, the origins sent (origin -> index k) and the outcomes.
EarlyCheck = Callable[[KafkaSettings, dict[int, int], OutcomeLog], list[int]]


@dataclass(frozen=True)
class Pipeline:
    """A scenario's task stages (``main``'s worker commands, one process each), the topic its
    records enter, its data topics (each with a replay topic), its sink (outputs, broker
    time) and the check of the outputs against the outcomes."""

    workers: tuple[str, ...]
    entry: str
    data: tuple[str, ...]
    sink: str
    value: Callable[[int], bytes]
    early: EarlyCheck


def pipeline(kind: str, ns: str) -> Pipeline:
    """``tree``: fan-out (1-3 children) -> leaf (fails, drops, sink outputs); ``cycle``: a
    task that feeds each record back into its own input until it converges (test_cycles)."""
    if kind == "tree":
        orders, enriched, sink = _names(ns)
        return Pipeline(("fanout", "leaf"), orders, (orders, enriched), sink, lambda k: b"order %d" % k,
                        partial(_without_all_outputs, sink))
    loop, results = _cycle_names(ns)
    return Pipeline(("step",), loop, (loop,), results, lambda k: b"%d:%d:0" % (_cycle_start(k), _cycle_start(k)),
                    partial(_before_last_iteration, results))


# --------------------------------------------------------------------------- workers


def run_fanout(bootstrap: str, namespace: str) -> None:
    orders, enriched, _ = _names(namespace)

    def handle(record: TaskRecord, ctx: TaskContext) -> None:
        origin = record.tracking.origin if record.tracking else 0
        for i in range(fan_out_of(origin)):
            ctx.emit(enriched, record.key, b"%d" % i)

    Task(
        KafkaSettings.from_env(bootstrap), namespace, [orders, topics.replay_topic(orders)],
        f"{namespace}.fanout", handle, TaskConfig(consumer=TASK_CONSUMER),
    ).run(install_signals=True)


def run_leaf(bootstrap: str, namespace: str, lose_outputs: bool = False) -> None:
    _, enriched, sink = _names(namespace)

    def handle(record: TaskRecord, ctx: TaskContext) -> None:
        tracking = record.tracking
        assert tracking is not None
        draw = _draw(tracking.record_id, b"leaf")  # per record: every attempt draws anew
        if draw < FAIL_RATE:
            ctx.fail("injected failure")
        elif draw < FAIL_RATE + DROP_RATE:
            skip_ack(ctx)
        elif lose_outputs and draw > 0.99:
            return  # a planted bug: acked without its output (the checks must catch it)
        else:
            ctx.output(sink, record.key, b"%d|%s" % (tracking.origin, record.value or b""))

    Task(
        KafkaSettings.from_env(bootstrap), namespace, [enriched], f"{namespace}.leaf", handle,
        TaskConfig(consumer=TASK_CONSUMER),
    ).run(install_signals=True)


def run_step(bootstrap: str, namespace: str, lose_outputs: bool = False) -> None:
    """One iteration of the Collatz map per record (value ``start:n:hops``), fed back into
    its own input until n is 1 or the bound is reached; then the result goes to the sink,
    with the srid of the attempt that reached it. An iteration is dropped silently now and
    then (CYCLE_DROP_RATE): its record times out and goes round its loop again."""
    loop, results = _cycle_names(namespace)

    def handle(record: TaskRecord, ctx: TaskContext) -> None:
        tracking = record.tracking
        assert tracking is not None
        draw = _draw(tracking.record_id, b"step")
        if draw < CYCLE_DROP_RATE:
            skip_ack(ctx)
            return
        if lose_outputs and draw > 0.998:
            return  # a planted bug: the loop ends early, acked without its next iteration
        start, n, hops = (int(x) for x in (record.value or b"1:1:0").split(b":"))
        if n == 1 or hops >= CYCLE_BOUND:
            ctx.output(results, record.key, b"%d|%d|%d|%d" % (tracking.origin, tracking.srid, start, hops))
            return
        ctx.emit(loop, record.key, b"%d:%d:%d" % (start, n // 2 if n % 2 == 0 else 3 * n + 1, hops + 1))

    Task(
        KafkaSettings.from_env(bootstrap), namespace, [loop, topics.replay_topic(loop)], f"{namespace}.step", handle,
        TaskConfig(consumer=TASK_CONSUMER),
    ).run(install_signals=True)


# --------------------------------------------------------------------------- the scenario


@dataclass
class ChaosReport:
    seed: int
    records: int
    sent: int = 0
    kills: dict[str, int] = field(default_factory=dict)
    broker_restarts: int = 0
    completed: int = 0
    dead_lettered: int = 0
    replays: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    brokers: int = 1
    crashed_nodes: list[int] = field(default_factory=list)
    replication_problems: list[str] = field(default_factory=list)


class Processes:
    """The services of the scenario, each restartable after a SIGKILL."""

    def __init__(
        self, bootstrap: str, namespace: str, logs: Path, *, unsafe: bool = False, lose_outputs: bool = False,
        workers: tuple[str, ...] = ("fanout", "leaf"), acker_bootstrap: dict[str, str] | None = None,
    ) -> None:
        """``workers``: the task stages (``main``'s worker commands), each one process;
        ``acker_bootstrap``: an acker's own bootstrap (a proxy in front of the broker)."""
        self.logs = logs
        py = [sys.executable, "-m"]

        def acker(name: str) -> list[str]:
            at = (acker_bootstrap or {}).get(name, bootstrap)
            return [*py, "broker", "acker", "--bootstrap", at, "--namespace", namespace,
                    *(["--unsafe-no-transactions"] if unsafe else [])]  # to show that the scenario can fail

        self.commands = {
            "acker-1": [*acker("acker-1"), "--instance-id", f"{namespace}-a1"],
            "acker-2": [*acker("acker-2"), "--instance-id", f"{namespace}-a2", "--standby"],
        }
        for worker in workers:
            self.commands[worker] = [*py, "tests.integration.test_chaos", worker, bootstrap, namespace,
                                     *(["--lose-outputs"] if lose_outputs else [])]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.exited_on_their_own: list[str] = []  # found dead by a kill, before their restart
        self.refused_at_start: list[str] = []  # started during the broker's outage: exited 2
        for name in self.commands:
            self.start(name)

    def note(self, what: str) -> None:
        """The harness's own timeline (``harness.log``), printed with the services' logs."""
        with (self.logs / "harness.log").open("a") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {what}\n")

    def _mark(self, name: str, what: str) -> None:
        """A line in the service's log too: its log then shows the harness's kills and starts."""
        self.note(f"{name}: {what}")
        with (self.logs / f"{name}.log").open("a") as log:
            log.write(f"===== {time.strftime('%Y-%m-%d %H:%M:%S')} harness: {what}\n")

    def start(self, name: str) -> None:
        self._mark(name, "start")
        with (self.logs / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                self.commands[name], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )

    def restart_refused(self) -> None:
        """What a supervisor does once the broker is back: start again the services that
        refused to start while it was down."""
        for name, proc in self.procs.items():
            if proc.poll() is not None and self._refused_to_start(name):
                self.refused_at_start.append(name)
                self._mark(name, f"exited {proc.returncode} (cannot reach Kafka); restarted")
                self.start(name)

    def _refused_to_start(self, name: str) -> bool:
        lines = [line for line in (self.logs / f"{name}.log").read_text(errors="replace").splitlines()
                 if line.strip() and not line.startswith("=====")]
        return bool(lines) and lines[-1].startswith("replaybroker: cannot reach Kafka")

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        exited = proc.poll()
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        if exited is not None and self._refused_to_start(name):
            # It started while the broker was down and refused, as a service must when it
            # cannot reach its cluster (one line, exit 2); a supervisor starts it again.
            self.refused_at_start.append(name)
        elif exited is not None:  # found dead: restarting it would hide that
            self.exited_on_their_own.append(f"{name} (exit code {exited})")
        self._mark(name, "kill -9" if exited is None else f"kill -9 (it had exited with {exited})")

    def died(self) -> list[str]:
        """Services that exited by themselves (the killed ones were restarted at once)."""
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


REACH_WAIT_S = 12.0
"""How long a starting service tries to reach its cluster before it refuses (``cli.REACH_TIMEOUT_S``
plus its start-up)."""


def _crash(rng: random.Random, procs: Processes, kafka: LocalKafka | LocalCluster, report: ChaosReport) -> None:
    """kill -9 the broker (or one random node of a cluster) and bring it back on its data."""
    procs.note("crashing the broker" + (" (one node)" if isinstance(kafka, LocalCluster) else ""))
    if isinstance(kafka, LocalCluster):
        node = rng.randrange(kafka.nodes)
        kafka.kill(node)
        time.sleep(rng.uniform(1.0, 3.0))
        kafka.restart(node)
        report.crashed_nodes.append(node)
    else:
        kafka.kill()
        time.sleep(rng.uniform(1.0, 3.0))
        kafka.restart()
    report.broker_restarts += 1
    procs.note("the broker is back")
    time.sleep(REACH_WAIT_S)  # a service started just before the crash gives up after this
    procs.restart_refused()


def _chaos(rng: random.Random, procs: Processes, kafka: LocalKafka | LocalCluster | None, kills: int,
           report: ChaosReport, stop: threading.Event, victims: list[str] | None = None) -> None:
    """``kills`` SIGKILLs of random services (of ``victims``: all) at random moments; the
    broker (one node of a cluster), when given, crashes once, half way through. Every killed
    service is restarted after a random pause."""
    try:
        _kill_and_restart(rng, procs, kafka, kills, report, stop, victims or sorted(procs.commands))
    except Exception as exc:  # noqa: BLE001 - a harness failure is a finding, reported with the logs
        report.problems.append(f"the chaos thread failed: {exc!r}")


def _kill_and_restart(rng: random.Random, procs: Processes, kafka: LocalKafka | LocalCluster | None, kills: int,
                      report: ChaosReport, stop: threading.Event, names: list[str]) -> None:
    for n in range(kills):
        if stop.wait(rng.uniform(0.5, 2.5)):
            return
        if n == kills // 2 and kafka is not None:
            _crash(rng, procs, kafka, report)
        victim = rng.choice(names)
        procs.kill(victim)
        report.kills[victim] = report.kills.get(victim, 0) + 1
        time.sleep(rng.uniform(0.0, 1.5))
        procs.start(victim)


def run_chaos(workdir: Path, *, records: int = 2_000, kills: int = 20, seed: int | None = None,
              send_s: float = 30.0, drain_s: float = 240.0, unsafe: bool = False,
              lose_outputs: bool = False, brokers: int = 1, kind: str = "tree") -> ChaosReport:
    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    report = ChaosReport(seed, records, brokers=brokers)
    started = time.monotonic()
    kafka: LocalKafka | LocalCluster = (
        LocalKafka(workdir / "kafka", heap="512m") if brokers == 1 else LocalCluster(brokers, workdir / "cluster")
    )
    kafka.start()
    procs: Processes | None = None
    try:
        bootstrap = kafka.bootstrap
        settings = KafkaSettings.from_env(bootstrap)
        ns = topics.Namespace(unique_name("chaos"))
        pipe = pipeline(kind, ns.name)
        _create(settings, ns, pipe, min(brokers, 3))
        report.replication_problems, _ = topics.check_replication(settings, ns, list(pipe.data))
        logs = workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        procs = Processes(bootstrap, ns.name, logs, unsafe=unsafe, lose_outputs=lose_outputs, workers=pipe.workers)

        stop = threading.Event()
        chaos = threading.Thread(target=_chaos, args=(rng, procs, kafka, kills, report, stop), daemon=True)
        chaos.start()
        sent = _send(settings, ns, pipe.entry, records, send_s,
                     SourceConfig(timeout_ms=TIMEOUT_MS, max_attempts=MAX_ATTEMPTS), pipe.value)
        report.sent = len(sent)
        chaos.join()  # the kills outlast the sending; wait for the last restart
        stop.set()
        _stop_and_check(report, settings, ns, sent, _drain(settings, ns, sent, drain_s), procs, pipe)
    finally:
        if procs is not None:
            procs.stop()
        kafka.stop()
    report.seconds = round(time.monotonic() - started, 1)
    if report.problems:
        _print_logs(workdir)
    return report


def _send(settings: KafkaSettings, ns: topics.Namespace, topic: str, records: int, send_s: float,
          config: SourceConfig, value: Callable[[int], bytes]) -> dict[int, int]:
    """Send ``records`` records (the k-th with ``value(k)``) over ``send_s`` seconds. The
    ground truth of what entered, origin -> k: records whose persist AND data records the
    broker confirmed (a chunk counts only once its flush succeeded)."""
    source = Source(settings, ns, config)
    sent: dict[int, int] = {}
    chunk = max(1, records // 100)
    for i in range(0, records, chunk):
        batch = {source.send(topic, f"customer-{k % 97}", value(k)).origin: k for k in range(i, min(records, i + chunk))}
        source.flush()
        sent.update(batch)
        time.sleep(send_s / 100)
    source.close()
    return sent


def _drain(settings: KafkaSettings, ns: topics.Namespace, sent: dict[int, int], drain_s: float) -> OutcomeTail:
    """Tail the outcomes until every origin of ``sent`` completed or was dead-lettered (or
    ``drain_s`` passed)."""
    tail = OutcomeTail(settings, ns)
    deadline = time.monotonic() + drain_s
    while time.monotonic() < deadline:
        tail.poll(0.5)
        if sent.keys() <= set(tail.log.completed_origins()) | tail.log.dlq_origins():
            break
    tail.poll(1.0)
    tail.close()
    return tail


def _stop_and_check(report: ChaosReport, settings: KafkaSettings, ns: topics.Namespace, sent: dict[int, int],
                    tail: OutcomeTail, procs: Processes, pipe: Pipeline) -> None:
    # Found dead at a kill (then restarted) or dead at the end: a service exited on its own.
    died = procs.exited_on_their_own + procs.died()
    procs.stop()
    _check(report, settings, ns, sent, tail, died, pipe.early)


def _create(settings: KafkaSettings, ns: topics.Namespace, pipe: Pipeline, replication: int = 1) -> None:
    """The namespace, the pipeline's data topics with their replay topics, its sink."""
    topics.create(settings, ns, P, dict.fromkeys(pipe.data, P))  # replication 3 / min.insync 2 on 3 brokers
    create_topics(settings.bootstrap_servers, {pipe.sink: P}, LOG_APPEND_TIME, replication=replication)


def _print_logs(workdir: Path) -> None:
    """The end of every service's and broker node's log: what a failed run needs to be read."""
    paths = sorted((workdir / "logs").glob("*.log")) + sorted(workdir.glob("*/node-*/server.log")) + sorted(
        workdir.glob("kafka/**/server.log"))
    for path in paths:
        lines = path.read_text(errors="replace").splitlines()
        print(f"===== {path.relative_to(workdir)} (last 60 of {len(lines)} lines)")
        print("\n".join(lines[-60:]))


def _without_all_outputs(sink: str, settings: KafkaSettings, sent: dict[int, int], log: OutcomeLog) -> list[int]:
    """The tree: completed origins whose sink lacks one of their leaf outputs."""
    outputs: dict[int, set[bytes]] = defaultdict(set)
    for msg in read_to_end(settings, sink, P):
        origin, _, index = (msg.value() or b"").partition(b"|")
        outputs[int(origin)].add(index)
    return [o for o in log.completed_origins() if o in sent
            and outputs.get(o, set()) != {b"%d" % i for i in range(fan_out_of(o))}]


def _before_last_iteration(sink: str, settings: KafkaSettings, sent: dict[int, int], log: OutcomeLog) -> list[int]:
    """The cycle: completed origins without the result of a last iteration - as many as the
    Collatz map of the start takes, up to the bound - written before the completion (broker
    time of the result, the acker's of the tombstone: one machine). Any attempt's result
    counts: a replay whose original completed late is tombstoned completed too."""
    results: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # origin -> (start, hops, ms)
    for msg in read_to_end(settings, sink, P):
        origin, _, start, hops = (int(x) for x in (msg.value() or b"0|0|0|0").split(b"|"))
        results[origin].append((start, hops, msg.timestamp()[1]))
    early = []
    for origin, events in log.outcomes.items():
        if origin not in sent:
            continue
        start = _cycle_start(sent[origin])
        last = (start, min(collatz_steps(start), CYCLE_BOUND))
        for _, outcome, ms in events:
            if outcome == "completed" and not any((s, h) == last and t <= ms for s, h, t in results[origin]):
                early.append(origin)
    return early


def _check(report: ChaosReport, settings: KafkaSettings, ns: topics.Namespace, sent: dict[int, int],
           tail: OutcomeTail, died: list[str], early: EarlyCheck) -> None:
    """From the topics: every origin of ``sent`` completed once or was dead-lettered, and
    ``early`` (the completed origins whose outputs show they completed too soon) is empty;
    the acker's committed counters equal what the topics show."""
    problems = report.problems
    if died:
        problems.append(f"services exited on their own: {died}")
    log = tail.log
    completed = log.completed_origins()  # origin -> completions
    dlq_msgs = [m for m in read_to_end(settings, ns.dlq, 1)
                if not (dict(m.headers() or ()).get(H_REASON) or b"").startswith(b"quarantine")]
    dead = {ids.decode_id(dict(m.headers() or ())[H_ORIGIN]) for m in dlq_msgs}
    report.completed = len(completed.keys() & sent.keys())
    report.dead_lettered = len(dead & sent.keys())
    report.replays = log.replays()

    lost = sent.keys() - completed.keys() - dead
    if lost:
        problems.append(f"{len(lost)} records neither completed nor dead-lettered, e.g. {sorted(lost)[:3]}")
    twice = [o for o, n in completed.items() if n > 1]
    if twice:
        problems.append(f"{len(twice)} origins completed more than once")
    both = set(completed) & dead
    if both:
        problems.append(f"{len(both)} origins both completed and dead-lettered")
    too_soon = early(settings, sent, log)
    if too_soon:
        problems.append(f"{len(too_soon)} origins completed without all their outputs, e.g. {too_soon[:3]}")
    if len(dlq_msgs) != len(dead):
        problems.append(f"{len(dlq_msgs)} DLQ records for {len(dead)} origins")

    _, counters = read_changelog(settings, ns, P)
    report.counters = counters
    tombstones = Counter(outcome for outs in log.outcomes.values() for _, outcome, _ in outs)
    # A settled superseded replay is tombstoned "completed" too (its origin completed through
    # the original attempt): counted apart, as superseded_settled.
    counters = {**counters, "completed": counters.get("completed", 0) + counters.get("superseded_settled", 0)}
    want = {
        "completed": tombstones["completed"],
        "replayed": tombstones["replay"],
        "dlq": len(dlq_msgs),
        "registered": len(sent) + tombstones["replay"],
    }
    for name, value in want.items():
        if counters.get(name, 0) != value:
            problems.append(f"counter {name}={counters.get(name, 0)}, the topics show {value}")
    if tombstones["replay"] and not counters.get("replays_backed_off", 0):
        problems.append(f"{tombstones['replay']} replays and not one waited its back-off (DEFAULT_RETRY)")


# --------------------------------------------------------------------------- fates across takeovers

FATE_TIMEOUT_MS, FATE_MAX_ATTEMPTS = 5_000, 10
MARK_MARGIN_MS = 1_000
"""A fail mark written this long before its attempt's deadline must decide the attempt as a
failure: the acker judges a deadline only once it has read its inputs up to a high watermark
sampled at or after that deadline (broker.acker.lag), so the mark has been read by then. The
margin covers the mark's create time (the task's clock) preceding its append, and a cached
watermark that is a fetch wait old; a mark later than that may lose to the clock, rightly."""


@dataclass
class Fates:
    """How the ackers decided the failed attempts of one run: their committed counters, and
    per attempt from the topics."""

    failed: int  # the ackers' committed counters (ns.ledger)
    timed_out: int
    registered: int
    marked: int  # attempts with a fail mark MARK_MARGIN_MS or more before their deadline
    marked_timed_out: list[int]  # of those, decided as a timeout (in their replay's or dead letter's history)


def read_fates(settings: KafkaSettings, ns: topics.Namespace, counters: dict[str, int]) -> Fates:
    attempts = Attempts(settings, ns, P)
    marks = read_fail_marks(settings, ns, P)
    marked = [s for s, ms in marks.items() if s in attempts.deadlines and ms <= attempts.deadlines[s] - MARK_MARGIN_MS]
    return Fates(
        counters.get("failed", 0), counters.get("timed_out", 0), counters.get("registered", 0), len(marked),
        sorted(s for s in marked if attempts.decided.get(s) == "timeout"),
    )


def run_fates(bootstrap: str, workdir: Path, *, records: int, kills: int, seed: int | None = None,
              send_s: float = 30.0, drain_s: float = 240.0) -> tuple[ChaosReport, Fates]:
    """The chaos load (fan-out, leaf with 5 % fails and 1 % drops; 5 s timeout, 10 attempts)
    on the shared broker, with ``kills`` kill -9 of the ackers alone (0: none)."""
    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    report = ChaosReport(seed, records)
    started = time.monotonic()
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("fates"))
    pipe = pipeline("tree", ns.name)
    orders, enriched = pipe.data
    _create(settings, ns, pipe)
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs = Processes(bootstrap, ns.name, logs)
    try:
        wait_assigned(settings, {f"{ns.name}.acker": ns.persist, f"{ns.name}.fanout": orders,
                                 f"{ns.name}.leaf": enriched}, P)
        stop = threading.Event()
        chaos = threading.Thread(target=_chaos, args=(rng, procs, None, kills, report, stop, ["acker-1", "acker-2"]),
                                 daemon=True)
        chaos.start()
        sent = _send(settings, ns, orders, records, send_s,
                     SourceConfig(timeout_ms=FATE_TIMEOUT_MS, max_attempts=FATE_MAX_ATTEMPTS), pipe.value)
        report.sent = len(sent)
        chaos.join()
        stop.set()
        _stop_and_check(report, settings, ns, sent, _drain(settings, ns, sent, drain_s), procs, pipe)
    finally:
        procs.stop()
    fates = read_fates(settings, ns, report.counters)
    report.seconds = round(time.monotonic() - started, 1)
    if report.problems:
        _print_logs(workdir)
    return report, fates


def test_takeovers_keep_every_failure(bootstrap: str, tmp_path: Path) -> None:
    """The same load twice, without kills and with kill -9 of the ackers: a takeover must not
    turn explicit failures into timeouts (a fail mark read, its offset committed, the mark
    itself not in the changelog: its record waits for the timeout instead).

    Exact, per attempt: every attempt failed explicitly well before its deadline (see
    MARK_MARGIN_MS) is decided as a failure in both runs. Between the runs, the committed
    counters ``failed`` and ``timed_out`` per registered attempt agree within noise: which
    attempts fail or are dropped is drawn per record id, so each count is binomial; the two
    rates may differ by 4 standard errors of their difference (a false alarm about once in
    15 000 runs)."""
    records = int(os.environ.get("REPLAYBROKER_FATES_RECORDS", 3_000))
    kills = int(os.environ.get("REPLAYBROKER_FATES_KILLS", 12))
    calm_report, calm = run_fates(bootstrap, tmp_path / "calm", records=records, kills=0)
    kill_report, killed = run_fates(bootstrap, tmp_path / "kills", records=records, kills=kills)
    print(json.dumps({"calm": [asdict(calm_report), asdict(calm)], "kills": [asdict(kill_report), asdict(killed)]}))
    assert calm_report.problems == [], f"seed {calm_report.seed}: {calm_report.problems}"
    assert kill_report.problems == [], f"seed {kill_report.seed}: {kill_report.problems}"
    assert sum(kill_report.kills.values()) == kills
    assert calm.marked_timed_out == []
    assert killed.marked_timed_out == [], (
        f"{len(killed.marked_timed_out)} of {killed.marked} explicit failures decided as timeouts across takeovers"
    )
    for name in ("failed", "timed_out"):
        a, b = getattr(calm, name), getattr(killed, name)
        pooled = (a + b) / (calm.registered + killed.registered)
        noise = math.sqrt(pooled * (1 - pooled) * (1 / calm.registered + 1 / killed.registered))
        difference = b / killed.registered - a / calm.registered
        assert abs(difference) <= 4 * noise, f"{name}: {a} of {calm.registered} without kills, {b} of {killed.registered} with"


# --------------------------------------------------------------------------- a network partition

CUT_S = 25.0
"""How long acker-1 is cut off: longer than the group's session timeout and the transaction
timeout (AckerConfig: 10 s each), so that it is expelled and its partitions are taken over."""


@dataclass
class PartitionReport:
    """What the group coordinator and acker-1's log showed around the cut."""

    owned_before: list[int] = field(default_factory=list)  # acker-1's ledger partitions before the cut
    taken_over: bool = False  # acker-2 owned every partition during the cut
    refusals: list[str] = field(default_factory=list)  # acker-1's log lines: commits refused, partitions lost
    owned_after: list[int] = field(default_factory=list)  # acker-1's partitions once back
    committed_after: dict[int, tuple[int, int]] = field(default_factory=dict)  # of those: offsets, at rejoin -> at the end
    problems: list[str] = field(default_factory=list)


def _acks_committed(admin: AdminClient, group: str, topic: str) -> dict[int, int]:
    """The acker group's committed offsets of ``topic`` (only the owner can commit them)."""
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(P)])
    result = admin.list_consumer_group_offsets([request])[group].result(timeout=30)
    return {tp.partition: tp.offset for tp in result.topic_partitions}


def _owned_by(owners: dict[int, str], suffix: str) -> list[int]:
    return sorted(p for p, member in owners.items() if member.endswith(suffix))


def _cut_and_heal(proxy: PartitionProxy, settings: KafkaSettings, ns: topics.Namespace, logs: Path,
                  cut_after_s: float, drop: bool, out: PartitionReport, rejoined: threading.Event) -> None:
    """Cut acker-1 off ``cut_after_s`` into the load for CUT_S, watching the group, then heal
    and wait until it owns partitions again."""
    admin = AdminClient(settings.client_config())
    group = f"{ns.name}.acker"
    try:
        time.sleep(cut_after_s)
        out.owned_before = _owned_by(group_owners(admin, group, ns.persist), "-a1")
        log = logs / "acker-1.log"
        seen = log.stat().st_size
        proxy.cut(drop=drop)
        (logs / "harness.log").open("a").write(f"{time.strftime('%H:%M:%S')} cut acker-1 off\n")
        cut_ends = time.monotonic() + CUT_S
        while time.monotonic() < cut_ends:
            if len(_owned_by(group_owners(admin, group, ns.persist), "-a2")) == P:
                out.taken_over = True
            time.sleep(0.5)
        proxy.heal()
        (logs / "harness.log").open("a").write(f"{time.strftime('%H:%M:%S')} healed\n")
        deadline = time.monotonic() + 120
        while not out.owned_after and time.monotonic() < deadline:
            time.sleep(0.5)
            out.owned_after = _owned_by(group_owners(admin, group, ns.persist), "-a1")
        with log.open(errors="replace") as text:
            text.seek(seen)
            out.refusals = [line.strip() for line in text
                            if "commit failed" in line or "lost ledger partitions" in line]
        if out.owned_after:
            committed = _acks_committed(admin, group, ns.acks)
            out.committed_after = {p: (committed.get(p, -1), -1) for p in out.owned_after}
    except Exception as exc:  # noqa: BLE001 - a harness failure is a finding
        out.problems.append(f"the partition thread failed: {exc!r}")
    finally:
        rejoined.set()


def run_partition(workdir: Path, *, records: int = 2_000, send_s: float = 60.0, seed: int | None = None,
                  drain_s: float = 240.0, drop: bool = False) -> tuple[ChaosReport, PartitionReport]:
    """The tree load on a broker of its own, acker-1 behind a ``PartitionProxy`` that is cut
    for CUT_S a sixth into the sending; the load goes on until acker-1 is back."""
    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    report, out = ChaosReport(seed, records), PartitionReport()
    started = time.monotonic()
    proxy = PartitionProxy()
    kafka = ProxiedKafka(workdir / "kafka", proxy.port)
    kafka.start()
    proxy.upstream = kafka.listener_port
    procs: Processes | None = None
    try:
        settings = KafkaSettings.from_env(kafka.bootstrap)
        ns = topics.Namespace(unique_name("partition"))
        pipe = pipeline("tree", ns.name)
        _create(settings, ns, pipe)
        logs = workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        procs = Processes(kafka.bootstrap, ns.name, logs, acker_bootstrap={"acker-1": f"127.0.0.1:{proxy.port}"})
        wait_assigned(settings, {f"{ns.name}.acker": ns.persist, f"{ns.name}.fanout": pipe.entry,
                                 f"{ns.name}.leaf": pipe.data[1]}, P)
        rejoined = threading.Event()
        partition = threading.Thread(target=_cut_and_heal, args=(proxy, settings, ns, logs, send_s / 6, drop, out, rejoined),
                                     daemon=True)
        partition.start()
        sent = _send(settings, ns, pipe.entry, records, send_s,
                     SourceConfig(timeout_ms=TIMEOUT_MS, max_attempts=MAX_ATTEMPTS), pipe.value)
        # acker-1 must commit after its return: more records, until it is back and a while after.
        rejoined.wait(180)
        sent |= _send(settings, ns, pipe.entry, records // 4, send_s / 4,
                      SourceConfig(timeout_ms=TIMEOUT_MS, max_attempts=MAX_ATTEMPTS), pipe.value)
        report.sent = len(sent)
        partition.join()
        tail = _drain(settings, ns, sent, drain_s)
        if out.owned_after:  # still acker-1's at the end: then only acker-1 can have moved their offsets
            admin = AdminClient(settings.client_config())
            committed = _acks_committed(admin, f"{ns.name}.acker", ns.acks)
            still = _owned_by(group_owners(admin, f"{ns.name}.acker", ns.persist), "-a1")
            out.committed_after = {p: (at, committed.get(p, -1)) for p, (at, _) in out.committed_after.items()
                                   if p in still}
        _stop_and_check(report, settings, ns, sent, tail, procs, pipe)
    finally:
        if procs is not None:
            procs.stop()
        proxy.close()
        kafka.stop()
    report.seconds = round(time.monotonic() - started, 1)
    if report.problems or out.problems:
        _print_logs(workdir)
    return report, out


def test_a_partitioned_acker_is_fenced_and_rejoins(tmp_path: Path) -> None:
    """acker-1 reaches the broker through a TCP proxy that is cut for CUT_S while the load runs
    (longer than the session and transaction timeouts), then healed. Its commits are refused
    and its partitions taken over by acker-2; nothing is lost or completed twice; once healed
    it owns partitions again, and their committed offsets move on - only their owner can
    commit them.

    The cut refuses acker-1's connections (a firewall's REJECT). REPLAYBROKER_PARTITION_DROP=1
    drops its packets instead (DROP: connections stall); once, a ``send_offsets_to_transaction``
    issued during such a cut stayed blocked past its timeout and past the heal (librdkafka
    #5456: a coordinator request waits for a broker state change that does not come); in CI the
    same once followed a REJECT cut: a commit that timed out then gets a new producer
    (broker.acker.recovery), the old one is not used again."""
    report, out = run_partition(tmp_path, drop=os.environ.get("REPLAYBROKER_PARTITION_DROP") == "1")
    print(json.dumps({"report": asdict(report), "partition": asdict(out)}))
    assert out.problems == []
    assert report.problems == [], f"seed {report.seed}: {report.problems}"
    assert out.owned_before, "acker-1 owned nothing before the cut"
    assert out.taken_over, "acker-2 did not take every partition over during the cut"
    assert out.refusals, "acker-1's log shows no refused commit nor lost partitions"
    assert out.owned_after, "acker-1 owns no partition after the heal"
    assert any(end > start for start, end in out.committed_after.values()), (
        f"acker-1 committed nothing after rejoining: {out.committed_after}"
    )


def test_chaos_kills_and_a_broker_crash_lose_nothing(tmp_path: Path) -> None:
    records = int(os.environ.get("REPLAYBROKER_CHAOS_RECORDS", 2_000))
    kills = int(os.environ.get("REPLAYBROKER_CHAOS_KILLS", 20))
    report = run_chaos(tmp_path, records=records, kills=kills)
    print(json.dumps(asdict(report)))
    assert sum(report.kills.values()) >= kills and report.broker_restarts == 1
    assert report.sent == records
    assert report.problems == [], f"seed {report.seed}: {report.problems}"


def test_a_broker_of_three_crashes_and_nothing_is_lost(tmp_path: Path) -> None:
    """The same scenario on a 3-node cluster (replication 3, min.insync.replicas 2 for every
    topic, the internal ones included): one node, chosen at random, is killed -9 mid-run and
    restarted on its data; fewer service kills, so the broker's failure is what is tested."""
    report = run_chaos(tmp_path, records=2_000, kills=6, brokers=3, send_s=20.0)
    print(json.dumps(asdict(report)))
    assert report.replication_problems == []
    assert report.broker_restarts == 1 and len(report.crashed_nodes) == 1
    assert report.sent == 2_000
    assert report.problems == [], f"seed {report.seed}: {report.problems}"


def test_cycles_under_chaos_complete_after_their_last_iteration(tmp_path: Path) -> None:
    """The iteration pipeline of test_cycles (a task feeding each record back into its own
    input until its Collatz map reaches 1, bounded) under the chaos test's kills - of the
    ackers and of the iterating task - and a crash of the broker: every record completes
    once or is dead-lettered, and each completion follows the result of its attempt's last
    iteration (from the sink, on the broker's clock)."""
    report = run_chaos(tmp_path, records=600, kills=10, send_s=20.0, kind="cycle")
    print(json.dumps(asdict(report)))
    assert sum(report.kills.values()) >= 10 and report.broker_restarts == 1
    assert report.sent == 600
    assert report.problems == [], f"seed {report.seed}: {report.problems}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.integration.test_chaos")
    sub = parser.add_subparsers(dest="command", required=True)
    for worker in ("fanout", "leaf", "step"):
        w = sub.add_parser(worker)
        w.add_argument("bootstrap")
        w.add_argument("namespace")
        w.add_argument("--lose-outputs", action="store_true", help=argparse.SUPPRESS)
    run = sub.add_parser("run", help="the scenario, on its own embedded broker")
    run.add_argument("--records", type=int, default=20_000)
    run.add_argument("--kills", type=int, default=100)
    run.add_argument("--seed", type=int)
    run.add_argument("--send-s", type=float, default=120.0, help="how long the source sends, s")
    run.add_argument("--unsafe", action="store_true", help="ackers without transactions (expected to fail)")
    run.add_argument("--lose-outputs", action="store_true",
                     help="a planted bug: the leaf acks 1 %% of its inputs without their output (expected to fail)")
    run.add_argument("--kind", choices=["tree", "cycle"], default="tree", help="the pipeline (see pipeline())")
    run.add_argument("--workdir", type=Path, default=Path("/tmp") / unique_name("chaos"))
    args = parser.parse_args(argv)
    if args.command == "fanout":
        run_fanout(args.bootstrap, args.namespace)
    elif args.command == "leaf":
        run_leaf(args.bootstrap, args.namespace, args.lose_outputs)
    elif args.command == "step":
        run_step(args.bootstrap, args.namespace, args.lose_outputs)
    else:
        report = run_chaos(args.workdir, records=args.records, kills=args.kills, seed=args.seed,
                           send_s=args.send_s, drain_s=600.0, unsafe=args.unsafe,
                           lose_outputs=args.lose_outputs, kind=args.kind)
        print(json.dumps(asdict(report), indent=2))
        return 1 if report.problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
