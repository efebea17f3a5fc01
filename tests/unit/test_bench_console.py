"""The console bench runs end to end at a small size (its figures go to docs/benchmarks.md)."""

from __future__ import annotations

from broker.bench.console import markdown, measure
from broker.bench.figures import CONSOLE_PAGES


def test_console_bench_fetches_every_page() -> None:
    result = measure(n=600, partitions=20, repeat=1)
    assert result["entries"] == 600 and len(result["pages_ms"]) == len(CONSOLE_PAGES)
    assert all(t["bytes"] > 0 for t in result["pages_ms"].values())
    assert "| dead letters, by header value |" in markdown(result)


def test_every_console_page_is_a_figure_of_the_bench() -> None:
    from broker.bench.console import record
    from broker.bench.figures import DEFAULT_SECTIONS, SPECS, Figures

    result = measure(n=400, partitions=10, repeat=1)
    assert sorted(t["key"] for t in result["pages_ms"].values()) == sorted(CONSOLE_PAGES)
    figures = Figures()
    record(figures, result)
    assert figures.value("console.dead_letters") == 400
    assert all(figures.value(f"console.{page}_median_ms") is not None for page in CONSOLE_PAGES)
    assert {k for k in SPECS if k.startswith("console.")} == set(figures.values)
    assert "console" in DEFAULT_SECTIONS
