"""examples/spark_pipeline.py runs as a user runs it (its own Spark session, a subprocess)
against the shared test broker: exit code and the JSON summary on its last line."""

from __future__ import annotations

import pytest

from tests.integration.test_examples import run_example

pytestmark = pytest.mark.e2e


def test_spark_example_completes_or_dead_letters_every_record(bootstrap: str) -> None:
    summary = run_example("spark_pipeline.py", bootstrap, "--records", "500", timeout_s=600)
    # 0 and 250 are unparsable: failed on both attempts (one replay each), dead-lettered. More
    # replays are timeouts of a slow machine (its first micro-batches), not losses.
    assert summary["replayed"] >= 2
    assert {k: v for k, v in summary.items() if k != "replayed"} == {"records": 500, "completed": 498, "dlq": 2, "lost": 0}
