"""An idempotent sink: Parquet facts, one directory per micro-batch, one row per output id.

A record's output identity is its origin (the srid of its source record's first attempt) and
its path (``rb-path``: the emit indices from the source record, ``"0"`` for the source record
itself, ``"0.2"`` for its third child): the same on every attempt, different for siblings.
A record can reach a sink more than once: its srid timed out while its ack was on the way
(the replay re-runs the tree from the root, with the same origin and paths), or a
micro-batch ran again after a restart. ``OriginParquetSink.write(df, batch_id)``:

1. keeps one row per (origin, path) of the batch (an original and its replay may share a
   batch);
2. drops the ids already written by *other* batches (an anti-join on the ``origin`` and
   ``path`` columns only, which Parquet reads without touching the rest of the files);
3. overwrites ``<path>/query_id=<q>/batch_id=<n>/``: a batch that runs again after a restart
   replaces its own earlier output instead of adding to it. ``q`` is the streaming query's id,
   which Spark keeps in the checkpoint: a restart from the checkpoint writes to the same
   directories, a query on a new checkpoint (whose batch ids start at 0 again) to new ones -
   never over an earlier query's facts.

Readers see every output id at most once in ``read()`` without a dedup step of their own.
"""

from __future__ import annotations

import uuid

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from broker.errors import ConfigurationError
from spark_jobs.tracking import ORIGIN, PATH

BATCH_ID = "batch_id"
QUERY_ID = "query_id"
# Set by Spark on the thread that runs a streaming query's batches (StreamExecution.QUERY_ID_KEY):
# the query's ``id``, restored from the checkpoint - not ``runId``, which changes on restart.
_QUERY_ID_PROPERTY = "sql.streaming.queryId"


class OriginParquetSink:
    def __init__(
        self,
        path: str,
        origin_column: str = ORIGIN,
        files_per_batch: int = 1,
        *,
        path_column: str = PATH,
        query_id: str | None = None,
    ) -> None:
        """``query_id`` names the batch directories' query; by default the streaming query's
        id, and outside a streaming query one drawn for this sink object."""
        self.path = path.rstrip("/")
        self.origin_column = origin_column
        self.path_column = path_column
        # Micro-batches are small; one file each keeps the dedup read cheap.
        self.files_per_batch = files_per_batch
        self.query_id = query_id
        # Writes from no streaming query: never into another sink object's directories. With
        # dashes, like a query id: Spark's partition inference then always reads a string.
        self._own_id = str(uuid.uuid4())

    @property
    def key(self) -> list[str]:
        return [self.origin_column, self.path_column]

    def _exists(self, spark: SparkSession) -> bool:
        """Hadoop's own FileSystem, so any URI Spark can write (file:, hdfs:, s3a:) works."""
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        path = jvm.org.apache.hadoop.fs.Path(self.path)
        fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        return bool(fs.exists(path))

    def current_query_id(self, spark: SparkSession) -> str:
        if self.query_id is not None:
            return self.query_id
        return spark.sparkContext.getLocalProperty(_QUERY_ID_PROPERTY) or self._own_id

    def written(
        self, spark: SparkSession, except_batch: tuple[str, int] | None = None
    ) -> DataFrame | None:
        """The output ids already in the sink (of every batch but ``except_batch``, a
        ``(query_id, batch_id)``)."""
        if not self._exists(spark):
            return None
        schema = StructType(
            [
                StructField(self.origin_column, LongType()),
                StructField(self.path_column, StringType()),
                StructField(QUERY_ID, StringType()),
                StructField(BATCH_ID, LongType()),
            ]
        )
        written = spark.read.schema(schema).parquet(self.path)
        if except_batch is not None:
            query_id, batch_id = except_batch
            written = written.where(~((F.col(QUERY_ID) == query_id) & (F.col(BATCH_ID) == batch_id)))
        return written.select(*self.key)

    def write(self, df: DataFrame, batch_id: int) -> None:
        missing = set(self.key) - set(df.columns)
        if missing:
            raise ConfigurationError(
                f"the sink deduplicates on {self.key}; the rows lack {sorted(missing)}: carry "
                "them over from the input rows (siblings of a fan-out share their origin)"
            )
        spark = df.sparkSession
        query_id = self.current_query_id(spark)
        rows = df.dropDuplicates(self.key)
        written = self.written(spark, except_batch=(query_id, batch_id))
        if written is not None:
            rows = rows.join(written, self.key, "left_anti")
        target = f"{self.path}/{QUERY_ID}={query_id}/{BATCH_ID}={batch_id}"
        rows.coalesce(self.files_per_batch).write.mode("overwrite").parquet(target)

    def read(self, spark: SparkSession) -> DataFrame:
        """Every fact written, with its ``query_id`` and ``batch_id``."""
        return spark.read.parquet(self.path)
