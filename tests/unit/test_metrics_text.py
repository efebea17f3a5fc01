"""The Prometheus text of the failure policy's series (issue 43 item 5): the attempts histogram
and the failures by class from the partitions' counters, the two waiting gauges apart, and a
task's failures by class (outage among them)."""

from __future__ import annotations

import urllib.request

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import AckerMetrics, AckerSnapshot, MetricsServer, PartitionFigures, TaskMetrics
from broker.task import TaskCounters


def _samples(registry: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()  # type: ignore[arg-type]
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text) for s in f.samples
    }


COUNTERS = {
    "completed": 10, "ended_completed_le_1": 7, "ended_completed_le_2": 2, "ended_completed_le_5": 1,
    "ended_completed_attempts": 7 + 4 + 5,
    "dlq": 2, "ended_dlq_le_5": 1, "ended_dlq_le_inf": 1, "ended_dlq_attempts": 5 + 1_200,
    "failed": 6, "failed_rejected": 2, "timed_out": 3,
}


def test_the_attempts_histogram_is_cumulative_per_outcome_and_partition() -> None:
    acker = AckerMetrics(lambda: 0)
    acker.publish(AckerSnapshot({3: PartitionFigures(COUNTERS, 0, None, 4, 9)}))
    got = _samples(acker.partitions_registry)
    completed = {le: got[("replaybroker_acker_attempts_bucket", (("le", le), ("outcome", "completed"), ("partition", "3")))]
                 for le in ("1.0", "2.0", "3.0", "5.0", "1000.0", "+Inf")}
    assert completed == {"1.0": 7, "2.0": 9, "3.0": 9, "5.0": 10, "1000.0": 10, "+Inf": 10}
    assert got[("replaybroker_acker_attempts_sum", (("outcome", "completed"), ("partition", "3")))] == 16
    assert got[("replaybroker_acker_attempts_count", (("outcome", "completed"), ("partition", "3")))] == 10
    dlq = (("outcome", "dlq"), ("partition", "3"))
    assert got[("replaybroker_acker_attempts_bucket", (("le", "1000.0"), *dlq))] == 1
    assert got[("replaybroker_acker_attempts_count", dlq)] == 2


def test_failures_by_class_and_the_two_waiting_gauges() -> None:
    acker = AckerMetrics(lambda: 0)
    acker.publish(AckerSnapshot({3: PartitionFigures(COUNTERS, 0, None, 4, 9)}))
    got = _samples(acker.partitions_registry)
    by_class = {c: got[("replaybroker_acker_failures_total", (("class", c), ("partition", "3")))]
                for c in ("transient", "timeout", "rejected")}
    assert by_class == {"transient": 4, "timeout": 3, "rejected": 2}
    assert got[("replaybroker_acker_replays_waiting", (("partition", "3"),))] == 4  # due, held back
    assert got[("replaybroker_acker_replays_backing_off", (("partition", "3"),))] == 9


def test_a_partition_without_the_counters_exports_zeros() -> None:
    acker = AckerMetrics(lambda: 0)
    acker.publish(AckerSnapshot({0: PartitionFigures({}, 0, None)}))
    got = _samples(acker.partitions_registry)
    assert got[("replaybroker_acker_attempts_count", (("outcome", "dlq"), ("partition", "0")))] == 0
    assert got[("replaybroker_acker_failures_total", (("class", "timeout"), ("partition", "0")))] == 0


def test_a_tasks_failures_by_class_count_its_outage_tries() -> None:
    counters = TaskCounters(failed=5, rejected=2, outage_tries=11)
    got = _samples(TaskMetrics(lambda: counters).registry)
    assert {c: got[("replaybroker_task_failures_total", (("class", c),))] for c in ("transient", "rejected", "outage")} == {
        "transient": 5, "rejected": 2, "outage": 11,
    }


# ------------------------------------------------------------- the default view: totals, worst


def _at_p1000(worst: int = 10) -> AckerMetrics:
    """An acker owning 1 000 partitions: partition i has i pending, the oldest i s old, and
    its two inputs i messages behind; its committed totals are apart from their counters."""
    acker = AckerMetrics(lambda: 2_000_000, worst=worst)
    acker.publish(AckerSnapshot(
        {i: PartitionFigures(COUNTERS, i, 2_000_000 - 1_000 * i, 1, 2, i % 3) for i in range(1_000)},
        {(topic, i): i for topic in ("ns.persist", "ns.acks") for i in range(1_000)},
        totals={"completed": 42, "failed": 5, "failed_rejected": 1, "ended_dlq_le_5": 3, "folded": 9},
    ))
    return acker


def test_a_scrape_at_p1000_is_the_totals_and_the_worst_ten_of_each_ranking() -> None:
    acker = _at_p1000()
    text = generate_latest(acker.registry).decode()
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(samples) < 200, len(samples)
    got = _samples(acker.registry)
    assert got[("replaybroker_acker_decisions_total", (("decision", "completed"),))] == 42
    assert got[("replaybroker_acker_failures_total", (("class", "transient"),))] == 4
    assert got[("replaybroker_acker_attempts_count", (("outcome", "dlq"),))] == 3
    assert got[("replaybroker_acker_folded_events_total", ())] == 9
    assert got[("replaybroker_acker_pending_entries", ())] == sum(range(1_000))
    assert got[("replaybroker_acker_oldest_pending_age_seconds", ())] == 999
    assert got[("replaybroker_acker_replays_backing_off", ())] == 2_000
    assert got[("replaybroker_acker_tasks_in_outage", ())] == 2
    assert got[("replaybroker_acker_input_lag_messages", (("topic", "ns.acks"),))] == sum(range(1_000))
    assert got[("replaybroker_acker_owned_partitions", ())] == 1_000
    worst = {labels: v for (name, labels), v in got.items() if name == "replaybroker_acker_worst_pending_entries"}
    assert worst == {(("partition", str(i)),): i for i in range(990, 1_000)}
    oldest = {labels for (name, labels) in got if name == "replaybroker_acker_worst_oldest_pending_age_seconds"}
    assert oldest == {(("partition", str(i)),) for i in range(990, 1_000)}
    lagging = {labels for (name, labels) in got if name == "replaybroker_acker_worst_input_lag_messages"}
    assert len(lagging) == 10 and all(int(dict(lab)["partition"]) >= 995 for lab in lagging)


def test_every_partition_is_served_at_partitions_all() -> None:
    acker = _at_p1000()
    server = MetricsServer(acker.registry, 0, addr="127.0.0.1", full=acker.partitions_registry)
    try:
        def scrape(query: str) -> str:
            url = f"http://127.0.0.1:{server.port}/metrics{query}"
            with urllib.request.urlopen(url, timeout=30) as response:
                return response.read().decode()

        default, every = scrape(""), scrape("?partitions=all")
    finally:
        server.close()
    assert 'replaybroker_acker_pending_entries{partition="999"} 999.0' in every
    assert 'replaybroker_acker_input_lag_messages{partition="7",topic="ns.persist"} 7.0' in every
    assert "replaybroker_acker_pending_entries 499500.0" in default
    assert 'partition="7"' not in default
    assert len(every.splitlines()) > 20 * len(default.splitlines())
