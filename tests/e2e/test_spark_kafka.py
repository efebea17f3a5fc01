"""The Spark helpers against a real Kafka: children anchoring, and replays placed where a
Spark shuffle would put their key (the ``spark`` partitioner)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker.dev.testing import unique_name
from broker.headers import Tracking, path_of
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task
from broker.topics import Namespace, create, replay_topic
from spark_jobs import Acking, BatchResult, Emit, read_with_replay
from spark_jobs.reader import FETCH_MAX_WAIT_MS

pytestmark = pytest.mark.e2e


def _wait(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.1)


def _keys() -> list[str]:
    """Every byte length mod 4, multi-byte UTF-8 tails included."""
    base = ["", "a", "ab", "abc", "abcd", "é", "中", "😀", "a😀", "ab中", "order-17", "x" * 41]
    return base + [f"customer-{i}" + "é" * (i % 4) for i in range(288)]


def test_replays_land_in_the_spark_shuffle_partition_of_their_key(
    spark: SparkSession, bootstrap: str, start_acker: Callable, consume_topic: Callable
) -> None:
    settings, ns = KafkaSettings(bootstrap), Namespace(unique_name("sparkpart"))
    topic, n = f"{ns.name}-events", 6
    create(settings, ns, 3, {topic: n})
    keys = _keys()
    config = SourceConfig(partitioners={topic: "spark"}, timeout_ms=120_000)
    with Source(settings, ns, config) as source:
        for i, key in enumerate(keys):
            source.send(topic, key, f"v{i}")

    with start_acker(ns):
        # Fail every first attempt from Spark: the acker replays each one at once.
        batch = read_with_replay(spark, bootstrap, topic, stream=False)
        with Acking(bootstrap, ns, lambda b, i: BatchResult(failed=F.col("attempt") == 1)) as acking:
            stats = acking.process(batch, 0)
        assert stats.fail_marks == len(keys)
        assert len(consume_topic(replay_topic(topic), n, len(keys))) == len(keys)

    everything = (
        read_with_replay(spark, bootstrap, topic, stream=False)
        .select("key", "partition", "attempt", "is_replay")
        .cache()
    )
    replays = everything.where("is_replay")
    assert replays.count() == replays.where("attempt = 2").count() == len(keys)

    def misplaced(frame: DataFrame, column: F.Column) -> list[tuple]:
        """Rows whose Kafka partition is not the Spark shuffle partition of ``column``."""
        placed = (
            frame.withColumn("k", column)
            .repartition(n, "k")
            .select("key", "partition", F.spark_partition_id().alias("pid"))
            .where("partition != pid")
        )
        return [tuple(r) for r in placed.collect()]

    for column in (F.col("key"), F.col("key").cast("string")):  # binary, and the same as text
        assert not misplaced(replays, column)
        assert not misplaced(everything.where("NOT is_replay"), column)
    everything.unpersist()


def test_children_are_anchored_to_their_parents_tree(
    spark: SparkSession, bootstrap: str, start_acker: Callable, consume_topic: Callable
) -> None:
    """A parent whose child is not acked must not complete; once the child is, it does."""
    settings, ns = KafkaSettings(bootstrap), Namespace(unique_name("sparkkids"))
    topic, kids, n = f"{ns.name}-parents", f"{ns.name}-kids", 40
    create(settings, ns, 2, {topic: 2, kids: 2})
    with Source(settings, ns, SourceConfig(timeout_ms=120_000)) as source:
        parents = {
            f"p{i}".encode(): source.send(topic, f"p{i}", "parent", headers=[("trace", f"t{i}")])
            for i in range(n)
        }

    def handler(batch: DataFrame, batch_id: int) -> BatchResult:
        # Half the children inherit the parent's user headers, half have none (null).
        inherit = F.col("offset") % 2 == 0
        children = batch.select(
            "key",
            F.lit("child").alias("value"),
            F.when(inherit, F.col("headers")).alias("headers"),
            "srid",
            "origin",
            "attempt",
            "path",
        )
        return BatchResult(emits=[Emit(kids, children)])

    with start_acker(ns) as acker:
        with Acking(bootstrap, ns, handler) as acking:
            stats = acking.process(read_with_replay(spark, bootstrap, topic, stream=False), 0)
        assert (stats.inputs, stats.children, stats.pairs) == (n, n, n)
        assert stats.events_job == 0  # the children's ids observed while they were written
        # Persisted (n roots) and acked (n events): the children's ids keep every value != 0.
        _wait(lambda: acker.totals["registered"] == n and acker.totals["folded"] == n)
        time.sleep(0.5)
        assert acker.totals["completed"] == 0

        children = consume_topic(kids, 2, n)
        assert len(children) == n
        seen_ids = set()
        inherited = 0
        for child in children:
            headers = child.headers()
            tracking = Tracking.from_headers(headers)
            parent = parents[child.key()]
            assert tracking is not None
            assert (tracking.srid, tracking.origin, tracking.attempt) == (parent.srid, parent.origin, 1)
            assert tracking.record_id not in (0, parent.record_id)
            assert path_of(headers) == "0.0"  # the first child of a source record
            seen_ids.add(tracking.record_id)
            user = [(k, v) for k, v in headers if not k.startswith("rb-")]
            assert user in ([], [("trace", f"t{child.key().decode()[1:]}".encode())])
            inherited += bool(user)
        assert len(seen_ids) == n
        assert 0 < inherited < n

        # A leaf task acks every child: now each tree is complete.
        Task(settings, ns, [kids], f"{ns.name}-kids", lambda record, ctx: None).run(max_idle_ms=3000)
        _wait(lambda: acker.totals["completed"] == n)


def test_the_source_holds_an_empty_fetch_briefly(spark: SparkSession, bootstrap: str) -> None:
    """The Kafka source's consumers are told how long a fetch that finds no data may wait at the
    broker (the Java consumer's 500 ms otherwise held every micro-batch that reads up to the end
    of a partition for ~1 s, spark_jobs/README.md); the caller's options still win."""
    settings, ns = KafkaSettings(bootstrap), Namespace(unique_name("sparkwait"))
    topic = f"{ns.name}-events"
    create(settings, ns, 1, {topic: 2})

    def source_options(frame: DataFrame) -> dict[str, str]:
        leaves = frame._jdf.queryExecution().logical().collectLeaves()  # the Kafka source alone
        assert leaves.size() == 1
        return dict(leaves.apply(0).extraOptions().asCaseSensitiveMap())

    options = source_options(read_with_replay(spark, bootstrap, topic))
    assert options["kafka.fetch.max.wait.ms"] == str(FETCH_MAX_WAIT_MS) == "10"
    assert options["kafka.isolation.level"] == "read_committed"
    mine = read_with_replay(spark, bootstrap, topic, options={"kafka.fetch.max.wait.ms": "250"})
    assert source_options(mine)["kafka.fetch.max.wait.ms"] == "250"


@pytest.mark.parametrize("how", ["events-job", "rows", "pinned"])
def test_rejected_rows_are_dead_lettered_at_once_with_their_reason(
    spark: SparkSession, bootstrap: str, start_acker: Callable, consume_topic: Callable, tmp_path: Any, how: str
) -> None:
    """Issue 43 item 2: ``BatchResult(rejected=...)`` - a reason column - dead-letters its rows'
    records on this attempt with ``rb-reason: rejected: <reason>``; ``failed`` rows are
    replayed; the rest is acked. The same from the events job, a ``rows`` frame, and a
    pinned decision (``write``). Ground truth: the DLQ, the replay topic and the tombstones."""
    from broker.dev.testing import unique_name as fresh
    from broker.kafka_io import read_to_end
    from spark_jobs.sinks import OriginParquetSink

    settings, ns = KafkaSettings(bootstrap), Namespace(fresh("sparkrej"))
    topic = f"{ns.name}-orders"
    create(settings, ns, 2, {topic: 2})
    with Source(settings, ns, SourceConfig(timeout_ms=120_000, max_attempts=5)) as source:
        for value in (b"ok", b"bad", b"ok", b"retry", b"bad"):
            source.send(topic, value, value)
    reason = F.when(F.col("value").cast("string") == "bad", F.lit("no such sku"))
    failed = F.col("value").cast("string") == "retry"
    written: list[int] = []

    def handler(batch: DataFrame, batch_id: int) -> BatchResult:
        if how == "events-job":
            return BatchResult(failed=failed, rejected=reason)
        if how == "rows":
            return BatchResult(failed=failed, rejected=reason, rows=batch.select("srid", "value"))

        def write(ok: DataFrame, _batch_id: int) -> None:
            written.append(ok.count())
            sink.write(ok.select("origin", "path", "srid"), _batch_id)

        sink = OriginParquetSink(str(tmp_path / "sink"))
        return BatchResult(failed=failed, rejected=reason, rows=batch.select("srid", "origin", "path", "value"),
                           write=write, sink=sink)

    with start_acker(ns):
        batch = read_with_replay(spark, bootstrap, topic, stream=False)
        with Acking(bootstrap, ns, handler) as acking:
            stats = acking.process(batch, 0)
        assert stats.fail_marks == 3
        assert len(consume_topic(replay_topic(topic), 2, 1)) == 1  # only the failed one
        _wait(lambda: len(read_to_end(settings, ns.dlq, 1)) == 2)
    dead = read_to_end(settings, ns.dlq, 1)
    assert sorted(m.value() for m in dead) == [b"bad", b"bad"]
    assert {dict(m.headers() or ())["rb-reason"] for m in dead} == {b"rejected: no such sku"}
    assert {dict(m.headers() or ())["rb-attempts"] for m in dead} == {b"1"}
    if how == "pinned":
        assert written == [2]  # the two ok rows: nothing of the rejected or failed
