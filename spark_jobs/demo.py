"""``replaybroker demo --spark``: source -> Spark Structured Streaming -> acker, with failures.

One run, on the Kafka it is given, in a namespace of its own:

1. topics: ``<ns>.persist/acks/ledger/dlq``, ``<ns>-orders`` and ``<ns>-alerts`` (each with
   its ``.replay``);
2. an acker and an alert consumer (a ``Task`` that acks every alert) run in threads;
3. the order job (``spark_jobs.orders``) runs once on the empty topics to warm the JVM up,
   then as a streaming query on ``orders`` + ``orders.replay``, acking from ``foreachBatch``;
   it fails ``fail_rate`` of the orders on their first attempt;
4. a ``Source`` sends the orders at ``send_rate``; the origins it returns are the demo's
   ground truth;
5. with ``restart``, once 40% of the orders went through, the query is stopped at the worst
   moment - a batch has written its outputs and not yet sent its acks - and started again
   from its checkpoint: that batch runs again, its first acks never existed;
6. the demo watches ``ns.persist`` (a tombstone without ``rb-outcome`` completes an
   origin; ``broker.completions``) and ``ns.dlq`` until every origin it sent is completed or dead-lettered, or the
   deadline passes; then it reads the sink back (``OriginParquetSink``, or with ``sink="delta"``
   ``OriginDeltaSink``).

``lost`` is counted against the ground truth, not against the broker's own figures.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from broker import ids
from broker.acker import Acker, AckerConfig
from broker.completions import OutcomeTail
from broker.dev.testing import unique_name
from broker.errors import ConfigurationError, ReplayBrokerError
from broker.headers import H_ORIGIN
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskContext, TaskRecord
from broker.topics import Namespace, create, delete, layout
from spark_jobs.acking import Acking, BatchHandler, BatchResult, Emit
from spark_jobs.orders import (
    Order,
    customer_frame,
    customers,
    first_attempt_failures,
    make_orders,
    order_job,
    revenue_by_region,
)
from spark_jobs.reader import read_with_replay
from spark_jobs.session import build_spark_session, driver_jvm_pid, python_workers
from spark_jobs.sinks import OriginDeltaSink, OriginParquetSink

log = logging.getLogger(__name__)


class DemoError(ReplayBrokerError):
    """The demo's streaming query or one of its services died."""


@dataclass(frozen=True)
class SparkDemoConfig:
    records: int = 2000
    fail_rate: float = 0.05
    restart: bool = True
    workdir: str | None = None  # keep checkpoint and sink here (default: a temporary dir)
    data_partitions: int = 4
    ledger_partitions: int = 4
    # Above twice the slowest micro-batch, or records still in flight time out and replay
    # again and again (the first batches take 10-15 s on a loaded 2-core machine). No record
    # of the demo waits for it: the batch cut by the restart runs again from the checkpoint.
    timeout_ms: int = 30_000
    max_attempts: int = 10
    trigger: str = "500 milliseconds"
    max_offsets_per_trigger: int | None = None  # per micro-batch, over both topics
    send_rate: float = 1000.0  # records/s, like a live stream; 0 sends all at once
    restart_after: float = 0.4  # fraction of the records processed before the restart
    alerts: bool = True  # emit anchored children to <ns>-alerts, acked by a Task
    deadline_ms: int = 240_000
    namespace: str | None = None
    master: str | None = None  # Spark master (default: spark_jobs.session's: $SPARK_MASTER, local[2])
    sink: str = "parquet"  # or "delta": OriginDeltaSink (the session needs Delta's jars)


SINKS = ("parquet", "delta")


# --------------------------------------------------------------------------- ground truth


def expected_revenue(
    orders: Sequence[Order], customer_rows: Sequence[tuple[str, str, str, float]]
) -> dict[str, dict[str, float]]:
    """``revenue_by_region`` of the orders sent, each counted once (computed in Python)."""
    dim = {c: (region, tier, discount) for c, region, tier, discount in customer_rows}
    out: dict[str, dict[str, float]] = {}
    for order in orders:
        region, tier, discount = dim[order.customer]
        entry = out.setdefault(f"{region}/{tier}", {"orders": 0, "net_revenue": 0.0})
        entry["orders"] += 1
        entry["net_revenue"] += order.amount * (1 - discount)
    return {k: {"orders": v["orders"], "net_revenue": round(v["net_revenue"], 2)} for k, v in sorted(out.items())}


class LedgerWatch:
    """Outcomes and dead letters of a namespace, read from Kafka as any consumer can: the
    persist tombstones' ``rb-outcome`` (``broker.completions``) and ``ns.dlq``'s
    ``rb-origin`` headers."""

    def __init__(self, settings: KafkaSettings, ns: Namespace) -> None:
        self.outcomes = OutcomeTail(settings, ns)
        self._dlq = Consumer(settings.consumer_config(None, defaults={"group.id": f"{ns.name}.watch"}))
        self._dlq.assign([TopicPartition(ns.dlq, 0, OFFSET_BEGINNING)])
        self.dead: set[int] = set()  # origins in the DLQ

    def update(self, timeout_s: float = 0.1) -> None:
        self.outcomes.poll(timeout_s)
        for msg in self._dlq.consume(10_000, 0):
            if msg.error() is None:
                origin = dict(msg.headers() or ()).get(H_ORIGIN)
                if origin is not None and len(origin) == 8:
                    self.dead.add(ids.decode_id(origin))

    def settled(self, origins: set[int]) -> bool:
        """Every one of ``origins`` completed or was dead-lettered."""
        completed = self.outcomes.log.completed_origins()
        return all(o in completed or o in self.dead for o in origins)

    def close(self) -> None:
        self.outcomes.close()
        self._dlq.close()


# --------------------------------------------------------------------------- moving parts


@dataclass
class _Services:
    """The acker and the alert task, each in a thread; a crash is kept for the main loop."""

    acker: Acker
    task: Task | None
    threads: list[threading.Thread] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def start(self) -> None:
        self._spawn("acker", self.acker.run)
        if self.task is not None:
            self._spawn("alerts", self.task.run)

    def _spawn(self, name: str, target: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                target()
            except BaseException as exc:
                self.errors.append(exc)
                raise

        thread = threading.Thread(target=run, name=f"demo-{name}", daemon=True)
        thread.start()
        self.threads.append(thread)

    def stop(self) -> None:
        if self.task is not None:
            self.task.stop()
        self.acker.stop()
        for thread in self.threads:
            thread.join(60)


class _MidBatchStop:
    """Holds one batch between its outputs and its acks until the query is being stopped.

    The batch's next Spark job then fails with an interruption: its outputs are written, its
    acks are not - the moment a driver crash hurts most. After the restart Spark runs that
    batch again from the checkpoint.
    """

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.reached = threading.Event()
        self.stopping = threading.Event()
        self.query: StreamingQuery | None = None

    def wrap(self, handler: BatchHandler) -> BatchHandler:
        def handle(batch: DataFrame, batch_id: int) -> BatchResult | None:
            result = handler(batch, batch_id) or BatchResult()
            inner = result.write

            def write(ok: DataFrame, batch_id: int) -> Sequence[Emit] | None:
                emits = inner(ok, batch_id) if inner is not None else None
                self._hold(batch_id)
                return emits

            # The job's outputs are written by ``write``: hold the batch right after it.
            return replace(result, write=write)

        return handle

    def _hold(self, batch_id: int) -> None:
        if not self.armed.is_set():
            return
        self.armed.clear()  # one batch only
        self.reached.set()
        log.info("batch %d wrote its outputs; holding it while the query stops", batch_id)
        self.stopping.wait(60)
        # stop() marks the query terminated, then interrupts this thread: wait for the mark
        # so the acks run into the interruption.
        deadline = time.monotonic() + 30
        while self.query is not None and self.query.isActive and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.1)


class SparkDemo:
    def __init__(self, bootstrap: str | KafkaSettings, config: SparkDemoConfig | None = None) -> None:
        self.settings = bootstrap if isinstance(bootstrap, KafkaSettings) else KafkaSettings(bootstrap)
        self.config = config or SparkDemoConfig()
        self.ns = Namespace(self.config.namespace or unique_name("sparkdemo"))
        self.topic = f"{self.ns.name}-orders"
        self.alerts_topic = f"{self.ns.name}-alerts"
        self.origins: set[int] = set()  # the ground truth: every origin sent
        self.alerts_acked = 0
        self.restarts = 0
        self.expected: dict[str, dict[str, float]] = {}
        self.watch: LedgerWatch | None = None
        self.acking: Acking | None = None
        self.sink: OriginParquetSink | OriginDeltaSink | None = None
        if self.config.sink not in SINKS:
            raise ConfigurationError(f"sink must be one of {SINKS}, got {self.config.sink!r}")

    def run(self, *, keep: bool = True) -> dict[str, Any]:
        try:
            return self._run_in_workdir()
        finally:
            if not keep:
                delete(self.settings, layout(self.ns, self.config.ledger_partitions, self._data_topics()))

    def _data_topics(self) -> dict[str, int]:
        data_topics = {self.topic: self.config.data_partitions}
        if self.config.alerts:
            data_topics[self.alerts_topic] = 2
        return data_topics

    def _run_in_workdir(self) -> dict[str, Any]:
        if self.config.workdir is None:
            with tempfile.TemporaryDirectory(prefix="rb-spark-demo-") as tmp:
                return self._run(Path(tmp))
        workdir = Path(self.config.workdir) / self.ns.name
        workdir.mkdir(parents=True, exist_ok=True)
        return self._run(workdir)

    # ------------------------------------------------------------------ pieces

    def _new_sink(self, path: Path) -> OriginParquetSink | OriginDeltaSink:
        return OriginDeltaSink(str(path)) if self.config.sink == "delta" else OriginParquetSink(str(path))

    def _handler(self, dim: DataFrame, sink: OriginParquetSink | OriginDeltaSink, fail_rate: float) -> BatchHandler:
        return order_job(
            sink,
            dim,
            alerts_topic=self.alerts_topic if self.config.alerts else None,
            inject=first_attempt_failures(fail_rate) if fail_rate > 0 else None,
        )

    def _warm_up(self, spark: SparkSession, dim: DataFrame, workdir: Path) -> float:
        """The job once on the still empty topics: the JVM compiles its code before the
        first record's timeout starts ticking, not during the first micro-batch."""
        started = time.monotonic()
        handler = self._handler(dim, self._new_sink(workdir / "warm-up"), 0.0)
        batch = read_with_replay(spark, self.settings, self.topic, stream=False)
        with Acking(self.settings, self.ns, handler) as acking:
            acking.process(batch, 0)
        return time.monotonic() - started

    def _start_query(self, spark: SparkSession, acking: Acking, checkpoint: Path) -> StreamingQuery:
        c = self.config
        stream = read_with_replay(spark, self.settings, self.topic, max_offsets_per_trigger=c.max_offsets_per_trigger)
        return (
            stream.writeStream.foreachBatch(acking)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime=c.trigger)
            .queryName(f"orders_{self.ns.name.replace('-', '_')}")
            .start()
        )

    def _on_alert(self, record: TaskRecord, ctx: TaskContext) -> None:
        self.alerts_acked += 1  # a leaf: returning acks the alert

    # ------------------------------------------------------------------ the run

    def _run(self, workdir: Path) -> dict[str, Any]:
        c, settings, ns = self.config, self.settings, self.ns
        create(settings, ns, c.ledger_partitions, self._data_topics())
        spark = build_spark_session(app_name="replaybroker-spark-demo", master=c.master)
        customer_rows = customers()
        dim = customer_frame(spark, customer_rows).cache()
        self.sink = self._new_sink(workdir / "sink" / "orders")
        stopper = _MidBatchStop()
        acking = self.acking = Acking(settings, ns, stopper.wrap(self._handler(dim, self.sink, c.fail_rate)))
        services = _Services(
            Acker(settings, ns, AckerConfig(instance_id=f"{ns.name}-acker", orphan_ttl_ms=30_000)),
            Task(settings, ns, [self.alerts_topic], f"{ns.name}-alerts", self._on_alert) if c.alerts else None,
        )
        watch = self.watch = LedgerWatch(settings, ns)
        orders = make_orders(c.records)
        self.expected = expected_revenue(orders, customer_rows)
        source = Source(settings, ns, SourceConfig(timeout_ms=c.timeout_ms, max_attempts=c.max_attempts))
        checkpoint = workdir / "checkpoint"
        query: StreamingQuery | None = None
        try:
            services.start()
            warm_up_s = self._warm_up(spark, dim, workdir)
            query = stopper.query = self._start_query(spark, acking, checkpoint)
            started = time.monotonic()
            sent, sent_s, armed_at = 0, 0.0, 0.0
            restart_pending = c.restart
            while time.monotonic() - started < c.deadline_ms / 1000:
                if sent < len(orders):
                    elapsed = time.monotonic() - started
                    due = len(orders) if c.send_rate <= 0 else min(len(orders), int(c.send_rate * elapsed) + 1)
                    for order in orders[sent:due]:
                        self.origins.add(source.send(self.topic, order.key(), order.value()).origin)
                    sent = due
                    if sent == len(orders):
                        source.flush()
                        sent_s = time.monotonic() - started
                watch.update(0.1)
                if query.exception() is not None or not query.isActive:
                    raise DemoError(f"the streaming query died: {query.exception()}")
                if services.errors:
                    raise DemoError(f"a service died: {services.errors[0]!r}")
                if restart_pending:
                    if not armed_at and acking.totals["inputs"] >= c.restart_after * c.records:
                        stopper.armed.set()
                        armed_at = time.monotonic()
                    # No batch will come (everything sent is settled), or none reached its
                    # acks within 60 s of arming: stop where the query is.
                    late = bool(armed_at) and (
                        (sent == len(orders) and watch.settled(self.origins))
                        or time.monotonic() - armed_at > 60
                    )
                    if stopper.reached.is_set() or late:
                        stopper.armed.clear()
                        log.info("stopping the query mid-run; restarting it from %s", checkpoint)
                        stopper.stopping.set()
                        query.stop()
                        self.restarts += 1
                        restart_pending = False
                        query = stopper.query = self._start_query(spark, acking, checkpoint)
                if sent == len(orders) and not restart_pending and watch.settled(self.origins):
                    break
            seconds = time.monotonic() - started
            query.stop()
            watch.update(0.5)
        finally:
            stopper.stopping.set()
            if query is not None and query.isActive:
                query.stop()
            services.stop()
            acking.close()
            source.close()
            watch.close()
        summary = self._summary(spark, seconds, sent_s)
        summary["warm_up_seconds"] = round(warm_up_s, 2)
        summary.update(self._where_it_ran(spark))
        summary["workdir"] = str(workdir) if c.workdir is not None else None
        return summary

    @staticmethod
    def _where_it_ran(spark: SparkSession) -> dict[str, Any]:
        """The master, the driver's JVM and the executors; on a cluster also the Python workers
        of one small job: their pids, interpreter, where ``spark_jobs`` came from (the zip
        shipped to the executors) and the JVM that started them (the executor)."""
        sc = spark.sparkContext
        jsc: Any = sc._jsc
        where: dict[str, Any] = {
            "spark_master": sc.master,
            "spark_app_id": sc.applicationId,
            "driver_pid": os.getpid(),
            "driver_jvm_pid": driver_jvm_pid(spark),
            "executors": sorted(filter(None, str(jsc.sc().getExecutorIds().mkString(",")).split(","))),
        }
        if not (sc.master or "local").startswith("local"):
            where["python_workers"] = python_workers(spark)
        return where

    def _summary(self, spark: SparkSession, seconds: float, sent_s: float) -> dict[str, Any]:
        assert self.watch is not None and self.acking is not None and self.sink is not None
        watch, acking = self.watch, self.acking
        outcomes = watch.outcomes.log
        completions = outcomes.completed_origins()
        completed = self.origins & completions.keys()
        dead = self.origins & watch.dead
        written = self.sink.read(spark).cache()
        sink_origins = [r[0] for r in written.select("origin").collect()]
        revenue = {
            f"{r['region']}/{r['tier']}": {"orders": r["orders"], "net_revenue": r["net_revenue"]}
            for r in revenue_by_region(written).orderBy("region", "tier").collect()
        }
        written.unpersist()
        return {
            "namespace": self.ns.name,
            "sink": self.config.sink,
            "topic": self.topic,
            "records": len(self.origins),
            "completed": len(completed),
            "completed_more_than_once": sum(1 for o in completed if completions[o] > 1),
            "pending": len(outcomes.live),
            "replayed": outcomes.replays(),
            "replays_read": acking.totals["replay_inputs"],
            "dlq": len(dead),
            "lost": len(self.origins - completed - dead),
            "fail_marks": acking.totals["fail_marks"],
            "alerts_emitted": acking.totals["children"],
            "alerts_acked": self.alerts_acked,
            "batches": acking.totals["batches"],
            # batches whose events needed a Spark job of their own (not observed: observed.py)
            "events_jobs": acking.totals["events_job"],
            "interrupted_batches": acking.totals["interrupted"],
            "restarts": self.restarts,
            "seconds": round(seconds, 2),
            "send_seconds": round(sent_s, 2),
            "sink_rows": len(sink_origins),
            "sink_duplicates": len(sink_origins) - len(set(sink_origins)),
            "sink_missing": len(completed - set(sink_origins)),
            "revenue": revenue,
            "revenue_expected": self.expected,
        }


def run_spark_demo(
    bootstrap: str,
    records: int = 2000,
    fail_rate: float = 0.05,
    restart: bool = True,
    workdir: str | None = None,
    *,
    timeout_ms: int | None = None,
    max_attempts: int | None = None,
    keep: bool = True,
    master: str | None = None,
    sink: str = "parquet",
) -> dict[str, Any]:
    """Run the Spark demo on ``bootstrap``; returns the summary (see the module docstring).
    ``keep=False`` deletes the topics it created afterwards; ``master`` is the Spark master
    (default: ``$SPARK_MASTER``, else ``local[2]``; under spark-submit its ``--master``);
    ``sink`` is ``parquet`` or ``delta``."""
    config = SparkDemoConfig(
        records=records, fail_rate=fail_rate, restart=restart, workdir=workdir, master=master, sink=sink
    )
    if timeout_ms is not None:
        config = replace(config, timeout_ms=timeout_ms)
    if max_attempts is not None:
        config = replace(config, max_attempts=max_attempts)
    return SparkDemo(bootstrap, config).run(keep=keep)


def main(argv: list[str] | None = None) -> int:
    """The example job as a program: ``spark-submit ... spark_jobs/demo.py --bootstrap H:P``
    (or ``python -m spark_jobs.demo``). Prints the summary as JSON; exit 1 if a record was lost."""
    import orjson

    parser = argparse.ArgumentParser(description="source -> the order job on Spark -> acker, with failures")
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
                        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS)")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, $SPARK_MASTER, local[2])")
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--fail-rate", type=float, default=0.05)
    parser.add_argument("--no-restart", action="store_true", help="no mid-batch query restart")
    parser.add_argument("--timeout-ms", type=int, help="per-record timeout (default: 30000)")
    parser.add_argument("--workdir", help="keep checkpoint and sink here (default: a temporary dir)")
    parser.add_argument("--keep", action="store_true", help="keep the demo's topics")
    parser.add_argument("--sink", choices=SINKS, default="parquet",
                        help="OriginParquetSink, or OriginDeltaSink (needs Delta's jars)")
    args = parser.parse_args(argv)
    if not args.bootstrap:
        parser.error("--bootstrap or $KAFKA_BOOTSTRAP_SERVERS is needed")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    summary = run_spark_demo(
        args.bootstrap, records=args.records, fail_rate=args.fail_rate, restart=not args.no_restart,
        workdir=args.workdir, keep=args.keep, master=args.master, timeout_ms=args.timeout_ms, sink=args.sink,
    )
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0 if summary["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
