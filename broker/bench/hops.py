"""One-hop runs: the pipeline (source -> task -> acker) and its baselines on one Kafka.

=========  ====================================  =====================================
system     processes                             a record is complete when
=========  ====================================  =====================================
pipeline   source, task, acker (``broker.cli``)  the acker's transaction holding its
           (+ a tail for completion times)       tombstone commits: its ``completed``
                                                 counter is committed with it
raw        producer, consumer                    the consumer has it (offsets committed
                                                 asynchronously per batch)
share      producer, share consumer              the broker confirmed its ACCEPT
skeleton   skeleton source, task, acker          its tombstone is delivered
=========  ====================================  =====================================

The **skeleton** makes the Kafka calls of the pipeline's data path that no wire format can
leave out - per source record a persist record and a data record produced, the data record
consumed, the persist record consumed and its tombstone produced - with the pipeline's
client settings (linger, fetch sizes and waits, one commit per commit interval) and no
headers, no ids, no XOR events, no state, no transactions and no per-record logic. Its
source, like the baselines' producer, keeps at most ``workers.PACING_WINDOW`` records ahead
of completion. It is the
ceiling of the pipeline on this host: what any implementation of the design could reach
before doing any of its work.

The same 100-byte records (1000 keys), the same partition count, one producing process
and one process per consuming stage. Every run first sends warm-up records and waits for
them to complete, so group joins, the acker's restore and connection set-up are outside
the measurement. Then:

- **throughput**: the producer sends as fast as it can for ``duration`` seconds; the rate is
  the completions counted between ``start + warm`` and the end of the send
  (``bench.completions``: no observer reads them), and the CPU of every process and the
  broker is taken at the same two moments (``Window``);
- **latency**: the producer sends at a fixed rate; every record sent is awaited (the
  system's count); latency is completion time minus the record's CreateTime, for the
  pipeline from a tail of one persist partition (a sample), whose count is checked against
  that partition's counters.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from broker import topics
from broker.bench import cost, requests
from broker.bench.completions import Mark, ledger_mark, proc_mark, rate, window
from broker.bench.procs import BenchError, Proc, acker, wait_until, worker
from broker.settings import KafkaSettings

WARMUP_RECORDS = 50
# how long a throughput window may run on past the send's end while the committed counters
# have not moved since its first edge (a commit slower than the window)
WINDOW_EXTENSION_S = 30.0


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
    # count the broker's requests (bench.requests) of these systems' runs: the bench's own broker only
    request_systems: tuple[str, ...] = ()
    created_topics: list[str] = field(default_factory=list)

    def unique(self, prefix: str) -> str:
        return f"bench-{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Window:
    """A throughput run's window, from ``warm`` seconds after the send began to its end: the
    CPU of every process of the system (and the broker's JVM) between two snapshots, and the
    completions counted between two marks taken with them (``bench.completions``)."""

    seconds: float  # wall time between the CPU snapshots
    cpu_s: dict[str, float]  # CPU seconds per process
    rate: float | None  # completions/s between the marks
    completed: int  # completions between the marks
    mark_seconds: float  # the marks' own window (the counting processes' clocks)
    extended_s: float = 0.0  # how long the window ran on past the send (the counters had not moved)

    def us_per_record(self, cpu_s: float) -> float | None:
        done = (self.rate or 0.0) * self.seconds
        return 1e6 * cpu_s / done if done > 0 else None


@dataclass
class HopRun:
    system: str
    sent: int
    t0: float  # wall clock, s: first record of the measured run
    t1: float  # last record sent
    recv: np.ndarray  # completion times (s) the tail or consumer saw, measured records only
    created_ms: np.ndarray  # CreateTime of each of them
    done: dict[str, dict[str, Any] | None]  # each process's "done" report
    warm: float = 0.0
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    namespace: str | None = None  # the pipeline's
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds per process in [t0, t1]
    cost: dict[str, Any] | None = None  # bench.cost.compare of the measured run (drained runs)
    window: Window | None = None  # runs not drained: the throughput window
    check: dict[str, Any] | None = None  # drained pipeline runs with a sampling tail: counters vs tail
    requests: dict[str, Any] | None = None  # bench.requests.compare over the window (or the drained run)

    def cpu_report(self, *, per_sent: bool = False) -> dict[str, dict[str, float]]:
        """Per process: share of one core, and CPU µs per record - in the throughput window
        per completed record, else over the send per record sent (``per_sent``: drained runs
        complete them all). A process near 100 % is a bottleneck; on a 2-core host the sum
        is at most 200 %."""
        if self.window is not None and not per_sent:
            w = self.window
            return {name: {"core_pct": round(100 * cpu / w.seconds, 1), "us_per_record": round(w.us_per_record(cpu) or 0.0, 1)}
                    for name, cpu in w.cpu_s.items()} if w.seconds > 0 else {}
        seconds = self.t1 - self.t0
        done = max(self.sent, 1)
        return {name: {"core_pct": round(100 * cpu / seconds, 1), "us_per_record": round(1e6 * cpu / done, 1)}
                for name, cpu in self.cpu_s.items()} if seconds > 0 else {}

    def cpu_us_per_record(self) -> float | None:
        """CPU of all the system's processes and the broker per completed record, in the
        window; None without the broker's CPU (not a local process)."""
        if self.window is None or KAFKA not in self.window.cpu_s:
            return None
        return self.window.us_per_record(sum(self.window.cpu_s.values()))

    def throughput(self) -> float:
        """Completions per second in the window (runs not drained), else those the tail or
        consumer saw in ``[t0 + warm, t1]``."""
        if self.window is not None:
            return self.window.rate or 0.0
        start, end = self.t0 + self.warm, self.t1
        n = int(np.count_nonzero((self.recv >= start) & (self.recv <= end)))
        return n / (end - start) if end > start else 0.0

    def latencies_ms(self) -> np.ndarray:
        return self.recv * 1000.0 - self.created_ms


KAFKA = "kafka (JVM)"


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
        pids[KAFKA] = env.kafka_pid
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


@dataclass
class _Setup:
    procs: list[Proc]  # every process, the producer last
    producer: Proc
    sink: Proc | None  # the process that saves completion times (none: throughput only)
    read: Callable[[], Mark]  # the system's completions so far (bench.completions)
    touched: list[str]  # the run's topics, for its cost
    namespace: str | None = None  # the pipeline's
    sample: int | None = None  # the persist partition a sampling tail reads


def _throttled(read: Callable[[], Mark], every: float) -> Callable[[], Mark]:
    """``read``, at most once per ``every`` seconds; a mark read earlier is still a true mark
    (its counts and their times go together)."""
    last: list[Any] = [0.0, None]

    def get() -> Mark:
        if last[1] is None or time.monotonic() - last[0] >= every:
            last[1], last[0] = read(), time.monotonic()
        return last[1]
    return get


def _counter_file(workdir: Path) -> str:
    """The completion point's count, read by the producing side's pacing (workers._paced)."""
    path = workdir / "completed"
    path.write_bytes(bytes(8))
    return str(path)


def _start(env: Env, system: str, run_id: str, workdir: Path, out: Path, tail: str,
           task_options: dict[str, Any] | None, timeout_ms: int | None, profile_dir: Path | None) -> _Setup:
    """Create the run's topics and start its processes (the producer last)."""
    base: dict[str, Any] = {"bootstrap": env.bootstrap}
    procs: list[Proc] = []
    if system == "pipeline":
        ns = topics.Namespace(run_id)
        data = f"{ns.name}.data"
        topics.create(env.settings, ns, env.partitions, {data: env.partitions})
        touched = [*ns.ledger_topics, ns.dlq, data, topics.replay_topic(data)]
        env.created_topics += touched
        procs.append(acker(env.bootstrap, ns.name, workdir, commit_interval_ms=env.commit_interval_ms,
                           profile_dir=profile_dir))
        procs.append(worker("task", {**base, "namespace": ns.name, "topic": data, "group": f"{ns.name}.task",
                                     **(task_options or {})}, workdir, profile_dir=profile_dir))
        sink = None
        if tail != "none":
            tail_config = {**base, "namespace": ns.name, "persist": ns.persist, "partitions": env.partitions,
                           "out": str(out)}
            if tail == "sample":
                tail_config["sample"] = [0]
            if task_options:
                tail_config["replay_topic"] = topics.replay_topic(data)
            sink = worker("tail", tail_config, workdir, profile_dir=profile_dir)
            procs.append(sink)
        source_config = {**base, "namespace": ns.name, "topic": data}
        if timeout_ms is not None:
            source_config["timeout_ms"] = timeout_ms
        producer = worker("source", source_config, workdir, profile_dir=profile_dir)
        tailed = sink
        if tailed is not None and tail == "all":
            read: Callable[[], Mark] = lambda: proc_mark(tailed)  # noqa: E731
        else:
            read = lambda: ledger_mark(env.settings, ns.name, env.partitions)  # noqa: E731
        return _Setup([*procs, producer], producer, sink, read, touched, ns.name, 0 if tail == "sample" else None)
    if system == "skeleton":
        data, persist = f"{run_id}.data", f"{run_id}.persist"
        _create_plain_topic(env, data)
        _create_plain_topic(env, persist, compacted=True)
        shared = {**base, "persist": persist, "counter_file": _counter_file(workdir),
                  "commit_interval_ms": env.commit_interval_ms}
        skeleton_acker = worker("skeleton_acker", {**shared, "group": f"{run_id}.acker"}, workdir, name="acker",
                                profile_dir=profile_dir)
        procs.append(skeleton_acker)
        procs.append(worker("skeleton_task", {**base, "topic": data, "group": f"{run_id}.task",
                                              "commit_interval_ms": env.commit_interval_ms}, workdir, name="task",
                            profile_dir=profile_dir))
        producer = worker("skeleton_source", {**shared, "topic": data}, workdir, name="source",
                          profile_dir=profile_dir)
        return _Setup([*procs, producer], producer, None, lambda: proc_mark(skeleton_acker), [data, persist])
    if system in ("raw", "share"):
        data = f"{run_id}.data"
        _create_plain_topic(env, data)
        group = f"{run_id}.group"
        if system == "share":
            _share_group_earliest(env, group)
        shared = {**base, "topic": data, "counter_file": _counter_file(workdir)}
        sink = worker("consumer" if system == "raw" else "share", {**shared, "group": group, "out": str(out)},
                      workdir, profile_dir=profile_dir)
        producer = worker("producer", shared, workdir, profile_dir=profile_dir)
        return _Setup([sink, producer], producer, sink, lambda: proc_mark(sink), [data])
    raise ValueError(system)


def run_hop(env: Env, system: str, *, duration: float | None = None, rate: float | None = None,
            records: int | None = None, warm: float = 0.0, drain: bool = False, drain_timeout: float = 120.0,
            task_options: dict[str, Any] | None = None, timeout_ms: int | None = None,
            on_progress: Any = None, warmup_timeout: float = 90.0, tail: str = "none") -> HopRun:
    """Set up ``system``, warm it up, run the measured send, tear it down.

    ``tail`` (the pipeline's): ``none`` - completions counted by the acker's counters only;
    ``sample`` - a tail reads persist partition 0 for completion times, and after the drain
    its count is checked against that partition's counters (``HopRun.check``); ``all`` - a
    tail reads every partition (and the replay topic) and counts the completions itself.
    A run not drained measures its throughput window (``HopRun.window``)."""
    run_id = env.unique(system)
    out = env.workdir / f"{run_id}.npz"
    workdir = env.workdir / run_id
    workdir.mkdir(parents=True, exist_ok=True)
    profile_dir = None
    if env.profile_dir is not None:
        profile_dir = env.profile_dir / system
        profile_dir.mkdir(parents=True, exist_ok=True)
    setup: _Setup | None = None
    probe: requests.Probe | None = None
    try:
        setup = _start(env, system, run_id, workdir, out, tail, task_options, timeout_ms, profile_dir)
        procs, producer, sink = setup.procs, setup.producer, setup.sink
        # polled while waiting: a ledger read is a consumer's round trips, twice a second is enough
        mark = _throttled(setup.read, 0.5 if system == "pipeline" and tail != "all" else 0.0)
        for p in procs:
            if p.popen.stdin is not None:
                p.wait_event("ready", 60)

        # warm-up: every stage joined, assigned and moving
        producer.send(cmd="send", n=WARMUP_RECORDS)
        producer.wait_event("sent", 60)
        wait_until(lambda: mark().total >= WARMUP_RECORDS, warmup_timeout, procs,
                   f"{system}: the warm-up records to complete")
        before = mark().total

        # the measured run
        probe = requests.start(env.kafka_pid) if system in env.request_systems else None
        cost_before = cost.snapshot(env.settings, setup.touched, log_dir=env.log_dir, kafka_pid=env.kafka_pid) \
            if drain else None
        if probe is not None and cost_before is not None:
            # The broker's counters are sampled (every 200 ms, later on a busy machine) and read
            # between the samples around the edge: none of the run's records may fall between
            # them, so the run starts once a sample after the edge is in.
            probe.at(cost_before.at, timeout=10.0)
        cpu_before, measured_at = _cpu_snapshot(env, procs), time.time()
        producer.send(cmd="run", duration=duration, rate=rate, n=records)
        expected = duration if duration is not None else (records or 0) / (rate or 1e9)
        started = time.monotonic()
        edges: list[tuple[float, dict[str, float], Mark]] = []

        def edge() -> None:  # the window's edge: CPU first, then the count (a ledger read takes a while)
            at, cpu = time.time(), _cpu_snapshot(env, procs)
            edges.append((at, cpu, setup.read()))

        sent_event: dict[str, Any] | None = None
        while sent_event is None:
            if not drain and not edges and time.monotonic() - started >= warm:
                edge()
            try:
                sent_event = producer.wait_event("sent", 0.1)
            except BenchError:
                if not producer.alive() or time.monotonic() - started > expected + 120:
                    raise
                if on_progress is not None:
                    on_progress(min((time.monotonic() - started) / max(expected, 0.1), 1.0) * (0.8 if drain else 1.0))
        extended_s = 0.0
        if not drain:
            if not edges:
                raise BenchError(f"{system}: the send ended within the first {warm:g} s (the warm window)")
            edge()
            extended_s = extend_window(edges, edge, WINDOW_EXTENSION_S)
        cpu_after = _cpu_snapshot(env, procs)
        sent = int(sent_event["n"])
        check = None
        if drain:
            wait_until(lambda: mark().total >= before + sent, drain_timeout, procs,
                       f"{system}: all {sent} records to complete ({mark().total - before} so far)",
                       on_tick=(lambda: on_progress(0.8 + 0.2 * (mark().total - before) / max(sent, 1)))
                       if on_progress else None)
            if setup.sample is not None and sink is not None:
                check = _check_tail(setup.read(), setup.sample, sink)
        drained_at = time.time()
        cost_after = cost.snapshot(env.settings, setup.touched, log_dir=env.log_dir, kafka_pid=env.kafka_pid) \
            if cost_before is not None else None
        # A drained run's requests are counted between the log snapshots (``cost``): a marker of
        # the warm-up's last transaction, or one of the run's written after the drain, is in both.
        bracket = (cost_before.at, cost_after.at) if cost_before is not None and cost_after is not None \
            else (measured_at, drained_at)
        counted = _count_requests(probe, edges, (*bracket, sent) if drain else None, setup.namespace or run_id)
    except BaseException:
        if probe is not None:
            probe.stop()
        for p in reversed(setup.procs if setup is not None else []):
            p.stop(10)
        raise
    done: dict[str, dict[str, Any] | None] = {}
    done[producer.name] = producer.exit()
    for p in procs:
        if p is not producer and p is not sink:
            done[p.name] = p.stop(30)
    if sink is not None:
        done[sink.name] = sink.stop(30)
        if not out.exists():
            raise sink.fail("left no timings")
    arrays = _load(out) if sink is not None else {"recv": np.empty(0)}
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
    spent = None
    if cost_before is not None and cost_after is not None:
        # every record sent in the measured run completed before ``cost_after`` (drained)
        spent = cost.compare(env.settings, cost_before, cost_after, sent, setup.namespace)
    return HopRun(system, sent, t0, t1, recv[keep], created[keep], done, warm=warm, extra=extra,
                  namespace=setup.namespace, cpu_s=cpu, cost=spent, window=_window(edges, extended_s), check=check,
                  requests=counted)


def _count_requests(probe: requests.Probe | None, edges: list[tuple[float, dict[str, float], Mark]],
                    drained: tuple[float, float, int] | None, namespace: str | None) -> dict[str, Any] | None:
    """The broker's requests per completed record: in the throughput window (its
    completions as ``Window.us_per_record`` counts them), or over a drained run (every record
    sent completed)."""
    if probe is None:
        return None
    try:
        if drained is not None:
            start, end, completed = drained
            return requests.compare(probe.at(start), probe.at(end), completed, namespace)
        w = _window(edges, 0.0)
        if w is None or not w.rate:
            return None
        return requests.compare(probe.at(edges[0][0]), probe.at(edges[1][0]), w.rate * w.seconds, namespace)
    except requests.ProbeError:
        return None
    finally:
        probe.stop()


def extend_window(edges: list[tuple[float, dict[str, float], Mark]], edge: Callable[[], None],
                  limit_s: float, pause_s: float = 0.2) -> float:
    """A commit slower than the window leaves the committed counters where the first edge
    found them: the window then ends at the first count that moved (what the pipeline
    completed by then, over the time it took), never at a rate of nothing. Takes the end
    edge again (``edge`` appends one) until the count moved or ``limit_s`` passed; returns
    how far past the first end edge the window now ends (s)."""
    deadline, first_end = time.monotonic() + limit_s, edges[-1][0]
    while edges[-1][2].total <= edges[0][2].total and time.monotonic() < deadline:
        time.sleep(pause_s)
        del edges[-1]
        edge()
    return edges[-1][0] - first_end


def _window(edges: list[tuple[float, dict[str, float], Mark]], extended_s: float) -> Window | None:
    if len(edges) != 2:
        return None
    (a, cpu_a, mark_a), (b, cpu_b, mark_b) = edges
    completed, mark_seconds = window(mark_a, mark_b)
    return Window(b - a, {name: cpu_b[name] - cpu_a[name] for name in cpu_b if name in cpu_a},
                  rate(mark_a, mark_b), completed, round(mark_seconds, 3), round(extended_s, 3))


def _check_tail(counted: Mark, partition: int, tail: Proc, timeout: float = 30.0) -> dict[str, Any]:
    """The acker's ``completed`` count of ``partition`` against the completions a tail of that
    persist partition saw (both since the namespace began), once the tail caught up or
    ``timeout`` passed: equal when counting by the counters is right."""
    expected = counted.counts.get(partition, 0)
    deadline = time.monotonic() + timeout
    while tail.count < expected and time.monotonic() < deadline and tail.alive():
        time.sleep(0.05)
    return {"partition": partition, "counters": expected, "tail": tail.count}


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
