"""One Kafka port per service (broker.kafka_port): the services reach Kafka through what they
were handed, the real clients by default; the in-memory fakes offer every call of it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from broker.acker import Acker, AckerConfig
from broker.app import App
from broker.bridge import Bridge, BridgeConfig
from broker.kafka_port import KafkaClients, KafkaPort
from broker.settings import KafkaSettings
from broker.source import Source
from broker.task import Task
from tests.unit.fakes import FakeKafka
from tests.unit.log_cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
PORT_CALLS = sorted(n for n, _ in inspect.getmembers(KafkaPort, inspect.isfunction) if not n.startswith("_"))


def test_the_port_has_the_calls_the_services_make() -> None:
    assert PORT_CALLS == [
        "check", "consumer", "consumer_group_protocol", "delete_retention_ms", "max_message_bytes",
        "partition_counts", "producer", "set_group_timeouts", "watermarks",
    ]


@pytest.mark.parametrize("port", [KafkaClients, Cluster, FakeKafka])
def test_every_port_offers_every_call_with_its_parameters(port: type) -> None:
    for name in PORT_CALLS:
        want = inspect.signature(getattr(KafkaPort, name)).parameters
        got = inspect.signature(getattr(port, name)).parameters
        assert list(got) == list(want), (port.__name__, name)


def test_services_default_to_the_real_clients_of_their_settings() -> None:
    settings = KafkaSettings("fake:9092")
    acker = Acker(settings, "unit", AckerConfig(instance_id="a"))
    task = Task(settings, "unit", ["orders"], "g", lambda r, c: None)
    source = Source(settings, "unit")
    bridge = Bridge(settings, "unit", BridgeConfig(input_topic="legacy"))
    for service in (acker, task, source, bridge):
        assert isinstance(service.kafka, KafkaClients) and service.kafka.settings is settings


def test_a_service_makes_its_clients_with_the_port_it_was_handed() -> None:
    cluster = Cluster()
    acker = Acker(KafkaSettings("fake:9092"), "unit", AckerConfig(instance_id="a"), kafka=cluster)
    task = Task(KafkaSettings("fake:9092"), "unit", ["orders"], "g", lambda r, c: None, kafka=cluster)
    made = {id(c) for c in [*cluster.producers, *cluster.consumers]}
    assert id(acker.live.producer) in made and id(acker.live.consumer) in made
    assert id(task._producer) in made and id(task._consumer) in made
    assert len(cluster.consumers) == 4  # the acker's group, restorer and fetcher; the task's group


def test_a_bridge_and_its_source_make_their_clients_with_the_port_they_were_handed() -> None:
    cluster = Cluster()
    bridge = Bridge(KafkaSettings("fake:9092"), "unit", BridgeConfig(input_topic="legacy"), kafka=cluster)
    assert bridge.source.kafka is cluster
    assert bridge._consumer in cluster.consumers and bridge.source._producer in cluster.producers


def test_an_app_hands_its_port_to_every_service() -> None:
    cluster = Cluster()
    app = App("unit", settings=KafkaSettings("fake:9092"), kafka=cluster)
    orders = app.topic("orders")
    app.task("copy", [orders], lambda r, c: None)
    app.acker()
    assert app.source().kafka is cluster
    assert all(app.service(role).kafka is cluster for role in app.roles)


SERVICE_MODULES = sorted(
    str(p.relative_to(ROOT)) for p in [
        *(ROOT / "broker" / "acker").glob("*.py"),
        *(ROOT / "broker" / "task").glob("*.py"),
        *(ROOT / "broker" / "source").glob("*.py"),
        *(ROOT / "broker" / name for name in ("markers.py", "delivery.py", "bridge.py", "app.py")),
    ]
)
CLIENTS = {"Producer", "Consumer", "AdminClient"}
LOOKUPS = {
    "broker.kafka_io": {"partition_counts", "watermarks", "delete_retention_ms", "max_message_bytes",
                        "consumer_group_protocol", "set_group_timeouts", "configs_of"},
    "broker.topics": {"check"},
}


def kafka_reached_around_the_port(source: str) -> list[str]:
    """The clients a module makes itself and the look-ups it imports, instead of asking its
    port."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CLIENTS:
            found.append(f"{node.func.id}() at line {node.lineno}")
        elif isinstance(node, ast.ImportFrom) and node.module in LOOKUPS:
            found += [f"{node.module}.{a.name}" for a in node.names if a.name in LOOKUPS[node.module]]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id in ("kafka_io", "topics") and node.attr in LOOKUPS[f"broker.{node.value.id}"]):
            found.append(f"{node.value.id}.{node.attr} at line {node.lineno}")
    return found


@pytest.mark.parametrize("module", SERVICE_MODULES)
def test_the_services_reach_kafka_only_through_their_port(module: str) -> None:
    """A call made around the port would escape every fake handed in (STYLE.md: a seam is a
    constructor argument): the broker.app module builds the services, it checks through
    ``topics.check`` only without a port."""
    found = kafka_reached_around_the_port((ROOT / module).read_text())
    assert found == ([] if module != "broker/app.py" else ["broker.topics.check"])


def test_the_scan_sees_a_client_made_and_a_look_up_imported() -> None:
    source = "from broker.kafka_io import partition_counts\nfrom broker import kafka_io\np = Producer({})\nkafka_io.watermarks(s)"
    assert kafka_reached_around_the_port(source) == [
        "broker.kafka_io.partition_counts", "Producer() at line 3", "kafka_io.watermarks at line 4",
    ]
