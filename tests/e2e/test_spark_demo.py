"""5 000 orders through the Spark job with 5 % first-attempt failures and one query restart
(mid-batch: outputs written, acks not sent): every origin completes exactly once, the sink
holds each exactly once, and the failed ones came back through ``<topic>.replay``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from broker import ids
from broker.headers import OUTCOME_COMPLETED, outcome_of
from broker.kafka_io import read_to_end
from broker.schemas import PersistedRecord
from broker.settings import KafkaSettings
from broker.topics import Namespace, replay_topic
from spark_jobs.demo import SparkDemo, SparkDemoConfig
from spark_jobs.orders import first_attempt_failures

pytestmark = pytest.mark.e2e

RECORDS, FAIL_RATE = 5000, 0.05


def test_every_origin_completes_once_through_spark_with_failures_and_a_restart(
    spark: SparkSession, bootstrap: str, tmp_path: Path
) -> None:
    config = SparkDemoConfig(records=RECORDS, fail_rate=FAIL_RATE, restart=True, workdir=str(tmp_path))
    demo = SparkDemo(bootstrap, config)
    summary = demo.run()
    print(summary)  # shown with -s: the figures of this run

    assert len(demo.origins) == RECORDS
    assert summary["lost"] == 0 and summary["dlq"] == 0 and summary["pending"] == 0
    assert summary["restarts"] == 1
    assert summary["interrupted_batches"] == 1  # stopped between its outputs and its acks

    # The ledger, read back from Kafka: one completed tombstone per origin, no more.
    settings, ns = KafkaSettings(bootstrap), Namespace(summary["namespace"])
    origin_of: dict[int, int] = {}
    completions: Counter[int] = Counter()
    for msg in read_to_end(settings, ns.persist, config.ledger_partitions):
        srid = ids.decode_id(msg.key())
        if msg.value() is not None:
            origin_of[srid] = PersistedRecord.decode(msg.value()).origin
        elif outcome_of(msg.headers()) == OUTCOME_COMPLETED:
            completions[origin_of[srid]] += 1
    assert set(completions) == demo.origins
    assert set(completions.values()) == {1}

    # The sink: each origin exactly once, nothing else.
    assert demo.sink is not None
    facts = demo.sink.read(spark)
    rows = facts.select("origin").collect()
    assert len(rows) == RECORDS == summary["sink_rows"]
    assert {r["origin"] for r in rows} == demo.origins
    assert summary["sink_duplicates"] == 0

    # The injected failures were replayed through <topic>.replay, and only then written.
    failed_first = facts.where(
        F.pmod(F.xxhash64("origin"), F.lit(1_000_000)) < int(FAIL_RATE * 1_000_000)
    )
    n_failed = failed_first.count()
    assert 0.02 * RECORDS < n_failed < 0.08 * RECORDS
    assert failed_first.where(
        (F.col("attempt") >= 2) & (F.col("source_topic") == replay_topic(demo.topic))
    ).count() == n_failed
    assert facts.where(first_attempt_failures(FAIL_RATE)).count() == 0  # never at attempt 1
    assert summary["replays_read"] >= n_failed
    assert summary["fail_marks"] >= n_failed

    # Revenue over the deduplicated facts counts every order once.
    for group, expected in summary["revenue_expected"].items():
        got = summary["revenue"][group]
        assert got["orders"] == expected["orders"]
        assert got["net_revenue"] == pytest.approx(expected["net_revenue"], abs=0.05)
