"""Every example runs, as a user runs it, against the shared test broker: exit code and the
JSON summary on its last line (ground truth: nothing lost)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, bootstrap: str, *args: str, timeout_s: float = 300) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--bootstrap", bootstrap, *args],
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_quickstart_completes_or_dead_letters_every_record(bootstrap: str) -> None:
    summary = run_example("quickstart.py", bootstrap, "--records", "600")
    # ids 0, 250, 500 always fail: dead-lettered after 3 attempts (2 replays each); 100, 200,
    # 300, 400 fail on their first attempt only (1 replay each). Any more replays would be
    # timeouts of a loaded machine, never a loss.
    assert summary["replayed"] >= 10
    assert {k: v for k, v in summary.items() if k != "replayed"} == {"records": 600, "completed": 597, "dlq": 3, "lost": 0}


def test_bridge_example_puts_an_existing_topic_under_the_guarantee(bootstrap: str) -> None:
    summary = run_example("bridge_pipeline.py", bootstrap, "--records", "300")
    assert summary["lost"] == 0 and summary["completed"] == summary["records"] == 300
