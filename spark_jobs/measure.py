"""What the acking step costs a micro-batch, and what a sink's batch costs as it grows
(``python -m spark_jobs.measure --bootstrap HOST:PORT``; ``replaybroker bench --only spark``).

``compare_acking``: the order job on the same topic, with and without ``Acking``, in one
Spark session. Every query reads the topic from the start in batches of ``batch_records``
offsets with an ``availableNow`` trigger; the figures are Spark's own ``durationMs`` of each
micro-batch (``triggerExecution``: the whole trigger; ``addBatch``: the foreachBatch function)
from ``query.recentProgress``, and the Spark jobs and stages each batch ran (``Probe``). The
variants alternate round by round, after warm-up rounds until the JVM's JIT compiler is quiet
(``warm_max_s``), the first round and the first batch of every query (its start-up) left
out. No acker runs: the acks are produced, not folded.

``measure_sink_growth``: ``OriginDeltaSink`` (with its replay window) and ``OriginParquetSink``
written micro-batch by micro-batch into sinks prefilled, by one bulk write, with a small and
a large number of rows.

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
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from broker.dev.testing import unique_name
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.topics import Namespace, create
from spark_jobs.acking import Acking, AckingConfig, BatchHandler, BatchStats, with_tracking
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


_JOB_GROUP = "spark.jobGroup.id"


class Probe:
    """A ``foreachBatch`` function around another: per batch its wall time and the Spark jobs
    (and their stages) it ran - what the Spark UI shows, read from the status tracker.

    Each batch runs under a job group of its own (the thread's ``spark.jobGroup.id``, put back
    afterwards), so its jobs are the group's; they are counted once the query has ended
    (``resolve``), when the status tracker, which trails the scheduler, has seen them all."""

    def __init__(self, func: Callable[[DataFrame, int], Any]) -> None:
        self.func = func
        self.batches: list[dict[str, Any]] = []
        self._prefix = f"probe-{uuid.uuid4().hex[:8]}"

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        sc = batch.sparkSession.sparkContext
        group = f"{self._prefix}-{batch_id}"
        previous = sc.getLocalProperty(_JOB_GROUP)
        sc.setLocalProperty(_JOB_GROUP, group)
        started = time.perf_counter()
        try:
            self.func(batch, batch_id)
        finally:
            sc.setLocalProperty(_JOB_GROUP, previous)  # type: ignore[arg-type]
        self.batches.append({"batch_id": batch_id, "seconds": time.perf_counter() - started, "group": group})

    def resolve(self, spark: SparkSession) -> None:
        tracker = spark.sparkContext.statusTracker()
        for entry in self.batches:
            ids = tracker.getJobIdsForGroup(entry["group"])
            infos = [tracker.getJobInfo(j) for j in ids]
            entry["jobs"] = len(ids)
            entry["stages"] = sum(len(i.stageIds) for i in infos if i is not None)


def plain_batch(handler: BatchHandler) -> Callable[[DataFrame, int], None]:
    """The job alone: its outputs from the rows it did not fail, no pinning, no acks."""

    def plain(batch: DataFrame, batch_id: int) -> None:
        batch = with_tracking(batch)
        result = handler(batch, batch_id)
        if result is not None and result.write is not None:
            rows = batch if result.rows is None else result.rows
            if isinstance(result.failed, Column):
                rows = rows.where(~F.coalesce(result.failed, F.lit(False)))
            result.write(rows, batch_id)

    return plain


def send_orders(settings: KafkaSettings, ns: Namespace, topic: str, records: int) -> None:
    """``records`` orders through ``Source`` (tracked: persist record + data record)."""
    with Source(settings, ns, SourceConfig(timeout_ms=600_000)) as source:
        for order in make_orders(records):
            source.send(topic, order.key(), order.value())


def offsets_read(progress: dict[str, Any]) -> int:
    """The records a micro-batch read: its sources' end offsets minus their start offsets.

    Not ``numInputRows``: Spark counts the rows every job of the batch scanned, so a batch
    that the handler and the ack step both read from Kafka counts twice. A source without a
    start offset (a query's first batch) is counted by its own ``numInputRows``."""
    total = 0
    for source in progress.get("sources", []):
        start, end = _offsets(source.get("startOffset")), _offsets(source.get("endOffset"))
        if start is None or end is None:
            total += int(source.get("numInputRows") or 0)
            continue
        for topic, partitions in end.items():
            for partition, offset in partitions.items():
                total += int(offset) - int(start.get(topic, {}).get(partition, offset))
    return total


def _offsets(value: Any) -> dict[str, dict[str, int]] | None:
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else None


def _summary(progress: list[dict[str, Any]], probes: list[dict[str, Any]], batch_records: int) -> dict[str, Any]:
    """Rates and times of the batches kept. The rate and the batch time are the median over
    the *full* batches - at least half of ``batch_records`` read: a query over a finite topic
    ends on a remainder of a few rows whose rate measures only a batch's fixed cost, and with
    two of them among six batches the median of all was the mean of the two slowest full ones
    while the median time was the fastest ones'. ``records_per_s_total`` is every batch's rows
    over their summed time, the remainders included."""
    read = [offsets_read(p) for p in progress]
    rows = sum(read)
    trigger = [p["durationMs"]["triggerExecution"] for p in progress]
    add = [p["durationMs"]["addBatch"] for p in progress]
    full = [(n, t) for n, t in zip(read, trigger, strict=True) if t and 2 * n >= batch_records] or [
        (n, t) for n, t in zip(read, trigger, strict=True) if t
    ]
    rates = [1000 * n / t for n, t in full]
    full_ms = [t for _, t in full]
    out: dict[str, Any] = {
        "batches": len(progress),
        "full_batches": len(full),
        "rows": rows,
        "rows_per_batch": statistics.median(n for n, _ in full) if full else 0,
        "spark_input_rows": sum(p["numInputRows"] for p in progress),
        # The median batch's rate: on 2 shared cores one stalled batch (a GC, a slow listing)
        # moved a sum over the 4-8 batches kept by more than the acking costs, either way.
        "records_per_s": statistics.median(rates) if rates else None,
        "records_per_s_total": rows / (sum(trigger) / 1000) if sum(trigger) else None,
        "records_per_s_full_total": sum(n for n, _ in full) / (sum(full_ms) / 1000) if sum(full_ms) else None,
        "batch_ms_p50": statistics.median(full_ms) if full_ms else None,
        "add_batch_ms_p50": statistics.median(add) if add else None,
    }
    jobs = [b["jobs"] for b in probes if "jobs" in b]
    if jobs:
        out["jobs_per_batch"] = statistics.median(jobs)
        out["stages_per_batch"] = statistics.median(b["stages"] for b in probes if "stages" in b)
    return out


def jit_ms(spark: SparkSession) -> float | None:
    """The driver JVM's JIT compilation time so far, in ms summed over its compiler threads
    (``CompilationMXBean``), or None where the JVM does not keep it. Under ``local[*]`` the
    executors are the same JVM."""
    try:
        jvm: Any = spark.sparkContext._jvm
        bean = jvm.java.lang.management.ManagementFactory.getCompilationMXBean()
        return float(bean.getTotalCompilationTime()) if bean.isCompilationTimeMonitoringSupported() else None
    except Exception:  # noqa: BLE001 - a figure beside the figures: None says it is not there
        return None


class JitClock:
    """Wall time and the JIT compiler's time since it was made: ``share()`` is the compiler's
    ms per ms of wall time (up to the number of compiler threads), or None."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.wall, self.jit = time.perf_counter(), jit_ms(spark)

    def seconds(self) -> float:
        return time.perf_counter() - self.wall

    def share(self) -> float | None:
        now = jit_ms(self.spark)
        if now is None or self.jit is None:
            return None
        return round((now - self.jit) / (1000 * self.seconds()), 3)


def compare_acking(
    spark: SparkSession,
    settings: KafkaSettings,
    ns: Namespace,
    topic: str,
    workdir: Path,
    *,
    batch_records: int = 2_000,
    rounds: int = 2,
    config: AckingConfig | None = None,
    warm_max_s: float = 0.0,
    warm_quiet: float = 0.25,
    progress: Callable[[float, str], None] | None = None,
) -> dict[str, Any]:
    """The order job on ``topic`` (already filled) with and without ``Acking``, same input,
    same session: ``rounds`` rounds, each a plain and an acked query over the whole topic in
    micro-batches of ``batch_records``, the order alternating from round to round. The first
    round is left out; so is the first batch of every query (its start-up). Records/s is the
    median over the full batches kept of rows read / ``triggerExecution`` (``_summary``;
    ``records_per_s_total``: all rows over the summed time).

    With ``warm_max_s``, warm-up rounds come first (both variants, in batches of a third of
    the size: what stays cold longest is the driver's planning code, which runs once a batch)
    until the JIT compiler's share of the wall time (``JitClock``) is down to ``warm_quiet``
    or ``warm_max_s`` have passed. ``warm_up`` lists each warm-up round's share, and
    ``jit_share`` is the share over the rounds kept: how cold the figures were."""
    dim = customer_frame(spark, customers()).cache()
    dim.count()
    kept: dict[str, list[dict[str, Any]]] = {"plain": [], "acked": []}
    probed: dict[str, list[dict[str, Any]]] = {"plain": [], "acked": []}
    acked_stats: list[BatchStats] = []

    def query(variant: str, name: str, records_per_batch: int) -> tuple[list[dict[str, Any]], Probe, Acking | None]:
        sink = OriginParquetSink(str(workdir / f"sink-{variant}-{name}"))
        handler: BatchHandler = order_job(sink, dim)
        acking = Acking(settings, ns, handler, config) if variant == "acked" else None
        probe = Probe(acking or plain_batch(handler))
        try:
            batches = _run_query(spark, settings.bootstrap_servers, topic, probe, records_per_batch,
                                 workdir / f"ck-{variant}-{name}")
        finally:
            if acking is not None:
                acking.close()
        probe.resolve(spark)
        return batches, probe, acking

    warm: list[dict[str, Any]] = []
    while warm_max_s > 0:
        if progress is not None:
            progress(0.0, f"warming the JVM up, round {len(warm) + 1}")
        clock = JitClock(spark)
        for variant in ("plain", "acked"):
            query(variant, f"warm{len(warm)}", max(1, batch_records // 3))
        share = clock.share()
        warm.append({"seconds": round(clock.seconds(), 1), "jit_share": share})
        if share is None or share <= warm_quiet or sum(w["seconds"] for w in warm) >= warm_max_s:
            break
    measured = JitClock(spark)  # replaced after the first round, which is left out
    runs = 0
    for round_ in range(rounds):
        order = ("plain", "acked") if round_ % 2 == 0 else ("acked", "plain")
        for variant in order:
            if progress is not None:
                progress(runs / (2 * rounds), f"round {round_ + 1}/{rounds}, {variant}")
            runs += 1
            batches, probe, acking = query(variant, str(round_), batch_records)
            if round_ == 0:
                continue
            kept[variant] += batches[1:]
            probed[variant] += probe.batches[1:]
            if acking is not None:
                acked_stats += list(acking.history)[1:]
        if round_ == 0:
            measured = JitClock(spark)  # the rounds kept start here
    dim.unpersist()
    result: dict[str, Any] = {
        variant: _summary(kept[variant], probed[variant], batch_records) for variant in kept
    }
    result["warm_up"] = warm
    result["jit_share"] = measured.share()
    if acked_stats:
        result["acked"]["handler_ms_p50"] = round(1000 * statistics.median(s.handler_s for s in acked_stats), 1)
        result["acked"]["ack_ms_p50"] = round(1000 * statistics.median(s.ack_s for s in acked_stats), 1)
    plain_rps, acked_rps = result["plain"]["records_per_s"], result["acked"]["records_per_s"]
    result["acked_vs_plain"] = acked_rps / plain_rps if plain_rps and acked_rps else None
    return result


def measure_ack_overhead(
    bootstrap: str, records: int = 20_000, batch_records: int = 2_000, workdir: str | None = None, rounds: int = 2,
    warm_max_s: float = 0.0,
) -> dict[str, Any]:
    settings, ns = KafkaSettings(bootstrap), Namespace(unique_name("measure"))
    topic = f"{ns.name}-orders"
    create(settings, ns, 4, {topic: 4})
    send_orders(settings, ns, topic, records)
    spark = build_spark_session(app_name="replaybroker-measure")
    with tempfile.TemporaryDirectory(prefix="rb-measure-", dir=workdir) as tmp:
        result = compare_acking(spark, settings, ns, topic, Path(tmp), batch_records=batch_records, rounds=rounds,
                                warm_max_s=warm_max_s)
    return {"records": records, "batch_records": batch_records, **result}


# The ways of bounding OriginDeltaSink's MERGE: (buckets, replay window, rows already there
# older than the window).
DELTA_VARIANTS: dict[str, tuple[int, int | None]] = {
    "whole table": (1, None),  # one partition: every batch reads every (origin, path)
    "batch's buckets": (64, None),
    "batch's buckets + replay window": (64, 600_000),
    "whole table + replay window": (1, 600_000),
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
                sinks[size] = OriginDeltaSink(str(table), buckets=buckets, replay_window_ms=window, query_id="m")
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


def _bulk_prefill(spark: SparkSession, sink: str, path: Path, rows: int) -> None:
    """``rows`` facts already in a sink, written a day ago in one bulk write (a few files of
    up to 250 000 rows), not batch by batch: the figure is what the rows cost a batch, and a
    bulk write of 10^6 rows takes seconds where 1 000 micro-batches would take an hour."""
    facts = _delta_rows(spark, rows, seed=1_000, written_at=time.time() - 86_400)
    files = max(1, rows // 250_000)
    if sink == "delta":
        (facts.withColumn(BUCKET, F.lit(0)).repartition(files).write.format("delta").partitionBy(BUCKET)
         .mode("append").save(str(path)))
    else:  # the layout of OriginParquetSink: one directory per (query, batch)
        facts.repartition(files).write.parquet(str(path / "query_id=prefill" / "batch_id=0"))


def _span(progress: Callable[[float, str], None] | None, start: float,
          share: float) -> Callable[[float, str], None] | None:
    """``progress`` of a part that runs from ``start`` for ``share`` of the whole."""
    if progress is None:
        return None
    report = progress
    return lambda fraction, detail: report(start + share * fraction, detail)


def _write_batches(
    spark: SparkSession,
    targets: dict[Any, OriginDeltaSink | OriginParquetSink],
    batches: int,
    batch_rows: int,
    replayed: float,
    label: str,
    progress: Callable[[float, str], None] | None = None,
) -> dict[Any, list[float]]:
    """Milliseconds of ``sink.write`` per target, batch ids 0 .. ``batches``: ``batch_rows``
    new rows plus ``replayed`` of that many ids of the previous batch. The targets take each
    batch in turn, so a change in the machine's load falls on all alike."""
    ms: dict[Any, list[float]] = {key: [] for key in targets}
    for batch_id in range(batches + 1):
        if progress is not None:
            progress(batch_id / (batches + 1), f"{label}: batch {batch_id + 1}/{batches + 1}")
        rows = _delta_rows(spark, batch_rows, seed=batch_id)
        if batch_id > 0:
            rows = rows.unionByName(_delta_rows(spark, int(batch_rows * replayed), seed=batch_id - 1))
        for key, sink in targets.items():
            started = time.perf_counter()
            sink.write(rows, batch_id)
            ms[key].append(1000 * (time.perf_counter() - started))
    return ms


def _check_rows(spark: SparkSession, kind: str, targets: dict[int, OriginDeltaSink | OriginParquetSink],
                batches: int, batch_rows: int) -> None:
    """Every target (keyed by its prefilled row count) holds its rows and each batch's new ones."""
    for size, sink in targets.items():
        written = sink.read(spark).count()
        if written != size + (batches + 1) * batch_rows:
            raise RuntimeError(f"{kind} sink of {size} rows holds {written} after the batches, "
                               f"expected {size + (batches + 1) * batch_rows}")


def measure_sink_growth(
    spark: SparkSession,
    workdir: Path,
    *,
    sizes: tuple[int, int] = (10_000, 1_000_000),
    batch_rows: int = 1_000,
    batches: int = 3,
    replayed: float = 0.1,
    replay_window_ms: int = 600_000,
    sinks: tuple[str, ...] = ("delta", "parquet"),
    progress: Callable[[float, str], None] | None = None,
) -> dict[str, Any]:
    """Milliseconds of ``sink.write`` per micro-batch of ``batch_rows`` new rows plus
    ``replayed`` of that many ids of the previous batch, into a sink that already holds
    ``sizes[0]`` and one that holds ``sizes[1]`` rows; median of ``batches`` batches after a
    first, warm-up one. The two sinks of a kind take the batches in turn, so a change in the
    machine's load falls on both alike. ``delta`` is ``OriginDeltaSink(replay_window_ms=...)``,
    the configuration the project recommends; ``parquet`` is ``OriginParquetSink``."""
    results: dict[str, Any] = {"batch_rows": batch_rows, "replayed": replayed, "sizes": list(sizes)}
    steps = len(sinks) * (2 + batches + 1)
    done = 0
    for kind in sinks:
        targets: dict[int, OriginDeltaSink | OriginParquetSink] = {}
        prefill_s: dict[int, float] = {}
        for size in sizes:
            if progress is not None:
                progress(done / steps, f"{kind}: {size} rows in the sink")
            path = workdir / f"{kind}-{size}"
            started = time.perf_counter()
            _bulk_prefill(spark, kind, path, size)
            prefill_s[size] = round(time.perf_counter() - started, 2)
            done += 1
            targets[size] = (
                OriginDeltaSink(str(path), replay_window_ms=replay_window_ms, query_id="bench")
                if kind == "delta"
                else OriginParquetSink(str(path), query_id="bench")
            )
        ms = _write_batches(spark, targets, batches, batch_rows, replayed, kind,
                            _span(progress, done / steps, (batches + 1) / steps))
        done += batches + 1
        _check_rows(spark, kind, targets, batches, batch_rows)
        results[kind] = {
            "batch_ms_p50": {size: statistics.median(ms[size][1:]) for size in sizes},
            "batch_ms": {size: [round(m) for m in ms[size]] for size in sizes},
            "prefill_s": prefill_s,
        }
        small, large = sizes
        results[kind]["growth"] = results[kind]["batch_ms_p50"][large] / results[kind]["batch_ms_p50"][small]
    return results


def _table_files(spark: SparkSession, path: str) -> int:
    """The files of the table's current snapshot (what a reader or a MERGE opens)."""
    return len(spark.read.format("delta").load(path).inputFiles())


class _TimedOptimizeSink(OriginDeltaSink):
    """``OriginDeltaSink`` that times each of its ``OPTIMIZE`` runs and counts the table's files
    before and after it (``counting_ms``: what the counting took, not the sink's cost)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs: list[dict[str, float]] = []

    def optimize(self, spark: SparkSession) -> None:
        counting = time.perf_counter()
        before = _table_files(spark, self.path)
        started = time.perf_counter()
        super().optimize(spark)
        ended = time.perf_counter()
        after = _table_files(spark, self.path)
        counting_ms = 1000 * (started - counting + time.perf_counter() - ended)
        self.runs.append({"ms": 1000 * (ended - started), "files_before": before, "files_after": after,
                          "counting_ms": counting_ms})


def measure_optimize(
    spark: SparkSession,
    workdir: Path,
    *,
    rows: int = 10_000,
    optimize_every: int = 8,
    batch_rows: int = 1_000,
    replayed: float = 0.1,
    replay_window_ms: int = 600_000,
    progress: Callable[[float, str], None] | None = None,
) -> dict[str, Any]:
    """What ``OriginDeltaSink(optimize_every=n)`` costs: two tables prefilled alike with
    ``rows`` rows take the same ``2n`` micro-batches (after a warm-up batch 0), in turn; one
    compacts before batches ``n`` and ``2n``, the other never. Per table: the write's
    milliseconds per batch (mean: the OPTIMIZE runs spread over every batch; p50: a batch
    without one, on compacted files or not), the files of its snapshot at the end; and each
    OPTIMIZE's own milliseconds and the table's files before and after it."""
    batches = 2 * optimize_every
    sinks: dict[str, OriginDeltaSink] = {}
    for name, every in (("plain", None), ("optimized", optimize_every)):
        path = workdir / f"optimize-{name}"
        _bulk_prefill(spark, "delta", path, rows)
        cls = OriginDeltaSink if every is None else _TimedOptimizeSink
        sinks[name] = cls(str(path), replay_window_ms=replay_window_ms, query_id="bench", optimize_every=every)
    targets: dict[Any, OriginDeltaSink | OriginParquetSink] = dict(sinks)
    ms = _write_batches(spark, targets, batches, batch_rows, replayed, "OPTIMIZE", progress)
    timed = sinks["optimized"]
    assert isinstance(timed, _TimedOptimizeSink)
    for index, run in enumerate(timed.runs):  # before batches n, 2n
        ms["optimized"][(index + 1) * optimize_every] -= run.pop("counting_ms")
    results: dict[str, Any] = {"rows": rows, "optimize_every": optimize_every, "batch_rows": batch_rows,
                               "batches": batches}
    for name, sink in sinks.items():
        kept = ms[name][1:]
        results[name] = {"batch_ms": [round(m) for m in ms[name]], "batch_ms_mean": statistics.mean(kept),
                         "batch_ms_p50": statistics.median(kept), "files": _table_files(spark, sink.path)}
        if sink.read(spark).count() != rows + (batches + 1) * batch_rows:
            raise RuntimeError(f"the {name} table lost or doubled rows")
    results["runs"] = [{k: round(v) for k, v in run.items()} for run in timed.runs]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="Kafka (the acking measurement)")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batch-records", type=int, default=2_000)
    parser.add_argument("--warm-s", type=float, default=100.0,
                        help="at most this long warming the JVM up first, until its JIT compiler is quiet")
    parser.add_argument("--delta", action="store_true", help="time OriginDeltaSink instead (no Kafka)")
    args = parser.parse_args(argv)
    if args.delta:
        result = measure_delta_sink()
    elif args.bootstrap is None:
        parser.error("--bootstrap is required (or --delta)")
    else:
        result = measure_ack_overhead(args.bootstrap, args.records, args.batch_records, warm_max_s=args.warm_s)
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
