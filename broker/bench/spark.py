"""Spark at production scale: what ``Acking`` costs a micro-batch, and how a sink's batch time
grows with the rows already in it (spark_jobs/measure.py does the measuring).

One Spark session (``local[2]``, the project's defaults) serves the whole section, so the JVM
is started once and warm for every figure after the first round.

- ``acked_vs_plain``: the order job (``spark_jobs.orders``) over one topic of tracked orders,
  with and without ``Acking``, same input, same session, alternating query by query; after
  warm-up rounds until the JIT compiler is quiet (at most the plan's ``spark_warm_s``), the
  first round and the first batch of every query (its start-up) left out. ``spark.jit_share``
  is the compiler's share of the wall time over the rounds kept.
  Records/s is the median over the full batches kept (at least half the batch size: not a
  topic's last few rows) of rows read / Spark's own ``triggerExecution`` (robust to one
  stalled batch; the summed rates are in the details).
- ``large_acked_vs_plain``: the same comparison over a topic of its own with micro-batches
  about 3x larger (the plan's ``spark_large_batch_records``), no target: whether what the
  acking adds is per batch (the ratio would rise with the size) or per row.
- ``sink_batch_growth``: ``OriginDeltaSink(replay_window_ms=600_000)`` - the sink the project
  recommends - written micro-batch by micro-batch into a table that already holds the small
  and the large row count (prefilled by one bulk write); the same for ``OriginParquetSink``.
- ``optimize.*``: what ``OriginDeltaSink(optimize_every=n)`` costs - two tables of the small row
  count take the same ``2n`` micro-batches, one compacting before batches ``n`` and ``2n``: the
  batch time with and without (mean: OPTIMIZE spread over the batches; p50), OPTIMIZE's own time
  and the table's files before and after it (``spark_jobs.measure.measure_optimize``).
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker import topics
from broker.bench.figures import FIGURE_KEYS, Figures
from broker.bench.hops import Env


def spark_missing() -> str | None:
    """Why Spark cannot run here (no pyspark, no Java), or None."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("pyspark") is None:
        return "Spark is not available: pyspark is not installed (the spark extra)"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "Spark is not available: no java on PATH and no JAVA_HOME"
    return None


def measure_spark(env: Env, figures: Figures, *, warm_s: float, records: int, batch_records: int, rounds: int,
                  sink_sizes: tuple[int, int], sink_batches: int, large: tuple[int, int] | None = None,
                  optimize_every: int = 4,
                  progress: Callable[[float, str], None] | None = None) -> dict[str, Any]:
    missing = spark_missing()
    if missing is not None:
        figures.unavailable([k for k in FIGURE_KEYS if k.startswith("spark.")], missing)
        return {"unavailable": missing}
    from spark_jobs.measure import measure_optimize, measure_sink_growth
    from spark_jobs.session import build_spark_session

    def part(start: float, share: float) -> Callable[[float, str], None]:
        return lambda f, detail: progress(start + share * f, detail) if progress else None

    ns = topics.Namespace(env.unique("spark"))
    topics.create(env.settings, ns, env.partitions)
    env.created_topics += [*ns.ledger_topics, ns.dlq]
    topic = _orders_topic(env, ns, "orders", records, part(0.0, 1.0))
    part(0.0, 1.0)(0.02, "starting Spark")
    spark = build_spark_session(app_name="replaybroker-bench")
    details: dict[str, Any] = {"warm_s": warm_s, "records": records, "batch_records": batch_records, "rounds": rounds,
                               "master": spark.sparkContext.master}
    with tempfile.TemporaryDirectory(prefix="spark-", dir=env.workdir) as tmp:
        root = Path(tmp)
        acking = _compare(env, spark, ns, topic, root / "acking", batch_records, rounds, part(0.1, 0.35), warm_s)
        details["acking"] = acking
        _acking_figures(figures, acking)
        if large is not None:
            details["acking_large"] = _compare_large(env, spark, ns, root, large, rounds, part(0.45, 0.25))
            _large_figures(figures, details["acking_large"])
        small, large_sink = sink_sizes
        sinks = measure_sink_growth(spark, root / "sinks", sizes=(small, large_sink), batches=sink_batches,
                                    progress=part(0.7, 0.2))
        details["sinks"] = sinks
        for kind, prefix in (("delta", "spark.sink"), ("parquet", "spark.parquet_sink")):
            figures.set(f"{prefix}_small_rows", float(small))
            figures.set(f"{prefix}_large_rows", float(large_sink))
            figures.set(f"{prefix}_small_batch_p50_ms", sinks[kind]["batch_ms_p50"][small])
            figures.set(f"{prefix}_large_batch_p50_ms", sinks[kind]["batch_ms_p50"][large_sink])
            figures.ratio(f"{prefix}_batch_growth", f"{prefix}_large_batch_p50_ms", f"{prefix}_small_batch_p50_ms")
        details["optimize"] = measure_optimize(spark, root / "optimize", rows=small, optimize_every=optimize_every,
                                               progress=part(0.9, 0.1))
        _optimize_figures(figures, details["optimize"])
    if "error" in acking:
        raise RuntimeError(f"acked vs plain: {acking['error']}")
    return details


def _acking_figures(figures: Figures, acking: dict[str, Any]) -> None:
    if "error" in acking:
        return
    _rates(figures, acking, "spark.")
    figures.set("spark.jit_share", acking.get("jit_share"), warm_up=acking.get("warm_up"),
                unavailable="the JVM does not report its compilation time")
    for variant in ("plain", "acked"):
        run = acking[variant]
        figures.set(f"spark.{variant}_batch_p50_ms", run["batch_ms_p50"])
        figures.set(f"spark.{variant}_rows_per_batch", float(run["rows_per_batch"]))
        figures.set(f"spark.{variant}_jobs_per_batch", run.get("jobs_per_batch"), stages=run.get("stages_per_batch"),
                    unavailable="the status tracker listed no jobs of the batches")


def _optimize_figures(figures: Figures, optimize: dict[str, Any]) -> None:
    figures.set("spark.optimize.every", float(optimize["optimize_every"]), rows=optimize["rows"])
    for name, prefix in (("optimized", "spark.optimize."), ("plain", "spark.optimize.plain_")):
        run = optimize[name]
        figures.set(f"{prefix}batch_mean_ms", run["batch_ms_mean"], batch_ms=run["batch_ms"])
        figures.set(f"{prefix}batch_p50_ms", run["batch_ms_p50"])
        figures.set(f"{prefix}files", float(run["files"]))
    figures.ratio("spark.optimize.batch_cost", "spark.optimize.batch_mean_ms", "spark.optimize.plain_batch_mean_ms")
    runs = optimize["runs"]
    figures.set("spark.optimize.run_ms", statistics.median(r["ms"] for r in runs) if runs else None, runs=runs,
                unavailable="no OPTIMIZE ran")
    figures.set("spark.optimize.files_before", float(runs[-1]["files_before"]) if runs else None,
                unavailable="no OPTIMIZE ran")
    figures.set("spark.optimize.files_after", float(runs[-1]["files_after"]) if runs else None,
                unavailable="no OPTIMIZE ran")


def _orders_topic(env: Env, ns: topics.Namespace, name: str, records: int,
                  progress: Callable[[float, str], None]) -> str:
    """A data topic of the namespace, filled with ``records`` tracked orders."""
    from spark_jobs.measure import send_orders

    topic = f"{ns.name}-{name}"
    topics.create(env.settings, ns, env.partitions, {topic: env.partitions})
    env.created_topics += [topic, topics.replay_topic(topic)]
    progress(0.0, f"sending {records} orders")
    send_orders(env.settings, ns, topic, records)
    return topic


def _compare(env: Env, spark: Any, ns: topics.Namespace, topic: str, workdir: Path, batch_records: int,
             rounds: int, progress: Callable[[float, str], None], warm_s: float = 0.0) -> dict[str, Any]:
    """``compare_acking`` on ``topic`` (warming the JVM up for at most ``warm_s`` first), or
    ``{"error": ...}`` in one line: the other figures do not depend on it."""
    from spark_jobs.measure import compare_acking

    try:
        return compare_acking(spark, env.settings, ns, topic, workdir, batch_records=batch_records, rounds=rounds,
                              warm_max_s=warm_s, progress=progress)
    except Exception as exc:  # noqa: BLE001 - reported, the section goes on
        return {"error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"}


def _compare_large(env: Env, spark: Any, ns: topics.Namespace, root: Path, large: tuple[int, int], rounds: int,
                   progress: Callable[[float, str], None]) -> dict[str, Any]:
    """``_compare`` again with larger micro-batches, over a topic of its own (same namespace,
    same session, already warm)."""
    records, batch_records = large
    topic = _orders_topic(env, ns, "orders-large", records,
                          lambda f, d: progress(f, f"{d} for {batch_records}-row batches"))
    result = _compare(env, spark, ns, topic, root / "acking-large", batch_records, rounds,
                      lambda f, d: progress(0.05 + 0.95 * f, f"larger batches: {d}"))
    return result if "error" in result else {"records": records, "batch_records": batch_records, **result}


def _rates(figures: Figures, acking: dict[str, Any], prefix: str) -> None:
    """``{prefix}plain_rps``, ``{prefix}acked_rps`` and their ratio ``{prefix}acked_vs_plain``."""
    for variant in ("plain", "acked"):
        run = acking[variant]
        figures.set(f"{prefix}{variant}_rps", run["records_per_s"], rows=run["rows"], batches=run["batches"],
                    total_rps=run.get("records_per_s_total"))
    figures.ratio(f"{prefix}acked_vs_plain", f"{prefix}acked_rps", f"{prefix}plain_rps")


def _large_figures(figures: Figures, acking: dict[str, Any]) -> None:
    if "error" in acking:
        keys = [k for k in FIGURE_KEYS if k.startswith("spark.large_")]
        figures.unavailable(keys, f"larger batches: {acking['error']}")
        return
    _rates(figures, acking, "spark.large_")
    figures.set("spark.large_rows_per_batch", float(acking["acked"]["rows_per_batch"]))
