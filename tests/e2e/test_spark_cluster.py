"""The Spark demo on a standalone cluster: a master and one worker started from pyspark's jars
(``broker.dev.spark_cluster``), the executor a JVM of its own, its Python workers processes of
their own. ``replaybroker demo --spark --master spark://...`` runs in a subprocess - a process
holds one SparkContext, and this test session's is ``local`` - and the test checks, from the
topics, that every record completed, and from the processes and the cluster's own records that
the job ran on the executor: the connector jars and the project's zip reached it, and its
Python workers ran this virtualenv's interpreter with ``spark_jobs`` from the shipped zip.

The second test submits the demo with the Delta sink by ``spark-submit``, with the command
docs/operations.md shows (read from there, its placeholders filled)."""

from __future__ import annotations

import json
import os
import re
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


def _completions(settings: KafkaSettings, ns: Namespace) -> Counter[int]:
    """The ledger, read back from Kafka: completed tombstones per origin."""
    origin_of: dict[int, int] = {}
    completions: Counter[int] = Counter()
    for msg in read_to_end(settings, ns.persist, LEDGER_PARTITIONS):
        srid = ids.decode_id(msg.key())
        if msg.value() is not None:
            origin_of[srid] = PersistedRecord.decode(msg.value()).origin
        elif outcome_of(msg.headers()) == OUTCOME_COMPLETED:
            completions[origin_of[srid]] += 1
    return completions


def _delete_topics(settings: KafkaSettings, summary: dict[str, object]) -> None:
    ns = Namespace(str(summary["namespace"]))
    delete(settings, layout(ns, LEDGER_PARTITIONS, {str(summary["topic"]): 4, f"{ns.name}-alerts": 2}))


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

        completions = _completions(settings, ns)
        assert len(completions) == RECORDS
        assert set(completions.values()) == {1}
    finally:
        _delete_topics(settings, summary)

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
    apps = [a for a in status["completedapps"] if a["id"] == summary["spark_app_id"]]
    assert len(apps) == 1 and apps[0]["name"] == APP_NAME
    assert apps[0]["state"] == "FINISHED" and apps[0]["cores"] > 0

    # The worker's: one executor directory for the app, holding the executor's log (that JVM's
    # pid) and what the driver shipped to it - the connector jars and the project's zip.
    executor_dirs = list((Path(state.work_dir) / apps[0]["id"]).iterdir())
    assert len(executor_dirs) == 1
    shipped = {p.name for p in executor_dirs[0].iterdir()}
    assert "replaybroker.zip" in shipped
    assert any(name.startswith("spark-sql-kafka-0-10") for name in shipped)
    executor_log = (executor_dirs[0] / "stderr").read_text(errors="replace")
    assert f"CoarseGrainedExecutorBackend: Started daemon with process name: {executor_pid}@" in executor_log


REPO = Path(__file__).resolve().parents[2]
# Fewer records than the docs' 2000 and a far longer record timeout: a cold executor's
# batches on a loaded 2-core machine take 10-40 s. argparse keeps the last of a repeated option.
SPARK_INFO = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d INFO ")
SUBMIT_OPTIONS = "--records 300 --timeout-ms 120000 --keep"


def documented_submit() -> str:
    """The ``sh`` block of docs/operations.md "Running on a Spark cluster" that runs spark-submit."""
    text = (REPO / "docs" / "operations.md").read_text()
    section = text[text.index("### Running on a Spark cluster"):]
    return next(b for b in re.findall(r"```sh\n(.*?)```", section, re.S) if "spark-submit" in b)


def test_spark_submit_runs_the_demo_with_the_delta_sink(
    spark_cluster: SparkClusterState, bootstrap: str, tmp_path: Path
) -> None:
    state = spark_cluster
    script = documented_submit()
    for placeholder, value in (("spark://MASTER:7077", state.master_url), ("KAFKA:9092", bootstrap),
                               ("/path/to/the/executors/python", sys.executable)):
        assert placeholder in script
        script = script.replace(placeholder, value)
    script = script.rstrip() + f" {SUBMIT_OPTIONS} --workdir {tmp_path / 'sink'}\n"
    # The block's relative paths (dist/, spark_jobs/demo.py) from a directory of the test's own.
    (tmp_path / "spark_jobs").symlink_to(REPO / "spark_jobs")
    conf = tmp_path / "conf"
    conf.mkdir()
    # The client compiler only, as in the test above, by Spark's defaults file, not the command.
    (conf / "spark-defaults.conf").write_text(
        "spark.driver.extraJavaOptions -XX:TieredStopAtLevel=1\n"
        "spark.executor.extraJavaOptions -XX:TieredStopAtLevel=1\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", SPARK_CONF_DIR=str(conf))
    proc = subprocess.run(["bash", "-euc", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=480, env=env, check=False)
    # Without Spark's own INFO lines (its start-up alone is pages of them).
    errors = "\n".join(line for line in proc.stderr.splitlines() if not SPARK_INFO.match(line))
    assert proc.returncode == 0, f"spark-submit exited {proc.returncode}:\n{errors[-6000:]}\n{proc.stdout[-3000:]}"
    # The summary is the last JSON line (py4j may log a line after it on shutdown).
    summary = json.loads(next(line for line in reversed(proc.stdout.splitlines()) if line.startswith("{")))
    print(f"spark-submit on {state.master_url}:", summary)  # shown with -s

    settings = KafkaSettings(bootstrap)
    try:
        assert summary["sink"] == "delta" and summary["spark_master"] == state.master_url
        assert summary["lost"] == 0 and summary["pending"] == 0 and summary["dlq"] == 0
        assert summary["completed"] == summary["records"] == 300
        assert summary["fail_marks"] > 0
        assert summary["sink_rows"] == 300 and summary["sink_duplicates"] == 0
        completions = _completions(settings, Namespace(summary["namespace"]))
        assert len(completions) == 300 and set(completions.values()) == {1}
    finally:
        _delete_topics(settings, summary)
    # The rows are a Delta table; the executor's Python workers imported the shipped zip, and
    # the driver served it Delta's jars and the connector's (the --jars).
    assert (Path(summary["workdir"]) / "sink" / "orders" / "_delta_log").is_dir()
    assert summary["python_workers"]
    for worker in summary["python_workers"]:
        assert worker["jvm_main"] == EXECUTOR and "replaybroker.zip" in worker["spark_jobs"]
    shipped = {p.name for d in (Path(state.work_dir) / summary["spark_app_id"]).iterdir() for p in d.iterdir()}
    assert "replaybroker.zip" in shipped
    assert any(name.startswith("delta-spark") for name in shipped)
    assert any(name.startswith("spark-sql-kafka-0-10") for name in shipped)
