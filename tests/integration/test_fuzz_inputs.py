"""Fuzzing the acker's inputs: 10 000 malformed messages while a run goes on.

A plain producer writes 10 000 bad messages, generated from a fixed seed, into ``ns.acks``
and ``ns.persist`` (all partitions), interleaved with a Source -> leaf Task workload. The
acker (a real ``Acker`` in a thread) must stay up, complete every valid record exactly once,
and keep every message it rejects byte for byte in ``ns.dlq`` (``rb-reason: quarantine: ...``,
``rb-source: topic/partition/offset``), counting each once as ``quarantined``.

Each category and its fate (``CATEGORIES``: topic, how many, fate):

ns.acks - an XorBatch must decode, name its own ledger partition and hold only srids of that
partition, none 0; a message failing any of this is quarantined whole:

- random bytes (values the XorBatch decoder refuses), random keys, garbage headers;
- a valid XorBatch truncated at a random length;
- a valid XorBatch whose ``ledger_partition`` field is not the partition it is written to;
- a batch whose srids (or fail marks) all belong to another ledger partition;
- a batch of srid 0 events, a batch of srid-0 fail marks;
- a ``PersistedRecord`` written to ``ns.acks``;
- an empty value, a null value;
- 500 KB of random bytes (under the broker's 1 MB ``message.max.bytes``).

ns.persist - a record must have an 8-byte key (its srid, non-zero, of this ledger partition)
and a value whose 42-byte prefix (broker.schemas) names that srid, before a record starting
with it (the first Avro field), the fields the rule decides by (in the prefix) inside its
domain. Headers are ignored (garbage ones are written anyway). All of these are quarantined whole:

- random bytes; a persist value truncated in its prefix or its record's srid;
- a value of another srid than the key's;
- a valid record under a key of 1-7 or 9-16 bytes;
- a valid record of another ledger partition's srid, and one of srid 0;
- an empty value;
- a well-formed record whose ``created_ms + timeout_ms`` (its deadline) is beyond 64 bits:
  no Source writes it (its prefix holds the largest long).

ns.persist - quarantined at its deadline: a record with a well-formed prefix is registered
without decoding; when it times out the acker reads its value for the replay, and quarantines
it byte for byte and lets the srid go (a ``dlq`` tombstone) when the value is no record - cut
after its srid (500 KB ones too: a 500 KB value without its last two bytes), with a deadline
long past - or holds a ``timeout_ms`` that gives the replay no 64-bit deadline (its deadline
during the run).

ns.persist - quarantined at registration too: a record cut before the end of its placement
(``topic``, ``key_hash_partition``), or whose ``key_hash_partition`` is negative - no replay
could go to it. (Before, it was registered and, at its deadline, its
replay was refused: the commit aborted, the acker rewound and dead-lettered it.)

ns.persist - ignored, not quarantined: a tombstone (null value) of an unknown srid is a
completion the acker did not make (another owner's), not garbage.

Not injected, because it is not malformed for the acker: a well-formed XorBatch of unknown
srids of the right partition (an orphan, tested in test_bad_input.py).

No forged events: every srid in the bad messages is drawn from this test's seeded generator
(64-bit, non-zero) and checked against the valid records' srids (fresh ids from the Source),
so no garbage that parses can XOR, fail or tombstone a valid record.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from confluent_kafka import KafkaError, Message, Producer

from broker import ids, topics
from broker.acker import Acker, AckerConfig
from broker.dev.testing import unique_name
from broker.errors import DecodeError
from broker.headers import H_ORIGIN, H_REASON, H_SOURCE
from broker.kafka_io import read_to_end
from broker.schemas import (
    PERSIST_PREFIX_LEN,
    PersistedRecord,
    XorBatch,
    avro_long,
    read_persist_prefixes,
)
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskContext, TaskRecord
from tests.integration.ground_truth import LOG_APPEND_TIME, PersistWatch, read_changelog

pytestmark = pytest.mark.integration

SEED = 20261123
P = 4
VALID_RECORDS = 1_000
ROUNDS = 20
BAD_TOTAL = 10_000
HUGE = 500 * 1024  # under the broker's message.max.bytes (1 048 588) with the DLQ headers
DEADLINE_S = 90.0
CREATED_MS = 1_700_000_000_000
Headers = list[tuple[str, bytes | None]] | None

# Per category: (topic "acks" | "persist", how many, fate). The random bytes of ns.persist
# take what is left of BAD_TOTAL.
CATEGORIES: dict[str, tuple[str, int, str]] = {
    "acks: random bytes": ("acks", 1_100, "quarantine"),
    "acks: truncated XorBatch": ("acks", 900, "quarantine"),
    "acks: ledger_partition is another partition": ("acks", 800, "quarantine"),
    "acks: srids of another partition": ("acks", 600, "quarantine"),
    "acks: fail marks of another partition": ("acks", 300, "quarantine"),
    "acks: srid 0": ("acks", 500, "quarantine"),
    "acks: failed srid 0": ("acks", 300, "quarantine"),
    "acks: PersistedRecord": ("acks", 300, "quarantine"),
    "acks: empty value": ("acks", 300, "quarantine"),
    "acks: null value": ("acks", 200, "quarantine"),
    "acks: 500 KB random bytes": ("acks", 20, "quarantine"),
    "persist: random bytes": ("persist", 0, "quarantine"),
    "persist: truncated in its prefix or srid": ("persist", 400, "quarantine"),
    "persist: truncated before its placement": ("persist", 100, "quarantine"),
    "persist: truncated record": ("persist", 300, "quarantine at its deadline"),
    "persist: value is not the key's srid": ("persist", 700, "quarantine"),
    "persist: key of the wrong length": ("persist", 600, "quarantine"),
    "persist: srid of another partition": ("persist", 600, "quarantine"),
    "persist: srid 0": ("persist", 400, "quarantine"),
    "persist: empty value": ("persist", 300, "quarantine"),
    "persist: 500 KB truncated PersistedRecord": ("persist", 20, "quarantine at its deadline"),
    "persist: deadline past 64 bits": ("persist", 100, "quarantine"),
    "persist: registered, timeout past 64 bits": ("persist", 50, "quarantine at its deadline"),
    "persist: negative key_hash_partition": ("persist", 50, "quarantine"),
    "persist: tombstone of an unknown srid": ("persist", 200, "ignored"),
}
_rest = BAD_TOTAL - sum(n for _, n, _ in CATEGORIES.values())
CATEGORIES["persist: random bytes"] = ("persist", _rest, "quarantine")


@dataclass(frozen=True)
class Bad:
    what: str
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    srids: tuple[int, ...]  # every srid it names: none may be a valid record's


class Fuzz:
    """Deterministic malformed messages from one seeded generator."""

    def __init__(self, ns: topics.Namespace, seed: int, soon_ms: int) -> None:
        self.ns = ns
        self.rng = random.Random(seed)
        self.soon_ms = soon_ms  # a deadline during the run

    def srid_in(self, partition: int) -> int:
        while True:
            srid = self.rng.randrange(-(2**63), 2**63)
            srid -= srid % P - partition
            if srid != 0 and -(2**63) <= srid < 2**63:
                return srid

    def other(self, p: int) -> int:
        return (p + self.rng.randrange(1, P)) % P

    def longs(self, n: int) -> np.ndarray:
        return np.array([self.rng.randrange(-(2**63), 2**63) for _ in range(n)], dtype=np.int64)

    def batch(self, lp: int, srids: list[int], failed: list[int] | None = None) -> XorBatch:
        return XorBatch(
            lp, np.array(srids, dtype=np.int64), self.longs(len(srids)), np.array(failed or [], dtype=np.int64),
            "fuzz",
        )

    def record(self, srid: int, size: int = 40, created_ms: int = CREATED_MS, timeout_ms: int = 600_000) -> PersistedRecord:
        return PersistedRecord(
            srid=srid, origin=srid, attempt=1, root_xor=self.rng.randrange(-(2**63), 2**63),
            record_id=self.rng.randrange(-(2**63), 2**63), topic=f"{self.ns.name}.orders",
            key_hash_partition=0, key=b"k", value=self.rng.randbytes(size),
            created_ms=created_ms, timeout_ms=timeout_ms,
        )

    def refused(self, decode: Callable[[bytes], object], make: Callable[[], bytes]) -> bytes:
        """A value from ``make`` that ``decode`` refuses (a few random strings are valid)."""
        while True:
            data = make()
            try:
                decode(data)
            except DecodeError:
                return data

    def truncated(self, decode: Callable[[bytes], object], whole: bytes) -> bytes:
        return self.refused(decode, lambda: whole[: self.rng.randrange(1, len(whole))])

    def garbage_headers(self) -> Headers:
        """Headers the acker must ignore (an older writer's registration headers among them)."""
        r = self.rng
        return r.choice([
            None,
            [],
            [("rb-root", r.randbytes(3)), ("rb-deadline", r.randbytes(8))],
            [("rb-root", None), ("rb-deadline", r.randbytes(8))],
            [("rb-root", r.randbytes(8)), ("rb-deadline", r.randbytes(8))],
            [("rb-x", r.randbytes(5)), ("rb-outcome", b"completed"), ("rb-srid", r.randbytes(2))],
        ])

    def due(self, record: PersistedRecord, deadline_ms: int) -> bytes:
        """``record``'s persist value, created ``timeout_ms`` before ``deadline_ms``."""
        return dataclasses.replace(record, created_ms=deadline_ms - record.timeout_ms).encode()

    def make(self, what: str) -> Bad:
        r = self.rng
        p = r.randrange(P)
        a, pe = self.ns.acks, self.ns.persist
        if what == "acks: random bytes":
            value = self.refused(XorBatch.decode, lambda: r.randbytes(r.randrange(1, 300)))
            return Bad(what, a, p, r.choice([None, r.randbytes(r.randrange(0, 20))]), value, self.garbage_headers(), ())
        if what == "acks: truncated XorBatch":
            srids = [self.srid_in(p) for _ in range(r.randrange(1, 20))]
            return Bad(what, a, p, None, self.truncated(XorBatch.decode, self.batch(p, srids).encode()), None, tuple(srids))
        if what == "acks: ledger_partition is another partition":
            srids = [self.srid_in(p) for _ in range(r.randrange(1, 20))]
            return Bad(what, a, self.other(p), None, self.batch(p, srids).encode(), None, tuple(srids))
        if what == "acks: srids of another partition":
            srids = [self.srid_in(self.other(p)) for _ in range(r.randrange(1, 20))]
            return Bad(what, a, p, None, self.batch(p, srids).encode(), None, tuple(srids))
        if what == "acks: fail marks of another partition":
            srids = [self.srid_in(self.other(p)) for _ in range(r.randrange(1, 5))]
            return Bad(what, a, p, None, self.batch(p, [], srids).encode(), None, tuple(srids))
        if what == "acks: srid 0":
            return Bad(what, a, p, None, self.batch(p, [0] * r.randrange(1, 4)).encode(), None, ())
        if what == "acks: failed srid 0":
            return Bad(what, a, p, None, self.batch(p, [], [0]).encode(), None, ())
        if what == "acks: PersistedRecord":
            srid = self.srid_in(p)
            return Bad(what, a, p, ids.encode_id(srid), self.record(srid).encode(), None, (srid,))
        if what == "acks: empty value":
            return Bad(what, a, p, None, b"", self.garbage_headers(), ())
        if what == "acks: null value":
            return Bad(what, a, p, None, None, None, ())
        if what == "acks: 500 KB random bytes":
            return Bad(what, a, p, None, self.refused(XorBatch.decode, lambda: r.randbytes(HUGE)), None, ())

        srid = self.srid_in(p)
        key = ids.encode_id(srid)
        if what == "persist: random bytes":
            value = self.refused(PersistedRecord.decode, lambda: r.randbytes(r.randrange(1, 300)))
            return Bad(what, pe, p, key, value, self.garbage_headers(), (srid,))
        if what.startswith("persist: truncated"):
            # Cut in the prefix or the record's srid (what the acker registers by), in the
            # fields before its placement's end (topic, key_hash_partition: checked at
            # registration too), or after.
            whole = self.record(srid).encode()
            read = PERSIST_PREFIX_LEN + len(avro_long(srid))
            placed = int(read_persist_prefixes([whole]).placement_ends[0])
            if what.endswith("srid"):
                cut = r.randrange(1, read)
            elif what.endswith("placement"):
                cut = r.randrange(read, placed)
            else:
                cut = r.randrange(placed, len(whole))
            return Bad(what, pe, p, key, whole[:cut], self.garbage_headers(), (srid,))
        if what == "persist: value is not the key's srid":
            another = self.srid_in(p)
            return Bad(what, pe, p, key, self.record(another).encode(), self.garbage_headers(), (srid, another))
        if what == "persist: key of the wrong length":
            short_or_long = r.choice([r.randrange(1, 8), r.randrange(9, 17)])
            wrong = (key * 3)[:short_or_long]
            return Bad(what, pe, p, wrong, self.record(srid).encode(), self.garbage_headers(), (srid,))
        if what == "persist: srid of another partition":
            return Bad(what, pe, self.other(p), key, self.record(srid).encode(), self.garbage_headers(), (srid,))
        if what == "persist: srid 0":
            return Bad(what, pe, p, ids.encode_id(0), self.record(0).encode(), self.garbage_headers(), ())
        if what == "persist: empty value":
            return Bad(what, pe, p, key, b"", self.garbage_headers(), (srid,))
        if what == "persist: 500 KB truncated PersistedRecord":
            return Bad(what, pe, p, key, self.record(srid, HUGE).encode()[:-2], None, (srid,))
        if what == "persist: deadline past 64 bits":
            # created_ms + timeout_ms is no 64-bit deadline: the prefix holds the largest long.
            created, timeout = r.choice([
                (CREATED_MS, 2**63 - 1 - r.randrange(CREATED_MS)),
                (2**63 - 1 - r.randrange(1000), r.randrange(1000, 2**40)),
                (-(2**63) + r.randrange(1000), -r.randrange(1000, 2**40)),
            ])
            record = self.record(srid, created_ms=created, timeout_ms=timeout)
            return Bad(what, pe, p, key, record.encode(), self.garbage_headers(), (srid,))
        if what == "persist: registered, timeout past 64 bits":
            # Registered from its prefix (deadline: a few seconds from now); its value is
            # read when it times out, and a replay's deadline now + timeout_ms is no long.
            record = self.record(srid, timeout_ms=2**63 - 1 - r.randrange(CREATED_MS))
            return Bad(what, pe, p, key, self.due(record, self.soon_ms), None, (srid,))
        if what == "persist: negative key_hash_partition":
            # No replay could go to partition -n of orders.replay: quarantined at registration.
            record = dataclasses.replace(self.record(srid), key_hash_partition=-r.randrange(2, 2**31))
            return Bad(what, pe, p, key, self.due(record, self.soon_ms), None, (srid,))
        if what == "persist: tombstone of an unknown srid":
            return Bad(what, pe, p, key, None, None, (srid,))
        raise AssertionError(what)

    def all(self) -> list[Bad]:
        kinds = [what for what, (_, n, _) in CATEGORIES.items() for _ in range(n)]
        self.rng.shuffle(kinds)
        return [self.make(what) for what in kinds]


def test_ten_thousand_malformed_inputs_are_quarantined_and_the_run_completes(bootstrap: str) -> None:
    started = time.monotonic()
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("fuzz"))
    orders = f"{ns.name}.orders"
    topics.create(settings, ns, P, {orders: P}, overrides={ns.persist: LOG_APPEND_TIME})  # PersistWatch's clock
    bads = Fuzz(ns, SEED, int(time.time() * 1000) + 3_000).all()
    assert len(bads) == BAD_TOTAL

    def leaf(record: TaskRecord, ctx: TaskContext) -> None:
        return None

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker")))
    acker_errors: list[BaseException] = []

    def run_acker() -> None:
        try:
            acker.run()
        except BaseException as exc:  # noqa: BLE001 - asserted by the test
            acker_errors.append(exc)

    task = Task(settings, ns, [orders, topics.replay_topic(orders)], unique_name("leaf"), leaf)
    task_thread = threading.Thread(target=task.run, daemon=True)
    acker_thread = threading.Thread(target=run_acker, daemon=True)
    task_thread.start()
    acker_thread.start()

    raw = Producer(settings.producer_config(required={"enable.idempotence": False}, defaults={"linger.ms": 5}))
    delivered: dict[str, Bad] = {}  # "topic/partition/offset" -> what was written there
    delivery_errors: list[str] = []

    def on_delivery(bad: Bad) -> Callable[[KafkaError | None, Message], None]:
        def report(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                delivery_errors.append(f"{bad.what}: {err}")
            else:
                delivered[f"{msg.topic()}/{msg.partition()}/{msg.offset()}"] = bad
        return report

    watch = PersistWatch(settings, ns, P)
    valid: set[int] = set()
    try:
        with Source(settings, ns, SourceConfig(timeout_ms=600_000)) as source:
            per_round, bad_per_round = VALID_RECORDS // ROUNDS, BAD_TOTAL // ROUNDS
            for round_no in range(ROUNDS):
                round_bad = bads[round_no * bad_per_round:(round_no + 1) * bad_per_round]
                for i in range(per_round):
                    n = round_no * per_round + i
                    valid.add(source.send(orders, f"customer-{n % 101}", b"order-%d" % n).srid)
                    # the round's bad messages between its valid records
                    for bad in round_bad[i * len(round_bad) // per_round:(i + 1) * len(round_bad) // per_round]:
                        while True:
                            try:
                                raw.produce(bad.topic, key=bad.key, value=bad.value, partition=bad.partition,
                                            headers=bad.headers, on_delivery=on_delivery(bad))
                                break
                            except BufferError:
                                raw.poll(0.1)
                    raw.poll(0)
                source.flush()
        assert raw.flush(60) == 0 and not delivery_errors, delivery_errors[:5]
        assert len(delivered) == BAD_TOTAL
        # No bad message names a valid record: none can complete, fail or tombstone one.
        assert not valid & {s for b in bads for s in b.srids}
        want = Counter(b.what for b in bads if CATEGORIES[b.what][2].startswith("quarantine"))
        want_quarantined = sum(want.values())
        dead = [b for b in bads if CATEGORIES[b.what][2] == "dead-lettered at its deadline"]

        deadline = time.monotonic() + DEADLINE_S
        while True:
            assert acker_thread.is_alive() and not acker_errors, f"the acker stopped: {acker_errors}"
            watch.poll(0.2)
            quarantined = acker.totals["quarantined"]
            if valid <= watch.completed and quarantined >= want_quarantined and acker.totals["dlq"] >= len(dead):
                break
            assert time.monotonic() < deadline, (
                f"{len(valid - watch.completed)} valid records pending; quarantined {quarantined} "
                f"of {want_quarantined}; counters {dict(acker.totals)}"
            )
        watch.drain()
        assert acker_thread.is_alive() and not acker_errors, f"the acker stopped: {acker_errors}"
    finally:
        acker.stop()
        acker_thread.join(60)
        task.stop()
        task_thread.join(30)
        watch.close()
    assert not acker_errors, acker_errors

    # (b) Every valid record completed, once; nothing replayed, and only the records
    # registered to time out timed out (and left quarantined or dead-lettered: a dlq tombstone).
    outcomes = Counter(tuple(o for o, _ in watch.tombstones[s]) for s in valid)
    assert outcomes == Counter({("completed",): len(valid)}), outcomes
    timing_out = [b for b in bads if CATEGORIES[b.what][2].endswith("at its deadline")]
    assert all([o for o, _ in watch.tombstones[b.srids[0]]] == ["dlq"] for b in timing_out)
    counters = acker.counters()
    for name in ("replayed", "failed", "duplicate_roots"):
        assert counters[name] == 0, (name, counters)
    assert counters["dlq"] == len(dead), counters
    assert counters["timed_out"] == len(timing_out), counters
    assert counters["registered"] == len(valid) + len(timing_out), counters
    assert counters["completed"] == len(valid), counters

    # (c) Each rejected message is in the DLQ once, byte for byte, with its reason and source;
    # the ignored ones are not. Per category, the DLQ holds what was injected.
    dlq = read_to_end(settings, ns.dlq, 1)
    by_source: dict[str, list[Message]] = {}
    letters: dict[int, list[Message]] = {}  # dead letters (no rb-source) by rb-origin
    for msg in dlq:
        headers = dict(msg.headers() or ())
        if H_SOURCE in headers:
            by_source.setdefault((headers[H_SOURCE] or b"").decode(), []).append(msg)
        else:
            letters.setdefault(ids.decode_id(headers[H_ORIGIN] or b""), []).append(msg)
    assert set(by_source) <= set(delivered), "DLQ records of no injected message"
    found: Counter[str] = Counter()
    for where, bad in delivered.items():
        kept = by_source.get(where, [])
        if not CATEGORIES[bad.what][2].startswith("quarantine"):
            assert not kept, f"{bad.what} at {where} was quarantined"
            continue
        assert len(kept) == 1, f"{bad.what} at {where}: {len(kept)} DLQ records"
        (msg,) = kept
        reason = dict(msg.headers() or ()).get(H_REASON) or b""
        assert reason.startswith(b"quarantine: "), (bad.what, reason)
        assert (msg.key(), msg.value()) == (bad.key, bad.value), f"{bad.what} at {where}: not its bytes"
        found[bad.what] += 1
    assert found == want, {w: (found[w], want[w]) for w in want if found[w] != want[w]}
    assert len(dlq) == want_quarantined + len(dead)
    assert set(letters) == {b.srids[0] for b in dead}
    for b in dead:
        (msg,) = letters[b.srids[0]]
        record = PersistedRecord.decode(b.value)
        assert (msg.key(), msg.value()) == (record.key, record.value)
        assert b"cannot replay" in (dict(msg.headers() or ()).get(H_REASON) or b""), b.what

    # (d) The acker counted each once, in memory and in its changelog.
    assert counters["quarantined"] == want_quarantined, counters
    _, logged = read_changelog(settings, ns, P)
    assert logged["quarantined"] == want_quarantined, logged
    print(f"fuzz: {BAD_TOTAL} bad, {len(valid)} valid in {time.monotonic() - started:.1f} s; {counters}")
