"""Output identity below the root: siblings of a fan-out are different facts, the same fact on
every attempt; and a query on a fresh checkpoint never deletes an earlier query's facts.

Ground truth: the records the pipeline delivered to Kafka and the rows in the sink, counted
here - not the sink's or the wrapper's own figures.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Message
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker.dev.testing import unique_name
from broker.headers import path_of
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskContext, TaskRecord
from broker.topics import Namespace, create, replay_topic
from spark_jobs import Acking, BatchResult, Emit, OriginParquetSink, read_with_replay

pytestmark = pytest.mark.e2e

FAN_OUT = 3


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _facts_job(sink: OriginParquetSink) -> Callable[[DataFrame, int], BatchResult]:
    """One fact per input row (the leaf of the tree), acked."""

    def write(ok: DataFrame, batch_id: int) -> None:
        sink.write(ok.select("origin", "path", F.col("value").cast("string").alias("value")), batch_id)

    return lambda batch, batch_id: BatchResult(write=write, sink=sink)


def _sink_by_origin(spark: SparkSession, sink: OriginParquetSink) -> dict[int, list[str]]:
    rows = sink.read(spark).select("origin", "value").collect()
    out: dict[int, list[str]] = defaultdict(list)
    for r in rows:
        out[r["origin"]].append(r["value"])
    return out


def _paths(messages: list[Message]) -> dict[str, set[str]]:
    """value -> the rb-path headers it was delivered with (every attempt)."""
    out: dict[str, set[str]] = defaultdict(set)
    for m in messages:
        out[m.value().decode()].add(path_of(m.headers()))
    return out


def _check(facts: dict[int, list[str]], sent: dict[int, int], delivered: list[Message]) -> None:
    assert set(facts) == set(sent)
    for origin, values in facts.items():
        expected = [f"order-{sent[origin]}/item-{k}" for k in range(FAN_OUT)]
        assert sorted(values) == expected, (origin, values)  # 3 siblings, no replay twice
    # Each sibling had one path on every attempt, and siblings had different ones.
    paths = _paths(delivered)
    for i in sent.values():
        assert [paths[f"order-{i}/item-{k}"] for k in range(FAN_OUT)] == [{f"0.{k}"} for k in range(FAN_OUT)]


def test_task_siblings_are_three_facts_and_a_replay_adds_none(
    spark: SparkSession, bootstrap: str, start_acker: Callable, consume_topic: Callable, tmp_path: Path
) -> None:
    """A Python task fans every order out to 3 items; half the orders fail after emitting
    (first attempt) and come back as replays that emit the same 3 items again."""
    settings, ns = KafkaSettings(bootstrap), Namespace(unique_name("taskpath"))
    orders, items, n = f"{ns.name}-orders", f"{ns.name}-items", 20
    create(settings, ns, 2, {orders: 2, items: 2})
    with Source(settings, ns, SourceConfig(timeout_ms=120_000)) as source:
        sent = {source.send(orders, f"o{i}", f"order-{i}").origin: i for i in range(n)}
    failing = {o for o, i in sent.items() if i % 2 == 0}

    def fan_out(record: TaskRecord, ctx: TaskContext) -> None:
        for k in range(FAN_OUT):
            ctx.emit(items, record.key, f"{record.value.decode()}/item-{k}")
        if record.tracking.attempt == 1 and record.tracking.origin in failing:
            ctx.fail("after its children were out")

    with start_acker(ns) as acker:
        Task(settings, ns, [orders, replay_topic(orders)], f"{ns.name}-fan", fan_out).run(max_idle_ms=8000)
        delivered = consume_topic(items, 2, FAN_OUT * (n + len(failing)))
        assert len(delivered) == FAN_OUT * (n + len(failing))

        sink = OriginParquetSink(str(tmp_path / "items"))
        everything = read_with_replay(spark, bootstrap, items, stream=False)
        with Acking(bootstrap, ns, _facts_job(sink)) as acking:
            acking.process(everything.where("attempt = 1"), 0)  # a replay in a later batch
            acking.process(everything.where("attempt = 2"), 1)
        _wait(lambda: acker.totals["completed"] == n, f"completed: {acker.totals}")

    _check(_sink_by_origin(spark, sink), sent, delivered)


def test_spark_siblings_are_three_facts_and_a_replay_adds_none(
    spark: SparkSession, bootstrap: str, start_acker: Callable, consume_topic: Callable, tmp_path: Path
) -> None:
    """The same fan-out from Spark (``Emit``): every first attempt fails after emitting."""
    settings, ns = KafkaSettings(bootstrap), Namespace(unique_name("sparkpath"))
    orders, items, n = f"{ns.name}-orders", f"{ns.name}-items", 20
    create(settings, ns, 2, {orders: 2, items: 2})
    with Source(settings, ns, SourceConfig(timeout_ms=120_000)) as source:
        sent = {source.send(orders, f"o{i}", f"order-{i}").origin: i for i in range(n)}

    def fan_out(batch: DataFrame, batch_id: int) -> BatchResult:
        siblings = batch.select("*", F.explode(F.array(*[F.lit(k) for k in range(FAN_OUT)])).alias("k"))
        children = siblings.select(
            "key",
            F.concat(F.col("value").cast("string"), F.lit("/item-"), F.col("k").cast("string")).alias("value"),
            "srid",
            "origin",
            "attempt",
            "path",
        )
        return BatchResult(failed=F.col("attempt") == 1, emits=[Emit(items, children)])

    with start_acker(ns) as acker:
        with Acking(bootstrap, ns, fan_out) as acking:
            acking.process(read_with_replay(spark, bootstrap, orders, stream=False), 0)
            assert len(consume_topic(replay_topic(orders), 2, n)) == n
            replays = read_with_replay(spark, bootstrap, orders, stream=False).where("is_replay")
            acking.process(replays, 1)
        delivered = consume_topic(items, 2, 2 * FAN_OUT * n)
        assert len(delivered) == 2 * FAN_OUT * n

        sink = OriginParquetSink(str(tmp_path / "items"))
        everything = read_with_replay(spark, bootstrap, items, stream=False)
        with Acking(bootstrap, ns, _facts_job(sink)) as acking:
            acking.process(everything.where("attempt = 1"), 0)
            acking.process(everything.where("attempt = 2"), 1)
        _wait(lambda: acker.totals["completed"] == n, f"completed: {acker.totals}")

    _check(_sink_by_origin(spark, sink), sent, delivered)


def test_a_fresh_checkpoint_keeps_the_first_querys_facts(
    spark: SparkSession, bootstrap: str, tmp_path: Path
) -> None:
    """Batch ids restart at 0 on a new checkpoint: the second query's batch 0 must not
    replace the first query's."""
    settings, ns = KafkaSettings(bootstrap), Namespace(unique_name("freshck"))
    first, second, n = f"{ns.name}-first", f"{ns.name}-second", 30
    create(settings, ns, 2, {first: 2, second: 2})
    sink = OriginParquetSink(str(tmp_path / "facts"))
    origins: dict[str, set[int]] = {}

    def run(topic: str, checkpoint: str) -> None:
        with Source(settings, ns) as source:
            origins[topic] = {source.send(topic, f"k{i}", f"{topic}-{i}").origin for i in range(n)}
        acking = Acking(bootstrap, ns, _facts_job(sink))
        query = (
            read_with_replay(spark, bootstrap, topic)
            .writeStream.foreachBatch(acking)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="1 second")
            .start()
        )
        def arrived() -> bool:
            try:
                return origins[topic] <= set(_sink_by_origin(spark, sink))
            except Exception:  # noqa: BLE001 - read while a batch (re)writes its directory
                return False

        try:
            _wait(arrived, f"{topic} in the sink")
        finally:
            query.stop()
            acking.close()

    run(first, str(tmp_path / "checkpoint-1"))
    run(second, str(tmp_path / "checkpoint-2"))  # a new checkpoint: batch ids from 0 again

    facts = _sink_by_origin(spark, sink)
    assert origins[first] <= set(facts), f"{len(origins[first] - set(facts))} facts of the first query lost"
    assert set(facts) == origins[first] | origins[second]
