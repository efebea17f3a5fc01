"""A micro-batch run again after it died between its outputs and its acks acks what its sink
committed, not a new decision (docs/design.md §8, "Reruns"; ``spark_jobs/committed.py``).

Real Kafka, an acker, a streaming query on Spark, both sinks. The handler's lookup is flaky
by its call count per key: the keys of ``FIRST`` fail on their first call only, those of
``SECOND`` on their second call only (the lookup goes down while the batch runs again). Batch
0 holds every record; its first run dies after the write, either

- ``exception``: an error before any ack is sent (``AckFault.BEFORE_ACKS``), or
- ``delivery``: an ack delivery error after the acks went out (``AckFault.AFTER_ACKS``);

and the query is started again from the same checkpoint, which runs batch 0 again. Decided
again, the rerun would ack ``FIRST`` (Delta kept the first commit, without them: lost) or
overwrite the Parquet batch without ``SECOND``, whose acks went out (lost).

Ground truth from the topics and the sink, not from the code under test: every origin sent
has exactly one ``completed`` tombstone in ``ns.persist``, none is dead-lettered, and the sink
holds exactly one row per origin (the record's output identity (origin, "0")) and no other.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from broker import ids
from broker.dev.testing import unique_name
from broker.errors import DeliveryError
from broker.headers import H_ORIGIN, H_OUTCOME, OUTCOME_COMPLETED
from broker.kafka_io import read_to_end
from broker.schemas import PersistedRecord
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.topics import Namespace, create
from spark_jobs import Acking, BatchResult, OriginDeltaSink, OriginParquetSink, read_with_replay
from spark_jobs.acking import AckFault

pytestmark = pytest.mark.e2e

RECORDS = 200
PARTITIONS = 2
FIRST = frozenset(f"k{i}" for i in range(RECORDS) if i % 12 == 3)  # fail on their first call
SECOND = frozenset(f"k{i}" for i in range(RECORDS) if i % 12 == 7)  # fail on their second call
FAULTS = {
    "exception": (AckFault.BEFORE_ACKS, RuntimeError("the batch dies after its write")),
    "delivery": (AckFault.AFTER_ACKS, DeliveryError("acks not delivered (injected)")),
}


def _flaky_lookup(calls: str) -> Callable[[str], bool]:
    """Whether the lookup fails for ``key`` on this call: its calls are counted in files
    under ``calls`` (shared by every Python worker of the session)."""

    def fails(key: str) -> bool:
        n = 1
        while True:
            try:
                os.close(os.open(os.path.join(calls, f"{key}.{n}"), os.O_CREAT | os.O_EXCL))
                break
            except FileExistsError:
                n += 1
        return (key in FIRST and n == 1) or (key in SECOND and n == 2)

    return fails


def _outcomes(settings: KafkaSettings, ns: Namespace) -> tuple[Counter[int], set[int]]:
    """``completed`` tombstones per origin (``ns.persist``) and the dead-lettered origins."""
    origin_of: dict[int, int] = {}
    completions: Counter[int] = Counter()
    for msg in read_to_end(settings, ns.persist, PARTITIONS):
        srid = ids.decode_id(msg.key())
        if msg.value() is not None:
            origin_of[srid] = PersistedRecord.decode(msg.value()).origin
        elif dict(msg.headers() or ()).get(H_OUTCOME) == OUTCOME_COMPLETED:
            completions[origin_of[srid]] += 1
    dead = {
        ids.decode_id(origin)
        for msg in read_to_end(settings, ns.dlq, 1)
        if (origin := dict(msg.headers() or ()).get(H_ORIGIN)) is not None
    }
    return completions, dead


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("kind", ["parquet", "delta"])
def test_a_rerun_batch_acks_what_its_sink_committed(
    spark: SparkSession, bootstrap: str, start_acker: Callable, tmp_path: Path, kind: str, fault: str
) -> None:
    settings, ns = KafkaSettings(bootstrap), Namespace(unique_name("rerun"))
    topic = f"{ns.name}-in"
    create(settings, ns, PARTITIONS, {topic: 2})
    with Source(settings, ns, SourceConfig(timeout_ms=60_000, max_attempts=3)) as source:
        sent = {source.send(topic, f"k{i}", f"v{i}").origin for i in range(RECORDS)}

    (tmp_path / "calls").mkdir()
    lookup = F.udf(_flaky_lookup(str(tmp_path / "calls")), "boolean").asNondeterministic()
    out = str(tmp_path / kind)
    sink = OriginDeltaSink(out) if kind == "delta" else OriginParquetSink(out)

    def write(ok: DataFrame, batch_id: int) -> None:
        sink.write(ok.select("origin", "path", "key"), batch_id)

    def handler(batch: DataFrame, batch_id: int) -> BatchResult:
        rows = batch.select("srid", "record_id", "origin", "attempt", "path", F.col("key").cast("string").alias("key"))
        return BatchResult(rows=rows, failed=lookup(F.col("key")), write=write, sink=sink)

    point, error = FAULTS[fault]

    def inject(at: AckFault, batch_id: int) -> None:
        if at is point and batch_id == 0:
            raise error

    def start(acking: Acking) -> StreamingQuery:
        return (
            read_with_replay(spark, bootstrap, topic)
            .writeStream.foreachBatch(acking)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="1 second")
            .start()
        )

    with start_acker(ns):
        first = start(Acking(bootstrap, ns, handler, inject=inject))
        try:
            first.awaitTermination(180)
        except Exception as exc:  # noqa: BLE001 - the injected failure ends the query
            assert "batch 0 failed" in str(exc), exc
        finally:
            first.stop()
        assert not first.isActive

        query = start(Acking(bootstrap, ns, handler))  # the same checkpoint: batch 0 again
        try:
            deadline = time.monotonic() + 180
            while True:
                completions, dead = _outcomes(settings, ns)
                if set(completions) | dead >= sent:
                    break
                assert query.exception() is None and query.isActive, query.exception()
                assert time.monotonic() < deadline, f"{len(sent - set(completions) - dead)} records unsettled"
                time.sleep(1.0)
        finally:
            query.stop()

    completions, dead = _outcomes(settings, ns)
    rows = Counter((r["origin"], r["path"]) for r in sink.read(spark).select("origin", "path").collect())
    written = {origin for origin, _ in rows}
    assert not dead, f"{len(dead)} dead-lettered"
    assert set(completions) == sent and set(completions.values()) == {1}, completions
    assert not written - sent, "rows for origins never sent"
    assert {path for _, path in rows} == {"0"}
    assert not [k for k, n in rows.items() if n > 1], "an output written twice"
    assert sent <= written, f"{len(sent - written)} records completed without their output"
