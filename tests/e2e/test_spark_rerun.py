"""A micro-batch run again after it died between its outputs and its acks acks what its sink
committed, not a new decision (docs/design.md §8, "Reruns"; ``spark_jobs/committed.py``).

Real Kafka, an acker, a streaming query on Spark, both sinks. The handler's lookup is flaky
by its call count per key: the keys of ``FIRST`` fail on their first call only, those of
``SECOND`` on their second call only (the lookup goes down while the batch runs again). Batch
0 holds every record; its first run dies after the write, either

- ``exception``: an error before any ack is sent (``AckFault.BEFORE_ACKS``), or
- ``delivery``: an ack delivery error after the acks went out (``AckFault.AFTER_ACKS``)
  (``tests/e2e/ack_faults.py``: a subclass of ``Acking`` injects them);

and the query is started again from the same checkpoint, which runs batch 0 again. Decided
again, the rerun would ack ``FIRST`` (Delta kept the first commit, without them: lost) or
overwrite the Parquet batch without ``SECOND``, whose acks went out (lost).

Ground truth from the topics and the sink, not from the code under test: every origin sent
has exactly one ``completed`` tombstone in ``ns.persist``, none is dead-lettered, and the sink
holds exactly one row per origin (the record's output identity (origin, "0")) and no other
(``Outcomes``, shared with the driver-kill test).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from broker.dev.testing import unique_name
from broker.errors import ConfigurationError, DeliveryError
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.topics import Namespace, create
from spark_jobs import Acking, BatchResult, OriginDeltaSink, OriginParquetSink, read_with_replay
from spark_jobs.committed import RETAINED, Committed
from tests.e2e.ack_faults import AckFault, FaultyAcking
from tests.e2e.test_spark_driver_kill import LEDGER_PARTITIONS, Outcomes

pytestmark = pytest.mark.e2e

RECORDS = 200
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


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("kind", ["parquet", "delta"])
def test_a_rerun_batch_acks_what_its_sink_committed(
    spark: SparkSession, bootstrap: str, start_acker: Callable, tmp_path: Path, kind: str, fault: str
) -> None:
    settings, ns = KafkaSettings(bootstrap), Namespace(unique_name("rerun"))
    topic = f"{ns.name}-in"
    create(settings, ns, LEDGER_PARTITIONS, {topic: 2})
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
        first = start(FaultyAcking(bootstrap, ns, handler, inject=inject))
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
                unsettled = Outcomes.read(settings, ns).unsettled(sent)
                if not unsettled:
                    break
                assert query.exception() is None and query.isActive, query.exception()
                assert time.monotonic() < deadline, f"{len(unsettled)} records unsettled"
                time.sleep(1.0)
        finally:
            query.stop()

    outcomes = Outcomes.read(settings, ns)
    completions, dead = outcomes.completions, outcomes.dead
    rows = Counter((r["origin"], r["path"]) for r in sink.read(spark).select("origin", "path").collect())
    written = {origin for origin, _ in rows}
    assert not dead, f"{len(dead)} dead-lettered"
    assert set(completions) == sent and set(completions.values()) == {1}, completions
    assert not written - sent, "rows for origins never sent"
    assert {path for _, path in rows} == {"0"}
    assert not [k for k, n in rows.items() if n > 1], "an output written twice"
    assert sent <= written, f"{len(sent - written)} records completed without their output"


def test_write_needs_a_sink_that_tells_a_committed_batch(tmp_path: Path) -> None:
    """``BatchResult.write`` without a ``CommittingSink`` is refused: a rerun could not know
    what the first run committed."""

    def write(ok: DataFrame, batch_id: int) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"BatchResult\.sink"):
        BatchResult(write=write).checked_sink()
    with pytest.raises(ConfigurationError, match="not a CommittingSink"):
        BatchResult(write=write, sink=object()).checked_sink()  # type: ignore[arg-type]
    sink = OriginParquetSink(str(tmp_path / "facts"))
    assert BatchResult(write=write, sink=sink).checked_sink() is sink
    assert BatchResult(sink=sink).checked_sink() is None  # nothing written: nothing to check


def test_a_committed_parquet_batch_is_never_overwritten(spark: SparkSession, tmp_path: Path) -> None:
    """A batch with a record is committed: ``write`` returns ``False`` and keeps its rows; a
    batch directory without one is a cut run, written again. Records round-trip, and writing
    one drops the record ``RETAINED`` batches older."""
    sink = OriginParquetSink(str(tmp_path / "facts"), query_id="q")
    facts = spark.createDataFrame([(1, "0"), (2, "0")], "origin long, path string")
    assert sink.write(facts, 0) and sink.committed(spark, 0) is None
    assert sink.write(facts.limit(1), 0)  # not committed: the cut run's rows are replaced
    decision = Committed(np.array([1, -(2**63)], dtype=np.int64), np.array([7], dtype=np.int64))
    sink.record(spark, 0, decision)
    assert not sink.write(facts, 0)
    assert sink.read(spark).count() == 1
    committed = sink.committed(spark, 0)
    assert committed is not None and committed.acked is not None
    assert committed.acked.tolist() == [1, -(2**63)] and committed.failed.tolist() == [7]

    sink.record(spark, RETAINED, decision)
    assert sink.committed(spark, 0) is None and sink.committed(spark, RETAINED) is not None
