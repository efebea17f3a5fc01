"""A key's replays keep the order its records were sent in, whatever the number of ackers.

Every attempt of an origin lives in one ledger partition, and a keyed record's origin in its
key's (docs/design.md §6): one acker decides all of a key's records. Records sent in bursts
(``send_many``: one millisecond for a whole burst, several keys interleaved) are dropped by the
task at random, so many of a key's records time out in the same tick; 1, 2 or 4 acker
processes share the ledger partitions, and one of four is killed with SIGKILL half-way.

Ground truth: the order the source sent each key's records in (``send_many``'s results,
confirmed by ``flush``), and the records on ``<topic>.replay`` as Kafka delivered them, per
partition in offset order. Each key's replays must be its dropped records in send order, on the
key's partition, and every record must complete exactly once. The ledger has 8 partitions and
the data topic 3, so a key's ledger partition comes from its hash, not its data partition.
Before one origin lived in one ledger partition, one acker inverted hundreds of pairs here:
records that timed out in the same tick were replayed in persist-offset order across ledger
partitions.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from broker import topics
from broker.completions import OutcomeTail
from broker.dev.faults import skip_ack
from broker.dev.testing import stop_processes, unique_name
from broker.headers import Tracking
from broker.kafka_io import read_to_end
from broker.retry import DEFAULT_RETRY, RetryPolicy
from broker.schemas import PersistedRecord
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from tests.integration.test_replay import draw

pytestmark = pytest.mark.integration

LEDGER_PARTITIONS = 8
DATA_PARTITIONS = 3
KEYS = [b"alpha", b"bravo", b"charlie"]
BURSTS, BURST = 30, 40
DROP = 0.4
TIMEOUT_MS = 3_000
SESSION_TIMEOUT_MS = 6_000  # the embedded broker's minimum: the kill is noticed sooner


def _acker(bootstrap: str, ns: str, log_path: Path) -> subprocess.Popen[bytes]:
    args = [
        sys.executable, "-m", "broker.cli", "acker", "--bootstrap", bootstrap, "--namespace", ns,
        "--instance-id", unique_name("acker"), "--session-timeout-ms", str(SESSION_TIMEOUT_MS),
    ]
    return subprocess.Popen(args, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)


def _persisted(settings: KafkaSettings, ns: topics.Namespace) -> dict[int, tuple[int, int, int]]:
    """seq -> (ledger partition, persist offset, created_ms) of each first attempt."""
    out = {}
    for msg in read_to_end(settings, ns.persist, LEDGER_PARTITIONS):
        if msg.value() is not None:
            record = PersistedRecord.decode(msg.value())
            if record.attempt == 1 and record.key != b"warm-up":
                out[int(record.value or b"0")] = (msg.partition(), msg.offset(), record.created_ms)
    return out


@pytest.mark.parametrize(("ackers", "kill"), [(1, ""), (2, ""), (4, ""), (4, "sending"), (1, "waiting"), (2, "waiting")])
def test_a_keys_replays_keep_its_send_order(bootstrap: str, tmp_path: Path, ackers: int, kill: str) -> None:
    """``kill``: SIGKILL one acker half-way through the sending ("sending"), or once the first
    bursts' records timed out and their replays wait ("waiting": half the dropped records fail
    at once asking for 15 s - the kill is noticed after the 6 s session - the others time out
    and wait a 2 s back-off, behind the earlier ones of their key; the turns are in the killed
    acker's memory, the new owner - the other acker, or a new process - restores the waits
    from the changelog while the later bursts time out). On 998b494 "waiting" inverted a
    key's replays with 1 and with 2 ackers."""
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("order"))
    topic = f"{ns.name}.orders"
    replay = topics.replay_topic(topic)
    topics.create(settings, ns, LEDGER_PARTITIONS, {topic: DATA_PARTITIONS})
    procs = [_acker(bootstrap, ns.name, tmp_path / f"acker-{i}.log") for i in range(ackers)]
    errors: list[BaseException] = []

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        tracking = record.tracking
        assert tracking is not None
        if tracking.attempt == 1 and record.key != b"warm-up" and draw(tracking.origin) < DROP:
            if kill == "waiting" and draw(tracking.origin, b"fail") < 0.5:
                # Failed at once, its replay asked for at 15 s: a key's later records that time
                # out (at 3 s, their replays at 5 s) wait behind it.
                ctx.fail("busy", retry_after_ms=15_000)
                return
            skip_ack(ctx)  # never acked: it times out, with the others of its burst

    task = Task(settings, ns, [topic, replay], unique_name("task"), handler, TaskConfig(poll_timeout_ms=50))

    def run_task() -> None:
        try:
            task.run()
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    thread = threading.Thread(target=run_task, name="task", daemon=True)
    thread.start()
    retry = RetryPolicy(initial_ms=2_000, multiplier=2.0, max_ms=8_000, jitter=0.2) if kill == "waiting" else DEFAULT_RETRY
    source = Source(settings, ns, SourceConfig(timeout_ms=TIMEOUT_MS, max_attempts=5, retry=retry))
    tail = OutcomeTail(settings, ns)

    def wait_for(origins: set[int], what: str, limit_s: float = 120.0) -> None:
        deadline = time.monotonic() + limit_s
        while not origins <= tail.log.completed_origins().keys():
            assert not errors, f"the task died: {errors[0]!r}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            tail.poll(0.2)

    try:
        warm = source.send(topic, b"warm-up", b"warm-up").origin
        source.flush()
        wait_for({warm}, "the warm-up record")
        sent: dict[bytes, list[tuple[int, int]]] = defaultdict(list)  # key -> (origin, seq) in send order
        partition_of: dict[bytes, int] = {}
        first_sent = time.monotonic()
        for burst in range(BURSTS):
            records = [(KEYS[i % len(KEYS)], b"%d" % (burst * BURST + i)) for i in range(BURST)]
            for (key, value), result in zip(records, source.send_many(topic, records), strict=True):
                sent[key].append((result.origin, int(value)))
                partition_of[key] = result.key_hash_partition
            source.poll(0)
            time.sleep(0.02)
            if kill == "sending" and burst == BURSTS // 2:
                procs[0].send_signal(signal.SIGKILL)
        source.flush()
        if kill == "waiting":
            # The first bursts timed out at 3 s and wait until 5 s or so; the last ones time
            # out at 3.6 s, after the kill.
            time.sleep(max(0.0, first_sent + TIMEOUT_MS / 1000 + 0.4 - time.monotonic()))
            procs[0].send_signal(signal.SIGKILL)
            if ackers == 1:
                procs.append(_acker(bootstrap, ns.name, tmp_path / "acker-new.log"))
        wait_for({origin for records in sent.values() for origin, _ in records}, "every record to complete")
        counts = tail.log.completed_origins()
        assert all(n == 1 for n in counts.values()), "a record completed twice"

        replayed: dict[bytes, list[tuple[int, int]]] = defaultdict(list)  # key -> (partition, seq)
        for msg in sorted(read_to_end(settings, replay, DATA_PARTITIONS), key=lambda m: (m.partition(), m.offset())):
            t = Tracking.from_headers(msg.headers())
            assert t is not None and t.attempt == 2
            replayed[msg.key()].append((msg.partition(), int(msg.value())))
        for key in KEYS:
            dropped = [seq for origin, seq in sent[key] if draw(origin) < DROP]
            assert {p for p, _ in replayed[key]} == {partition_of[key]}, f"replays of {key!r} left their partition"
            order = [seq for _, seq in replayed[key]]
            inversions = sum(a > b for a, b in itertools.pairwise(order))
            if order != dropped:
                i = next(i for i, (a, b) in enumerate(zip(order, dropped, strict=False)) if a != b)
                persisted = _persisted(settings, ns)
                shown = {seq: persisted.get(seq) for seq in (order[i], dropped[i])}
                raise AssertionError(f"{key!r}: {len(order)} replays, {inversions} inversions; at {i}: replayed "
                                     f"{order[i]} for {dropped[i]} (seq: ledger partition, offset, created_ms) {shown}")
    finally:
        task.stop()
        thread.join(60)
        tail.close()
        source.close()
        stop_processes(procs)
