"""The one place a SparkSession is built, so jobs and tests configure Spark the same way.

Every session carries the spark-sql-kafka connector from the start: jars cannot be added to a
running JVM, and one session serves a whole process (``getOrCreate``), so a session built
without them could never read Kafka later. The jars come from the classpath that ``replaybroker setup`` resolved into the local Maven
repository (``$REPLAYBROKER_SPARK_JARS``, else ``<home>/maven/spark-sql-kafka-<version>.classpath``),
so nothing is downloaded when Spark starts. Without either, the connector is named by its
Maven coordinates (``spark.jars.packages``) and Spark fetches it, as on any cluster.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[2]"

# Small and quiet: the jobs shuffle little, and a console progress bar or UI helps no one here.
_DEFAULT_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "1g",
}

CONNECTOR_ARTIFACT = "org.apache.spark:spark-sql-kafka-0-10_2.13"


def _home() -> Path:
    return Path(os.environ.get("REPLAYBROKER_HOME") or Path.home() / ".cache" / "replaybroker")


def resolved_connector_jars(pyspark_version: str | None = None) -> list[str] | None:
    """The connector's resolved jars, or None when ``replaybroker setup`` has not run."""
    explicit = os.environ.get("REPLAYBROKER_SPARK_JARS")
    if explicit:
        return [j for j in explicit.split(os.pathsep) if j]
    if pyspark_version is None:
        import pyspark

        pyspark_version = pyspark.__version__
    cache = _home() / "maven" / f"spark-sql-kafka-{pyspark_version}.classpath"
    if not cache.exists():
        return None
    jars = [j for j in cache.read_text().strip().split(os.pathsep) if j]
    return jars if jars and all(Path(j).exists() for j in jars) else None


_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+?)-\d[\w.\-]*\.jar$")


def _artifact(jar: str) -> str:
    name = Path(jar).name
    match = _VERSIONED_JAR.match(name)
    return match.group("artifact") if match else name


def _spark_home_jars() -> set[str]:
    import pyspark

    jars_dir = Path(pyspark.__file__).parent / "jars"
    return {_artifact(str(j)) for j in jars_dir.glob("*.jar")}


def connector_jars(extra: Iterable[str] = ()) -> list[str] | None:
    """The connector's jars minus the artifacts Spark already ships (scala-library, hadoop
    client, slf4j, lz4, snappy ...): two versions of one class on the classpath is a bug
    waiting for the wrong class loader, so only what Spark lacks is added. None when the
    connector has not been resolved locally."""
    resolved = resolved_connector_jars()
    if resolved is None:
        return None
    shipped = _spark_home_jars()
    jars = [j for j in resolved if _artifact(j) not in shipped]
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
        # cluster the executors' own Python is the cluster's business. PySpark 4 takes the
        # workers' interpreter from $PYSPARK_PYTHON when the context starts (the conf key is
        # read only by spark-submit): without it a UDF runs outside this virtualenv.
        settings["spark.pyspark.python"] = sys.executable
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings.update(conf or {})
    local = connector_jars(jars)
    if local is None:
        import pyspark

        settings["spark.jars.packages"] = f"{CONNECTOR_ARTIFACT}:{pyspark.__version__}"
        local = list(jars)
    settings["spark.jars"] = ",".join(
        [*local, *filter(None, settings.get("spark.jars", "").split(","))]
    )
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
