"""Superseded replays in the Spark path: the handler's rows leave them out, the events still
ack them (as leaves), with no Python per row. No Kafka: DataFrames shaped like a batch with
tracking columns."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from broker import ids
from broker.schemas import XorBatch
from spark_jobs.acking import collect_xor_batches, without_superseded, xor_events

pytestmark = pytest.mark.e2e


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
