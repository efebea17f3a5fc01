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


def test_failure_policy_waits_out_an_outage_and_rejects_what_fails_every_time(bootstrap: str) -> None:
    """The service is down 5 s while orders arrive. Without the policy the orders of the outage
    burn their attempts into the DLQ while the service is called over and over; with it no valid
    order is dead-lettered, the service is tried a few times, not once per attempt, a malformed
    order takes one attempt, and a flaky one's attempts are spaced by the back-off."""
    args = ("--records", "600", "--rate", "100", "--down", "1:6")
    without = run_example("failure_policy.py", bootstrap, *args, "--no-policy")
    assert without["lost"] == 0 and without["dlq_valid"] > 0 and without["malformed_attempts_max"] == 6
    policy = run_example("failure_policy.py", bootstrap, *args)
    assert policy["lost"] == 0 and policy["dlq_valid"] == 0 and policy["dlq_malformed"] == 6
    assert policy["completed"] == 594 and policy["malformed_attempts_max"] == 1
    assert policy["calls_while_down"] < without["calls_while_down"] / 10
    # DEFAULT_RETRY: 0.5 s, 1 s, 2 s (jitter 0.2) - each gap at least 80 % of its back-off.
    assert [g >= 0.8 * b for g, b in zip(policy["flaky_gaps_s"], (0.5, 1.0, 2.0), strict=True)] == [True] * 3


def test_failure_policy_waits_each_back_off_as_its_policy_says(bootstrap: str) -> None:
    """No outage, 20 orders failed on their first three attempts among 600 (1 % rejected): each
    attempt of each is delivered its policy's back-off after the one before it (DEFAULT_RETRY:
    0.5 s, 1 s, 2 s, jitter 0.2), within 20 % and 0.5 s - from when the hop saw them."""
    policy = run_example("failure_policy.py", bootstrap, "--records", "600", "--rate", "100", "--down", "0:0",
                         "--flaky-every", "30")
    assert policy["lost"] == 0 and policy["dlq_valid"] == 0 and policy["dlq_malformed"] == 6
    each = policy["flaky_gaps_each_s"]
    assert len(each) == 20 and all(len(g) == 3 for g in each), each
    off = [(i, g) for i, g in enumerate(each)
           if not all(0.8 * b <= x <= 1.2 * b + 0.5 for x, b in zip(g, (0.5, 1.0, 2.0), strict=True))]
    assert not off, off
