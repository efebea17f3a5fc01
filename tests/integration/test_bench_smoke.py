"""``replaybroker bench --smoke`` (``--quick`` with smaller sizes) end to end, so the harness
cannot rot. No timing is asserted: the figures only have to exist and be positive numbers, or
say why they are unavailable."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from broker.bench.figures import FIGURE_KEYS

pytestmark = pytest.mark.integration

# Figures that may legitimately be missing in a quick run on a CI broker.
MAY_BE_UNAVAILABLE = {
    # the share-group baseline needs a Kafka >= 4.1 with share groups enabled
    "throughput.share_rps",
    "throughput.pipeline_vs_share",
    # 10^7 pending entries are skipped in --quick, and so is the takeover of 10^6
    *(k for k in FIGURE_KEYS if k.startswith(("fold.1e7.", "takeover.1e6."))),
    # bytes on disk and the broker's CPU are read on the broker's host: a remote test cluster
    *(k for k in FIGURE_KEYS if k.startswith("cost.") and ("bytes" in k or "broker_cpu" in k)),
    *(k for k in FIGURE_KEYS if k.startswith("cpu.")),
    "cost.broker_vs_skeleton",
    # the broker's own request counters are read only on the bench's own broker (bench.requests)
    *(k for k in FIGURE_KEYS if k.startswith("requests.")),
    # the scale section runs only when named (--only scale: a 3-broker cluster of its own)
    *(k for k in FIGURE_KEYS if k.startswith("scale.")),
}


# Counts that are rightly 0 (replays of records that completed).
MAY_BE_ZERO = {"replay.fixed_spurious_per_1e5", "replay.adaptive_spurious_per_1e5"}


def test_bench_quick(bootstrap: str, tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "broker.cli", "bench", "--smoke", "--json",
         "--bootstrap", bootstrap, "--results-dir", str(results)],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert proc.returncode == 0, f"bench failed ({proc.returncode}):\n{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"--json prints one JSON object, got {len(lines)} lines"
    result = json.loads(lines[0])

    # What the bench printed while it ran: the first thing to read when an assertion fails.
    trail = f"\n--- bench stderr (end) ---\n{proc.stderr[-3000:]}"
    assert result["errors"] == {}, f"bench sections failed: {result['errors']}{trail}"
    figures = result["figures"]
    assert set(FIGURE_KEYS) <= set(figures), f"missing figures: {set(FIGURE_KEYS) - set(figures)}"
    for key in FIGURE_KEYS:
        entry = figures[key]
        value = entry["value"]
        if value is None:
            assert isinstance(entry.get("unavailable"), str) and entry["unavailable"], f"{key}: no reason"
            spark_missing = key.startswith("spark.") and entry["unavailable"].startswith("Spark is not available")
            assert key in MAY_BE_UNAVAILABLE or spark_missing, f"{key} unavailable: {entry['unavailable']}{trail}"
        else:
            positive = value >= 0 if key in MAY_BE_ZERO else value > 0
            assert isinstance(value, int | float) and math.isfinite(value) and positive, f"{key}: {value!r}{trail}"
            assert entry["unit"]

    files = result["files"]
    assert Path(files["json"]).is_file() and Path(files["json"]).parent == results
    assert json.loads(Path(files["json"]).read_text())["figures"].keys() == figures.keys()
    markdown = Path(files["markdown"]).read_text()
    assert "| figure | value | baseline |" in markdown
    assert len(files["plots"]) >= 4
    for plot in files["plots"]:
        data = Path(plot).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", plot
    # The spark section: each figure a number or an explicit reason, and the acked and the plain
    # query read the same rows (same input, same run).
    spark = {k: v for k, v in figures.items() if k.startswith("spark.")}
    assert {"spark.acked_vs_plain", "spark.sink_batch_growth", "spark.acked_rps", "spark.plain_rps"} <= set(spark)
    for key, entry in spark.items():
        assert entry["value"] is not None or entry.get("unavailable"), f"{key}: {entry}"
    if figures["spark.acked_rps"]["value"] is not None:
        assert figures["spark.acked_rows_per_batch"]["value"] == figures["spark.plain_rows_per_batch"]["value"]
        assert figures["spark.acked_vs_plain"]["target"] == ">= 0.8"
        assert figures["spark.sink_batch_growth"]["target"] == "<= 1.5"
        assert "Spark (`" in markdown
    assert sorted(p.name for p in results.glob("*.png")) == sorted(Path(p).name for p in files["plots"])
