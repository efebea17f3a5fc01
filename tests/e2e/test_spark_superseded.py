"""Superseded replays in the Spark path: the handler's rows leave them out, the events still
ack them (as leaves), with no Python per row - on DataFrames shaped like a batch with tracking
columns, and end to end with a real late original (Kafka, an acker, a streaming query)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from broker import ids
from broker.dev.testing import unique_name
from broker.kafka_io import read_to_end
from broker.markers import SupersededMarkers
from broker.schemas import XorBatch
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.topics import Namespace, create
from spark_jobs import Acking, BatchResult, OriginParquetSink, read_with_replay
from spark_jobs.acking import collect_xor_batches, without_superseded, xor_events
from tests.e2e.test_spark_driver_kill import LEDGER_PARTITIONS, Outcomes

pytestmark = pytest.mark.e2e

RECORDS = 10
TIMEOUT_MS = 20_000  # the late originals are held past it; their replays are acked well within it


def test_superseded_rows_are_left_out_for_the_handler_and_acked_as_leaves(spark: SparkSession) -> None:
    first, replay, other = ids.new_id(), ids.new_id(), ids.new_id()
    rid_first, rid_replay, rid_other = ids.new_id(), ids.new_id(), ids.new_id()
    batch = spark.createDataFrame(
        [("a", first, rid_first, 1), ("b", replay, rid_replay, 2), ("c", other, rid_other, 2), ("u", None, None, None)],
        "key string, srid long, record_id long, attempt int",
    )
    marked = spark.createDataFrame([(replay,), (ids.new_id(),)], "srid long")

    rows = without_superseded(batch, marked)
    assert sorted(r.key for r in rows.collect()) == ["a", "c", "u"]  # untracked rows stay
    assert "Python" not in rows._jdf.queryExecution().executedPlan().toString()  # no UDF

    batches, _ = collect_xor_batches(xor_events(batch, 1), "test")
    pairs = {s: x for xb in batches for s, x in zip(XorBatch.decode(xb.encode()).srids.tolist(), xb.xors.tolist(), strict=True)}
    assert pairs == {first: rid_first, replay: rid_replay, other: rid_other}  # the skipped one acked as a leaf


def test_a_late_original_completes_and_its_replay_is_skipped(
    spark: SparkSession, bootstrap: str, start_acker: Callable, tmp_path: Path
) -> None:
    """Real late originals: their batch holds them past their timeout, until the acker's
    replays of them are in ``<topic>.replay``, then writes and acks them. The originals
    complete late, the acker marks the replays superseded, and the next run of the query (on
    the same checkpoint) skips the replays: ``write`` never gets an attempt 2, the sink holds
    one row per origin, and every origin has one ``completed`` tombstone (``ns.persist``)."""
    settings, ns = KafkaSettings(bootstrap), Namespace(unique_name("late"))
    topic = f"{ns.name}-in"
    create(settings, ns, LEDGER_PARTITIONS, {topic: 2})
    with Source(settings, ns, SourceConfig(timeout_ms=TIMEOUT_MS, max_attempts=3)) as source:
        sent = {source.send(topic, f"k{i}", f"v{i}").origin for i in range(RECORDS)}
    sink = OriginParquetSink(str(tmp_path / "facts"))
    handled: list[tuple[int, int]] = []  # (origin, attempt) of every row handed to write

    def write(ok: DataFrame, batch_id: int) -> None:
        seen = [(r["origin"], r["attempt"]) for r in ok.select("origin", "attempt").collect()]
        handled.extend(seen)
        if any(attempt == 1 for _, attempt in seen):  # past their timeout: until replayed
            deadline = time.monotonic() + 90
            while len(read_to_end(settings, f"{topic}.replay", 2)) < len(seen):
                assert time.monotonic() < deadline, "the late originals were not replayed"
                time.sleep(0.5)
        sink.write(ok.select("origin", "path"), batch_id)

    def handler(batch: DataFrame, batch_id: int) -> BatchResult:
        return BatchResult(write=write, sink=sink)

    def run(acking: Acking) -> None:
        query = (
            read_with_replay(spark, bootstrap, topic)
            .writeStream.foreachBatch(acking)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert query.awaitTermination(180), "the query did not finish its input"
            assert query.exception() is None, query.exception()
        finally:
            query.stop()

    with start_acker(ns):
        with Acking(bootstrap, ns, handler) as first:
            run(first)
        markers = SupersededMarkers(settings, ns)
        try:
            deadline = time.monotonic() + 60
            while len(markers.srids) < RECORDS:  # the late acks folded: the replays marked
                assert time.monotonic() < deadline, "no superseded marker"
                markers.poll(0.5)
        finally:
            markers.close()
        with Acking(bootstrap, ns, handler) as second:
            # Acking polls its marker reader without waiting, once per batch (a known gap: a
            # batch does not wait for markers): let it have read them before the replays come.
            reader = second._markers
            assert reader is not None
            deadline = time.monotonic() + 60
            while len(reader.srids) < RECORDS:
                assert time.monotonic() < deadline, "the query's marker reader read no markers"
                reader.poll(0.5)
            run(second)  # reads the replays
        deadline = time.monotonic() + 60
        while unsettled := Outcomes.read(settings, ns).unsettled(sent):
            assert time.monotonic() < deadline, f"{len(unsettled)} records unsettled"
            time.sleep(0.5)

    outcomes = Outcomes.read(settings, ns)
    assert not outcomes.dead and set(outcomes.completions.values()) == {1}
    assert sorted(handled) == sorted((origin, 1) for origin in sent), "a superseded replay was written"
    assert second.totals["skipped"] == RECORDS
    rows = Counter(r["origin"] for r in sink.read(spark).select("origin").collect())
    assert set(rows) == sent and set(rows.values()) == {1}
