"""The example query as a driver process of its own: ``python -m spark_jobs.run_query``.

``read_with_replay`` -> ``Acking(order_job)`` -> ``OriginParquetSink``, on a namespace whose
topics exist, with a checkpoint and a sink directory, until SIGTERM or SIGINT (the query is
stopped, the process exits 0) or until the process is killed. Started again with the same
``--checkpoint`` it resumes the query: Spark runs a batch that had no commit again, with the
same query id, so the sink writes into the same batch directories.

Records enter through ``broker.source.Source`` elsewhere, and an acker serves the namespace
elsewhere (``replaybroker acker``); with ``--alerts-topic`` something must ack the alerts
(a ``Task``). ``tests/e2e/test_spark_driver_kill.py`` kills this process with SIGKILL inside
its micro-batches and starts it again.

Each batch's steps go to the log (stderr), one line each, for whoever watches the driver
from outside::

    batch 7 started
    batch 7 written          outputs in the sink, acks not sent yet
    batch 7 acked
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

from pyspark.sql import DataFrame
from pyspark.sql.streaming import StreamingQuery

from broker.settings import KafkaSettings
from broker.topics import Namespace
from spark_jobs.acking import Acking, BatchHandler, BatchResult, Emit
from spark_jobs.orders import customer_frame, customers, first_attempt_failures, order_job
from spark_jobs.reader import read_with_replay
from spark_jobs.session import build_spark_session
from spark_jobs.sinks import OriginParquetSink

log = logging.getLogger("spark_jobs.run_query")


@dataclass(frozen=True)
class QueryConfig:
    namespace: str
    topic: str  # the orders topic; its replay topic is read too
    checkpoint: str
    sink: str  # the OriginParquetSink's directory
    alerts_topic: str | None = None  # emit large-order alerts here (someone must ack them)
    fail_rate: float = 0.0  # failed on their first attempt (orders.first_attempt_failures)
    trigger: str = "1 second"
    max_offsets_per_trigger: int | None = None
    master: str | None = None  # default: spark_jobs.session's ($SPARK_MASTER, local[2])


def logged(handler: BatchHandler) -> BatchHandler:
    """``handler`` with a log line when its outputs are written (before the acks go out)."""

    def handle(batch: DataFrame, batch_id: int) -> BatchResult | None:
        result = handler(batch, batch_id) or BatchResult()
        inner = result.write

        def write(ok: DataFrame, batch_id: int) -> list[Emit]:
            emits = list(inner(ok, batch_id) or ()) if inner is not None else []
            log.info("batch %d written", batch_id)
            return emits

        return replace(result, write=write)

    return handle


class QueryDriver:
    """Starts the query and keeps it running until ``stop()`` (or the query dies)."""

    def __init__(self, settings: KafkaSettings, config: QueryConfig) -> None:
        self.settings = settings
        self.config = config
        self.ns = Namespace(config.namespace)
        self._stop = threading.Event()
        self.acking: Acking | None = None

    def stop(self) -> None:
        self._stop.set()

    def _on_batch(self, batch: DataFrame, batch_id: int) -> None:
        assert self.acking is not None
        log.info("batch %d started", batch_id)
        self.acking(batch, batch_id)
        log.info("batch %d acked", batch_id)

    def run(self) -> int:
        """0 when stopped, 1 when the query died."""
        c = self.config
        spark = build_spark_session(app_name="replaybroker-orders", master=c.master)
        dim = customer_frame(spark, customers()).cache()
        sink = OriginParquetSink(c.sink)
        handler = order_job(
            sink,
            dim,
            alerts_topic=c.alerts_topic,
            inject=first_attempt_failures(c.fail_rate) if c.fail_rate > 0 else None,
        )
        self.acking = Acking(self.settings, self.ns, logged(handler))
        stream = read_with_replay(spark, self.settings, c.topic, max_offsets_per_trigger=c.max_offsets_per_trigger)
        query: StreamingQuery = (
            stream.writeStream.foreachBatch(self._on_batch)
            .option("checkpointLocation", c.checkpoint)
            .trigger(processingTime=c.trigger)
            .start()
        )
        log.info("query started: id %s, run %s, checkpoint %s", query.id, query.runId, c.checkpoint)
        try:
            while not self._stop.is_set():
                if query.awaitTermination(1):
                    break
            if query.isActive:
                log.info("stopping the query")
                query.stop()
                return 0
            error = query.exception()
            log.error("the query died: %s", error)
            return 1
        finally:
            if query.isActive:
                query.stop()
            self.acking.close()
            spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="the example order query (read_with_replay -> Acking -> OriginParquetSink) until SIGTERM"
    )
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
                        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS)")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--topic", required=True, help="the orders topic (its .replay is read too)")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    parser.add_argument("--sink", required=True, help="the Parquet sink's directory")
    parser.add_argument("--alerts-topic", help="emit large-order alerts to this fault-tolerant topic")
    parser.add_argument("--fail-rate", type=float, default=0.0, help="fail this fraction of first attempts")
    parser.add_argument("--trigger", default="1 second", help="processing-time trigger interval")
    parser.add_argument("--max-offsets-per-trigger", type=int)
    parser.add_argument("--master", help="Spark master (default: $SPARK_MASTER, local[2])")
    args = parser.parse_args(argv)
    if not args.bootstrap:
        parser.error("--bootstrap or $KAFKA_BOOTSTRAP_SERVERS is needed")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a line per callback otherwise
    config = QueryConfig(
        namespace=args.namespace, topic=args.topic, checkpoint=str(Path(args.checkpoint)),
        sink=str(Path(args.sink)), alerts_topic=args.alerts_topic, fail_rate=args.fail_rate,
        trigger=args.trigger, max_offsets_per_trigger=args.max_offsets_per_trigger, master=args.master,
    )
    driver = QueryDriver(KafkaSettings(args.bootstrap), config)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("%s: stopping", signal.Signals(signum).name)
        driver.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return driver.run()


if __name__ == "__main__":
    sys.exit(main())
