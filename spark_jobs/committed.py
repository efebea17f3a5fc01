"""The sink's commit is the batch's decision: what a sink must provide so that a micro-batch
run again acks what the first run committed (docs/design.md §8, "Reruns").

Spark runs a micro-batch again, with the same batch id and the same offsets, when the run
before died after its outputs were committed and before Spark's checkpoint recorded the
batch: an error after the write, an ack delivery error, a killed driver. The sink keeps the
first run's output (Delta skips the commit by its transaction id; the Parquet sink does not
overwrite a committed batch), so the rerun must not decide again - a row that failed on the
first run and passes on the rerun would be acked without its output. For a batch the sink has
committed, ``Acking`` takes the decision from the commit instead of the handler:

1. before the decision, it asks the sink ``committed(spark, batch_id)``;
2. ``None`` (not committed): the handler decides, ``write`` writes the outputs, and
   ``record(spark, batch_id, Committed(acked, failed))`` puts the srids the acks will
   complete and fail beside the output before any ack is sent;
3. a ``Committed``: every srid of the batch not in its ``acked`` fails (is replayed), the
   handler's ``failed`` is not asked; ``write`` runs on the acked rows (for their children)
   and its sink finds the batch committed and writes nothing. A commit whose decision is not
   known (``acked is None``: Delta committed the rows, the driver died before the record)
   fails every srid of the batch: each is replayed and written at most once by its output
   identity.

A sink that cannot tell a committed batch from a new one cannot be used with ``write``:
``BatchResult.sink`` must be a ``CommittingSink``.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from pyspark.sql import DataFrame, SparkSession

DECISIONS_DIR = "_rb_decisions"  # "_": Spark's readers and Delta's VACUUM leave it alone
# Records kept per query: Spark runs again only the last batch of a checkpoint, and keeps the
# metadata of 100 (spark.sql.streaming.minBatchesToRetain's default).
RETAINED = 100


@dataclass(frozen=True)
class Committed:
    """A committed batch's decision: the srids its acks complete (``acked``; ``None``: not
    known, every srid of the batch fails) and the srids they fail."""

    acked: np.ndarray | None
    failed: np.ndarray


@runtime_checkable
class CommittingSink(Protocol):
    """A sink whose commit of a batch is that batch's decision (module docstring).

    - ``write(df, batch_id)`` commits the batch's rows atomically, once per batch id (per
      streaming query): for a batch id already committed it writes nothing and returns
      ``False``, else ``True``. It never deletes the rows of a committed batch.
    - ``committed(spark, batch_id)``: ``None`` if the batch id is not committed; else its
      ``Committed`` decision as ``record`` stored it, or ``Committed(None, ...)`` if the rows
      are committed and the decision is not.
    - ``record(spark, batch_id, decision)``: stores the decision durably; called after
      ``write`` returned and before any ack is sent. A batch whose rows are not committed
      before its record exists (a Parquet directory written again) counts as committed from
      the record on.
    """

    def write(self, df: DataFrame, batch_id: int) -> bool: ...

    def committed(self, spark: SparkSession, batch_id: int) -> Committed | None: ...

    def record(self, spark: SparkSession, batch_id: int, decision: Committed) -> None: ...


def _fs(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """Hadoop's FileSystem for ``path`` and the path, so any URI Spark writes (file:, hdfs:,
    s3a:) works."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    return hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), hpath


def _pack(values: np.ndarray) -> str:
    return base64.b64encode(np.asarray(values, dtype=">i8").tobytes()).decode("ascii")


def _unpack(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=">i8").astype(np.int64)


class DecisionLog:
    """The decisions of a sink's batches, one small file each under
    ``<sink>/_rb_decisions/query_id=<q>/batch_id=<n>.json``, written to a temporary name and
    renamed: a reader finds the whole file or none. Writing batch ``n``'s record deletes
    batch ``n - RETAINED``'s: the directory stays bounded."""

    def __init__(self, sink_path: str) -> None:
        self.root = f"{sink_path.rstrip('/')}/{DECISIONS_DIR}"

    def _path(self, query_id: str, batch_id: int) -> str:
        return f"{self.root}/query_id={query_id}/batch_id={batch_id}.json"

    def exists(self, spark: SparkSession, query_id: str, batch_id: int) -> bool:
        fs, path = _fs(spark, self._path(query_id, batch_id))
        return bool(fs.exists(path))

    def read(self, spark: SparkSession, query_id: str, batch_id: int) -> Committed | None:
        fs, path = _fs(spark, self._path(query_id, batch_id))
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            data = json.loads(bytes(stream.readAllBytes()).decode("utf-8"))
        finally:
            stream.close()
        return Committed(_unpack(data["acked"]), _unpack(data["failed"]))

    def write(self, spark: SparkSession, query_id: str, batch_id: int, decision: Committed) -> None:
        if decision.acked is None:
            raise ValueError("a decision to record names the srids it acks")
        final = self._path(query_id, batch_id)
        fs, path = _fs(spark, final)
        _, temporary = _fs(spark, f"{final}.tmp")
        body = json.dumps({"acked": _pack(decision.acked), "failed": _pack(decision.failed)})
        out = fs.create(temporary, True)
        try:
            out.write(bytearray(body.encode("utf-8")))
        finally:
            out.close()
        if not fs.rename(temporary, path):  # never over an existing record: that one counts
            raise OSError(f"could not rename {final}.tmp to {final}")
        if batch_id >= RETAINED:
            _, old = _fs(spark, self._path(query_id, batch_id - RETAINED))
            fs.delete(old, False)
