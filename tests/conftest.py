"""Session fixtures: one Kafka broker and (in tests/e2e) one Spark session per test run."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from broker.dev.testing import KafkaCluster, create_topics, kafka_cluster, unique_name


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaCluster]:
    """The shared broker; see broker.testing for how it is chosen. In CI a broker that does
    not start fails the run: integration tests are never skipped."""
    with kafka_cluster() as cluster:
        os.environ.setdefault("REPLAYBROKER_TEST_BOOTSTRAP", cluster.bootstrap_servers)
        yield cluster


@pytest.fixture(scope="session")
def bootstrap(kafka: KafkaCluster) -> str:
    return kafka.bootstrap_servers


@pytest.fixture
def new_topic(bootstrap: str) -> Callable[..., str]:
    """Create a uniquely named topic: ``new_topic(partitions=3, config={...})``."""

    def make(partitions: int = 1, config: dict[str, str] | None = None, prefix: str = "t") -> str:
        name = unique_name(prefix)
        create_topics(bootstrap, {name: partitions}, config)
        return name

    return make
