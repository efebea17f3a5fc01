"""The embedded Kafka's failures say what is wrong and what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.dev import kafka_local, maven
from broker.errors import LocalKafkaError


def test_missing_java_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    with pytest.raises(LocalKafkaError, match=r"no `java` on PATH.*JDK 17"):
        kafka_local.require_java()
    with pytest.raises(LocalKafkaError, match="java"):
        kafka_local.LocalKafka(tmp_path / "run").start()


def test_missing_maven_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("REPLAYBROKER_HOME", str(tmp_path / "home"))
    with pytest.raises(LocalKafkaError, match=r"no `mvn` on PATH"):
        maven.resolve_classpath("x", [("org.example", "nothing", "1")])


def test_free_port_is_bindable() -> None:
    import socket

    port = kafka_local.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_state_of_a_dead_broker_is_not_running(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(
        '{"pid": 999999999, "bootstrap": "127.0.0.1:1", "port": 1, "controller_port": 2,'
        ' "run_dir": "x", "kafka_version": "4", "cluster_id": "c", "started_at": 0}'
    )
    assert kafka_local.read_state(tmp_path) is not None
    assert kafka_local.running_state(tmp_path) is None
    (tmp_path / "state.json").write_text("not json")
    assert kafka_local.read_state(tmp_path) is None
