"""The console bench runs end to end at a small size (its figures go to docs/benchmarks.md)."""

from __future__ import annotations

from broker.bench.console import markdown, measure


def test_console_bench_fetches_every_page() -> None:
    result = measure(n=600, partitions=20, repeat=1)
    assert result["entries"] == 600 and len(result["pages_ms"]) == 10
    assert all(t["bytes"] > 0 for t in result["pages_ms"].values())
    assert "| dead letters, by header value |" in markdown(result)
