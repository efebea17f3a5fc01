"""The DLQ end to end on a real Kafka: a poison record dead-letters after max attempts with
its history; ``replaybroker dlq list`` shows it (and quarantined input); ``dlq redrive``
brings it back as a fresh source record with the same origin, it completes once the task
accepts it, and a second redrive injects nothing."""

from __future__ import annotations

import gc
import threading

import orjson
import pytest
from confluent_kafka import Producer

from broker import cli, ids, topics
from broker.acker import Acker, AckerConfig
from broker.dev.testing import unique_name
from broker.dlq import redriven_topic
from broker.headers import Tracking
from broker.kafka_io import read_to_end
from broker.schemas import PersistedRecord
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from tests.integration.ground_truth import Services

pytestmark = pytest.mark.integration

POISON = b"poison: {not json"


def count(settings: KafkaSettings, topic: str, partitions: int) -> int:
    """Records in a topic (offsets would also count transaction markers)."""
    return len(read_to_end(settings, topic, partitions))


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def test_poison_record_dead_letters_then_redrive_completes_it_once(
    bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("rb"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {topic: 3})
    accept_poison = threading.Event()
    seen: list[tuple[str, int, Tracking]] = []  # topic, partition, tracking of every poison input

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        if record.value == POISON:
            assert record.tracking is not None
            seen.append((record.topic, record.partition, record.tracking))
            if not accept_poison.is_set():
                ctx.fail("cannot parse")

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))
    task = Task(
        settings, ns, [topic, topics.replay_topic(topic)], unique_name("task"), handler,
        TaskConfig(poll_timeout_ms=50),
    )
    services = Services(settings, ns, acker, task)
    tail, errors = services.tail, services.errors
    source = Source(settings, ns, SourceConfig(timeout_ms=30_000, max_attempts=3))
    wait = services.wait

    try:
        good = [source.send(topic, f"good-{i}", f"fine {i}").origin for i in range(20)]
        poison = source.send(topic, b"bad-key", POISON)
        source.flush()
        wait(lambda: poison.origin in tail.log.dlq_origins(), "the poison record in the DLQ")
        wait(lambda: set(good) <= tail.log.completed_origins().keys(), "the good records")
        # undecodable input on ns.acks: quarantined into the DLQ, never redriven
        producer = Producer(settings.producer_config())
        producer.produce(ns.acks, value=b"\x00 not an XorBatch", partition=1)
        assert producer.flush(30) == 0
        wait(lambda: count(settings, ns.dlq, 1) >= 2, "the quarantined message")

        # ---- the DLQ entry: reason, attempts, where it belongs, the history of every attempt
        attempts = [t for _, _, t in seen]
        assert [t.attempt for t in attempts] == [1, 2, 3]
        assert {t.origin for t in attempts} == {poison.origin}
        listed = orjson.loads(run_cli(capsys, "dlq", "list", "--bootstrap", bootstrap, "--namespace", ns.name, "--json"))
        assert [e["kind"] for e in listed] == ["record", "quarantine"]
        record, quarantined = listed
        assert record["origin"] == poison.origin
        assert (record["key"], record["value"], record["reason"], record["attempts"]) == (
            "bad-key", POISON.decode(), "failed", 3,
        )
        assert (record["topic"], record["key_hash_partition"], record["partitioner"]) == (
            topic, poison.key_hash_partition, "kafka",
        )
        assert [(h["srid"], h["attempt"], h["reason"]) for h in record["history"]] == [
            (t.srid, t.attempt, "failed") for t in attempts
        ]
        assert record["redriven"] is None and record["timestamp"].endswith("Z")
        assert quarantined["reason"].startswith("quarantine: ")
        assert quarantined["source"]["topic"] == ns.acks and quarantined["source"]["partition"] == 1
        assert quarantined["value"].startswith("0x00")
        text = run_cli(capsys, "dlq", "list", "--bootstrap", bootstrap, "--namespace", ns.name, "--limit", "1")
        assert f"origin {poison.origin}" in text and "quarantined from" not in text

        # ---- filters select nothing; a dry run selects without injecting
        for filters in (
            ["--reason-prefix", "timeout"], ["--origin", str(good[0])], ["--topic", f"{ns.name}.payments"],
            ["--key", "good-1"], ["--since", "2999-01-01T00:00:00Z"], ["--until", "1h"],
        ):
            out = orjson.loads(run_cli(capsys, "dlq", "redrive", "--bootstrap", bootstrap, "--namespace", ns.name, "--json", *filters))
            assert (out["redriven"], out["skipped_not_matching"], out["skipped_quarantined"]) == (0, 1, 1), filters
        dry = orjson.loads(run_cli(
            capsys, "dlq", "redrive", "--bootstrap", bootstrap, "--namespace", ns.name, "--json", "--dry-run",
            "--origin", str(poison.origin), "--reason-prefix", "fail", "--topic", topic, "--key", "bad-key",
            "--since", "1h",
        ))
        assert (dry["selected"], dry["redriven"], dry["dry_run"]) == (1, 0, True)
        data_before = count(settings, topic, 3)
        replay_before = count(settings, topics.replay_topic(topic), 3)

        # ---- redrive: a fresh source record with the same origin, through the replay path
        accept_poison.set()
        out = orjson.loads(run_cli(
            capsys, "dlq", "redrive", "--bootstrap", bootstrap, "--namespace", ns.name, "--json", "--rate", "50",
            "--key", "bad-key",
        ))
        assert (out["redriven"], out["skipped_quarantined"], out["skipped_already_redriven"]) == (1, 1, 0)
        (redriven,) = out["records"]
        assert redriven["origin"] == poison.origin
        wait(lambda: poison.origin in tail.log.completed_origins(), "the redriven record to complete")
        tail.poll(0.5)
        assert tail.log.completed_origins()[poison.origin] == 1
        assert count(settings, topic, 3) == data_before  # not into live traffic
        assert count(settings, topics.replay_topic(topic), 3) == replay_before + 1
        data_topic, partition, fresh = seen[-1]
        assert (data_topic, partition) == (topics.replay_topic(topic), poison.key_hash_partition)
        assert (fresh.origin, fresh.attempt, fresh.srid) == (poison.origin, 1, redriven["new_srid"])
        (again,) = [
            PersistedRecord.decode(m.value()) for m in read_to_end(settings, ns.persist, 2)
            if m.value() is not None and PersistedRecord.decode(m.value()).srid == fresh.srid
        ]
        assert (again.origin, again.attempt, again.key_hash_partition, again.max_attempts) == (
            poison.origin, 1, poison.key_hash_partition, 5,
        )
        assert [f.srid for f in again.history[:3]] == [t.srid for t in attempts]
        assert again.history[3].reason.startswith("redrive: from ")

        # ---- a second redrive injects nothing; the listing shows what was redriven
        out = orjson.loads(run_cli(capsys, "dlq", "redrive", "--bootstrap", bootstrap, "--namespace", ns.name, "--json"))
        assert (out["redriven"], out["skipped_already_redriven"], out["skipped_quarantined"]) == (0, 1, 1)
        assert count(settings, topics.replay_topic(topic), 3) == replay_before + 1
        # ---- every run is recorded (a dry run sends nothing and is not): who, when, the filter, how many
        runs = orjson.loads(run_cli(capsys, "dlq", "runs", "--bootstrap", bootstrap, "--namespace", ns.name, "--json"))
        assert count(settings, redriven_topic(ns), 1) == 1 + len(runs)  # one marker
        assert [(r["redriven"], r["filter"], r["rate_per_s"]) for r in runs] == [
            (0, {"reason_prefix": "timeout"}, None), (0, {"origins": [good[0]]}, None),
            (0, {"topics": [f"{ns.name}.payments"]}, None), (0, {"keys": ["good-1"]}, None),
            (0, {"since": "2999-01-01T00:00:00.000Z"}, None), (0, {"until": runs[5]["filter"]["until"]}, None),
            (1, {"keys": ["bad-key"]}, 50.0), (0, {}, None),
        ]
        assert all("@" in r["who"] and r["at"].endswith("Z") for r in runs)
        listed = orjson.loads(run_cli(capsys, "dlq", "list", "--bootstrap", bootstrap, "--namespace", ns.name, "--json"))
        assert listed[0]["redriven"]["new_srid"] == fresh.srid
        assert [t.attempt for _, _, t in seen] == [1, 2, 3, 1]
    finally:
        services.stop()
        source.close()
        del acker, task, source
        gc.collect()  # Kafka clients sit in reference cycles (delivery callbacks)
    assert not errors


class Malformed(Exception):
    pass


def test_a_rejected_input_is_dead_lettered_at_once_with_its_reason(bootstrap: str) -> None:
    """Issue 43 item 2: ``ctx.reject`` and an exception of ``TaskConfig.fatal`` dead-letter the
    input on its first attempt, the DLQ record naming why (the exception's class); a transient
    error is still retried. Ground truth: the DLQ and the completions on the real broker."""
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("rej"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {topic: 3})
    tries: dict[bytes, int] = {}

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        tries[record.key or b""] = tries.get(record.key or b"", 0) + 1
        if record.value == b"no-sku":
            ctx.reject("no such sku")
        elif record.value == b"{not json":
            raise Malformed("not json")
        elif record.value == b"flaky" and tries[record.key or b""] == 1:
            raise TimeoutError("slow service")

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))
    task = Task(settings, ns, [topic, topics.replay_topic(topic)], unique_name("task"), handler,
                TaskConfig(poll_timeout_ms=50, fatal=(Malformed,)))
    services = Services(settings, ns, acker, task)
    source = Source(settings, ns, SourceConfig(timeout_ms=30_000, max_attempts=5))
    try:
        sku = source.send(topic, b"a", b"no-sku").origin
        bad = source.send(topic, b"b", b"{not json").origin
        flaky = source.send(topic, b"c", b"flaky").origin
        good = source.send(topic, b"d", b"fine").origin
        source.flush()
        log = services.tail.log
        services.wait(lambda: {sku, bad} <= set(log.dlq_origins()) and {flaky, good} <= set(log.completed_origins()),
                      "the rejections dead-lettered, the others completed")
        dead = {ids.decode_id(dict(m.headers() or ()).get("rb-origin") or b""): m for m in read_to_end(settings, ns.dlq, 1)}
        assert set(dead) == {sku, bad}
        reasons = {o: dict(m.headers() or ())["rb-reason"] for o, m in dead.items()}
        assert reasons == {sku: b"rejected: no such sku", bad: b"rejected: exception: Malformed: not json"}
        assert {o: dict(m.headers() or ())["rb-attempts"] for o, m in dead.items()} == {sku: b"1", bad: b"1"}
        assert tries == {b"a": 1, b"b": 1, b"c": 2, b"d": 1}  # a rejection is never tried again
        assert task.counters.rejected == 2
    finally:
        services.stop()
        source.close()
        del acker, task, source
        gc.collect()
    assert not services.errors
