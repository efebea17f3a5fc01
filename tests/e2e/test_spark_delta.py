"""``OriginDeltaSink``: a re-run batch writes nothing twice, a replay leaves one row.

No Kafka here: DataFrames with the sink's key columns, written the way ``Acking`` hands them
to a ``write``. Its per-batch cost is a figure of ``python -m spark_jobs.measure delta``, not
a test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from broker.errors import ConfigurationError
from spark_jobs.sinks import BUCKET, OriginDeltaSink

pytestmark = pytest.mark.e2e

SCHEMA = "origin long, path string, amount double"


def _facts(spark: SparkSession, rows: list[tuple[int, str, float]]) -> DataFrame:
    return spark.createDataFrame(rows, SCHEMA)


def _ids(sink: OriginDeltaSink, spark: SparkSession) -> list[tuple[int, str]]:
    return sorted((r.origin, r.path) for r in sink.read(spark).select("origin", "path").collect())


def _commits(spark: SparkSession, path: Path) -> int:
    return DeltaTable.forPath(spark, str(path)).history().count()


def test_a_batch_written_twice_with_its_batch_id_writes_once(spark: SparkSession, tmp_path: Path) -> None:
    """The second run of a batch - a driver that died after Delta's commit and before Spark's
    checkpoint - is skipped by its transaction id, even with ids the table has never seen:
    the first batch (which creates the table) and a later one (a MERGE) alike."""
    sink = OriginDeltaSink(str(tmp_path / "facts"), query_id="q-rerun")
    sink.write(_facts(spark, [(1, "0", 1.0), (2, "0", 2.0)]), 0)
    sink.write(_facts(spark, [(1, "0", 1.0), (2, "0", 2.0), (9, "0", 9.0)]), 0)
    assert _ids(sink, spark) == [(1, "0"), (2, "0")]

    sink.write(_facts(spark, [(3, "0", 3.0)]), 1)
    sink.write(_facts(spark, [(3, "0", 3.0), (4, "0", 4.0)]), 1)
    assert _ids(sink, spark) == [(1, "0"), (2, "0"), (3, "0")]
    assert _commits(spark, tmp_path / "facts") == 2  # the re-runs committed nothing

    # Another query (a new checkpoint: batch ids from 0 again) is another transaction id.
    other = OriginDeltaSink(str(tmp_path / "facts"), query_id="q-other")
    other.write(_facts(spark, [(5, "0", 5.0)]), 0)
    assert (5, "0") in _ids(other, spark)


@pytest.mark.parametrize("replay_window_ms", [None, 3_600_000])
def test_a_replayed_output_leaves_one_row(
    spark: SparkSession, tmp_path: Path, replay_window_ms: int | None
) -> None:
    """A replay (same origin and path, another batch) adds nothing, in the same batch as its
    first copy or in a later one; a sibling of a fan-out (same origin, another path) and
    ids in buckets the batch does not share are written; the table is partitioned by
    bucket."""
    sink = OriginDeltaSink(
        str(tmp_path / "facts"), query_id="q-replay", buckets=64, replay_window_ms=replay_window_ms
    )
    sink.write(_facts(spark, [(10, "0", 1.0), (10, "0", 1.0), (-7, "0", 2.0)]), 0)
    sink.write(_facts(spark, [(10, "0", 1.5), (10, "0.1", 3.0), (2**63 - 1, "0", 4.0)]), 1)
    sink.write(_facts(spark, [(-7, "0", 2.5), (10, "0.1", 3.5), (10, "0", 1.5)]), 2)
    assert _ids(sink, spark) == [(-7, "0"), (10, "0"), (10, "0.1"), (2**63 - 1, "0")]
    first = {(r.origin, r.path): r.amount for r in sink.read(spark).collect()}
    assert first[(10, "0")] == 1.0  # the first copy stays
    detail = DeltaTable.forPath(spark, str(tmp_path / "facts")).detail().first()
    assert detail is not None
    assert detail.partitionColumns == [BUCKET]
    buckets = {r[0] for r in sink.read(spark).select(BUCKET).collect()}
    assert buckets == {(-7) % 64, 10, (2**63 - 1) % 64}


def test_the_sink_needs_the_output_id(spark: SparkSession, tmp_path: Path) -> None:
    sink = OriginDeltaSink(str(tmp_path / "facts"))
    with pytest.raises(ConfigurationError, match="path"):
        sink.write(spark.createDataFrame([(1, 1.0)], "origin long, amount double"), 0)


@pytest.mark.parametrize("replay_window_ms", [None, 3_600_000])
def test_the_file_count_stays_bounded_on_the_optimize_schedule(
    spark: SparkSession, tmp_path: Path, replay_window_ms: int | None
) -> None:
    """``optimize_every=3``: batches 3 and 6 compact the table before their commit, so after
    seven batches (a file each) it holds the compacted file and batch 6's; every id is still
    there once, and a replay after the compaction adds nothing."""
    path = tmp_path / "facts"
    sink = OriginDeltaSink(str(path), query_id="q-opt", replay_window_ms=replay_window_ms, optimize_every=3)
    for batch_id in range(7):
        sink.write(_facts(spark, [(batch_id, "0", 1.0), (max(batch_id - 1, 0), "0", 2.0)]), batch_id)
    assert len(sink.read(spark).inputFiles()) == 2
    assert _ids(sink, spark) == [(i, "0") for i in range(7)]
    operations = [r.operation for r in DeltaTable.forPath(spark, str(path)).history().collect()]
    assert operations.count("OPTIMIZE") == 2
    assert sink.write(_facts(spark, [(1, "0", 3.0), (7, "0", 7.0)]), 7)
    assert _ids(sink, spark) == [(i, "0") for i in range(8)]


def test_optimize_every_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="optimize_every"):
        OriginDeltaSink(str(tmp_path / "facts"), optimize_every=0)
