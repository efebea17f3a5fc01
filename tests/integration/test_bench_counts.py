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


def test_the_brokers_request_counts_agree_with_its_log(tmp_path: Path) -> None:
    """bench.requests reads the broker's own counters (a broker of the test's own: a shared one
    counts other clients too); the records it saw produced to ns.persist must be those its
    log appended (bench.cost, from the log end offsets) in the same drained run."""
    from broker.dev.kafka_local import LocalKafka
    from broker.dev.maven import kafka_classpath

    kafka_classpath()  # resolved once per machine: outside the test's own broker's start-up
    with LocalKafka(tmp_path / "kafka") as kafka:
        state = kafka.state
        assert state is not None
        env = Env(state.bootstrap, KafkaSettings.from_env(state.bootstrap), 2, tmp_path, kafka_pid=state.pid,
                  request_systems=("pipeline",))
        run = run_hop(env, "pipeline", records=600, rate=600.0, drain=True)
    assert run.requests is not None and run.cost is not None
    counted = run.requests
    assert counted["requests_per_1k"]["Produce"] > 0 and counted["requests_per_1k"]["FetchConsumer"] > 0
    assert counted["requests_per_1k"]["EndTxn"] > 0  # the acker's transactions
    assert counted["produce"]["records_per_request"] >= 1
    # a persist record and its tombstone, and the acker's transaction markers (the broker counts
    # a marker as a record appended)
    persist = run.cost["topics"]["persist"]
    appended = persist["writes_per_record"] + persist["markers_per_record"]
    assert abs(counted["topics"]["persist"]["records_in_per_record"] - appended) < 0.005, (counted, run.cost)
