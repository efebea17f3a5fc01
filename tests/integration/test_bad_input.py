"""Bad input never kills the acker (issue #3; STYLE: count it, quarantine it, keep going).

Raw producers write garbage straight into ``ns.acks`` and ``ns.persist`` - random bytes,
truncated Avro, values of the wrong schema, empty values, misrouted batches and records,
srid 0, and events for srids nobody persisted - interleaved with a normal workload through
source -> fan-out -> leaf. The acker (in a thread, orphan TTL 2 s) must:

- keep running and complete every valid record exactly once, with no replay;
- count each undecodable or misrouted message once (``quarantined``) and keep it byte for
  byte in ``ns.dlq`` with ``rb-reason: quarantine: ...`` and ``rb-source: topic/partition/offset``;
  of an XorBatch holding good and bad pairs, keep only the bad pairs (as an XorBatch) and fold
  the good ones;
- count the unknown srids as ``orphans`` once the orphan TTL has passed;
- ignore persist tombstones of unknown srids (a completion it did not make is not an error).
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
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)

from broker import ids, topics
from broker.acker import Acker, AckerConfig
from broker.dev.testing import unique_name
from broker.errors import DecodeError
from broker.headers import outcome_of
from broker.kafka_io import read_to_end
from broker.schemas import (
    COUNTERS_KEY,
    PERSIST_PREFIX_LEN,
    LedgerEntry,
    PersistedRecord,
    XorBatch,
    decode_counters,
)
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskContext, TaskRecord

pytestmark = pytest.mark.integration

P = 4
VALID_RECORDS = 3_000
ROUNDS = 10
ORPHAN_TTL_MS = 2_000
DEADLINE_S = 60.0
EMPTY = np.empty(0, dtype=np.int64)


def srid_in(partition: int, rng: random.Random) -> int:
    """A random non-zero srid of ledger partition ``partition``."""
    while True:
        srid = rng.randrange(-(2**63), 2**63)
        srid -= srid % P - partition
        if srid != 0 and -(2**63) <= srid < 2**63:
            return srid


def read_all(settings: KafkaSettings, topic: str, partitions: int) -> list[Message]:
    """Every committed message of ``topic``, read from the beginning to the end."""
    return read_to_end(settings, topic, partitions)


@dataclass(frozen=True)
class Bad:
    """One message written behind the clients' back, and what the acker must make of it."""

    what: str
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    expect: str  # "quarantine" | "orphans:<n>" | "quarantine+orphans:<n>" | "ignored"
    kept: bytes | None = None  # what the DLQ holds when not the whole value: the bad pairs


def bad_messages(ns: topics.Namespace, rng: random.Random, round_no: int) -> list[Bad]:
    """One round of every kind of bad input, spread over the ledger partitions."""
    p = round_no % P
    other = (p + 1) % P
    srid = srid_in(p, rng)
    record = PersistedRecord(
        srid=srid, origin=srid, attempt=1, root_xor=ids.new_id(), record_id=ids.new_id(),
        topic=f"{ns.name}.orders", key_hash_partition=0, key=b"k", value=b"v" * 40,
        created_ms=int(time.time() * 1000), timeout_ms=600_000,
    )
    batch = XorBatch(p, np.array([srid_in(p, rng)], dtype=np.int64), np.array([ids.new_id()], dtype=np.int64), EMPTY)

    def garbage(decode: Callable[[bytes], object]) -> bytes:
        """Random bytes the decoder refuses (a few random strings are well-formed values)."""
        while True:
            data = rng.randbytes(rng.randrange(1, 120))
            try:
                decode(data)
            except DecodeError:
                return data

    def misrouted(srids: list[int], failed: tuple[int, ...] = ()) -> bytes:
        return XorBatch(
            p, np.array(srids, dtype=np.int64), np.array([ids.new_id() for _ in srids], dtype=np.int64),
            np.array(failed, dtype=np.int64),
        ).encode()

    def mixed(bad: int, good: list[int]) -> tuple[bytes, bytes]:
        """A batch of good pairs (unknown srids: orphans) and one bad pair, and the bad pair."""
        xors = [ids.new_id() for _ in range(len(good) + 1)]
        whole = XorBatch(p, np.array([*good[:1], bad, *good[1:]], dtype=np.int64), np.array(xors, dtype=np.int64), EMPTY)
        kept = XorBatch(p, np.array([bad], dtype=np.int64), np.array(xors[1:2], dtype=np.int64), EMPTY)
        return whole.encode(), kept.encode()

    unknown = [srid_in(p, rng) for _ in range(5)]
    zero_and_good, zero_kept = mixed(0, [srid_in(p, rng)])
    other_and_good, other_kept = mixed(srid_in(other, rng), [srid_in(p, rng), srid_in(p, rng)])
    unknown_failed = [srid_in(p, rng) for _ in range(2)]
    key = ids.encode_id(srid)
    a, pe = ns.acks, ns.persist
    return [
        # ns.acks: every one is quarantined
        Bad("random bytes", a, p, None, garbage(XorBatch.decode), "quarantine"),
        Bad("truncated XorBatch", a, p, None, batch.encode()[:-3], "quarantine"),
        Bad("XorBatch + trailing bytes", a, p, None, batch.encode() + b"\x00\x02", "quarantine"),
        Bad("PersistedRecord in acks", a, p, None, record.encode(), "quarantine"),
        Bad("LedgerEntry in acks", a, p, None, LedgerEntry(1, 1, 1, 1).encode(), "quarantine"),
        Bad("empty value in acks", a, p, None, b"", "quarantine"),
        Bad("null value in acks", a, p, None, None, "quarantine"),
        Bad("srids of another partition", a, p, None, misrouted([srid_in(other, rng)]), "quarantine"),
        Bad("fail mark of another partition", a, p, None, misrouted([], (srid_in(other, rng),)), "quarantine"),
        Bad("batch for another partition", a, other, None, batch.encode(), "quarantine"),
        Bad("srid 0 among good", a, p, None, zero_and_good, "quarantine+orphans:1", zero_kept),
        Bad("srid of another partition among good", a, p, None, other_and_good, "quarantine+orphans:2", other_kept),
        Bad("failed srid 0", a, p, None, misrouted([], (0,)), "quarantine"),
        # ns.acks: well-formed events of srids nobody persisted -> orphans after the TTL
        Bad("events of unknown srids", a, p, None, misrouted(unknown), f"orphans:{len(unknown)}"),
        Bad("fail marks of unknown srids", a, p, None, misrouted([], tuple(unknown_failed)), f"orphans:{len(unknown_failed)}"),
        # ns.persist: every one is quarantined (a null key cannot get in: the broker refuses
        # keyless records on a compacted topic)
        Bad("random bytes in persist", pe, p, key, garbage(PersistedRecord.decode), "quarantine"),
        # (a record cut after its srid is registered from its prefix, and quarantined only when
        # a replay needs it: test_fuzz_inputs.py)
        Bad("truncated in its prefix", pe, p, key, record.encode()[:PERSIST_PREFIX_LEN - 5], "quarantine"),
        Bad("truncated in its srid", pe, p, key, record.encode()[:PERSIST_PREFIX_LEN + 3], "quarantine"),
        Bad("XorBatch in persist", pe, p, key, batch.encode(), "quarantine"),
        Bad("LedgerEntry in persist", pe, p, key, LedgerEntry(1, 1, 1, 1).encode(), "quarantine"),
        Bad("empty value in persist", pe, p, key, b"", "quarantine"),
        Bad("7-byte key", pe, p, key[1:], record.encode(), "quarantine"),
        Bad("key is another srid", pe, p, ids.encode_id(srid_in(p, rng)), record.encode(), "quarantine"),
        Bad("record of another partition", pe, other, key, record.encode(), "quarantine"),
        Bad(
            "srid 0", pe, 0, ids.encode_id(0),
            dataclasses.replace(record, srid=0, origin=0).encode(), "quarantine",
        ),
        # ns.persist: a tombstone of an unknown srid is not an error
        Bad("tombstone of an unknown srid", pe, p, ids.encode_id(srid_in(p, rng)), None, "ignored"),
    ]


def test_bad_input_is_counted_quarantined_and_survived(bootstrap: str) -> None:
    rng = random.Random(20241121)
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("bad"))
    orders, enriched = f"{ns.name}.orders", f"{ns.name}.enriched"
    topics.create(settings, ns, P, {orders: P, enriched: P})

    def fan_out(record: TaskRecord, ctx: TaskContext) -> None:
        for i in range(1 + (record.offset % 3)):
            ctx.emit(enriched, record.key, (record.value or b"") + b"|%d" % i)

    def leaf(record: TaskRecord, ctx: TaskContext) -> None:
        return None

    acker = Acker(settings, ns, AckerConfig(orphan_ttl_ms=ORPHAN_TTL_MS, instance_id=unique_name("acker")))
    acker_errors: list[BaseException] = []

    def run_acker() -> None:
        try:
            acker.run()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            acker_errors.append(exc)

    tasks = [
        Task(settings, ns, [orders, topics.replay_topic(orders)], unique_name("fan-out"), fan_out),
        Task(settings, ns, [enriched], unique_name("leaf"), leaf),
    ]
    threads = [threading.Thread(target=t.run, daemon=True) for t in tasks]
    acker_thread = threading.Thread(target=run_acker, daemon=True)
    for thread in [*threads, acker_thread]:
        thread.start()

    raw = Producer(settings.producer_config(required={"enable.idempotence": False}, defaults={"linger.ms": 0}))
    delivered: dict[tuple[str, int, int], Bad] = {}
    delivery_errors: list[str] = []

    def on_delivery(bad: Bad) -> Callable[[KafkaError | None, Message], None]:
        def report(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                delivery_errors.append(f"{bad.what}: {err}")
            else:
                delivered[(msg.topic(), msg.partition(), msg.offset())] = bad
        return report

    valid: set[int] = set()
    kinds = 0
    watch = Consumer(settings.consumer_config(None, defaults={"group.id": unique_name("watch")}))
    watch.assign([TopicPartition(ns.persist, p, OFFSET_BEGINNING) for p in range(P)])
    outcomes: dict[int, list[str]] = {}
    try:
        with Source(settings, ns, SourceConfig(timeout_ms=600_000)) as source:
            per_round = VALID_RECORDS // ROUNDS
            for round_no in range(ROUNDS):
                for i in range(per_round):
                    n = round_no * per_round + i
                    valid.add(source.send(orders, f"customer-{n % 101}", b"order-%d" % n).srid)
                    if i == per_round // 2:  # bad input in the middle of the round's records
                        round_bad = bad_messages(ns, rng, round_no)
                        kinds = len(round_bad)
                        for bad in round_bad:
                            raw.produce(bad.topic, key=bad.key, value=bad.value, partition=bad.partition,
                                        on_delivery=on_delivery(bad))
                        raw.poll(0)
                source.flush()
        assert raw.flush(30) == 0 and not delivery_errors, delivery_errors
        bads = list(delivered.values())
        want_quarantined = sum(1 for b in bads if b.expect.startswith("quarantine"))
        want_orphans = sum(int(b.expect.split(":")[1]) for b in bads if "orphans:" in b.expect)
        assert len(bads) == ROUNDS * kinds

        deadline = time.monotonic() + DEADLINE_S
        while True:
            assert acker_thread.is_alive(), f"the acker stopped: {acker_errors}"
            for msg in watch.consume(10_000, 0.2):
                if msg.error() is None and msg.value() is None and len(msg.key() or b"") == 8:
                    outcome = outcome_of(msg.headers()).decode()
                    outcomes.setdefault(ids.decode_id(msg.key()), []).append(outcome)
            counters = dict(acker.totals)  # counters() also walks the states: not across threads
            done = sum(1 for s in valid if s in outcomes)
            if (
                done == len(valid)
                and counters["quarantined"] >= want_quarantined
                and counters["orphans"] >= want_orphans
            ):
                break
            assert time.monotonic() < deadline, (
                f"{len(valid) - done} valid records pending; counters {counters}; "
                f"want quarantined={want_quarantined} orphans={want_orphans}"
            )
    finally:
        acker.stop()
        acker_thread.join(60)
        for task in tasks:
            task.stop()
        for thread in threads:
            thread.join(30)
        watch.close()
    assert not acker_errors, acker_errors

    # Every valid record completed exactly once; no replay, no DLQ record, no timeout.
    assert all(outcomes[s] == ["completed"] for s in valid), Counter(
        tuple(outcomes.get(s, [])) for s in valid
    )
    counters = acker.counters()
    assert counters["quarantined"] == want_quarantined, counters
    assert counters["orphans"] == want_orphans, counters
    assert counters["completed"] == len(valid), counters
    assert counters["registered"] == len(valid), counters
    for name in ("replayed", "dlq", "timed_out", "failed", "duplicate_roots"):
        assert counters[name] == 0, (name, counters)
    assert counters["pending"] == 0, counters

    # The same counts are in the changelog (what `replaybroker status` shows).
    logged: Counter[str] = Counter()
    latest = {(m.partition(), m.key()): m.value() for m in read_all(settings, ns.ledger, P)}
    for (_, key), value in latest.items():
        if key == COUNTERS_KEY and value is not None:
            logged.update(decode_counters(value)[0])
    assert logged["quarantined"] == want_quarantined and logged["orphans"] == want_orphans, logged

    # Each quarantined message is in the DLQ once, byte for byte, with its reason and source.
    dlq = read_all(settings, ns.dlq, 1)
    by_source: dict[str, list[Message]] = {}
    for msg in dlq:
        headers = dict(msg.headers() or ())
        by_source.setdefault((headers.get("rb-source") or b"").decode(), []).append(msg)
    assert len(dlq) == want_quarantined
    for (topic, partition, offset), bad in delivered.items():
        found = by_source.get(f"{topic}/{partition}/{offset}", [])
        if not bad.expect.startswith("quarantine"):
            assert not found, f"{bad.what} was quarantined"
            continue
        assert len(found) == 1, f"{bad.what} at {topic}/{partition}/{offset}: {len(found)} DLQ records"
        (msg,) = found
        reason = dict(msg.headers() or ())["rb-reason"] or b""
        assert reason.startswith(b"quarantine: "), (bad.what, reason)
        assert (msg.key(), msg.value()) == (bad.key, bad.value if bad.kept is None else bad.kept), bad.what
