"""The Prometheus text of the failure policy's series (issue 43 item 5): the attempts histogram
and the failures by class from the partitions' counters, the two waiting gauges apart, and a
task's failures by class (outage among them)."""

from __future__ import annotations

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import AckerMetrics, AckerSnapshot, PartitionFigures, TaskMetrics
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
    got = _samples(acker.registry)
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
    got = _samples(acker.registry)
    by_class = {c: got[("replaybroker_acker_failures_total", (("class", c), ("partition", "3")))]
                for c in ("transient", "timeout", "rejected")}
    assert by_class == {"transient": 4, "timeout": 3, "rejected": 2}
    assert got[("replaybroker_acker_replays_waiting", (("partition", "3"),))] == 4  # due, held back
    assert got[("replaybroker_acker_replays_backing_off", (("partition", "3"),))] == 9


def test_a_partition_without_the_counters_exports_zeros() -> None:
    acker = AckerMetrics(lambda: 0)
    acker.publish(AckerSnapshot({0: PartitionFigures({}, 0, None)}))
    got = _samples(acker.registry)
    assert got[("replaybroker_acker_attempts_count", (("outcome", "dlq"), ("partition", "0")))] == 0
    assert got[("replaybroker_acker_failures_total", (("class", "timeout"), ("partition", "0")))] == 0


def test_a_tasks_failures_by_class_count_its_outage_tries() -> None:
    counters = TaskCounters(failed=5, rejected=2, outage_tries=11)
    got = _samples(TaskMetrics(lambda: counters).registry)
    assert {c: got[("replaybroker_task_failures_total", (("class", c),))] for c in ("transient", "rejected", "outage")} == {
        "transient": 5, "rejected": 2, "outage": 11,
    }
