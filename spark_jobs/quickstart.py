"""The README's snippet: an existing Structured Streaming job, pointed at the replay topics.

The lines between the ``--8<--`` markers are quoted verbatim in ``spark_jobs/README.md``, and
``tests/e2e/test_spark_quickstart.py`` checks the quote and runs this function.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery


def start_payments_query(
    spark: SparkSession, bootstrap: str, namespace: str, topic: str, out: str, checkpoint: str
) -> StreamingQuery:
    # --8<-- [start:quickstart]
    from spark_jobs import Acking, BatchResult, OriginParquetSink, read_with_replay

    payments = read_with_replay(spark, bootstrap, topic)  # topic + topic.replay, ids as columns
    sink = OriginParquetSink(out)  # one row per (origin, path), however often it is replayed

    def process(batch, batch_id):  # the foreachBatch body you had: decide here, write below
        amount = F.get_json_object(F.col("value").cast("string"), "$.amount").try_cast("double")
        parsed = batch.withColumn("amount", amount)
        # unparsable (try_cast: null, not an error): fail -> replay, then DLQ
        return BatchResult(rows=parsed, failed=F.col("amount").isNull(), write=write, sink=sink)

    def write(ok, batch_id):  # ok: the rows not failed - exactly the rows that are acked
        sink.write(ok.select("origin", "path", "key", "amount"), batch_id)

    query = (
        payments.writeStream.foreachBatch(Acking(bootstrap, namespace, process))  # acks last
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 second")
        .start()
    )
    # --8<-- [end:quickstart]
    return query
