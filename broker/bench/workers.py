"""The processes of a benchmark run: ``python -m bench.workers ROLE CONFIG_JSON``.

Each role is one process of the measured topology, so the pipeline and its baselines run
with the same process layout (one producing process, one consuming process per hop):

========== ===================================================================
role       what it is
========== ===================================================================
source     ``broker.source.Source``: persist record + data record per send
producer   raw confluent-kafka ``Producer`` (the baselines' producing side), at
           most ``PACING_WINDOW`` records ahead of its consumer
task       ``broker.task.Task`` with a leaf handler (or failure injection)
consumer   raw confluent-kafka ``Consumer`` (the raw baseline's completion point)
share      KIP-932 ``ShareConsumer``, explicit ACCEPT per record (share baseline)
tail       the pipeline's completion times: tails ``ns.persist`` (all partitions, or a
           sample of them) for completion tombstones (no ``rb-outcome``) (and
           ``<topic>.replay`` for replays); throughput is counted without it
           (``bench.completions``)
skeleton_source
           the skeleton (``bench.hops``): a persist-sized record to its persist topic
           and the data record, per record; no headers, no callbacks, no logic;
           at most ``PACING_WINDOW`` records ahead of its acker
skeleton_task
           the skeleton's task: consumes the data records, commits per interval
skeleton_acker
           the skeleton's acker: reads the persist topic, writes each record's
           tombstone once per commit interval (no header, no transaction, no
           state); its count is the skeleton's completions
========== ===================================================================

Protocol: a worker writes JSON lines on stdout - ``{"event": "ready"}`` once set up,
``{"event": "progress", "count": n}`` (completion points, every 0.1 s while it changes) and
``{"event": "done", ...}`` last. Producing workers read commands as JSON lines on stdin
(``send``: n records now; ``run``: for a duration at a rate; ``exit``). Consuming workers
run until SIGTERM, then save their per-record timings (wall-clock seconds / milliseconds,
comparable across processes of one host) to ``config["out"]`` (``.npz``) and report done.
Logging and librdkafka chatter go to stderr, which the runner sends to a log file.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

log = logging.getLogger("broker.bench.workers")

VALUE_BYTES = 100
KEYS = 1000  # distinct keys, spread over the data topic's partitions by murmur2


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(orjson.dumps({"event": event, **fields}, option=orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")
    sys.stdout.flush()


def record_value(i: int) -> bytes:
    """A 100-byte value (the same records for the pipeline and the baselines)."""
    head = b"%012d|" % i
    return head + b"x" * (VALUE_BYTES - len(head))


def record_key(i: int) -> bytes:
    return b"key-%d" % (i % KEYS)


def _keys(config: dict[str, Any]) -> Callable[[int], bytes]:
    """Record i's key: ``record_key``, or one of ``config["keys"]`` keys, in turn or (with
    ``config["zipf_s"]``) drawn from a Zipf law - the ledger partition follows the key, so
    this is how skew reaches the ackers (``bench.scale``)."""
    keys = config.get("keys")
    if keys is None:
        return record_key
    if config.get("zipf_s") is None:
        return lambda i: b"key-%d" % (i % keys)
    from broker.bench.keys import zipf_indices

    drawn = zipf_indices(1 << 16, keys, float(config["zipf_s"])).tolist()
    return lambda i: b"key-%d" % drawn[i % len(drawn)]


def fraction(srid: int, salt: bytes) -> float:
    """A deterministic draw in [0, 1) per srid (failure injection, as in broker.demo)."""
    digest = hashlib.blake2b(srid.to_bytes(8, "big", signed=True) + salt, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _settings(config: dict[str, Any]) -> Any:
    from broker.settings import KafkaSettings

    return KafkaSettings.from_env(config["bootstrap"])


class _Stop:
    """SIGTERM / SIGINT set a flag; the loops check it."""

    def __init__(self) -> None:
        self.event = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: self.event.set())
        signal.signal(signal.SIGINT, lambda *_: self.event.set())

    def __bool__(self) -> bool:
        return self.event.is_set()


class _Progress:
    def __init__(self) -> None:
        self.count = 0
        self._reported = -1
        self._at = 0.0

    def maybe_report(self, now: float) -> None:
        if self.count != self._reported and now - self._at >= 0.1:
            self._reported, self._at = self.count, now
            emit("progress", count=self.count, at=now)


# --------------------------------------------------------------------------- producing side


def _paced_send(send: Callable[[int], None], poll: Callable[[], None], n: int | None, duration: float | None,
                rate: float | None, start_index: int,
                burst_send: Callable[[int, int], None] | None = None) -> tuple[int, float, float]:
    """Call ``send(i)`` (or ``burst_send(i, k)`` for records i..i+k-1 at once) as fast as
    possible or at ``rate``/s, for ``n`` records or ``duration`` seconds. Pacing releases the
    records due every millisecond (no burst longer than 1 ms)."""
    sent = 0
    t0 = time.time()
    end = t0 + duration if duration is not None else None
    i = start_index
    while True:
        now = time.time()
        if (n is not None and sent >= n) or (end is not None and now >= end):
            break
        if rate is not None:
            due = int((now - t0) * rate) + 1
            if n is not None:
                due = min(due, n)
            if sent >= due:
                poll()
                time.sleep(0.0005)
                continue
            burst = due - sent
        else:
            burst = 256 if n is None else min(256, n - sent)
        if burst_send is not None:
            burst_send(i, burst)
            i += burst
        else:
            for _ in range(burst):
                send(i)
                i += 1
        sent += burst
    return sent, t0, time.time()


def _producer_loop(send: Callable[[int], None], poll: Callable[[], None], flush: Callable[[], None],
                   burst_send: Callable[[int, int], None] | None = None) -> None:
    emit("ready")
    index = 0
    for line in sys.stdin:
        cmd = orjson.loads(line)
        if cmd["cmd"] == "exit":
            break
        n = cmd.get("n")
        sent, t0, t1 = _paced_send(send, poll, n, cmd.get("duration"), cmd.get("rate"), index, burst_send)
        index += sent
        flush()
        emit("sent", n=sent, t0=t0, t1=t1, flushed=time.time())
    emit("done", total=index)


def run_source(config: dict[str, Any]) -> None:
    from broker.source import Source, SourceConfig

    source = Source(
        _settings(config),
        config["namespace"],
        # No back-off: the replay figures measure the mechanism (a replay at once, or at its
        # timeout), not the default policy's wait.
        SourceConfig(timeout_ms=config.get("timeout_ms", 30_000), max_attempts=config.get("max_attempts", 5),
                     retry=None),
    )
    topic = config["topic"]
    key = _keys(config)

    def send(i: int) -> None:
        source.send(topic, key(i), record_value(i))

    def send_many(i: int, k: int) -> None:  # the batch API, as a source with bursts uses it
        source.send_many(topic, [(key(j), record_value(j)) for j in range(i, i + k)])
        source.poll()

    _producer_loop(send, source.poll, source.flush, None if config.get("per_record") else send_many)
    source.close()


def run_producer(config: dict[str, Any]) -> None:
    from confluent_kafka import Producer

    # The Source's producer settings: idempotent, acks=all, lz4, murmur2, linger 5 ms.
    producer = Producer(_settings(config).producer_config(defaults={"linger.ms": 5}))
    topic = config["topic"]
    wait = _paced(config, producer.poll)

    def send(i: int) -> None:
        wait(i)
        while True:
            try:
                producer.produce(topic, record_value(i), record_key(i))
                return
            except BufferError:
                producer.poll(0.05)

    _producer_loop(send, lambda: producer.poll(0), lambda: producer.flush(60))


PERSIST_VALUE = b"p" * 150  # about a persist record's value (payload, partition, attempt, deadline)

# The producing side of the skeleton and of the baselines keeps at most this many records
# sent and not completed (the completion point's count, shared through a file,
# ``config["counter_file"]``): it cannot run ahead of the stages behind it - as the pipeline's
# source, whose own CPU paces it, does not (sent 75.8k/s, completed 74.3k/s) - so the CPU in a
# throughput window is spent on the records completed in it. Above rate x latency (~150 ms:
# linger, fetch wait, commit interval) at any rate seen here.
PACING_WINDOW = 50_000


def _paced(config: dict[str, Any], poll: Callable[[float], Any]) -> Callable[[int], None]:
    """``wait(i)``: before record ``i``, wait while ``PACING_WINDOW`` records are pending (a
    look every 1024 records); nothing without a counter file."""
    path = config.get("counter_file")
    if path is None:
        return lambda _i: None
    fd = os.open(path, os.O_RDONLY)

    def completed() -> int:
        return int.from_bytes(os.pread(fd, 8, 0) or bytes(8), "little")

    def wait(i: int) -> None:
        if not i & 1023:
            while i - completed() > PACING_WINDOW:
                poll(0.001)
    return wait


def _counted(config: dict[str, Any]) -> Callable[[int], None]:
    """``count(n)``: the completion point's count, for a producer's ``_paced``."""
    path = config.get("counter_file")
    if path is None:
        return lambda _n: None
    fd = os.open(path, os.O_WRONLY)

    def count(n: int) -> None:
        os.pwrite(fd, n.to_bytes(8, "little"), 0)
    return count


def run_skeleton_source(config: dict[str, Any]) -> None:
    """The calls the source's data path cannot do without, and nothing else: per record a
    persist record keyed by a unique id, then the data record - no headers, no delivery
    callbacks, no ids drawn, no encoding (the Source's producer settings, its linger). Paced
    by ``PACING_WINDOW``."""
    from confluent_kafka import Producer

    from broker.kafka_io import produce

    producer = Producer(_settings(config).producer_config(defaults={"linger.ms": 10}))
    data, persist = config["topic"], config["persist"]
    wait = _paced(config, producer.poll)

    def send(i: int) -> None:
        wait(i)
        produce(producer, persist, value=PERSIST_VALUE, key=i.to_bytes(8, "big"))
        produce(producer, data, value=record_value(i), key=record_key(i))

    _producer_loop(send, lambda: producer.poll(0), lambda: producer.flush(60))


def run_skeleton_task(config: dict[str, Any]) -> None:
    """The task's data path without its logic: consume the data records with the task's fetch
    settings, commit the offsets once per commit interval (``Task.finish``)."""
    from confluent_kafka import Consumer, KafkaException

    stop = _Stop()
    consumer = Consumer(_settings(config).consumer_config(
        config["group"], defaults={"fetch.wait.max.ms": 10, "fetch.min.bytes": 262_144}))
    consumer.subscribe([config["topic"]])
    interval = config["commit_interval_ms"] / 1000
    read, due, dirty = 0, time.monotonic() + interval, False
    emit("ready")
    try:
        while not stop:
            msgs = _available(consumer, 1000, 0.05)
            read += len(msgs)
            dirty = dirty or bool(msgs)
            if dirty and time.monotonic() >= due:
                with contextlib.suppress(KafkaException):  # nothing to commit yet, a rebalance
                    consumer.commit(asynchronous=False)
                due, dirty = time.monotonic() + interval, False
    finally:
        consumer.close()
    emit("done", read=read)


def run_skeleton_acker(config: dict[str, Any]) -> None:
    """The calls the acker's data path cannot do without: read every persist record (the
    acker's fetch settings), and once per commit interval write the tombstones of those read
    to their partitions, wait for their delivery and commit the offsets - no XOR events, no
    state, no transaction, no header. A record completes when its tombstone is delivered:
    the count goes to ``progress`` and to ``config["counter_file"]`` (the source's window)."""
    from confluent_kafka import Consumer, KafkaException, Producer

    from broker.kafka_io import produce

    stop = _Stop()
    consumer = Consumer(_settings(config).consumer_config(
        config["group"], defaults={"fetch.wait.max.ms": 20, "fetch.min.bytes": 262_144}))
    consumer.subscribe([config["persist"]])
    producer = Producer(_settings(config).producer_config(defaults={"linger.ms": 10}))  # the acker's
    count = _counted(config)
    interval = config["commit_interval_ms"] / 1000
    progress = _Progress()  # its count only: a progress event follows every commit
    pending: list[tuple[str, int, bytes]] = []
    due = time.monotonic() + interval
    emit("ready")
    try:
        while not stop:
            for m in _available(consumer, 1000, 0.05):
                if m.error() is None and m.value() is not None:  # not a tombstone of ours, read back
                    pending.append((m.topic(), m.partition(), m.key()))
            if time.monotonic() < due:
                continue
            if pending:
                for topic, partition, key in pending:
                    produce(producer, topic, value=None, key=key, partition=partition)
                producer.flush(30)
                with contextlib.suppress(KafkaException):  # nothing to commit yet, a rebalance
                    consumer.commit(asynchronous=False)
                progress.count += len(pending)
                pending = []
                count(progress.count)
                emit("progress", count=progress.count, at=time.time())
            due = time.monotonic() + interval
    finally:
        consumer.close()
    emit("done", count=progress.count)


# --------------------------------------------------------------------------- consuming side


def run_task(config: dict[str, Any]) -> None:
    """``Task`` over the data topic and its replay topic. ``fail_rate`` / ``drop_rate`` inject
    failures on first attempts: failed inputs are replayed at once, dropped (never acked)
    ones after their timeout. The wall time of each injected failure is reported."""
    from broker.dev.faults import skip_ack, skipped_acks
    from broker.task import Task, TaskContext, TaskRecord
    from broker.topics import replay_topic

    fail_rate = float(config.get("fail_rate", 0.0))
    drop_rate = float(config.get("drop_rate", 0.0))
    inject_from = int(config.get("inject_from", 0))  # records before this index: the warm-up
    failed_at: dict[int, float] = {}
    dropped: list[int] = []

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        tracking = record.tracking
        if tracking is None or tracking.attempt != 1 or not (fail_rate or drop_rate):
            return  # a leaf: the ack is the input's own id
        if inject_from and int((record.value or b"0")[:12]) < inject_from:
            return
        draw = fraction(tracking.origin, b"bench-inject")
        if draw < fail_rate:
            failed_at[tracking.origin] = time.time()
            ctx.fail("bench: injected failure")
        elif draw < fail_rate + drop_rate:
            dropped.append(tracking.origin)
            skip_ack(ctx)

    topic = config["topic"]
    task = Task(_settings(config), config["namespace"], [topic, replay_topic(topic)], config["group"], handler)
    signal.signal(signal.SIGINT, lambda *_: task.stop())
    emit("ready")
    counters = task.run(install_signals=True)
    emit(
        "done",
        processed=counters.processed,
        acked=counters.acked,
        failed=counters.failed,
        unacked=skipped_acks(task),
        failed_at=[[o, t] for o, t in failed_at.items()],
        dropped=dropped,
    )


def _available(consumer: Any, n: int, timeout: float) -> list[Any]:
    """Wait up to ``timeout`` for the FIRST message only, then take what is already fetched.

    ``Consumer.consume(n, timeout)`` waits until it has ``n`` messages or the timeout
    passes, which adds up to ``timeout`` of latency to every batch at moderate rates."""
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(n - 1, 0)]


def _consumer_conf(config: dict[str, Any], group: str | None, **extra: Any) -> dict[str, Any]:
    # Same fetch settings for every completion point, so latencies compare like for like.
    return _settings(config).consumer_config(group, defaults={"fetch.wait.max.ms": 20, **extra})


def run_consumer(config: dict[str, Any]) -> None:
    """Raw baseline: consume, note the time, commit the batch's offsets asynchronously."""
    from confluent_kafka import Consumer

    stop = _Stop()
    consumer = Consumer(_consumer_conf(config, config["group"], **{"isolation.level": "read_uncommitted"}))
    consumer.subscribe([config["topic"]])
    progress = _Progress()
    count = _counted(config)
    recv: list[np.ndarray] = []
    created: list[np.ndarray] = []
    emit("ready")
    try:
        while not stop:
            msgs = _available(consumer, 1000, 0.05)
            now = time.time()
            if msgs:
                ts = [m.timestamp()[1] for m in msgs if m.error() is None]
                if ts:
                    created.append(np.array(ts, dtype=np.int64))
                    recv.append(np.full(len(ts), now))
                    progress.count += len(ts)
                    count(progress.count)
                    consumer.commit(asynchronous=True)
            progress.maybe_report(now)
    finally:
        consumer.close()
    _save(config, recv=recv, created_ms=created)
    emit("done", count=progress.count)


def run_share(config: dict[str, Any]) -> None:
    """KIP-932 baseline: a share-group member that ACCEPTs every record explicitly; a record
    is complete when the broker confirms its acknowledgement (commit callback)."""
    from confluent_kafka import AcknowledgeType, KafkaException, ShareConsumer

    stop = _Stop()
    progress = _Progress()
    count = _counted(config)
    recv: list[np.ndarray] = []
    errors: list[str] = []

    def on_commit(offsets: dict[Any, set[int]], exc: Exception | None) -> None:
        if exc is not None:
            errors.append(str(exc))
            return
        n = sum(len(v) for v in offsets.values())
        if n:
            recv.append(np.full(n, time.time()))
            progress.count += n
            count(progress.count)

    conf = _consumer_conf(config, config["group"])
    for key in ("enable.auto.commit", "auto.offset.reset", "isolation.level", "partition.assignment.strategy"):
        conf.pop(key, None)  # not share-consumer properties
    conf["share.acknowledgement.mode"] = "explicit"
    conf["log_level"] = 3  # the "Preview" notice is a warning
    consumer = ShareConsumer(conf)
    consumer.set_acknowledgement_commit_callback(on_commit)
    consumer.subscribe([config["topic"]])
    emit("ready")
    try:
        while not stop:
            msgs = consumer.poll(0.05)
            for m in msgs:
                if m.error() is None:
                    consumer.acknowledge(m, AcknowledgeType.ACCEPT)
                else:
                    errors.append(str(m.error()))
            if len(msgs):
                consumer.commit_async()
            progress.maybe_report(time.time())
        consumer.commit_sync(10)
    except KafkaException as exc:
        errors.append(str(exc))
    finally:
        try:
            consumer.close()
        except KafkaException as exc:
            errors.append(str(exc))
    _save(config, recv=recv)
    emit("done", count=progress.count, errors=errors[:5])


def run_tail(config: dict[str, Any]) -> None:
    """The pipeline's completion point. A record completes when the acker's transaction
    holding its persist tombstone (a completion) commits: this read_committed
    consumer then sees it. Latency = receive time - persist record timestamp (CreateTime,
    taken in ``Source.send``); the tombstone's own CreateTime (the acker's decision, before
    its commit) is kept too."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from broker.headers import Tracking, outcome_of

    stop = _Stop()
    persist = config["persist"]
    # "sample": the persist partitions read (latency: one of them, so the tail costs little)
    tps = [TopicPartition(persist, p, OFFSET_BEGINNING) for p in config.get("sample", range(config["partitions"]))]
    replay = config.get("replay_topic")
    if replay:
        tps += [TopicPartition(replay, p, OFFSET_BEGINNING) for p in range(config["partitions"])]
    consumer = Consumer(_consumer_conf(config, None, **{"group.id": f"{config['namespace']}.bench-tail"}))
    consumer.assign(tps)
    keep_all = bool(replay)
    persisted: dict[bytes, int] = {}  # srid key -> persist CreateTime (ms)
    first_persist: dict[bytes, int] = {}
    progress = _Progress()
    recv: list[float] = []
    created: list[int] = []
    decided: list[int] = []
    outcomes: dict[str, int] = {}
    replays: list[tuple[int, int, float]] = []  # origin, attempt, receive time (0, 0: untracked)
    emit("ready")
    try:
        while not stop:
            msgs = _available(consumer, 10_000, 0.05)
            now = time.time()
            for m in msgs:
                if m.error() is not None:
                    continue
                if m.topic() != persist:
                    t = Tracking.from_headers(m.headers())
                    replays.append((0, 0, now) if t is None else (t.origin, t.attempt, now))
                    continue
                key = m.key()
                if m.value() is not None:
                    persisted[key] = m.timestamp()[1]
                    if keep_all:
                        first_persist.setdefault(key, m.timestamp()[1])
                    continue
                outcome = outcome_of(m.headers()).decode()
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                t_persist = persisted.pop(key, None)
                if outcome == "completed" and t_persist is not None:
                    recv.append(now)
                    created.append(t_persist)
                    decided.append(m.timestamp()[1])
                    progress.count += 1
            progress.maybe_report(now)
    finally:
        consumer.close()
    extra: dict[str, Any] = {}
    if keep_all:
        extra["replay_origin"] = [o for o, _, _ in replays]
        extra["replay_attempt"] = [a for _, a, _ in replays]
        extra["replay_recv"] = [t for _, _, t in replays]
        extra["first_origin"] = [int.from_bytes(k, "big", signed=True) for k in first_persist]
        extra["first_persist_ms"] = list(first_persist.values())
    _save(
        config,
        recv=[np.array(recv)],
        created_ms=[np.array(created, dtype=np.int64)],
        decided_ms=[np.array(decided, dtype=np.int64)],
        **{k: [np.array(v)] for k, v in extra.items()},
    )
    emit("done", count=progress.count, outcomes=outcomes, pending=len(persisted))


def _save(config: dict[str, Any], **arrays: list[np.ndarray]) -> None:
    out = {k: (np.concatenate(v) if v else np.empty(0)) for k, v in arrays.items()}
    np.savez(config["out"], **out)  # type: ignore[arg-type]


ROLES: dict[str, Callable[[dict[str, Any]], None]] = {
    "source": run_source,
    "producer": run_producer,
    "task": run_task,
    "consumer": run_consumer,
    "share": run_share,
    "tail": run_tail,
    "skeleton_source": run_skeleton_source,
    "skeleton_task": run_skeleton_task,
    "skeleton_acker": run_skeleton_acker,
}


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    role, config = argv[0], orjson.loads(argv[1])
    ROLES[role](config)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
