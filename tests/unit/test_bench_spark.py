"""The spark section's figures and its part of the report (no Spark needed)."""

from __future__ import annotations

import pytest

from broker.bench import report
from broker.bench.figures import FIGURE_KEYS, SECTIONS, SPECS, Figures


def test_spark_is_a_section_with_its_targets() -> None:
    assert "spark" in SECTIONS
    assert SPECS["spark.acked_vs_plain"].target == (">=", 0.8)
    assert SPECS["spark.sink_batch_growth"].target == ("<=", 1.5)
    assert SPECS["spark.parquet_sink_batch_growth"].target is None
    spark = [k for k in FIGURE_KEYS if k.startswith("spark.")]
    for raw in ("spark.acked_rps", "spark.plain_rps", "spark.acked_batch_p50_ms", "spark.sink_large_rows",
                "spark.sink_small_batch_p50_ms", "spark.acked_jobs_per_batch"):
        assert raw in spark


def test_a_ratio_below_its_target_is_reported_not_met() -> None:
    figures = Figures()
    figures.set("spark.plain_rps", 1000.0)
    figures.set("spark.acked_rps", 700.0)
    figures.ratio("spark.acked_vs_plain", "spark.acked_rps", "spark.plain_rps")
    assert figures.values["spark.acked_vs_plain"]["met"] is False
    figures.set("spark.sink_large_batch_p50_ms", None, unavailable="Spark is not available: no java")
    figures.ratio("spark.sink_batch_growth", "spark.sink_large_batch_p50_ms", "spark.sink_small_batch_p50_ms")
    assert figures.values["spark.sink_batch_growth"]["value"] is None
    assert "unavailable" in figures.values["spark.sink_batch_growth"]["unavailable"]


def _result(details: dict) -> dict:
    figures = Figures()
    figures.set("spark.plain_rps", 1000.0)
    figures.set("spark.acked_rps", 900.0)
    figures.ratio("spark.acked_vs_plain", "spark.acked_rps", "spark.plain_rps")
    meta = {"stamp": "s", "mode": "quick", "kafka": "k", "partitions": 4, "cpus": 2, "loadavg_start": "1",
            "loadavg_end": "1", "seconds": 1.0}
    return {"meta": meta, "figures": figures.complete(), "errors": {}, "details": {"spark": details}}


def test_the_report_shows_the_spark_rows_and_the_batch_profile() -> None:
    run = {"records_per_s": 1000.0, "batch_ms_p50": 900, "add_batch_ms_p50": 800, "rows_per_batch": 3000,
           "jobs_per_batch": 3, "stages_per_batch": 4}
    details = {"master": "local[2]", "records": 9000, "batch_records": 3000, "rounds": 2,
               "acking": {"plain": run, "acked": {**run, "jobs_per_batch": 4, "handler_ms_p50": 500.0,
                                                  "ack_ms_p50": 300.0},
                          "warm_up": [{"seconds": 30.0, "jit_share": 0.9}, {"seconds": 20.0, "jit_share": 0.2}],
                          "jit_share": 0.15},
               "sinks": {"batch_rows": 1000, "replayed": 0.1, "delta": {"batch_ms": {1000: [5, 4], 100000: [6, 4]}}}}
    text = report.markdown(_result(details))
    assert "| Spark order job under Acking, records/s | 900 |" in text
    assert "| acked | 1000 | 900 | 800 | 3000 | 4.00 | 4.00 |" in text
    assert "the ack step (events, collect, produce) 300 ms" in text
    assert "warm-up rounds 0.9 (30.00 s), 0.2 (20.00 s); the rounds kept 0.15." in text
    assert "- delta: 1000 rows: 5, 4 ms; 100000 rows: 6, 4 ms" in text


def test_the_report_says_why_the_comparison_is_missing() -> None:
    text = report.markdown(_result({"acking": {"error": "RuntimeError: query failed"}}))
    assert "Spark, acked vs plain: RuntimeError: query failed" in text


def test_a_batch_counts_the_offsets_it_read_not_the_rows_every_job_scanned() -> None:
    from spark_jobs.measure import offsets_read

    # A batch read twice from Kafka (the handler's write and the ack step): Spark says 12 rows.
    progress = {
        "numInputRows": 12,
        "sources": [
            {"startOffset": {"orders": {"0": 10, "1": 4}}, "endOffset": {"orders": {"0": 13, "1": 6}},
             "numInputRows": 10},
            # Offsets as Spark's JSON text; a partition missing from the start offsets counts nothing.
            {"startOffset": '{"orders.replay": {"0": 0}}', "endOffset": '{"orders.replay": {"0": 1, "1": 7}}',
             "numInputRows": 2},
        ],
    }
    assert offsets_read(progress) == 3 + 2 + 1
    # A query's first batch has no start offset: its own count is all there is.
    assert offsets_read({"sources": [{"startOffset": None, "endOffset": {"t": {"0": 5}}, "numInputRows": 5}]}) == 5


def test_the_larger_batches_give_their_own_figures_or_say_why_not() -> None:
    from broker.bench.spark import _large_figures

    run = {"records_per_s": 3000.0, "rows": 40_000, "batches": 4, "batch_ms_p50": 3300, "rows_per_batch": 10_000}
    figures = Figures()
    _large_figures(figures, {"plain": run, "acked": {**run, "records_per_s": 2400.0}})
    assert figures.value("spark.large_acked_vs_plain") == 0.8
    assert figures.value("spark.large_rows_per_batch") == 10_000
    assert SPECS["spark.large_acked_vs_plain"].target is None  # the target is the plan's batch size's
    text = report.markdown(_result({}) | {"figures": {**_result({})["figures"], **figures.complete()}})
    assert "| Spark order job under Acking, larger batches, rec/s | 2400 |" in text

    failed = Figures()
    _large_figures(failed, {"error": "RuntimeError: query failed"})
    assert failed.values["spark.large_acked_vs_plain"]["value"] is None
    assert failed.values["spark.large_acked_vs_plain"]["unavailable"] == "larger batches: RuntimeError: query failed"


def _progress(read: int, ms: int) -> dict:
    return {"sources": [{"startOffset": {"t": {"0": 0}}, "endOffset": {"t": {"0": read}}, "numInputRows": read}],
            "numInputRows": read, "durationMs": {"triggerExecution": ms, "addBatch": ms - 10}}


def test_the_rate_is_the_median_full_batch_not_a_remainder() -> None:
    from spark_jobs.measure import _summary

    # Four full batches of 3 000 rows and two remainders of a few rows, as a query over a
    # finite topic ends: over all six the median rate would be the two slowest full ones'.
    batches = [(3000, 500), (3000, 600), (3000, 1000), (3000, 1500), (4, 300), (2, 250)]
    out = _summary([_progress(n, ms) for n, ms in batches], [], 3000)
    assert out["full_batches"] == 4
    assert out["records_per_s"] == (3000 / 0.6 + 3000 / 1.0) / 2
    assert out["batch_ms_p50"] == 800
    assert out["rows_per_batch"] == 3000
    assert out["records_per_s_full_total"] == 12_000 / 3.6
    assert out["records_per_s_total"] == 12_006 / 4.15
    # Only remainders: they are what there is.
    only = _summary([_progress(5, 200), _progress(7, 300)], [], 3000)
    assert only["full_batches"] == 2 and only["records_per_s"] is not None


class _Jvm:
    """The part of a py4j JVM view that ``jit_ms`` reads: ManagementFactory's compilation bean."""

    def __init__(self, supported: bool = True) -> None:
        self.compiled_ms = 0.0
        self.supported = supported
        self.java = self
        self.lang = self
        self.management = self
        self.ManagementFactory = self

    def getCompilationMXBean(self) -> _Jvm:
        return self

    def isCompilationTimeMonitoringSupported(self) -> bool:
        return self.supported

    def getTotalCompilationTime(self) -> float:
        return self.compiled_ms


class _Spark:
    def __init__(self, jvm: _Jvm) -> None:
        self.sparkContext = type("Context", (), {"_jvm": jvm})()


def test_the_jit_share_is_compile_time_over_wall_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_jobs import measure

    now = [100.0]
    monkeypatch.setattr(measure.time, "perf_counter", lambda: now[0])
    jvm = _Jvm()
    jvm.compiled_ms = 5_000.0
    clock = measure.JitClock(_Spark(jvm))  # type: ignore[arg-type]
    now[0] += 2.0
    jvm.compiled_ms += 500.0  # half a second of compiling in two seconds
    assert clock.share() == 0.25
    assert measure.JitClock(_Spark(_Jvm(supported=False))).share() is None  # type: ignore[arg-type]


def test_the_cost_of_optimize_is_a_figure_and_a_report_row() -> None:
    from broker.bench.spark import _optimize_figures

    optimize = {"rows": 1000, "optimize_every": 4, "batch_rows": 1000, "batches": 8,
                "optimized": {"batch_ms": [900, 400, 400, 400, 1600, 400, 400, 400, 1600], "batch_ms_mean": 700.0,
                              "batch_ms_p50": 400.0, "files": 6},
                "plain": {"batch_ms": [900, 500, 500, 500, 500, 500, 500, 500, 500], "batch_ms_mean": 500.0,
                          "batch_ms_p50": 500.0, "files": 30},
                "runs": [{"ms": 1100, "files_before": 17, "files_after": 1}, {"ms": 1300, "files_before": 14,
                                                                              "files_after": 2}]}
    figures = Figures()
    _optimize_figures(figures, optimize)
    assert figures.value("spark.optimize.batch_cost") == 1.4
    assert figures.value("spark.optimize.run_ms") == 1200
    assert (figures.value("spark.optimize.files_before"), figures.value("spark.optimize.files_after")) == (14, 2)
    assert figures.value("spark.optimize.plain_files") == 30
    result = _result({"optimize": optimize})
    text = report.markdown(result | {"figures": {**result["figures"], **figures.complete()}})
    assert "| OriginDeltaSink batch ms (mean), optimize_every | 700 |" in text
    assert "- OPTIMIZE runs: 1100 ms, 17 -> 1 files; 1300 ms, 14 -> 2 files" in text

    never = Figures()
    _optimize_figures(never, {**optimize, "runs": []})
    assert never.values["spark.optimize.run_ms"]["unavailable"] == "no OPTIMIZE ran"
