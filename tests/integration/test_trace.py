"""``replaybroker trace`` on a real Kafka: a record replayed once then completed, a record
still pending, and a record dead-lettered - each traced from its origin, checked against what
the test sent (``SendResult``) and what the task saw (tracking headers of every attempt)."""

from __future__ import annotations

import gc
import subprocess
import sys
import time

import pytest

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.dev.faults import skip_ack
from broker.dev.testing import unique_name
from broker.headers import Tracking
from broker.ids import encode_id
from broker.kafka_io import read_to_end
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from broker.trace import id_hex, trace
from tests.integration.ground_truth import Services

pytestmark = pytest.mark.integration

HOLD_TIMEOUT_MS = 600_000


def test_trace_shows_replays_pending_entries_and_dead_letters(bootstrap: str) -> None:
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("rb"))
    topic = f"{ns.name}.orders"
    P = 3
    topics.create(settings, ns, P, {topic: 2})
    seen: dict[bytes, list[tuple[str, int, int, Tracking]]] = {}  # value -> topic, partition, offset, tracking

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        assert record.tracking is not None and record.value is not None
        seen.setdefault(record.value, []).append((record.topic, record.partition, record.offset, record.tracking))
        if record.value == b"flaky" and record.tracking.attempt == 1:
            ctx.fail("first attempt fails")
        elif record.value == b"poison":
            ctx.fail("poison")
        elif record.value == b"hold":
            skip_ack(ctx)

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))
    task = Task(
        settings, ns, [topic, topics.replay_topic(topic)], unique_name("task"), handler,
        TaskConfig(poll_timeout_ms=50),
    )
    services = Services(settings, ns, acker, task)
    tail, errors = services.tail, services.errors
    source = Source(settings, ns, SourceConfig(timeout_ms=30_000, max_attempts=5))
    wait = services.wait

    try:
        good = [source.send(topic, f"good-{i}", f"fine {i}").origin for i in range(5)]
        flaky = source.send(topic, b"flaky-key", b"flaky")
        poison = source.send(topic, b"poison-key", b"poison", max_attempts=1)
        hold_sent_ms = int(time.time() * 1000)
        hold = source.send(topic, b"hold-key", b"hold", timeout_ms=HOLD_TIMEOUT_MS)
        source.flush()
        hold_flushed_ms = int(time.time() * 1000)
        wait(lambda: flaky.origin in tail.log.completed_origins(), "the flaky record's replay to complete")
        wait(lambda: poison.origin in tail.log.dlq_origins(), "the poison record in the DLQ")
        wait(lambda: set(good) <= tail.log.completed_origins().keys(), "the good records")
        wait(lambda: b"hold" in seen, "the held record at the task")
        hold_key = encode_id(hold.srid)
        wait(
            lambda: any(m.key() == hold_key for m in read_to_end(settings, ns.ledger, P)),
            "the held record's entry in the ledger changelog",
        )

        # ---- replayed once, then completed: trace from the origin and from the replay's srid
        first, second = (t for _, _, _, t in seen[b"flaky"])
        assert (first.srid, first.attempt, second.attempt, second.origin) == (flaky.srid, 1, 2, flaky.origin)
        replay_topic, replay_partition, replay_offset, _ = seen[b"flaky"][1]
        assert replay_topic == topics.replay_topic(topic)
        for ident in (flaky.origin, second.srid):
            out = trace(settings, ns.name, ident)
            assert out["found"] and out["origin"] == flaky.origin
            assert out["origin_hex"] == id_hex(flaky.origin)
            assert [(a["srid"], a["attempt"]) for a in out["attempts"]] == [(flaky.srid, 1), (second.srid, 2)]
            one, two = out["attempts"]
            assert one["decision"]["outcome"] == "replay" and two["decision"]["outcome"] == "completed"
            assert one["ledger_partition"] == flaky.srid % P and two["ledger_partition"] == second.srid % P
            # the failed first attempt is watched for its window (design §6), or already gone
            assert one["ledger"]["state"] in ("watch", "gone", "none") and two["ledger"]["state"] in ("gone", "none")
            assert one["replay"] is None
            assert (two["replay"]["topic"], two["replay"]["partition"], two["replay"]["offset"]) == (
                replay_topic, replay_partition, replay_offset,
            )
            assert replay_partition == flaky.key_hash_partition
            for a in out["attempts"]:  # not yet compacted: the persist records are still there
                assert a["persisted"]["topic"] == topic
                assert a["persisted"]["key_hash_partition"] == flaky.key_hash_partition
                assert a["persisted"]["partition"] == a["srid"] % P
            assert out["dlq"] == []
            assert set(out["read"][ns.persist]) == {flaky.srid % P, second.srid % P}

        # ---- still pending: its ledger entry, with the deadline of its long timeout
        out = trace(settings, ns.name, hold.srid)
        (held,) = out["attempts"]
        assert (held["srid"], held["attempt"], held["decision"]) == (hold.srid, 1, None)
        assert held["persisted"]["timeout_ms"] == HOLD_TIMEOUT_MS
        assert held["persisted"]["key_hash_partition"] == hold.key_hash_partition
        ledger = held["ledger"]
        assert ledger["state"] == "pending" and "registered" in ledger["flag_names"]
        assert "failed" not in ledger["flag_names"]
        assert hold_sent_ms + HOLD_TIMEOUT_MS - 1000 <= ledger["deadline_ms"] <= hold_flushed_ms + HOLD_TIMEOUT_MS + 1000
        assert ledger["persist_offset"] == held["persisted"]["offset"]
        assert out["read"][ns.persist] == [hold.srid % P] and out["read"][ns.ledger] == [hold.srid % P]

        # ---- max_attempts=1: dead-lettered at once, with its DLQ entry
        out = trace(settings, ns.name, poison.origin)
        (dead,) = out["attempts"]
        assert (dead["srid"], dead["attempt"], dead["decision"]["outcome"]) == (poison.srid, 1, "dlq")
        (entry,) = out["dlq"]
        assert (entry["kind"], entry["reason"], entry["attempts"], entry["srids"]) == (
            "record", "failed", 1, [poison.srid],  # the acker records "failed"
        )

        # ---- the command: the outcome on one screen; an unknown id is one line and exit 1
        cmd = [sys.executable, "-m", "broker", "trace", "--bootstrap", bootstrap, "--namespace", ns.name]
        shown = subprocess.run([*cmd, str(flaky.origin)], capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        assert f"origin {flaky.origin}" in shown.stdout
        assert "decision:   replay" in shown.stdout and "decision:   completed" in shown.stdout
        by_hex = subprocess.run([*cmd, id_hex(poison.origin)], capture_output=True, text=True, timeout=120)
        assert by_hex.returncode == 0 and "decision:   dlq" in by_hex.stdout and "reason: failed" in by_hex.stdout
        unknown = 12345
        assert unknown not in {flaky.srid, second.srid, poison.srid, hold.srid, *good}
        missing = subprocess.run([*cmd, str(unknown)], capture_output=True, text=True, timeout=120)
        assert missing.returncode == 1
        assert missing.stdout.strip().splitlines() == [f"no record {unknown} ({id_hex(unknown)}) in namespace {ns.name}"]
    finally:
        services.stop()
        source.close()
        del acker, task, source
        gc.collect()  # Kafka clients sit in reference cycles (delivery callbacks)
    assert not errors
