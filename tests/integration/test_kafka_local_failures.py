"""Launcher failures with real Maven and a real broker: a Maven failure names the artifact,
a taken port means another port, not a crash."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from broker.dev import kafka_local, maven
from broker.errors import LocalKafkaError

pytestmark = pytest.mark.integration


def test_maven_failure_names_the_artifact(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("REPLAYBROKER_HOME", str(tmp_path))
    with pytest.raises(LocalKafkaError, match=re.escape("org.apache.kafka:kafka-does-not-exist:0.0.1")):
        maven.resolve_classpath(
            "bogus", [("org.apache.kafka", "kafka-does-not-exist", "0.0.1")]
        )


def test_a_taken_port_means_another_port(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    taken = blocker.getsockname()[1]
    ports = iter([taken, kafka_local.free_port()])
    real_free_port = kafka_local.free_port

    def first_taken() -> int:
        return next(ports, None) or real_free_port()

    monkeypatch.setattr(kafka_local, "free_port", first_taken)
    kafka = kafka_local.LocalKafka(tmp_path / "kafka")
    try:
        state = kafka.start()
        assert state.port != taken
        assert kafka_local.running_state(kafka.run_dir) is not None
    finally:
        kafka.stop()
        blocker.close()
    assert kafka_local.running_state(kafka.run_dir) is None
