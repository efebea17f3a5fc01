"""Chaos: SIGKILLs of ackers and tasks at random moments and a crash of the broker itself,
while records flow source -> fan-out (1-3) -> leaf (5 % explicit fails, 1 % silent drops,
outputs to a sink topic). Afterwards, from what the topics hold (never from what the code
under test believes):

- every record the source confirmed is either completed - once - with ALL of its outputs in
  the sink (so no tree completed before its leaves wrote), or dead-lettered in ``ns.dlq``;
- no origin completed twice, none both completed and dead-lettered;
- the acker's exactly-once counters (``ns.ledger``) equal what the topics show: completed
  and replay tombstones in ``ns.persist``, records in ``ns.dlq``, persist records folded.

Two ackers run (one ``--standby``); the scenario has its own embedded broker, so that it can
kill -9 it mid-run and bring it back on the same data and ports. The default is sized for
CI; the long run is::

    python -m tests.integration.test_chaos run --records 20000 --kills 100

``--lose-outputs`` plants a bug (the leaf acks 1 % of its inputs without writing their output)
to show the checks fail; ``--unsafe`` runs the ackers without transactions.

Workers (the two task stages) run as ``python -m tests.integration.test_chaos fanout|leaf``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from broker import ids, topics
from broker.completions import OutcomeTail
from broker.dev.faults import skip_ack
from broker.dev.kafka_cluster import LocalCluster
from broker.dev.kafka_local import LocalKafka
from broker.dev.testing import create_topics, unique_name
from broker.headers import H_ORIGIN, H_REASON
from broker.kafka_io import read_to_end
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from tests.integration.ground_truth import fan_out_of, read_changelog

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
        self, bootstrap: str, namespace: str, logs: Path, *, unsafe: bool = False, lose_outputs: bool = False
    ) -> None:
        self.logs = logs
        py = [sys.executable, "-m"]
        acker = [*py, "broker", "acker", "--bootstrap", bootstrap, "--namespace", namespace]
        if unsafe:  # to show that the scenario can fail: no transactions, no exactly-once
            acker.append("--unsafe-no-transactions")
        self.commands = {
            "acker-1": [*acker, "--instance-id", f"{namespace}-a1"],
            "acker-2": [*acker, "--instance-id", f"{namespace}-a2", "--standby"],
            "fanout": [*py, "tests.integration.test_chaos", "fanout", bootstrap, namespace],
            "leaf": [*py, "tests.integration.test_chaos", "leaf", bootstrap, namespace,
                     *(["--lose-outputs"] if lose_outputs else [])],
        }
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


def _chaos(rng: random.Random, procs: Processes, kafka: LocalKafka | LocalCluster, kills: int,
           report: ChaosReport, stop: threading.Event) -> None:
    """``kills`` SIGKILLs of random services at random moments; the broker (one node of a
    cluster) crashes once, half way through. Every killed service is restarted after a random
    pause."""
    try:
        _kill_and_restart(rng, procs, kafka, kills, report, stop)
    except Exception as exc:  # noqa: BLE001 - a harness failure is a finding, reported with the logs
        report.problems.append(f"the chaos thread failed: {exc!r}")


def _kill_and_restart(rng: random.Random, procs: Processes, kafka: LocalKafka | LocalCluster, kills: int,
                      report: ChaosReport, stop: threading.Event) -> None:
    names = sorted(procs.commands)
    for n in range(kills):
        if stop.wait(rng.uniform(0.5, 2.5)):
            return
        if n == kills // 2:
            _crash(rng, procs, kafka, report)
        victim = rng.choice(names)
        procs.kill(victim)
        report.kills[victim] = report.kills.get(victim, 0) + 1
        time.sleep(rng.uniform(0.0, 1.5))
        procs.start(victim)


def run_chaos(workdir: Path, *, records: int = 2_000, kills: int = 20, seed: int | None = None,
              send_s: float = 30.0, drain_s: float = 240.0, unsafe: bool = False,
              lose_outputs: bool = False, brokers: int = 1) -> ChaosReport:
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
        orders, enriched, sink = _names(ns.name)
        topics.create(settings, ns, P, {orders: P, enriched: P})  # replication 3 / min.insync 2 on 3 brokers
        create_topics(bootstrap, {sink: P}, replication=min(brokers, 3))
        report.replication_problems, _ = topics.check_replication(settings, ns, [orders, enriched])
        logs = workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        procs = Processes(bootstrap, ns.name, logs, unsafe=unsafe, lose_outputs=lose_outputs)

        stop = threading.Event()
        chaos = threading.Thread(target=_chaos, args=(rng, procs, kafka, kills, report, stop), daemon=True)
        chaos.start()
        # Ground truth of what entered: origins of records whose persist AND data records the
        # broker confirmed (a chunk counts only once its flush succeeded).
        source = Source(settings, ns, SourceConfig(timeout_ms=TIMEOUT_MS, max_attempts=MAX_ATTEMPTS))
        sent: set[int] = set()
        chunk = max(1, records // 100)
        for i in range(0, records, chunk):
            batch = [source.send(orders, f"customer-{k % 97}", b"order %d" % k).origin
                     for k in range(i, min(records, i + chunk))]
            source.flush()
            sent.update(batch)
            time.sleep(send_s / 100)
        source.close()
        report.sent = len(sent)
        chaos.join()  # the kills outlast the sending; wait for the last restart
        stop.set()

        tail = OutcomeTail(settings, ns)
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline:
            tail.poll(0.5)
            if sent <= set(tail.log.completed_origins()) | tail.log.dlq_origins():
                break
        tail.poll(1.0)
        tail.close()
        # Found dead at a kill (then restarted) or dead at the end: a service exited on its own.
        died = procs.exited_on_their_own + procs.died()
        procs.stop()
        _check(report, settings, ns, sent, tail, died)
    finally:
        if procs is not None:
            procs.stop()
        kafka.stop()
    report.seconds = round(time.monotonic() - started, 1)
    if report.problems:
        _print_logs(workdir)
    return report


def _print_logs(workdir: Path) -> None:
    """The end of every service's and broker node's log: what a failed run needs to be read."""
    paths = sorted((workdir / "logs").glob("*.log")) + sorted(workdir.glob("*/node-*/server.log")) + sorted(
        workdir.glob("kafka/**/server.log"))
    for path in paths:
        lines = path.read_text(errors="replace").splitlines()
        print(f"===== {path.relative_to(workdir)} (last 60 of {len(lines)} lines)")
        print("\n".join(lines[-60:]))


def _check(report: ChaosReport, settings: KafkaSettings, ns: topics.Namespace, sent: set[int],
           tail: OutcomeTail, died: list[str]) -> None:
    problems = report.problems
    if died:
        problems.append(f"services exited on their own: {died}")
    _, _, sink = _names(ns.name)
    log = tail.log
    completed = log.completed_origins()  # origin -> completions
    dlq_msgs = [m for m in read_to_end(settings, ns.dlq, 1)
                if not (dict(m.headers() or ()).get(H_REASON) or b"").startswith(b"quarantine")]
    dead = {ids.decode_id(dict(m.headers() or ())[H_ORIGIN]) for m in dlq_msgs}
    outputs: dict[int, set[bytes]] = defaultdict(set)
    for msg in read_to_end(settings, sink, P):
        origin, _, index = (msg.value() or b"").partition(b"|")
        outputs[int(origin)].add(index)
    report.completed = len(set(completed) & sent)
    report.dead_lettered = len(dead & sent)
    report.replays = log.replays()

    lost = sent - set(completed) - dead
    if lost:
        problems.append(f"{len(lost)} records neither completed nor dead-lettered, e.g. {sorted(lost)[:3]}")
    twice = [o for o, n in completed.items() if n > 1]
    if twice:
        problems.append(f"{len(twice)} origins completed more than once")
    both = set(completed) & dead
    if both:
        problems.append(f"{len(both)} origins both completed and dead-lettered")
    early = [o for o in set(completed) & sent
             if outputs.get(o, set()) != {b"%d" % i for i in range(fan_out_of(o))}]
    if early:
        problems.append(f"{len(early)} origins completed without all their outputs in the sink, e.g. {early[:3]}")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.integration.test_chaos")
    sub = parser.add_subparsers(dest="command", required=True)
    for worker in ("fanout", "leaf"):
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
    run.add_argument("--workdir", type=Path, default=Path("/tmp") / unique_name("chaos"))
    args = parser.parse_args(argv)
    if args.command == "fanout":
        run_fanout(args.bootstrap, args.namespace)
    elif args.command == "leaf":
        run_leaf(args.bootstrap, args.namespace, args.lose_outputs)
    else:
        report = run_chaos(args.workdir, records=args.records, kills=args.kills, seed=args.seed,
                           send_s=args.send_s, drain_s=600.0, unsafe=args.unsafe,
                           lose_outputs=args.lose_outputs)
        print(json.dumps(asdict(report), indent=2))
        return 1 if report.problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
