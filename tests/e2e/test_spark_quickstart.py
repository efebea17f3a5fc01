"""The README's snippet is the code that runs: quoted verbatim, and run here end to end."""

from __future__ import annotations

import inspect
import json
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import spark_jobs.quickstart
from broker import ids
from broker.dev.testing import unique_name
from broker.headers import H_ORIGIN
from broker.kafka_io import read_to_end
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.topics import Namespace, create
from spark_jobs import OriginParquetSink
from spark_jobs.quickstart import start_payments_query

pytestmark = pytest.mark.e2e

README = Path(spark_jobs.quickstart.__file__).with_name("README.md")


def _snippet() -> str:
    source = inspect.getsource(spark_jobs.quickstart)
    start = source.index("# --8<-- [start:quickstart]\n") + len("# --8<-- [start:quickstart]\n")
    end = source.index("    # --8<-- [end:quickstart]")
    return textwrap.dedent(source[start:end]).strip()


def test_the_readme_quotes_the_snippet_verbatim() -> None:
    snippet = _snippet()
    assert "Acking(bootstrap, namespace, process)" in snippet
    assert f"```python\n{snippet}\n```" in README.read_text()
    top_readme = Path(__file__).resolve().parents[2] / "README.md"
    assert f"```python\n{snippet}\n```" in top_readme.read_text()


def test_the_snippet_runs_and_acks_every_record(
    spark: SparkSession, bootstrap: str, start_acker: Callable, tmp_path: Path
) -> None:
    settings, ns = KafkaSettings(bootstrap), Namespace(unique_name("quickstart"))
    topic, n = f"{ns.name}-payments", 300
    create(settings, ns, 2, {topic: 2})
    bad = {7, 150}  # unparsable: failed on every attempt, dead-lettered after max_attempts
    with Source(settings, ns, SourceConfig(timeout_ms=60_000, max_attempts=2)) as source:
        sent = {
            source.send(topic, f"acct-{i % 13}", "not json" if i in bad else json.dumps({"amount": i})).origin
            for i in range(n)
        }

    out, checkpoint = str(tmp_path / "payments"), str(tmp_path / "checkpoint")
    with start_acker(ns) as acker:
        query = start_payments_query(spark, bootstrap, ns.name, topic, out, checkpoint)
        try:
            deadline = time.monotonic() + 120
            while not (acker.totals["completed"] == n - len(bad) and acker.totals["dlq"] == len(bad)):
                assert query.exception() is None and query.isActive
                assert time.monotonic() < deadline, acker.totals
                time.sleep(0.2)
        finally:
            query.stop()

    rows = OriginParquetSink(out).read(spark).select("origin", "amount").collect()
    assert len(rows) == n - len(bad)
    assert {r["origin"] for r in rows} < sent
    assert sorted(r["amount"] for r in rows) == [float(i) for i in range(n) if i not in bad]


def test_a_poison_value_is_dead_lettered_and_the_query_keeps_running(
    spark: SparkSession, bootstrap: str, start_acker: Callable, tmp_path: Path
) -> None:
    """An amount that is not a number: under ANSI mode a plain cast of it throws, the batch
    fails, and the query restarts on the same offsets forever. It must fail only its record."""
    settings, ns = KafkaSettings(bootstrap), Namespace(unique_name("poison"))
    topic, n = f"{ns.name}-payments", 40
    create(settings, ns, 2, {topic: 2})
    poison = {5: json.dumps({"amount": "abc"}), 17: json.dumps({"amount": "12,50"})}
    with Source(settings, ns, SourceConfig(timeout_ms=60_000, max_attempts=2)) as source:
        origins = {
            i: source.send(topic, f"acct-{i % 7}", poison.get(i, json.dumps({"amount": i}))).origin
            for i in range(n)
        }
    bad = {origins[i] for i in poison}

    out, checkpoint = str(tmp_path / "payments"), str(tmp_path / "checkpoint")
    with start_acker(ns) as acker:
        query = start_payments_query(spark, bootstrap, ns.name, topic, out, checkpoint)
        try:
            deadline = time.monotonic() + 120
            while not (acker.totals["completed"] == n - len(bad) and acker.totals["dlq"] == len(bad)):
                assert query.exception() is None and query.isActive, query.exception()
                assert time.monotonic() < deadline, acker.totals
                time.sleep(0.2)
            assert query.exception() is None and query.isActive
        finally:
            query.stop()

    # Ground truth from the topics: the dead letters' origins, the sink's rows.
    dead = {
        ids.decode_id(dict(m.headers() or ())[H_ORIGIN]) for m in read_to_end(settings, ns.dlq, 1)
    }
    assert dead == bad
    rows = OriginParquetSink(out).read(spark).select("origin", "amount").collect()
    assert {r["origin"] for r in rows} == set(origins.values()) - bad
    assert sorted(r["amount"] for r in rows) == [float(i) for i in range(n) if i not in poison]
