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


def _exported() -> set[str]:
    acker = AckerMetrics(lambda: 10_000)
    acker.publish(AckerSnapshot({0: PartitionFigures({"completed": 1}, 1, 9_000)}, {("ns.acks", 0): 3},
                                {"orders": TopicEstimate(6_000, 1_500.0, 300)}))
    acker.commit_seconds.observe(0.01)
    task = TaskMetrics(TaskCounters)
    return {
        s.name
        for registry in (acker.registry, task.registry)
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
    }


def test_every_series_the_dashboard_queries_is_exported() -> None:
    text = DASHBOARD.read_text()
    queried = set(re.findall(r"replaybroker_[a-z_]+", text))
    dashboard = json.loads(text)
    assert queried and {"datasource"} <= {v["name"] for v in dashboard["templating"]["list"]}
    assert queried <= _exported(), queried - _exported()
