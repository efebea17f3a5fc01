"""An idempotent sink: Parquet facts, one directory per micro-batch, one row per origin id.

A source record can reach a sink more than once: its srid timed out while its ack was on the
way (the replay is then a second attempt with the same origin), or a micro-batch ran again
after a restart. ``OriginParquetSink.write(df, batch_id)``:

1. keeps one row per origin of the batch (an original and its replay may share a batch);
2. drops the origins already written by *other* batches (an anti-join on the ``origin``
   column only, which Parquet reads without touching the rest of the files);
3. overwrites ``<path>/batch_id=<n>/``: a batch that runs again after a restart replaces its
   own earlier output instead of adding to it.

Readers see every origin at most once in ``read()`` without a dedup step of their own.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from spark_jobs.tracking import ORIGIN

BATCH_ID = "batch_id"


class OriginParquetSink:
    def __init__(self, path: str, origin_column: str = ORIGIN, files_per_batch: int = 1) -> None:
        self.path = path.rstrip("/")
        self.origin_column = origin_column
        # Micro-batches are small; one file each keeps the dedup read cheap.
        self.files_per_batch = files_per_batch

    def _exists(self, spark: SparkSession) -> bool:
        """Hadoop's own FileSystem, so any URI Spark can write (file:, hdfs:, s3a:) works."""
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        path = jvm.org.apache.hadoop.fs.Path(self.path)
        fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        return bool(fs.exists(path))

    def written_origins(self, spark: SparkSession, except_batch: int | None = None) -> DataFrame | None:
        """The origins already in the sink (of every batch but ``except_batch``)."""
        if not self._exists(spark):
            return None
        schema = StructType(
            [StructField(self.origin_column, LongType()), StructField(BATCH_ID, LongType())]
        )
        written = spark.read.schema(schema).parquet(self.path)
        if except_batch is not None:
            written = written.where(F.col(BATCH_ID) != except_batch)
        return written.select(self.origin_column)

    def write(self, df: DataFrame, batch_id: int) -> None:
        rows = df.dropDuplicates([self.origin_column])
        written = self.written_origins(df.sparkSession, except_batch=batch_id)
        if written is not None:
            rows = rows.join(written, self.origin_column, "left_anti")
        rows.coalesce(self.files_per_batch).write.mode("overwrite").parquet(f"{self.path}/{BATCH_ID}={batch_id}")

    def read(self, spark: SparkSession) -> DataFrame:
        """Every fact written, with its ``batch_id``."""
        return spark.read.parquet(self.path)
