"""What the acking step costs a micro-batch: the order job on the same data, with and without
``Acking``, in one run (``python -m spark_jobs.measure --bootstrap HOST:PORT``).

Both variants read the same topic from the start in batches of ``batch_records`` with an
``availableNow`` trigger; the figures are Spark's own ``durationMs`` of each micro-batch
(``addBatch``: the foreachBatch function; ``triggerExecution``: the whole trigger) from
``query.recentProgress``, first batch of each query left out (query start-up). The variants
alternate (plain, acked, plain, acked) and the second round is reported, so JIT warm-up
does not favour the second one. No acker runs: the acks are produced, not folded.

``python -m spark_jobs.measure --delta`` (no Kafka) times ``OriginDeltaSink.write`` of one
micro-batch against a table that already holds 10^3 or 10^5 rows, for each way of bounding
its MERGE (``measure_delta_sink``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from broker.dev.testing import unique_name
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.topics import Namespace, create
from spark_jobs.acking import Acking, BatchHandler, with_tracking
from spark_jobs.orders import customer_frame, customers, make_orders, order_job
from spark_jobs.reader import read_with_replay
from spark_jobs.session import build_spark_session
from spark_jobs.sinks import BUCKET, WRITTEN_AT, OriginDeltaSink, OriginParquetSink


def _run_query(
    spark: SparkSession, bootstrap: str, topic: str, func: Any, batch_records: int, checkpoint: Path
) -> list[dict[str, Any]]:
    query = (
        read_with_replay(spark, bootstrap, topic, max_offsets_per_trigger=batch_records)
        .writeStream.foreachBatch(func)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"measurement query failed: {query.exception()}")
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def _figures(progress: list[dict[str, Any]]) -> dict[str, Any]:
    steady = progress[1:] or progress
    add = [p["durationMs"]["addBatch"] for p in steady]
    trigger = [p["durationMs"]["triggerExecution"] for p in steady]
    return {
        "batches": len(steady),
        "rows_per_batch": round(statistics.mean(p["numInputRows"] for p in steady)),
        "add_batch_ms_median": statistics.median(add),
        "add_batch_ms_mean": round(statistics.mean(add)),
        "trigger_ms_median": statistics.median(trigger),
    }


def measure_ack_overhead(
    bootstrap: str, records: int = 20_000, batch_records: int = 2_000, workdir: str | None = None
) -> dict[str, Any]:
    settings, ns = KafkaSettings(bootstrap), Namespace(unique_name("measure"))
    topic = f"{ns.name}-orders"
    create(settings, ns, 4, {topic: 4})
    with Source(settings, ns, SourceConfig(timeout_ms=600_000)) as source:
        for order in make_orders(records):
            source.send(topic, order.key(), order.value())
    spark = build_spark_session(app_name="replaybroker-measure")
    dim = customer_frame(spark, customers()).cache()
    with tempfile.TemporaryDirectory(prefix="rb-measure-", dir=workdir) as tmp:
        root = Path(tmp)
        results: dict[str, Any] = {"records": records, "batch_records": batch_records}
        for round_ in (1, 2):
            for variant in ("plain", "acked"):
                sink = OriginParquetSink(str(root / f"sink-{variant}-{round_}"))
                handler: BatchHandler = order_job(sink, dim)
                acking = Acking(settings, ns, handler) if variant == "acked" else None

                def plain(batch: DataFrame, batch_id: int, handler: BatchHandler = handler) -> None:
                    # The job alone: its outputs from the rows it did not fail, no pinning.
                    batch = with_tracking(batch)
                    result = handler(batch, batch_id)
                    if result is not None and result.write is not None:
                        rows = batch if result.rows is None else result.rows
                        if isinstance(result.failed, Column):
                            rows = rows.where(~F.coalesce(result.failed, F.lit(False)))
                        result.write(rows, batch_id)

                started = time.monotonic()
                progress = _run_query(
                    spark, bootstrap, topic, acking or plain, batch_records, root / f"ck-{variant}-{round_}"
                )
                if round_ == 2:
                    results[variant] = {**_figures(progress), "seconds": round(time.monotonic() - started, 2)}
                    if acking is not None:
                        stats = list(acking.history)[1:]
                        results[variant]["handler_s_median"] = round(statistics.median(s.handler_s for s in stats), 3)
                        results[variant]["ack_s_median"] = round(statistics.median(s.ack_s for s in stats), 3)
                if acking is not None:
                    acking.close()
    plain_ms, acked_ms = results["plain"]["add_batch_ms_median"], results["acked"]["add_batch_ms_median"]
    results["ack_overhead_ms_median"] = acked_ms - plain_ms
    results["ack_overhead_ratio"] = round(acked_ms / plain_ms, 2) if plain_ms else None
    return results


# The ways of bounding OriginDeltaSink's MERGE: (buckets, replay window, rows already there
# older than the window).
DELTA_VARIANTS: dict[str, tuple[int, float | None]] = {
    "whole table": (1, None),  # one partition: every batch reads every (origin, path)
    "batch's buckets": (64, None),
    "batch's buckets + replay window": (64, 600.0),
    "whole table + replay window": (1, 600.0),
}


def _delta_rows(spark: SparkSession, n: int, seed: int, written_at: float | None = None) -> DataFrame:
    """``n`` facts with random-looking origins (xxhash64 of a sequence, as random as srids)."""
    rows = spark.range(n).select(
        F.xxhash64(F.col("id"), F.lit(seed)).alias("origin"),
        F.lit("0").alias("path"),
        (F.col("id") % 1000).cast("double").alias("amount"),
    )
    if written_at is not None:
        rows = rows.withColumn(WRITTEN_AT, F.timestamp_seconds(F.lit(written_at)))
    return rows


def _prefill(spark: SparkSession, path: Path, rows: int, buckets: int, batch_rows: int = 2_000) -> None:
    """``rows`` already in the table, appended ``batch_rows`` at a time like the sink's own
    micro-batches (the file count matters as much as the row count), written a day ago."""
    old = time.time() - 86_400
    for index in range(max(1, rows // batch_rows)):
        batch = _delta_rows(spark, min(batch_rows, rows), seed=1_000 + index, written_at=old)
        batch = batch.withColumn(BUCKET, F.pmod(F.col("origin"), F.lit(buckets)).cast("int"))
        batch.repartition(BUCKET).write.format("delta").partitionBy(BUCKET).mode("append").save(str(path))


def measure_delta_sink(
    sizes: tuple[int, ...] = (1_000, 100_000),
    batch_rows: int = 1_000,
    batches: int = 4,
    replayed: float = 0.1,
    workdir: str | None = None,
    variants: tuple[str, ...] = tuple(DELTA_VARIANTS),
) -> dict[str, Any]:
    """Seconds of ``OriginDeltaSink.write`` per micro-batch of ``batch_rows`` new rows plus
    ``replayed`` of that many ids already in the table, for a table of each of ``sizes`` rows,
    per variant of DELTA_VARIANTS (median of ``batches`` batches after a first, warm-up one).

    The tables of one variant take their batches in turn (batch 1 to each, then batch 2 ...),
    so a change in the machine's load falls on both sizes alike."""
    spark = build_spark_session(app_name="replaybroker-measure-delta")
    results: dict[str, Any] = {"batch_rows": batch_rows, "replayed": replayed, "seconds_median": {}}
    with tempfile.TemporaryDirectory(prefix="rb-measure-delta-", dir=workdir) as tmp:
        root = Path(tmp)
        prefilled: dict[tuple[int, int], Path] = {}
        for size in sizes:
            for buckets in sorted({DELTA_VARIANTS[v][0] for v in variants}):
                started = time.monotonic()
                prefilled[size, buckets] = root / f"prefill-{size}-{buckets}"
                _prefill(spark, prefilled[size, buckets], size, buckets)
                results.setdefault("prefill_s", {})[f"{size}/{buckets}"] = round(time.monotonic() - started, 1)
        for index, name in enumerate(variants):
            buckets, window = DELTA_VARIANTS[name]
            sinks = {}
            for size in sizes:
                table = root / f"{index}-{size}"
                shutil.copytree(prefilled[size, buckets], table)
                sinks[size] = OriginDeltaSink(str(table), buckets=buckets, replay_window_s=window, query_id="m")
            seconds: dict[int, list[float]] = {size: [] for size in sizes}
            for batch_id in range(batches + 1):
                rows = _delta_rows(spark, batch_rows, seed=batch_id)
                if batch_id > 0:  # replays of the previous batch's ids: within any window
                    rows = rows.unionByName(_delta_rows(spark, int(batch_rows * replayed), seed=batch_id - 1))
                for size, sink in sinks.items():
                    started = time.monotonic()
                    sink.write(rows, batch_id)
                    seconds[size].append(time.monotonic() - started)
            for size, sink in sinks.items():
                written = sink.read(spark).count()
                assert written == size + (batches + 1) * batch_rows, (name, size, written)
                files = len(sink.read(spark).inputFiles())
                results["seconds_median"].setdefault(name, {})[size] = round(statistics.median(seconds[size][1:]), 2)
                results.setdefault("files", {}).setdefault(name, {})[size] = files
                sys.stderr.write(f"{name} / {size}: {[round(s, 2) for s in seconds[size]]}\n")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="Kafka (the acking measurement)")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batch-records", type=int, default=2_000)
    parser.add_argument("--delta", action="store_true", help="time OriginDeltaSink instead (no Kafka)")
    args = parser.parse_args(argv)
    if args.delta:
        result = measure_delta_sink()
    elif args.bootstrap is None:
        parser.error("--bootstrap is required (or --delta)")
    else:
        result = measure_ack_overhead(args.bootstrap, args.records, args.batch_records)
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
