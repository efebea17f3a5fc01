"""The Spark demo on a standalone cluster: a master and one worker started from pyspark's jars
(``broker.dev.spark_cluster``), the executor a JVM of its own, its Python workers processes of
their own. ``replaybroker demo --spark --master spark://...`` runs in a subprocess - a process
holds one SparkContext, and this test session's is ``local`` - and the test checks, from the
topics, that every record completed, and from the processes and the cluster's own records that
the job ran on the executor: the connector jars and the project's zip reached it, and its
Python workers ran this virtualenv's interpreter with ``spark_jobs`` from the shipped zip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker import ids
from broker.dev import maven
from broker.dev.spark_cluster import LocalSparkCluster, SparkClusterState, master_json
from broker.headers import OUTCOME_COMPLETED, outcome_of
from broker.kafka_io import read_to_end
from broker.schemas import PersistedRecord
from broker.settings import KafkaSettings
from broker.topics import Namespace, delete, layout

pytestmark = pytest.mark.e2e

RECORDS = 500
LEDGER_PARTITIONS = 4  # SparkDemoConfig's
EXECUTOR = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
APP_NAME = "replaybroker-spark-demo"


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkClusterState]:
    maven.spark_kafka_connector_jars()  # resolved once (no-op when `setup` did it already)
    with LocalSparkCluster(tmp_path_factory.mktemp("spark-cluster"), worker_memory="1g") as cluster:
        assert cluster.state is not None
        yield cluster.state


def test_the_spark_demo_runs_on_a_standalone_cluster(
    spark_cluster: SparkClusterState, bootstrap: str, tmp_path: Path
) -> None:
    state = spark_cluster
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_MASTER", "PYSPARK_PYTHON")}
    # A run this short on 2 cores spends much of its time compiling: the client compiler only
    # (as the local Kafka cluster's nodes do), in the driver's JVM and the executor's.
    env["PYSPARK_SUBMIT_ARGS"] = (
        "--driver-java-options -XX:TieredStopAtLevel=1 "
        "--conf spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1 pyspark-shell"
    )
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "broker", "demo", "--spark", "--master", state.master_url,
         "--bootstrap", bootstrap, "--records", str(RECORDS),
         # Batches of a cold executor on a loaded 2-core machine take 10-40 s: a timeout far
         # above that keeps the replays to the injected failures.
         "--timeout-ms", "120000", "--keep", "--json"],
        capture_output=True, text=True, timeout=420, env=env, check=False,
    )
    seconds = time.monotonic() - started
    assert proc.returncode == 0, f"demo exited {proc.returncode}:\n{proc.stderr[-6000:]}"
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"demo on {state.master_url} in {seconds:.0f}s:", summary)  # shown with -s

    settings, ns = KafkaSettings(bootstrap), Namespace(summary["namespace"])
    try:
        assert summary["records"] == RECORDS
        assert summary["lost"] == 0 and summary["pending"] == 0 and summary["dlq"] == 0
        assert summary["completed"] == RECORDS
        assert summary["fail_marks"] > 0  # injected failures, replayed through <topic>.replay
        assert summary["sink_rows"] == RECORDS and summary["sink_duplicates"] == 0

        # The ledger, read back from Kafka: every origin has a completed tombstone.
        origin_of: dict[int, int] = {}
        completions: Counter[int] = Counter()
        for msg in read_to_end(settings, ns.persist, LEDGER_PARTITIONS):
            srid = ids.decode_id(msg.key())
            if msg.value() is not None:
                origin_of[srid] = PersistedRecord.decode(msg.value()).origin
            elif outcome_of(msg.headers()) == OUTCOME_COMPLETED:
                completions[origin_of[srid]] += 1
        assert len(completions) == RECORDS
        assert set(completions.values()) == {1}
    finally:
        data_topics = {summary["topic"]: 4, f"{ns.name}-alerts": 2}
        delete(settings, layout(ns, LEDGER_PARTITIONS, data_topics))

    # The events were observed in the executors' tasks and merged on the driver, not gathered
    # by a job of their own (spark_jobs/observed.py), in every batch that wrote outputs.
    assert summary["events_jobs"] < summary["batches"]

    # The driver ran on the cluster and had an executor ...
    assert summary["spark_master"] == state.master_url
    assert len(summary["executors"]) == 1
    # ... whose Python workers are processes of their own, started by the executor's JVM (not
    # the driver's), running this interpreter, with spark_jobs imported from the shipped zip.
    workers = summary["python_workers"]
    assert workers
    for worker in workers:
        assert worker["jvm_main"] == EXECUTOR
        assert worker["jvm_pid"] != summary["driver_jvm_pid"]
        assert worker["pid"] != summary["driver_pid"]
        assert worker["python"] == sys.executable
        assert "replaybroker.zip" in worker["spark_jobs"]
    executor_pid = workers[0]["jvm_pid"]

    # The master's own record: the application ran with its executor's cores and finished.
    status = master_json(state.webui_url)
    assert status is not None
    apps = [a for a in status["completedapps"] if a["name"] == APP_NAME]
    assert len(apps) == 1 and apps[0]["state"] == "FINISHED" and apps[0]["cores"] > 0

    # The worker's: one executor directory for the app, holding the executor's log (that JVM's
    # pid) and what the driver shipped to it - the connector jars and the project's zip.
    executor_dirs = list((Path(state.work_dir) / apps[0]["id"]).iterdir())
    assert len(executor_dirs) == 1
    shipped = {p.name for p in executor_dirs[0].iterdir()}
    assert "replaybroker.zip" in shipped
    assert any(name.startswith("spark-sql-kafka-0-10") for name in shipped)
    executor_log = (executor_dirs[0] / "stderr").read_text(errors="replace")
    assert f"CoarseGrainedExecutorBackend: Started daemon with process name: {executor_pid}@" in executor_log
