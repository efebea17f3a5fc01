"""The one place a SparkSession is built, so jobs and tests configure Spark the same way."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[2]"

# Small and quiet: the jobs shuffle little, and a console progress bar or UI helps no one here.
_DEFAULT_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "1g",
}


def build_spark_session(
    app_name: str = "replaybroker",
    master: str | None = None,
    conf: dict[str, str] | None = None,
    jars: list[str] | None = None,
) -> SparkSession:
    """A SparkSession, shared with any already running in this process (``getOrCreate``).

    ``master`` defaults to ``$SPARK_MASTER``, else ``local[2]``; ``conf`` overrides the
    defaults above; ``jars`` become ``spark.jars``. JVM-level settings (driver memory, jars)
    only take effect when this call starts the JVM.
    """
    builder = SparkSession.builder.appName(app_name).master(
        master or os.environ.get("SPARK_MASTER") or DEFAULT_MASTER
    )
    settings = {**_DEFAULT_CONF, **(conf or {})}
    if jars:
        settings["spark.jars"] = ",".join(jars)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
