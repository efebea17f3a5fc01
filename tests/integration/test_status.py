"""``replaybroker status`` reports what Kafka holds: pending from live persist records, decisions
from the acker's exactly-once counters in the changelog, the DLQ by reading it."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from broker.dev.demo import run_demo

pytestmark = pytest.mark.integration


def test_status_after_a_demo_run_matches_the_demo(bootstrap: str) -> None:
    summary = run_demo(bootstrap, 1500, fail_rate=0.1, timeout_s=10.0, partitions=3)
    assert summary["lost"] == 0 and summary["completed"] == 1500
    out = subprocess.run(
        [sys.executable, "-m", "broker.cli", "status", "--bootstrap", bootstrap,
         "--namespace", summary["namespace"], "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    status = orjson.loads(out.stdout)
    assert status["ledger_partitions"] == 3
    assert status["pending"] == 0 and status["pending_per_partition"] == [0, 0, 0]
    assert status["oldest_pending_age_s"] is None
    assert status["completed"] == 1500
    assert status["replayed"] == summary["replayed"] > 0
    assert status["counters"]["failed"] == summary["replayed"]
    assert status["counters"]["registered"] == 1500 + summary["replayed"]
    assert status["dlq"] == 0
    assert set(status["sources"]) >= {"pending", "completed", "replayed", "dlq"}
    human = subprocess.run(
        [sys.executable, "-m", "broker.cli", "status", "--bootstrap", bootstrap,
         "--namespace", summary["namespace"]],
        capture_output=True, text=True, timeout=120, check=True,
    )
    assert "live records of" in human.stdout and "completed: 1500" in human.stdout
