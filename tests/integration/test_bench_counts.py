"""The bench counts completions without reading them (broker/bench/completions.py): the
acker's committed counters must count what a tail of the persist topic reads, and the
skeleton's acker must count its completions. No timing is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.bench.hops import Env, run_hop
from broker.settings import KafkaSettings

pytestmark = pytest.mark.integration


def test_the_acker_counters_count_what_a_tail_reads(bootstrap: str, tmp_path: Path) -> None:
    env = Env(bootstrap, KafkaSettings.from_env(bootstrap), 2, tmp_path)
    run = run_hop(env, "pipeline", records=600, rate=600.0, drain=True, tail="sample")
    assert run.check is not None and run.check["partition"] == 0
    # partition 0 of 2 holds about half of the 650 records (warm-up included)
    assert 100 < run.check["tail"] == run.check["counters"] < 650, run.check
    assert run.window is None  # a drained run has no throughput window
    assert run.recv.size < run.sent  # the tail sampled one partition


def test_throughput_runs_count_completions_in_their_window(bootstrap: str, tmp_path: Path) -> None:
    env = Env(bootstrap, KafkaSettings.from_env(bootstrap), 2, tmp_path)
    for system in ("pipeline", "skeleton"):
        run = run_hop(env, system, duration=3.0, warm=1.0)
        assert run.window is not None, system
        assert 0 < run.window.completed <= run.sent, (system, run.window)
        assert run.window.extended_s >= 0.0, (system, run.window)
        assert run.throughput() > 0 and run.window.mark_seconds > 0, (system, run.window)
        assert {"source", "task", "acker"} <= set(run.window.cpu_s), (system, run.window.cpu_s)
        assert run.recv.size == 0  # no tail ran
