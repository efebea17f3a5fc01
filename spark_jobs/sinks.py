"""Idempotent sinks, one row per output id: Parquet facts, one directory per micro-batch
(``OriginParquetSink``), or a Delta Lake table (``OriginDeltaSink``, at the end).

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

Both are ``CommittingSink``s (``spark_jobs/committed.py``): ``write`` returns ``False`` and
writes nothing for a batch id already committed, and the batch's decision (the srids its acks
complete and fail) is recorded beside the rows before the acks go out, so a batch run again
acks what its commit holds. A Parquet batch counts as committed once its record is written:
a batch directory without one is a run cut before its acks, overwritten by the next run.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import numpy as np
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from broker.errors import ConfigurationError
from spark_jobs.committed import Committed, DecisionLog
from spark_jobs.tracking import ORIGIN, PATH

BATCH_ID = "batch_id"
QUERY_ID = "query_id"
# Set by Spark on the thread that runs a streaming query's batches (StreamExecution.QUERY_ID_KEY):
# the query's ``id``, restored from the checkpoint - not ``runId``, which changes on restart.
_QUERY_ID_PROPERTY = "sql.streaming.queryId"


class _OriginKeyed:
    """What both sinks share: rows are identified by (origin column, path column), and batch
    writes are attributed to the streaming query's id - or, outside a streaming query, to an
    id drawn for this sink object (never another sink's)."""

    origin_column: str
    path_column: str
    query_id: str | None

    def _init_identity(self, path: str, origin_column: str, path_column: str, query_id: str | None) -> None:
        self.path = path.rstrip("/")
        self.origin_column = origin_column
        self.path_column = path_column
        self.query_id = query_id
        # With dashes, like a query id: Spark's partition inference then always reads a string.
        self._own_id = str(uuid.uuid4())
        self.decisions = DecisionLog(self.path)

    @property
    def key(self) -> list[str]:
        return [self.origin_column, self.path_column]

    def current_query_id(self, spark: SparkSession) -> str:
        if self.query_id is not None:
            return self.query_id
        return spark.sparkContext.getLocalProperty(_QUERY_ID_PROPERTY) or self._own_id

    def record(self, spark: SparkSession, batch_id: int, decision: Committed) -> None:
        """The batch's decision, beside its rows (``CommittingSink.record``)."""
        self.decisions.write(spark, self.current_query_id(spark), batch_id, decision)

    def _check_key(self, df: DataFrame) -> None:
        missing = set(self.key) - set(df.columns)
        if missing:
            raise ConfigurationError(
                f"the sink deduplicates on {self.key}; the rows lack {sorted(missing)}: carry "
                "them over from the input rows (siblings of a fan-out share their origin)"
            )


class OriginParquetSink(_OriginKeyed):
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
        self._init_identity(path, origin_column, path_column, query_id)
        # Micro-batches are small; one file each keeps the dedup read cheap.
        self.files_per_batch = files_per_batch

    def _exists(self, spark: SparkSession) -> bool:
        """Hadoop's own FileSystem, so any URI Spark can write (file:, hdfs:, s3a:) works."""
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        path = jvm.org.apache.hadoop.fs.Path(self.path)
        fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        return bool(fs.exists(path))

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

    def committed(self, spark: SparkSession, batch_id: int) -> Committed | None:
        """The batch's recorded decision: its record is its commit (``CommittingSink``)."""
        return self.decisions.read(spark, self.current_query_id(spark), batch_id)

    def write(self, df: DataFrame, batch_id: int) -> bool:
        """The batch's rows (module docstring); ``False``, writing nothing, when the batch is
        committed: its directory holds rows whose acks may have gone out."""
        self._check_key(df)
        spark = df.sparkSession
        query_id = self.current_query_id(spark)
        if self.decisions.exists(spark, query_id, batch_id):
            return False
        rows = df.dropDuplicates(self.key)
        written = self.written(spark, except_batch=(query_id, batch_id))
        if written is not None:
            rows = rows.join(written, self.key, "left_anti")
        target = f"{self.path}/{QUERY_ID}={query_id}/{BATCH_ID}={batch_id}"
        rows.coalesce(self.files_per_batch).write.mode("overwrite").parquet(target)
        return True

    def read(self, spark: SparkSession) -> DataFrame:
        """Every fact written, with its ``query_id`` and ``batch_id``."""
        return spark.read.parquet(self.path)


# --------------------------------------------------------------------------- Delta Lake

BUCKET = "bucket"
WRITTEN_AT = "written_at"
_DELTA_TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
_DELTA_TXN_VERSION = "spark.databricks.delta.write.txnVersion"


class OriginDeltaSink(_OriginKeyed):
    """A Delta Lake table with one row per output id (origin, path), written idempotently.

    ``write(df, batch_id)``:

    1. keeps one row per (origin, path) of the batch and adds ``bucket = pmod(origin,
       buckets)`` (the table's partition column) and ``written_at`` (the batch's time);
    2. inserts the rows whose id is not in the table yet - the first batch creates the table,
       every later one is an insert-only ``MERGE`` whose condition names only the buckets
       present in the batch and, with ``replay_window_ms``, only rows written within that
       window: Delta skips every other partition, and every file whose ``written_at`` range
       is older (its min/max statistics), before it reads anything;
    3. commits with a transaction id - ``txnAppId`` ``replaybroker-<query id>`` (the
       streaming query's id, kept in its checkpoint), ``txnVersion`` the batch id - so a
       batch that runs again after a driver crash, its commit already in the log, writes
       nothing (the MERGE takes them as session settings, the first write as options).

    ``replay_window_ms`` bounds the MERGE by time: a replay (same origin and path, later
    attempt) comes within ``max_attempts x timeout`` of its origin's first attempt, so of the
    earlier write of its id, so any window above that (with a margin for slow batches and
    clock skew) finds every earlier copy while the work per batch stays the rows written in
    the window - not the table. Without it every batch reads the (origin, path) columns of
    its buckets in full. A record sent again *after* its window (a DLQ entry redriven a day
    later, under its old origin) would then be written twice: leave the window unset, or
    longer, where that happens.

    ``optimize_every=n`` keeps the file count bounded: before writing batch ids ``n``, ``2n``,
    ... the sink compacts the table (Delta's ``OPTIMIZE``, a commit of its own that changes no
    row). Without a window it bin-packs the small files; with ``replay_window_ms`` it orders the
    rows by ``written_at`` (``ZORDER BY`` that one column), which rewrites the whole table but
    leaves files of narrow, ordered time ranges, so the window still skips every file older
    than it (a bin-packing would mix old and new rows into files every MERGE reads). Its cost
    grows with the table: choose ``n`` so that it runs rarely. ``None`` (the default): never.
    """

    def __init__(
        self,
        path: str,
        origin_column: str = ORIGIN,
        *,
        path_column: str = PATH,
        buckets: int = 1,
        replay_window_ms: int | None = None,
        query_id: str | None = None,
        optimize_every: int | None = None,
    ) -> None:
        """``buckets=1`` (one partition) unless batches are smaller than the bucket count: a
        batch of random origins touches every bucket and writes a file to each
        (docs/benchmarks.md, "Delta sink: the cost of a bounded MERGE", has the figures)."""
        if buckets < 1:
            raise ConfigurationError(f"buckets must be >= 1, got {buckets}")
        if optimize_every is not None and optimize_every < 1:
            raise ConfigurationError(f"optimize_every must be >= 1 or None, got {optimize_every}")
        self.optimize_every = optimize_every
        self._init_identity(path, origin_column, path_column, query_id)
        self.buckets = buckets
        self.replay_window_ms = replay_window_ms

    def app_id(self, spark: SparkSession) -> str:
        return f"replaybroker-{self.current_query_id(spark)}"

    def _bucket(self) -> Column:
        return F.pmod(F.col(self.origin_column), F.lit(self.buckets)).cast("int")

    def _committed_version(self, spark: SparkSession) -> int:
        """The last batch id this query committed to the table (its transaction version), -1
        for none: read from Delta's log, as the write's own skip is."""
        if "Delta" not in (spark.conf.get("spark.sql.extensions", "") or ""):
            raise ConfigurationError(
                "the Spark session has no Delta Lake: build it with build_spark_session() after "
                "`replaybroker setup` resolved Delta's jars (spark-submit: --jars with Delta's)"
            )
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, self.path)
        snapshot = log.update(False, getattr(log, "update$default$2")(), getattr(log, "update$default$3")())
        version = snapshot.transactions().get(self.app_id(spark))
        return -1 if version.isEmpty() else int(version.get())

    def committed(self, spark: SparkSession, batch_id: int) -> Committed | None:
        """The batch's recorded decision; ``Committed(None, ...)`` when the rows are committed
        (its transaction is in the log) and the driver died before the record."""
        recorded = self.decisions.read(spark, self.current_query_id(spark), batch_id)
        if recorded is not None:
            return recorded
        if self._committed_version(spark) >= batch_id:
            return Committed(None, np.empty(0, dtype=np.int64))
        return None

    def write(self, df: DataFrame, batch_id: int) -> bool:
        """The batch's rows (class docstring); ``False``, writing nothing, when its
        transaction is already in the log."""
        self._check_key(df)
        spark = df.sparkSession
        if self._committed_version(spark) >= batch_id:
            return False
        if self.optimize_every is not None and batch_id > 0 and batch_id % self.optimize_every == 0:
            # Before the batch's commit: a compaction that fails fails a batch not committed yet,
            # which its rerun decides anew (after the commit it would fail every srid of it).
            self.optimize(spark)
        self._commit(df, batch_id)
        return True

    def optimize(self, spark: SparkSession) -> None:
        """Compact the table's small files (class docstring, ``optimize_every``)."""
        from delta.tables import DeltaTable

        if not DeltaTable.isDeltaTable(spark, self.path):
            return
        builder = DeltaTable.forPath(spark, self.path).optimize()
        if self.replay_window_ms is not None:
            builder.executeZOrderBy(WRITTEN_AT)
        else:
            builder.executeCompaction()

    def _commit(self, df: DataFrame, batch_id: int) -> None:
        from delta.tables import DeltaTable

        spark = df.sparkSession
        app_id = self.app_id(spark)
        now = time.time()
        rows = (
            df.dropDuplicates(self.key)
            .withColumn(BUCKET, self._bucket())
            .withColumn(WRITTEN_AT, F.timestamp_seconds(F.lit(now)))
        )
        if not DeltaTable.isDeltaTable(spark, self.path):
            (
                rows.repartition(BUCKET)  # one file per bucket, as the MERGE writes them
                .write.format("delta")
                .partitionBy(BUCKET)
                .option("txnAppId", app_id)
                .option("txnVersion", batch_id)
                .mode("append")
                .save(self.path)
            )
            return
        present = sorted(r[0] for r in df.select(self._bucket().alias(BUCKET)).distinct().collect())
        if not present:
            return
        condition = [
            f"t.{BUCKET} IN ({', '.join(map(str, present))})",
            f"t.{BUCKET} = s.{BUCKET}",
            *(f"t.`{c}` = s.`{c}`" for c in self.key),
        ]
        if self.replay_window_ms is not None:
            # A literal, not an expression: Delta's file skipping compares it with each file's
            # min/max of written_at.
            cutoff = datetime.fromtimestamp(now - self.replay_window_ms / 1000, UTC).isoformat()
            condition.append(f"t.{WRITTEN_AT} >= TIMESTAMP '{cutoff}'")
        merge = (
            DeltaTable.forPath(spark, self.path)
            .alias("t")
            .merge(rows.alias("s"), " AND ".join(condition))
            .whenNotMatchedInsertAll()
        )
        # DML takes its transaction id from the session (the writer options are for appends);
        # in foreachBatch that is the query's own clone of the session.
        spark.conf.set(_DELTA_TXN_APP_ID, app_id)
        spark.conf.set(_DELTA_TXN_VERSION, str(batch_id))
        try:
            merge.execute()
        finally:
            spark.conf.unset(_DELTA_TXN_APP_ID)
            spark.conf.unset(_DELTA_TXN_VERSION)

    def read(self, spark: SparkSession) -> DataFrame:
        """Every fact written, with its ``bucket`` and ``written_at``."""
        return spark.read.format("delta").load(self.path)
