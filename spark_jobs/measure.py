"""What the acking step costs a micro-batch: the order job on the same data, with and without
``Acking``, in one run (``python -m spark_jobs.measure --bootstrap HOST:PORT``).

Both variants read the same topic from the start in batches of ``batch_records`` with an
``availableNow`` trigger; the figures are Spark's own ``durationMs`` of each micro-batch
(``addBatch``: the foreachBatch function; ``triggerExecution``: the whole trigger) from
``query.recentProgress``, first batch of each query left out (query start-up). The variants
alternate (plain, acked, plain, acked) and the second round is reported, so JIT warm-up
does not favour the second one. No acker runs: the acks are produced, not folded.
"""

from __future__ import annotations

import argparse
import json
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
from spark_jobs.sinks import OriginParquetSink


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batch-records", type=int, default=2_000)
    args = parser.parse_args(argv)
    result = measure_ack_overhead(args.bootstrap, args.records, args.batch_records)
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
