"""Spark Structured Streaming on the replay topics (docs/design.md §8).

- ``read_with_replay``: ``<topic>`` + ``<topic>.replay`` with srid, record id, origin and
  attempt decoded from the tracking header (``rb-t``), in the JVM;
- ``Acking``: the ``foreachBatch`` wrapper - the user's batch function, its children, then one
  XOR event per srid (the batch's pairs packed in the JVM, folded per srid on the driver:
  ``fold_events``), packed per ledger partition into ``ns.acks``;
- ``OriginParquetSink`` / ``OriginDeltaSink``: idempotent sinks, one row per output id
  (origin, path), as Parquet files or a Delta Lake table; ``CommittingSink``: what a sink
  of ``BatchResult.sink`` provides (a batch run again acks what it committed);
- ``build_spark_session``: the session, with the Kafka connector jars from the local Maven
  repository;
- ``orders`` (the example job) and ``demo`` (``run_spark_demo``).
"""

from spark_jobs.acking import (
    Acking,
    AckingConfig,
    BatchFailed,
    BatchResult,
    BatchStats,
    Emit,
    catching_udf,
)
from spark_jobs.committed import CommittingSink
from spark_jobs.reader import kafka_options, read_with_replay
from spark_jobs.session import build_spark_session
from spark_jobs.sinks import OriginDeltaSink, OriginParquetSink

__all__ = [
    "Acking",
    "AckingConfig",
    "BatchFailed",
    "BatchResult",
    "BatchStats",
    "CommittingSink",
    "Emit",
    "OriginDeltaSink",
    "OriginParquetSink",
    "build_spark_session",
    "catching_udf",
    "kafka_options",
    "read_with_replay",
]
