"""At scale (issue #44): many ledger partitions, several ackers, a killed acker, skewed keys
and idle services, on a local cluster of 3 brokers (replication 3, min.insync.replicas 2)
started for the section from the embedded Kafka's jars, and stopped after it.

Every run offers the same fixed load (``ScalePlan.rate``: two runs of the bench compare) from
one source process through one task process to the ackers (``python -m broker.cli acker``,
dynamic members, so a clean stop hands partitions over at once). A window sends for
``window_s`` and waits until every record sent is completed (the ackers' committed
``completed`` counters, ``bench.completions``); an acker's CPU is read from ``/proc`` at
both ends, its mean commit time from its Prometheus histogram. In order:

1. the idle cost: the brokers alone, then with one acker and one task that have nothing to
   do (P=16);
2. P=16 and one acker: a window, ``replaybroker status``, and a takeover (a second acker
   joins and is killed) - the baseline of
3. P=1000: the same with one acker, then 2 and 4 (CPU per record in total and per instance,
   records per instance), a window with Zipf keys (skew per ledger partition and per acker),
   kill -9 of one of the 4 without standby, then of one of 4 new ones started with
   ``--standby``;
4. ``bench.scale_join``: a task's longest pause while another joins its group, consumer
   protocol against the eager range assignor.

Whatever a run started is stopped when it fails half-way (``_Run.close``, the cluster's
context manager).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, TopicPartition

from broker import topics
from broker.bench.completions import Mark, ledger_mark
from broker.bench.figures import SCALE_ACKERS, Figures
from broker.bench.hops import Env
from broker.bench.keys import spread
from broker.bench.procs import BenchError, Proc, tail_text, wait_until, worker
from broker.bench.takeover import assignments, caught_up
from broker.dev.kafka_local import free_port
from broker.ranges import expand

SESSION_TIMEOUT_MS = 6_000  # the cluster's group.consumer.min.session.timeout.ms
# Three brokers holding ~10 000 replicas on 2 shared cores are starved for seconds at a time:
# with Kafka's defaults for a quiet machine (a controller's fetch times out after 2 s, a follower
# leaves the ISR after the chaos tests' 10 s) the quorum re-elects and the ISRs churn (1 300
# changes per node in one run), which times produce requests out. What a large cluster on a
# busy host is given; an idle follower fetch also waits longer (a produce still answers it at once),
# and the cleaner looks for dirty logs among 2 000 compacted partitions every 15 s, not 200 ms
# (the tests' setting: 11 s of CPU per node in 2.5 min here).
CLUSTER_HEAP = "768m"  # 384m spends a tenth of the time in GC at P=1000, old generation full
CLUSTER_PROPERTIES = {
    "log.cleaner.backoff.ms": 15_000,
    # acks=all waits for two follower fetches; one fetcher a leader means every fetch carries
    # its ~1 300 partitions (p50 of a produce: 0.33 s against 0.03 s with acks=1)
    "num.replica.fetchers": 4,
    "replica.lag.time.max.ms": 30_000,
    "replica.fetch.wait.max.ms": 2_000,
    "controller.quorum.fetch.timeout.ms": 10_000,
    "controller.quorum.election.timeout.ms": 5_000,
    "broker.session.timeout.ms": 30_000,
    "broker.heartbeat.interval.ms": 3_000,
}
ZIPF_S = 1.1
KEYS = 100_000  # distinct keys: every one of 1 000 ledger partitions gets records

_OWNING = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \w+ broker\.acker: (?:assigned|revoked|lost) ledger partitions "
    r"\d+ \[[\d, -]*\] \(owning \d+ (\[[\d, -]*\])\)",
    re.MULTILINE,
)
_COMMIT = re.compile(r"^replaybroker_acker_commit_duration_seconds_(sum|count)(?:\{[^}]*\})? (\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class ScalePlan:
    """The load of every window. At P=1000 each completed record costs its transaction a write
    to a ledger and a persist partition that no other record of the commit shares, and
    librdkafka sends one produce request per partition, at most 5 in flight per broker: a
    transaction over 100 partitions took 2.1 s to flush on these 3 brokers with nothing else
    running (~50 partition writes a second), so one acker at P=1000 sustains ~20 records/s
    within its 10 s transaction timeout (a commit that outlives it is aborted and rewound, and
    the next one is larger). The rate stays below that, for P=16 too: the same traffic.

    The ackers run with their default transaction timeout (10 s), which a takeover waits
    for when the killed acker left a transaction open (its partitions' offsets are not stable
    until it is aborted). Earlier, at P=1000, commits took 1.4-2.7 s and the first one after a
    warm-up outlived 10 s (rewound, and the next was as large), so these ackers ran with 20 s
    (and 60 s before that); since an idle partition costs a commit nothing, they take 0.4-0.9 s
    at this rate, and with 10 s a standby takeover's 250 partitions were all served 7.6 s after
    the kill instead of 21-29 s (2026-11-28)."""

    rate: float  # records/s offered in every window
    window_s: float
    idle_s: float
    join_s: float  # how long a join is watched
    takeover_wait_s: float  # at most this long after a kill

    @classmethod
    def make(cls, quick: bool) -> ScalePlan:
        return cls(10.0, 15.0, 4.0, 6.0, 150.0) if quick else cls(15.0, 40.0, 15.0, 12.0, 600.0)


def _log_time(date: str, ms: str) -> float:
    return datetime.datetime.strptime(date, "%Y-%m-%d %H:%M:%S").timestamp() + int(ms) / 1000


def owned(log: Path) -> set[int]:
    """The ledger partitions an acker owns by the latest change its log reports."""
    text = log.read_text(errors="replace") if log.exists() else ""
    changes = _OWNING.findall(text)
    return set(expand(changes[-1][2])) if changes else set()


def cpu_s(pid: int) -> float:
    """CPU seconds of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def commit_totals(port: int) -> tuple[float, float]:
    """(seconds, commits) of an acker's commit histogram, from its metrics server."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as response:
        text = response.read().decode()
    got = {m.group(1): float(m.group(2)) for m in _COMMIT.finditer(text)}
    return got.get("sum", 0.0), got.get("count", 0.0)


@dataclass
class ScaleWindow:
    sent: int
    seconds: float
    completed: dict[int, int]  # per ledger partition
    cpu: dict[str, float]  # CPU seconds per acker
    commit_ms: dict[str, float]  # mean commit per acker
    owners: dict[str, set[int]]

    def records(self, name: str) -> int:
        return sum(self.completed.get(lp, 0) for lp in self.owners.get(name, ()))

    @property
    def total(self) -> int:
        return sum(self.completed.values())

    def summary(self) -> dict[str, Any]:
        return {
            "sent": self.sent, "completed": self.total, "seconds": round(self.seconds, 2),
            "ackers": {name: {"cpu_s": round(cpu, 3), "records": self.records(name), "partitions": len(self.owners[name]),
                              "commit_ms": round(self.commit_ms.get(name, 0.0), 2)} for name, cpu in self.cpu.items()},
        }


class _Run:
    """One namespace under load: a source, a task and named ackers; ``close`` stops them all."""

    def __init__(self, env: Env, partitions: int, label: str) -> None:
        self.env = env
        self.P = partitions
        self.ns = topics.Namespace(env.unique(label))
        self.data = f"{self.ns.name}.data"
        topics.create(env.settings, self.ns, partitions, {self.data: 4})
        self.ackers: dict[str, Proc] = {}
        self.ports: dict[str, int] = {}
        self.others: list[Proc] = []
        self._started = 0

    def _worker(self, role: str, **config: Any) -> Proc:
        self._started += 1
        proc = worker(role, {"bootstrap": self.env.bootstrap, "namespace": self.ns.name, "topic": self.data, **config},
                      self.env.workdir, name=f"{self.ns.name}-{role}-{self._started}")
        self.others.append(proc)
        proc.wait_event("ready", 120)
        return proc

    def source(self, **keys: Any) -> Proc:
        return self._worker("source", timeout_ms=600_000, keys=KEYS, **keys)

    def task(self) -> Proc:
        return self._worker("task", group=f"{self.ns.name}.task")

    def start_acker(self, name: str, *, standby: bool = False) -> Proc:
        port = free_port()
        args = ["acker", "--bootstrap", self.env.bootstrap, "--namespace", self.ns.name, "--instance-id",
                f"{self.ns.name}-{name}", "--dynamic-membership", "--session-timeout-ms", str(SESSION_TIMEOUT_MS),
                "--commit-interval-ms", str(self.env.commit_interval_ms), "--metrics-port", str(port)]
        if standby:
            args.append("--standby")
        proc = Proc(f"{self.ns.name}-{name}", "broker.cli", args, self.env.workdir, protocol=False)
        self.ackers[name], self.ports[name] = proc, port
        return proc

    def stop_acker(self, name: str) -> None:
        self.ackers.pop(name).stop()
        self.ports.pop(name)

    def owners(self) -> dict[str, set[int]]:
        return {name: owned(proc.log_path) for name, proc in self.ackers.items()}

    def balanced(self, timeout: float = 120.0) -> None:
        """Until the live ackers own every ledger partition between them, each some."""
        def split() -> bool:
            owners = self.owners()
            return all(owners.values()) and sum(map(len, owners.values())) == self.P and \
                set().union(*owners.values()) == set(range(self.P))

        wait_until(split, timeout, list(self.ackers.values()), f"{len(self.ackers)} ackers to split {self.P} partitions")

    def mark(self) -> Mark:
        return ledger_mark(self.env.settings, self.ns.name, self.P)

    def warm(self, source: Proc, timeout: float = 180.0, n: int = 50, rate: float = 10.0) -> None:
        """Records through every stage before anything is measured (joins, restores)."""
        start = self.mark().total
        source.send(cmd="run", n=n, rate=rate)
        source.wait_event("sent", 120)
        wait_until(lambda: self.mark().total - start >= n, timeout, [*self.ackers.values(), *self.others],
                   "the warm-up records to complete")

    def window(self, source: Proc, rate: float, seconds: float) -> ScaleWindow:
        """Send at ``rate`` for ``seconds``, wait until every record is completed."""
        names = list(self.ackers)
        # The commit histograms are scraped outside the CPU snapshots: a scrape is the
        # acker's work, not the records'.
        k0 = {n: commit_totals(self.ports[n]) for n in names}
        m0, c0 = self.mark(), {n: cpu_s(self.ackers[n].popen.pid) for n in names}
        t0 = time.monotonic()
        source.send(cmd="run", rate=rate, duration=seconds)
        sent = int(source.wait_event("sent", seconds + 120)["n"])
        latest = [m0]

        def drained() -> bool:
            latest[0] = self.mark()
            return latest[0].total - m0.total >= sent

        wait_until(drained, 180, [*self.ackers.values(), *self.others], "the window's records to complete")
        m1 = latest[0]
        c1 = {n: cpu_s(self.ackers[n].popen.pid) for n in names}
        k1 = {n: commit_totals(self.ports[n]) for n in names}
        commit_ms = {n: 1000 * (k1[n][0] - k0[n][0]) / (k1[n][1] - k0[n][1]) for n in names if k1[n][1] > k0[n][1]}
        return ScaleWindow(sent, time.monotonic() - t0, {lp: m1.counts[lp] - m0.counts.get(lp, 0) for lp in m1.counts},
                      {n: c1[n] - c0[n] for n in names}, commit_ms, self.owners())

    def status_s(self) -> float:
        """``replaybroker status`` as a user runs it: a new process, wall time."""
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "broker.cli", "status", "--bootstrap", self.env.bootstrap,
                              "--namespace", self.ns.name, "--json"], capture_output=True, timeout=300, check=False)
        if out.returncode != 0:
            raise BenchError(f"status failed: {out.stderr.decode(errors='replace')[-500:]}")
        return time.monotonic() - t0

    def close(self) -> None:
        for proc in [*self.others, *self.ackers.values()]:
            with contextlib.suppress(Exception):
                proc.stop(10)


@contextlib.contextmanager
def _run(env: Env, partitions: int, label: str) -> Iterator[_Run]:
    run = _Run(env, partitions, label)
    try:
        yield run
    finally:
        run.close()


CHUNK_S = 3.0


class _Chunks:
    """A source kept sending at ``rate`` in short runs, one queued at a time, for as long as a
    takeover takes (a worker's run has a fixed length)."""

    def __init__(self, source: Proc, rate: float) -> None:
        self.source, self.rate, self.outstanding = source, rate, 0

    def keep_sending(self) -> None:
        while not self.source.events.empty():
            if self.source.events.get_nowait().get("event") == "sent":
                self.outstanding -= 1
        if self.outstanding == 0:
            self.source.send(cmd="run", rate=self.rate, duration=CHUNK_S)
            self.outstanding += 1

    def drain(self) -> None:
        for _ in range(self.outstanding):
            self.source.wait_event("sent", CHUNK_S + 60)
        self.outstanding = 0


def _covered(taken: list[dict[str, Any]]) -> set[int]:
    return set().union(*(set(a["partitions"]) for a in taken)) if taken else set()


def takeover(run: _Run, source: Proc, victim: str, rate: float, wait_s: float) -> dict[str, Any]:
    """kill -9 of ``victim`` under load: when its partitions complete again, what waited.

    A tail of ``ns.persist``'s victim partitions, from their ends before the kill, pairs each
    persist record with its tombstone (same key): a record is late when it was persisted
    before the first completion after the kill and completed at or after it. What is not seen
    within ``wait_s`` of the kill is left out of the result, and ``unfinished`` says so."""
    lps = run.owners()[victim]
    survivors = [n for n in run.ackers if n != victim]
    before = {n: len(assignments(run.ackers[n].log_path)) for n in survivors}
    tail = Consumer(run.env.settings.consumer_config(None, defaults={"group.id": f"{run.ns.name}.tail"}))
    tail.assign([TopicPartition(run.ns.persist, lp, OFFSET_END) for lp in sorted(lps)])
    persisted: dict[bytes, float] = {}
    completed: dict[bytes, float] = {}

    def read(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for msg in tail.consume(1000, 0.1):
                if msg.error() is None and msg.key() is not None:
                    (persisted if msg.value() is not None else completed)[msg.key()] = msg.timestamp()[1] / 1000

    chunks = _Chunks(source, rate)
    try:
        chunks.keep_sending()
        read(2.0)
        killed_at = time.time()
        run.ackers[victim].popen.kill()
        run.ackers[victim].popen.wait(30)
        deadline = time.monotonic() + wait_s
        first: float | None = None
        taken: list[dict[str, Any]] = []
        while (first is None or not _covered(taken) >= lps) and time.monotonic() < deadline:
            chunks.keep_sending()
            read(0.5)
            first = min((at for at in completed.values() if at > killed_at), default=None)
            taken = [a for n in survivors for a in assignments(run.ackers[n].log_path)[before[n]:]
                     if set(a["partitions"]) & lps]
        read(3.0)
    finally:
        tail.close()
        chunks.drain()
    run.ackers.pop(victim).stop(5)
    restored = _covered(taken) & lps
    out: dict[str, Any] = {
        "partitions": len(lps),
        "restored_partitions": len(restored),
        "waited_s": time.time() - killed_at,
        "changelog_records_read": sum(a["records_read"] for a in taken),
        "from_standby": sum(a["from_standby"] for a in taken),
    }
    if restored != lps:
        out["unfinished"] = f"{len(restored)} of {len(lps)} partitions restored {wait_s:.0f} s after the kill"
        # what the survivors were doing, for the report (their workdir goes with the run)
        out["survivor_logs"] = {n: tail_text(run.ackers[n].log_path, 40) for n in survivors if n in run.ackers}
    if first is None:
        return out
    restore_s = max((a["seconds"] for a in taken), default=None)
    return out | {
        "total_s": first - killed_at,
        "after_session_s": max(first - killed_at - SESSION_TIMEOUT_MS / 1000, 0.0),
        "all_assigned_s": None if restored != lps else max(a["at"] for a in taken) - killed_at,
        "late_records": sum(1 for key, at in completed.items() if at >= first and persisted.get(key, first) < first),
        "restore_s": restore_s,
        "partitions_per_s": len(restored) / restore_s if restore_s else None,
    }


def _record(figures: Figures, result: dict[str, Any], keys: dict[str, str]) -> None:
    """Figure key -> field of a takeover's result; a field it did not see is unavailable, with why."""
    why = result.get("unfinished") or "no completion on the victim's partitions seen"
    for key, name in keys.items():
        figures.set(key, result.get(name), unavailable=why)


def _idle(procs: dict[str, int], seconds: float) -> dict[str, float]:
    """% of a core per process over ``seconds`` of nothing to do."""
    c0 = {n: cpu_s(pid) for n, pid in procs.items()}
    time.sleep(seconds)
    return {n: 100 * (cpu_s(pid) - c0[n]) / seconds for n, pid in procs.items()}


def _brokers(pids: list[int]) -> dict[str, int]:
    return {f"broker{i}": pid for i, pid in enumerate(pids)}


def _baseline(env: Env, plan: ScalePlan, broker_pids: list[int], figures: Figures,
              step: Callable[[float, str], None]) -> dict[str, Any]:
    """Idle cost, P=16 CPU, commit, status and takeover."""
    step(0.02, "idle brokers")
    base = _idle(_brokers(broker_pids), plan.idle_s)
    figures.set("scale.idle_brokers_base_cpu_pct", sum(base.values()))
    with _run(env, 16, "scale16") as run:
        step(0.05, "P=16: starting")
        run.start_acker("a0")
        task = run.task()
        source = run.source()
        run.balanced()
        run.warm(source)
        step(0.1, "P=16: idle acker and task")
        idle = _idle({"acker": run.ackers["a0"].popen.pid, "task": task.popen.pid, **_brokers(broker_pids)},
                     plan.idle_s)
        figures.set("scale.idle_acker_cpu_pct", idle["acker"])
        figures.set("scale.idle_task_cpu_pct", idle["task"])
        figures.set("scale.idle_brokers_cpu_pct", sum(v for k, v in idle.items() if k.startswith("broker")))
        step(0.13, "P=16: window")
        w = run.window(source, plan.rate, plan.window_s)
        figures.set("scale.p16.cpu_us_per_record", 1e6 * w.cpu["a0"] / max(w.total, 1))
        figures.set("scale.p16.commit_ms", w.commit_ms.get("a0"))
        figures.set("scale.p16.status_s", run.status_s())
        step(0.18, "P=16: takeover")
        run.start_acker("a1")
        run.balanced()
        t = takeover(run, source, "a1", plan.rate, plan.takeover_wait_s)
        _record(figures, t, {"scale.p16.takeover_restore_s": "restore_s",
                             "scale.p16.takeover_partitions_per_s": "partitions_per_s"})
        return {"idle_base": base, "idle": idle, "window": w.summary(), "takeover": t}


def _at_1000(env: Env, plan: ScalePlan, broker_pids: list[int], figures: Figures,
             step: Callable[[float, str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with _run(env, 1000, "scale1000") as run:
        step(0.25, "P=1000: starting one acker")
        created = time.monotonic()
        run.start_acker("a0")
        run.task()
        source = run.source()
        run.balanced(plan.takeover_wait_s * 4)
        figures.set("scale.p1000.served_s", time.monotonic() - created)
        # Before any traffic: what needs no task (whose group may still be joining)
        step(0.28, "P=1000: idle acker, status")
        # the first seconds after the assignment are its restore and first commits, not idle
        time.sleep(plan.idle_s)
        idle = _idle({"acker": run.ackers["a0"].popen.pid, **_brokers(broker_pids)}, plan.idle_s)
        figures.set("scale.idle_acker_p1000_cpu_pct", idle["acker"])
        figures.set("scale.idle_brokers_p1000_cpu_pct", sum(v for k, v in idle.items() if k.startswith("broker")))
        figures.set("scale.status_p1000_s", run.status_s())
        run.warm(source, plan.takeover_wait_s * 2)
        for i, n in enumerate(SCALE_ACKERS):
            step(0.3 + 0.08 * i, f"P=1000: {n} ackers")
            while len(run.ackers) < n:
                run.start_acker(f"a{len(run.ackers)}")
            run.balanced(300)
            # The instances' floor: at this rate most of their CPU is each one's idle cost, which
            # grows with the instances; what a record adds above it is the per-record cost.
            time.sleep(plan.idle_s)  # the new members' restores and first commits
            floor = _idle({name: proc.popen.pid for name, proc in run.ackers.items()}, plan.idle_s)
            w = run.window(source, plan.rate, plan.window_s)
            out[f"ackers{n}"] = w.summary() | {"idle_cpu_pct": {k: round(v, 2) for k, v in floor.items()}}
            total = sum(w.cpu.values())
            figures.set(f"scale.ackers{n}.cpu_us_per_record", 1e6 * total / max(w.total, 1))
            figures.set(f"scale.ackers{n}.idle_cpu_pct", sum(floor.values()))
            above = total - sum(floor.values()) / 100 * w.seconds
            figures.set(f"scale.ackers{n}.cpu_us_per_record_above_idle", 1e6 * max(above, 0.0) / max(w.total, 1))
            per = {name: 1e6 * cpu / max(w.records(name), 1) for name, cpu in w.cpu.items()}
            figures.set(f"scale.ackers{n}.instance_cpu_us_per_record", max(per.values()))
            figures.set(f"scale.ackers{n}.records_max_vs_min", spread([w.records(a) for a in w.cpu])["max_vs_min"])
            if n == 1:
                figures.set("scale.p1000.cpu_us_per_record", 1e6 * total / max(w.total, 1))
                figures.set("scale.p1000.commit_ms", w.commit_ms.get("a0"))
                out["uniform_partition_spread"] = spread(list(w.completed.values()))
                figures.set("scale.uniform_partition_max_vs_mean", out["uniform_partition_spread"]["max_vs_mean"])
        figures.ratio("scale.acker_cpu_2_vs_1", "scale.ackers2.cpu_us_per_record", "scale.ackers1.cpu_us_per_record")
        figures.ratio("scale.acker_cpu_4_vs_1", "scale.ackers4.cpu_us_per_record", "scale.ackers1.cpu_us_per_record")
        figures.ratio("scale.acker_cpu_above_idle_4_vs_1", "scale.ackers4.cpu_us_per_record_above_idle",
                      "scale.ackers1.cpu_us_per_record_above_idle")

        step(0.55, "P=1000: Zipf keys")
        zipf = run.source(zipf_s=ZIPF_S)
        w = run.window(zipf, plan.rate, plan.window_s)
        out["zipf"] = w.summary()
        figures.set("scale.zipf_s", ZIPF_S)
        figures.set("scale.zipf_partition_max_vs_mean", spread(list(w.completed.values()))["max_vs_mean"])
        by_acker = spread([w.records(a) for a in w.cpu])
        figures.set("scale.zipf_acker_max_vs_min", by_acker["max_vs_min"])
        figures.set("scale.zipf_acker_max_vs_mean", by_acker["max_vs_mean"])

        for mode in ("cold", "standby"):
            step(0.62 if mode == "cold" else 0.72, f"P=1000: kill -9, {mode}")
            if mode == "standby":
                for name in list(run.ackers):
                    run.stop_acker(name)
                for i in range(4):
                    run.start_acker(f"s{i}", standby=True)
                run.balanced(300)
                _standbys_caught_up(run, 120)
                run.warm(source, plan.takeover_wait_s * 2)
            victim = sorted(run.ackers)[-1]
            t = takeover(run, source, victim, plan.rate, plan.takeover_wait_s)
            out[f"takeover_{mode}"] = t
            _record(figures, t, {f"scale.takeover_{mode}_s": "after_session_s",
                                 f"scale.takeover_{mode}_total_s": "total_s",
                                 f"scale.takeover_{mode}_all_s": "all_assigned_s",
                                 f"scale.takeover_{mode}_late_records": "late_records"})
            if mode == "cold":
                _record(figures, t, {"scale.p1000.takeover_restore_s": "restore_s",
                                     "scale.p1000.takeover_partitions_per_s": "partitions_per_s"})
    return out


def _standbys_caught_up(run: _Run, timeout: float) -> None:
    """Until every partition's changelog is tailed to its end by some acker that does not own it."""
    def ready() -> bool:
        owners = run.owners()
        for name, proc in run.ackers.items():
            warm = caught_up(proc.log_path)
            others = set().union(*(lps for n, lps in owners.items() if n != name))
            if not others <= warm:
                return False
        return True

    wait_until(ready, timeout, list(run.ackers.values()), "the standbys to catch up")


def measure_scale(workdir: Path, figures: Figures, details: dict[str, Any], *, quick: bool,
                  commit_interval_ms: int = 100, progress: Callable[[float, str], None] | None = None) -> None:
    """Fill ``scale.*`` and ``details`` part by part: a part that fails (a cluster too busy
    to hand 1 000 partitions to a group in time) leaves the others' figures, and raises at
    the end with every part's error."""
    from broker.bench.scale_join import measure_join
    from broker.dev.kafka_cluster import LocalCluster
    from broker.settings import KafkaSettings

    plan = ScalePlan.make(quick)
    details.update(plan=plan.__dict__, brokers=3, loadavg_start=" ".join(f"{x:.1f}" for x in os.getloadavg()))
    errors: dict[str, str] = {}

    def step(fraction: float, what: str) -> None:
        if progress:
            progress(fraction, what)

    def part(name: str, body: Callable[[], Any]) -> None:
        try:
            details[name] = body()
        except Exception as exc:  # noqa: BLE001 - one part failing must not hide the others
            errors[name] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
            details[f"{name}_error"] = f"{type(exc).__name__}: {exc}"

    step(0.0, "starting a 3-broker cluster")
    def drop_data() -> None:
        """The brokers' data (~200 MB at P=1000) goes; their logs stay in a failed run's workdir."""
        for data in (workdir / "cluster").glob("node-*/data"):
            shutil.rmtree(data, ignore_errors=True)

    with contextlib.ExitStack() as stack:
        stack.callback(drop_data)
        cluster = stack.enter_context(LocalCluster(3, workdir / "cluster", heap=CLUSTER_HEAP, properties=CLUSTER_PROPERTIES))
        env = Env(cluster.bootstrap, KafkaSettings.from_env(cluster.bootstrap), 4, workdir,
                  commit_interval_ms=commit_interval_ms)
        assert cluster.state is not None
        pids = cluster.state.pids
        figures.set("scale.load_rps", plan.rate)
        figures.set("scale.session_timeout_s", SESSION_TIMEOUT_MS / 1000)
        step(0.02, "a task joins")
        part("join", lambda: measure_join(env, figures, seconds=plan.join_s, rate=plan.rate))
        part("p16", lambda: _baseline(env, plan, pids, figures, step))
        part("p1000", lambda: _at_1000(env, plan, pids, figures, step))
        figures.ratio("scale.cpu_p1000_vs_p16", "scale.p1000.cpu_us_per_record", "scale.p16.cpu_us_per_record")
        figures.ratio("scale.commit_p1000_vs_p16", "scale.p1000.commit_ms", "scale.p16.commit_ms")
    details["loadavg_end"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    if errors:
        raise BenchError("; ".join(f"{name}: {why}" for name, why in errors.items()))
