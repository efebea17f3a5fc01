"""Topic replication on the shared (single-node) broker: replication 1 with a warning, a
replication the cluster cannot hold refused, ``topics check`` reporting the layout."""

from __future__ import annotations

import subprocess
import sys

import pytest

from broker import topics
from broker.dev.testing import unique_name
from broker.errors import TopologyError
from broker.settings import KafkaSettings

pytestmark = pytest.mark.integration


def test_single_broker_layout_is_replication_one_with_a_warning(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("rep"))
    data = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {data: 2})
    problems, warnings = topics.check_replication(settings, ns, [data])
    assert problems == []
    assert len(warnings) == 1 and ns.persist in warnings[0] and "replication factor 1" in warnings[0]
    out = subprocess.run(
        [sys.executable, "-m", "broker", "topics", "check", "--bootstrap", bootstrap, "--namespace", ns.name,
         "--data-topic", f"{data}:2"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "warning:" in out.stderr and "ok, 2 ledger partitions" in out.stdout


def test_a_replication_the_cluster_cannot_hold_is_refused(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("rep"))
    with pytest.raises(TopologyError, match="needs at least 3 brokers"):
        topics.create(settings, ns, 2, replication=3)
    assert topics.partition_counts(settings, [ns.persist])[ns.persist] is None  # nothing created
