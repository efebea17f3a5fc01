"""One-hop runs: the pipeline (source -> task -> acker) and its baselines on one Kafka.

=========  ====================================  =====================================
system     processes                             a record is complete when
=========  ====================================  =====================================
pipeline   source, task, acker (``broker.cli``)  its persist tombstone of a
           + tail (the completion point)         completion is visible
                                                 to a read_committed consumer
raw        producer, consumer                    the consumer has it (offsets committed
                                                 asynchronously per batch)
share      producer, share consumer              the broker confirmed its ACCEPT
skeleton   skeleton source, consumer (the task), as the pipeline's
           skeleton acker + tail
=========  ====================================  =====================================

The **skeleton** makes the Kafka calls of the pipeline's data path that no wire format can
leave out - per source record a persist record and a data record produced, the data record
consumed, the persist record consumed and its tombstone produced, and the tail reading the
persist topic for completions, as the pipeline's does - with no headers, no ids, no XOR
events, no state, no transactions and no per-record logic. It is the ceiling of the pipeline
on this host: what any implementation of the design could reach before doing any of its work.

The same 100-byte records (1000 keys), the same partition count, one producing process
and one process per consuming stage. Every run first sends warm-up records and waits for
them to complete, so group joins, the acker's restore and connection set-up are outside
the measurement. Then:

- **throughput**: the producer sends as fast as it can for ``duration`` seconds; the rate is
  the completions whose completion time falls in ``[start + warm, end]`` divided by that
  window - the sustained rate of the slowest stage, with every stage running.
- **latency**: the producer sends at a fixed rate; every record sent is awaited; latency is
  completion time minus the record's CreateTime (set when it was produced).
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from broker import topics
from broker.bench import cost
from broker.bench.procs import BenchError, Proc, acker, wait_until, worker
from broker.settings import KafkaSettings

WARMUP_RECORDS = 50


@dataclass
class Env:
    """What every run needs: the cluster, the layout, where to put logs and profiles."""

    bootstrap: str
    settings: KafkaSettings
    partitions: int
    workdir: Path
    profile_dir: Path | None = None
    commit_interval_ms: int = 100
    kafka_pid: int | None = None  # the embedded broker's JVM, for its CPU share
    log_dir: Path | None = None  # the broker's log directory, when on this host (bytes appended)
    created_topics: list[str] = field(default_factory=list)

    def unique(self, prefix: str) -> str:
        return f"bench-{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class HopRun:
    system: str
    sent: int
    t0: float  # wall clock, s: first record of the measured run
    t1: float  # last record sent
    recv: np.ndarray  # completion times (s), measured records only (after t0)
    created_ms: np.ndarray  # CreateTime of each completed record
    done: dict[str, dict[str, Any] | None]  # each process's "done" report
    warm: float = 0.0
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    namespace: str | None = None  # the pipeline's
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds per process in [t0, t1]
    cost: dict[str, Any] | None = None  # bench.cost.compare of the measured run (drained runs)

    def completed_in_run(self) -> int:
        return int(np.count_nonzero((self.recv >= self.t0) & (self.recv <= self.t1)))

    def cpu_report(self, *, per_sent: bool = False) -> dict[str, dict[str, float]]:
        """Per process: share of one core during the send, and CPU µs per record (completed
        in the send window, or sent when ``per_sent``: runs below capacity complete all) -
        a process near 100 % is a bottleneck; on a 2-core host the sum is at most 200 %."""
        seconds = self.t1 - self.t0
        done = max(self.sent if per_sent else self.completed_in_run(), 1)
        return {name: {"core_pct": round(100 * cpu / seconds, 1), "us_per_record": round(1e6 * cpu / done, 1)}
                for name, cpu in self.cpu_s.items()} if seconds > 0 else {}

    def throughput(self) -> float:
        """Completions per second in ``[t0 + warm, t1]``."""
        start, end = self.t0 + self.warm, self.t1
        n = int(np.count_nonzero((self.recv >= start) & (self.recv <= end)))
        return n / (end - start) if end > start else 0.0

    def latencies_ms(self) -> np.ndarray:
        return self.recv * 1000.0 - self.created_ms


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process and its threads (Linux /proc), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _cpu_snapshot(env: Env, procs: list[Proc]) -> dict[str, float]:
    pids = {p.name: p.popen.pid for p in procs}
    if env.kafka_pid is not None:
        pids["kafka (JVM)"] = env.kafka_pid
    out = {}
    for name, pid in pids.items():
        cpu = cpu_seconds(pid)
        if cpu is not None:
            out[name] = cpu
    return out


def _create_plain_topic(env: Env, name: str, *, compacted: bool = False) -> None:
    from broker.dev.testing import create_topics

    create_topics(env.bootstrap, {name: env.partitions}, config={"cleanup.policy": "compact"} if compacted else None)
    env.created_topics.append(name)


def _share_group_earliest(env: Env, group: str) -> None:
    """A share group starts at the log end by default; the warm-up would race it."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient(env.settings.client_config())
    resource = ConfigResource(
        ConfigResource.Type.GROUP, group,
        incremental_configs=[ConfigEntry("share.auto.offset.reset", "earliest",
                                         incremental_operation=AlterConfigOpType.SET)],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def run_hop(env: Env, system: str, *, duration: float | None = None, rate: float | None = None,
            records: int | None = None, warm: float = 0.0, drain: bool = False, drain_timeout: float = 120.0,
            task_options: dict[str, Any] | None = None, timeout_ms: int | None = None,
            on_progress: Any = None, warmup_timeout: float = 90.0) -> HopRun:
    """Set up ``system``, warm it up, run the measured send, tear it down."""
    run_id = env.unique(system)
    out = env.workdir / f"{run_id}.npz"
    procs: list[Proc] = []
    sink: Proc
    producer: Proc
    base: dict[str, Any] = {"bootstrap": env.bootstrap}
    workdir = env.workdir / run_id
    workdir.mkdir(parents=True, exist_ok=True)
    touched: list[str] = []  # the run's topics, for its cost
    profile_dir = None
    if env.profile_dir is not None:
        profile_dir = env.profile_dir / system
        profile_dir.mkdir(parents=True, exist_ok=True)
    try:
        if system == "pipeline":
            ns = topics.Namespace(run_id)
            data = f"{ns.name}.data"
            topics.create(env.settings, ns, env.partitions, {data: env.partitions})
            touched = [*ns.ledger_topics, ns.dlq, data, topics.replay_topic(data)]
            env.created_topics += touched
            procs.append(acker(env.bootstrap, ns.name, workdir, commit_interval_ms=env.commit_interval_ms,
                               profile_dir=profile_dir))
            task_config = {**base, "namespace": ns.name, "topic": data, "group": f"{ns.name}.task",
                           **(task_options or {})}
            procs.append(worker("task", task_config, workdir, profile_dir=profile_dir))
            tail_config = {**base, "namespace": ns.name, "persist": ns.persist, "partitions": env.partitions,
                           "out": str(out)}
            if task_options:
                tail_config["replay_topic"] = topics.replay_topic(data)
            sink = worker("tail", tail_config, workdir, profile_dir=profile_dir)
            source_config = {**base, "namespace": ns.name, "topic": data}
            if timeout_ms is not None:
                source_config["timeout_ms"] = timeout_ms
            producer = worker("source", source_config, workdir, profile_dir=profile_dir)
        elif system == "skeleton":
            data, persist = f"{run_id}.data", f"{run_id}.persist"
            _create_plain_topic(env, data)
            _create_plain_topic(env, persist, compacted=True)
            touched = [data, persist]
            procs.append(worker("skeleton_acker", {**base, "persist": persist, "group": f"{run_id}.acker"}, workdir,
                                name="acker", profile_dir=profile_dir))
            procs.append(worker("consumer", {**base, "topic": data, "group": f"{run_id}.task",
                                             "out": str(workdir / "task.npz")}, workdir, name="task",
                                profile_dir=profile_dir))
            sink = worker("tail", {**base, "namespace": run_id, "persist": persist, "partitions": env.partitions,
                                   "out": str(out)}, workdir, profile_dir=profile_dir)
            producer = worker("skeleton_source", {**base, "topic": data, "persist": persist}, workdir,
                              name="source", profile_dir=profile_dir)
        elif system in ("raw", "share"):
            data = f"{run_id}.data"
            _create_plain_topic(env, data)
            touched = [data]
            group = f"{run_id}.group"
            if system == "share":
                _share_group_earliest(env, group)
            sink = worker("consumer" if system == "raw" else "share",
                          {**base, "topic": data, "group": group, "out": str(out)}, workdir, profile_dir=profile_dir)
            producer = worker("producer", {**base, "topic": data}, workdir, profile_dir=profile_dir)
        else:
            raise ValueError(system)
        procs += [sink, producer]
        for p in procs:
            if p.popen.stdin is not None:
                p.wait_event("ready", 60)

        # warm-up: every stage joined, assigned and moving
        producer.send(cmd="send", n=WARMUP_RECORDS)
        producer.wait_event("sent", 60)
        wait_until(lambda: sink.count >= WARMUP_RECORDS, warmup_timeout, procs,
                   f"{system}: the warm-up records to complete")
        before = sink.count

        # the measured run
        cost_before = cost.snapshot(env.settings, touched, log_dir=env.log_dir, kafka_pid=env.kafka_pid) \
            if drain else None
        cpu_before = _cpu_snapshot(env, procs)
        producer.send(cmd="run", duration=duration, rate=rate, n=records)
        expected = duration if duration is not None else (records or 0) / (rate or 1e9)
        started = time.monotonic()
        sent_event: dict[str, Any] | None = None
        while sent_event is None:
            try:
                sent_event = producer.wait_event("sent", 0.5)
            except BenchError:
                if not producer.alive() or time.monotonic() - started > expected + 120:
                    raise
                if on_progress is not None:
                    on_progress(min((time.monotonic() - started) / max(expected, 0.1), 1.0) * (0.8 if drain else 1.0))
        cpu_after = _cpu_snapshot(env, procs)
        sent = int(sent_event["n"])
        if drain:
            wait_until(lambda: sink.count >= before + sent, drain_timeout, procs,
                       f"{system}: all {sent} records to complete ({sink.count - before} so far)",
                       on_tick=(lambda: on_progress(0.8 + 0.2 * (sink.count - before) / max(sent, 1)))
                       if on_progress else None)
        cost_after = cost.snapshot(env.settings, touched, log_dir=env.log_dir, kafka_pid=env.kafka_pid) \
            if cost_before is not None else None
    except BaseException:
        for p in reversed(procs):
            p.stop(10)
        raise
    done: dict[str, dict[str, Any] | None] = {}
    done[producer.name] = producer.exit()
    for p in procs:
        if p is not producer and p is not sink:
            done[p.name] = p.stop(30)
    done[sink.name] = sink.stop(30)
    if not out.exists():
        raise sink.fail("left no timings")
    arrays = _load(out)
    recv = arrays.pop("recv")
    created = arrays.pop("created_ms", np.zeros(recv.size, dtype=np.int64))
    if created.size != recv.size:
        created = np.zeros(recv.size, dtype=np.int64)
    t0, t1 = float(sent_event["t0"]), float(sent_event["t1"])
    # warm-up records were produced before t0: leave them out (the share consumer reports
    # no CreateTimes, only acknowledgement times)
    keep = recv >= t0 if system == "share" else created >= int(t0 * 1000) - 1
    extra = dict(arrays)
    if extra.get("decided_ms") is not None and extra["decided_ms"].size == keep.size:
        extra["decided_ms"] = extra["decided_ms"][keep]
    cpu = {name: cpu_after[name] - cpu_before[name] for name in cpu_after if name in cpu_before}
    namespace = run_id if system == "pipeline" else None
    spent = None
    if cost_before is not None and cost_after is not None:
        # every record sent in the measured run completed before ``cost_after`` (drained)
        spent = cost.compare(env.settings, cost_before, cost_after, sent, namespace)
    return HopRun(system, sent, t0, t1, recv[keep], created[keep], done, warm=warm, extra=extra,
                  namespace=namespace, cpu_s=cpu, cost=spent)


def read_all(env: Env, topic: str, partitions: int) -> list[Any]:
    """Every committed message of ``topic`` (read_committed, from the beginning)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(env.settings.consumer_config(None, defaults={"group.id": env.unique("read"),
                                                              "enable.partition.eof": True}))
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out: list[Any] = []
    eof: set[int] = set()
    deadline = time.monotonic() + 120
    try:
        while len(eof) < partitions and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.5):
                err = msg.error()
                if err is None:
                    out.append(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    eof.add(msg.partition())
    finally:
        consumer.close()
    return out
