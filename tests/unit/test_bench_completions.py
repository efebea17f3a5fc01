"""Counting completions at a window's edges (broker/bench/completions.py), the CPU figures and
the count check in the report (no Kafka needed)."""

from __future__ import annotations

import pytest

from broker.bench import report
from broker.bench.completions import Mark, rate, window
from broker.bench.figures import FIGURE_KEYS, Figures
from broker.bench.pipeline import record_check


def test_the_rate_is_the_completions_over_the_partitions_mean_window() -> None:
    start = Mark({0: 100, 1: 200}, {0: 1_000.0, 1: 1_010.0})
    end = Mark({0: 400, 1: 500}, {0: 4_000.0, 1: 3_990.0})
    assert window(start, end) == (600, pytest.approx(2.99))
    assert rate(start, end) == pytest.approx(600 / 2.99)


def test_a_partition_without_a_count_at_the_start_adds_its_completions_not_its_time() -> None:
    start = Mark({0: 100, 1: 0}, {0: 1_000.0, 1: 0.0})  # partition 1: no counters record yet
    end = Mark({0: 300, 1: 50}, {0: 3_000.0, 1: 3_000.0})
    assert window(start, end) == (250, 2.0)


def test_no_time_between_the_marks_is_no_rate() -> None:
    mark = Mark.of_count(10, 5.0)
    assert rate(mark, mark) is None
    assert rate(Mark.of_count(0, 0.0), Mark.of_count(10, 5.0)) is None  # nothing counted at the start
    assert rate(Mark.of_count(10, 5.0), Mark.of_count(40, 6.5)) == pytest.approx(20.0)


def test_the_check_is_met_only_when_the_counts_are_equal() -> None:
    figures = Figures()
    record_check(figures, {"partition": 0, "counters": 250, "tail": 250})
    assert figures.values["check.counters_vs_tail"]["value"] == 1.0
    assert figures.values["check.counters_vs_tail"]["met"] is True
    record_check(figures, {"partition": 0, "counters": 250, "tail": 249})
    assert figures.values["check.counters_vs_tail"]["met"] is False
    record_check(figures, {"partition": 0, "counters": 0, "tail": 0})
    assert figures.values["check.counters_vs_tail"]["value"] is None


def test_the_report_shows_the_cpu_figures_beside_the_share_group() -> None:
    assert not [k for k in FIGURE_KEYS if k.startswith("floor.")]
    figures = Figures()
    figures.set("cpu.pipeline_us_per_record", 30.0)
    figures.set("cpu.share_us_per_record", 6.0)
    figures.ratio("cpu.pipeline_vs_share", "cpu.share_us_per_record", "cpu.pipeline_us_per_record")
    meta = dict.fromkeys(("stamp", "mode", "kafka", "loadavg_start", "loadavg_end"), "-")
    meta |= {"partitions": 4, "cpus": 2, "seconds": 1.0}
    text = report.markdown({"meta": meta, "figures": figures.complete(), "errors": {}, "details": {}})
    assert "| CPU µs per completed record (processes + broker) | 30.00 | share group (ratio: share ÷ pipeline) " \
           "| 6.00 | 0.2x |" in text
    assert "`cpu.pipeline_us_per_record` 30.00 · `cpu.pipeline_vs_share` 0.2" in text


def test_a_window_whose_counters_did_not_move_ends_at_the_first_count_that_did() -> None:
    """Seen in CI: a commit slower than the 2 s window left the end edge's count where the
    first edge found it (completed 0, rate None). The window runs on until the count moves."""
    from broker.bench.hops import extend_window

    counts = iter([100, 100, 180])  # the ledger's committed count at each retaken end edge
    edges = [(0.0, {}, Mark.of_count(100, 1.0)), (2.0, {}, Mark.of_count(100, 1.0))]
    taken: list[float] = []

    def edge() -> None:
        at = 2.0 + 0.5 * (len(taken) + 1)
        taken.append(at)
        n = next(counts)
        edges.append((at, {}, Mark.of_count(n, at)))

    assert extend_window(edges, edge, limit_s=5.0, pause_s=0.0) == pytest.approx(1.5)
    assert len(edges) == 2 and window(edges[0][2], edges[1][2])[0] == 80


def test_a_window_that_never_moves_gives_up_at_its_limit() -> None:
    from broker.bench.hops import extend_window

    edges = [(0.0, {}, Mark.of_count(7, 1.0)), (2.0, {}, Mark.of_count(7, 1.0))]
    extended = extend_window(edges, lambda: edges.append((2.0, {}, Mark.of_count(7, 1.0))), limit_s=0.05, pause_s=0.01)
    assert extended == 0.0 and len(edges) == 2 and window(edges[0][2], edges[1][2])[0] == 0
