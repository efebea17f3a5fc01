"""The Grafana dashboard queries only series the services export."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import AckerMetrics, AckerSnapshot, PartitionFigures, TaskMetrics, TopicEstimate
from broker.task import TaskCounters

DASHBOARD = Path(__file__).resolve().parents[2] / "docker" / "grafana" / "replaybroker-dashboard.json"


def _labels() -> dict[str, set[str]]:
    """Each series the services export by default (what a scrape of /metrics gets), with its
    labels."""
    acker = AckerMetrics(lambda: 10_000)
    acker.publish(AckerSnapshot({0: PartitionFigures({"completed": 1}, 1, 9_000)}, {("ns.acks", 0): 3},
                                {"orders": TopicEstimate(6_000, 1_500.0, 300)}, {"completed": 1}))
    acker.commit_seconds.observe(0.01)
    task = TaskMetrics(TaskCounters)
    labels: dict[str, set[str]] = {}
    for registry in (acker.registry, task.registry):
        for f in text_string_to_metric_families(generate_latest(registry).decode()):
            for s in f.samples:
                labels.setdefault(s.name, set()).update(s.labels)
    return labels


def _exported() -> set[str]:
    return set(_labels())


def test_every_series_the_dashboard_queries_is_exported() -> None:
    text = DASHBOARD.read_text()
    queried = set(re.findall(r"replaybroker_[a-z_]+", text))
    dashboard = json.loads(text)
    assert queried and {"datasource"} <= {v["name"] for v in dashboard["templating"]["list"]}
    assert queried <= _exported(), queried - _exported()


def test_every_label_the_dashboard_groups_by_is_one_of_the_series() -> None:
    """``sum by (partition) (x)`` of a series without that label draws one line, not many."""
    labels = _labels()
    grouped = re.findall(r"by \(([^)]*)\) \((?:rate\()?(replaybroker_[a-z_]+)", DASHBOARD.read_text())
    assert grouped
    for by, series in grouped:
        wanted = {name.strip() for name in by.split(",")} - {"instance", "job"}
        assert wanted <= labels[series], (series, wanted - labels[series])
