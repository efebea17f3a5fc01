"""The one place a SparkSession is built, so jobs and tests configure Spark the same way.

Every session carries the spark-sql-kafka connector from the start: jars cannot be added to a
running JVM, and one session serves a whole process (``getOrCreate``), so a session built
without them could never read Kafka later. The jars come from the local Maven repository
(``broker.kafka_local.spark_kafka_connector_jars``, resolved once by ``replaybroker setup``);
nothing is downloaded when Spark starts.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from broker.kafka_local import spark_kafka_connector_jars

DEFAULT_MASTER = "local[2]"

# Small and quiet: the jobs shuffle little, and a console progress bar or UI helps no one here.
_DEFAULT_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "1g",
}

_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+?)-\d[\w.\-]*\.jar$")


def _artifact(jar: str) -> str:
    name = Path(jar).name
    match = _VERSIONED_JAR.match(name)
    return match.group("artifact") if match else name


def _spark_home_jars() -> set[str]:
    import pyspark

    jars_dir = Path(pyspark.__file__).parent / "jars"
    return {_artifact(str(j)) for j in jars_dir.glob("*.jar")}


def connector_jars(extra: Iterable[str] = ()) -> list[str]:
    """The connector's jars minus the artifacts Spark already ships (scala-library, hadoop
    client, slf4j, lz4, snappy ...): two versions of one class on the classpath is a bug
    waiting for the wrong class loader, so only what Spark lacks is added."""
    shipped = _spark_home_jars()
    jars = [j for j in spark_kafka_connector_jars() if _artifact(j) not in shipped]
    return [*jars, *extra]


def build_spark_session(
    app_name: str = "replaybroker",
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    jars: Iterable[str] = (),
) -> SparkSession:
    """A SparkSession, shared with any already running in this process (``getOrCreate``).

    ``master`` defaults to ``$SPARK_MASTER``, else ``local[2]``; ``conf`` overrides the
    defaults above; ``jars`` are added to the Kafka connector's jars (``spark.jars``).
    JVM-level settings (driver memory, jars) only take effect when this call starts the JVM.
    """
    master = master or os.environ.get("SPARK_MASTER") or DEFAULT_MASTER
    builder = SparkSession.builder.appName(app_name).master(master)
    settings = dict(_DEFAULT_CONF)
    if master.startswith("local"):
        # Python workers (UDFs) run this interpreter, not whatever `python3` is on PATH; on a
        # cluster the executors' own Python is the cluster's business.
        settings["spark.pyspark.python"] = sys.executable
    settings.update(conf or {})
    settings["spark.jars"] = ",".join(
        [*connector_jars(jars), *filter(None, settings.get("spark.jars", "").split(","))]
    )
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
