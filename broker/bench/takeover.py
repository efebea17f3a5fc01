"""Takeover: how long the ledger partitions of a killed acker wait before they complete
records again on a survivor, with ``--standby`` and without.

Two acker processes share a namespace of two ledger partitions, each holding ``N/2`` pending
entries (written straight to ``ns.ledger``, what their commits leave for N registered
records - as in ``bench.restore``). A task acks a trickle of probe records on both
partitions. Then the acker holding partition 0 is killed (SIGKILL) and, from the survivor's
log and the completion tombstones:

- ``detection_s``: the kill -> the survivor's assignment callback for the victim's
  partitions (the group's session timeout, with the consumer protocol);
- ``restore_s``: the callback itself - committed offsets, then the changelog read (a
  catch-up of the standby state, or a full read);
- ``total_s``: the kill -> the first completion tombstone on the victim's partition;
- ``survivor_gap_s``: the longest gap between completions on the survivor's own partition
  meanwhile (its restore runs in slices between polls: it keeps completing).

Detection is bounded below by the session timeout (``takeover.session_timeout_s``): a member
is declared dead only after it missed heartbeats for that long. Lowering it below a few
heartbeat intervals turns a GC pause or a slow commit into a spurious takeover (and the
broker bounds it: ``group.consumer.min.session.timeout.ms``, 45 s by default; the embedded
broker allows 6 s).
"""

from __future__ import annotations

import datetime
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from broker import ids, topics
from broker.bench.figures import Figures, size_label
from broker.bench.hops import Env
from broker.dev.testing import stop_processes
from broker.ledger.table import REGISTERED
from broker.ranges import expand
from broker.schemas import COUNTERS_KEY, LedgerEntry, encode_counters
from broker.source import Source, SourceConfig
from broker.task import Task

MODES = ("standby", "cold")
P = 2

_ASSIGNED = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) INFO broker\.acker: assigned ledger partitions \d+ (\[[\d, -]*\]) "
    r"\(owning \d+ \[[\d, -]*\]\): (\d+) from standby/warm state, (\d+) changelog records read, (\d+) entries, ([\d.]+)s"
)
_CAUGHT_UP = re.compile(r"standby of ledger partitions \d+ (\[[^]]*\]) caught up")


def _fill(env: Env, ns: topics.Namespace, per_partition: int) -> None:
    producer = Producer(env.settings.producer_config(defaults={"linger.ms": 20, "batch.size": 1_000_000}))
    deadline = int(time.time() * 1000) + 3_600_000
    for lp in range(P):
        srids = ids.new_ids(per_partition).tolist()
        values = ids.new_ids(per_partition).tolist()
        for i, (srid, value) in enumerate(zip(srids, values, strict=True)):
            record = LedgerEntry(value, REGISTERED, i, deadline).encode()
            while True:
                try:
                    producer.produce(ns.ledger, record, ids.encode_id(srid), partition=lp)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.produce(ns.ledger, encode_counters({"registered": per_partition}, int(time.time() * 1000)),
                         COUNTERS_KEY, partition=lp)
    if producer.flush(300):
        raise RuntimeError("changelog records not delivered")


def assignments(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        m = _ASSIGNED.search(line)
        if m:
            stamp = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000
            out.append({
                "at": stamp,
                "partitions": expand(m.group(3)),
                "from_standby": int(m.group(4)),
                "records_read": int(m.group(5)),
                "entries": int(m.group(6)),
                "seconds": float(m.group(7)),
            })
    return out


def caught_up(path: Path) -> set[int]:
    """The ledger partitions an acker's log says its standbys caught up on."""
    return {lp for m in _CAUGHT_UP.finditer(path.read_text(errors="replace")) for lp in expand(m.group(1))}


def _owner(logs: dict[str, Path], lp: int) -> str | None:
    """The acker whose latest assignment gave it ``lp`` (each owns one of two here)."""
    latest: tuple[float, str] | None = None
    for name, path in logs.items():
        for a in assignments(path):
            if lp in a["partitions"] and (latest is None or a["at"] > latest[0]):
                latest = (a["at"], name)
    return latest[1] if latest else None


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


class _Probe:
    """A trickle of records on every ledger partition, acked by a task; tails the
    completion tombstones (partition, create time)."""

    def __init__(self, env: Env, ns: topics.Namespace, data: str) -> None:
        self.completions: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._task = Task(env.settings, ns, [data], f"{ns.name}.probe", lambda record, ctx: None)
        self._source = Source(env.settings, ns, SourceConfig(timeout_ms=600_000))
        self._tail = Consumer(env.settings.consumer_config(None, defaults={"group.id": f"{ns.name}.tail"}))
        self._tail.assign([TopicPartition(ns.persist, lp, OFFSET_BEGINNING) for lp in range(P)])
        self._data = data
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._send, self._read)]
        self._threads.append(threading.Thread(target=self._task.run, daemon=True))
        for t in self._threads:
            t.start()

    def _send(self) -> None:
        i = 0
        while not self._stop.wait(0.01):  # ~100 records/s
            self._source.send(self._data, f"probe-{i}", b"p")
            i += 1

    def _read(self) -> None:
        while not self._stop.is_set():
            for msg in self._tail.consume(1000, 0.05):
                if msg.error() is None and msg.value() is None:
                    # Create time: the acker's commit, not when this tail read it.
                    self.completions.append((msg.partition(), msg.timestamp()[1] / 1000))

    def completed_since(self, lp: int, t: float) -> float | None:
        return next((at for p, at in list(self.completions) if p == lp and at > t), None)

    def close(self) -> None:
        self._stop.set()
        self._task.stop()
        for t in self._threads:
            t.join(30)
        self._source.close()
        self._tail.close()


def _one(env: Env, entries: int, standby: bool, session_timeout_ms: int,
         progress: Callable[[str], None]) -> dict[str, Any]:
    ns = topics.Namespace(env.unique("takeover"))
    data = f"{ns.name}.data"
    topics.create(env.settings, ns, P, {data: P})
    env.created_topics += [*ns.ledger_topics, ns.dlq, data, topics.replay_topic(data)]
    progress(f"writing {entries} pending entries")
    _fill(env, ns, entries // P)
    logs = {name: env.workdir / f"{ns.name}-{name}.log" for name in ("a", "b")}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    probe: _Probe | None = None
    try:
        def start(name: str) -> None:
            args = [sys.executable, "-m", "broker.cli", "acker", "--bootstrap", env.bootstrap,
                    "--namespace", ns.name, "--instance-id", f"{ns.name}-{name}",
                    "--session-timeout-ms", str(session_timeout_ms)]
            if standby:
                args.append("--standby")
            with open(logs[name], "wb") as out:
                procs[name] = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

        # The victim first: it restores both partitions, then hands one to the survivor, which
        # never owned the victim's - without standby, its takeover is a full restore.
        progress("the first acker restoring")
        start("a")
        _wait(lambda: all(_owner(logs, lp) == "a" for lp in range(P)), 300, "the first acker to own both partitions")
        progress("the second acker joining")
        start("b")
        _wait(lambda: {_owner(logs, lp) for lp in range(P)} == set(logs), 300, "one ledger partition per acker")
        victim, survivor = "a", "b"
        victim_lp = next(lp for lp in range(P) if _owner(logs, lp) == victim)
        if standby:
            progress("standby catching up")
            _wait(lambda: victim_lp in caught_up(logs[survivor]), 300, "the survivor's standby to catch up")
        probe = _Probe(env, ns, data)
        _wait(lambda: all(probe.completed_since(lp, 0) for lp in range(P)), 120, "completions on both partitions")
        before = len(assignments(logs[survivor]))
        progress("kill -9")
        killed_at = time.time()
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait(30)

        def taken() -> dict[str, Any] | None:
            return next((a for a in assignments(logs[survivor])[before:] if victim_lp in a["partitions"]), None)

        _wait(lambda: taken() is not None, 120, "the survivor to take the partition over")
        _wait(lambda: probe.completed_since(victim_lp, killed_at) is not None, 120,
              "a completion on the victim's partition")
        first = probe.completed_since(victim_lp, killed_at)
        assignment = taken()
        assert assignment is not None and first is not None
        time.sleep(0.5)  # the survivor's own completions up to a little past the takeover
        survivor_lp = next(lp for lp in range(P) if lp != victim_lp)
        own = sorted(at for lp, at in list(probe.completions) if lp == survivor_lp and killed_at <= at <= first + 0.5)
        gaps = [b - a for a, b in zip([killed_at, *own], own, strict=False)]
        callback_started = assignment["at"] - assignment["seconds"]
        return {
            "entries": entries,
            "standby": standby,
            "detection_s": callback_started - killed_at,
            "restore_s": assignment["seconds"],
            "total_s": first - killed_at,
            # The survivor's own partition while it detects and restores: completions go on.
            "survivor_gap_s": max(gaps, default=first - killed_at),
            "from_standby": assignment["from_standby"],
            "changelog_records_read": assignment["records_read"],
            "entries_taken_over": assignment["entries"],
        }
    finally:
        if probe is not None:
            probe.close()
        stop_processes(procs.values())


def measure_takeover(env: Env, figures: Figures, *, sizes: tuple[int, ...], session_timeout_ms: int,
                     progress: Callable[[float, str], None] | None = None) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    steps = [(n, mode) for n in sizes for mode in MODES]
    for i, (n, mode) in enumerate(steps):
        label = f"{size_label(n)}.{mode}"

        def step(what: str, i: int = i, label: str = label) -> None:
            if progress:
                progress(i / len(steps), f"{label}: {what}")

        run = _one(env, n, mode == "standby", session_timeout_ms, step)
        runs[label] = run
        for key in ("detection_s", "restore_s", "total_s", "survivor_gap_s"):
            figures.set(f"takeover.{label}.{key}", run[key])
    figures.set("takeover.session_timeout_s", session_timeout_ms / 1000)
    return runs
