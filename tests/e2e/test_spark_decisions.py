"""One failure decision per row: the sink rows and the acks come from the same evaluation.

The decision here is a nondeterministic Python UDF (a coin flip per call): evaluated twice, it
would disagree with itself for about half of the rows. The ground truth is what went out -
the XorBatches in ``ns.acks`` and the facts in the sink - not the wrapper's own counters.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker.dev.testing import unique_name
from broker.kafka_io import read_to_end
from broker.schemas import XorBatch
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.topics import Namespace, create
from spark_jobs import Acking, AckingConfig, BatchResult, OriginParquetSink, read_with_replay

pytestmark = pytest.mark.e2e


def _acks(settings: KafkaSettings, ns: Namespace, partitions: int) -> tuple[set[int], set[int]]:
    """The srids acked (a pair) and failed (a fail mark), as the acker will read them."""
    acked: set[int] = set()
    failed: set[int] = set()
    for msg in read_to_end(settings, ns.acks, partitions):
        xb = XorBatch.decode(msg.value())
        acked.update(xb.srids.tolist())
        failed.update(xb.failed.tolist())
    return acked, failed


@pytest.mark.parametrize("observe", [True, False], ids=["observed", "events-job"])
@pytest.mark.parametrize("form", ["column", "dataframe"])
def test_rows_acked_are_the_rows_written(
    spark: SparkSession, bootstrap: str, tmp_path: Path, form: str, observe: bool
) -> None:
    settings, ns = KafkaSettings(bootstrap), Namespace(unique_name("decide"))
    topic, n, P = f"{ns.name}-in", 200, 2
    create(settings, ns, P, {topic: 2})
    with Source(settings, ns, SourceConfig(timeout_ms=120_000)) as source:
        sent = {source.send(topic, f"k{i}", f"v{i}").srid for i in range(n)}

    def coin(_value: object) -> bool:  # nested: pickled by value, the workers import nothing
        return random.random() < 0.5

    flaky = F.udf(coin, "boolean").asNondeterministic()  # a flaky lookup, say
    sink = OriginParquetSink(str(tmp_path / "sink"))

    def write(ok: DataFrame, batch_id: int) -> None:
        sink.write(ok.select("origin", "path", "srid"), batch_id)

    def handler(batch: DataFrame, batch_id: int) -> BatchResult:
        if form == "column":
            return BatchResult(failed=flaky(F.col("value")), write=write, sink=sink)
        return BatchResult(failed=batch.where(flaky(F.col("value"))).select("srid"), write=write, sink=sink)

    with Acking(bootstrap, ns, handler, AckingConfig(observe_events=observe)) as acking:
        stats = acking.process(read_with_replay(spark, bootstrap, topic, stream=False), 0)
    # The acks came from the observations of the write's own jobs (spark_jobs/observed.py),
    # not from an events job: that is the path under test. The same test with
    # AckingConfig(observe_events=False) covers the events job (below).
    assert stats.events_job == int(not observe)

    acked, failed = _acks(settings, ns, P)
    written = {r["srid"] for r in sink.read(spark).select("srid").collect()}

    assert acked | failed == sent and not acked & failed
    assert 0 < len(failed) < n  # the coin did flip
    assert acked <= written, f"{len(acked - written)} rows acked as complete but not in the sink"
    assert sent - written <= failed, f"{len(sent - written - failed)} rows missing and not failed"
    assert not written & failed, f"{len(written & failed)} rows written and failed"
