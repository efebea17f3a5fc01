"""How the test Kafka is chosen: env var -> testcontainers (Docker answers) -> local launcher."""

from __future__ import annotations

import pytest

from broker.dev.testing import choose_backend, docker_available


def _no_docker() -> bool:
    return False


def _docker() -> bool:
    return True


def _must_not_ping() -> bool:
    raise AssertionError("the Docker engine must not be asked when the choice is already made")


@pytest.mark.parametrize(
    ("env", "ping", "expected"),
    [
        ({"KAFKA_BOOTSTRAP_SERVERS": "h:9092"}, _must_not_ping, "env"),
        ({}, _docker, "testcontainers"),
        ({}, _no_docker, "local"),
        ({"KAFKA_BOOTSTRAP_SERVERS": ""}, _no_docker, "local"),
        ({"REPLAYBROKER_KAFKA_BACKEND": "local", "KAFKA_BOOTSTRAP_SERVERS": "h:1"}, _must_not_ping, "local"),
        ({"REPLAYBROKER_KAFKA_BACKEND": "testcontainers"}, _must_not_ping, "testcontainers"),
    ],
)
def test_choose_backend(env: dict[str, str], ping, expected: str) -> None:
    assert choose_backend(env, ping) == expected


def test_unknown_forced_backend_is_an_error() -> None:
    with pytest.raises(ValueError, match="REPLAYBROKER_KAFKA_BACKEND"):
        choose_backend({"REPLAYBROKER_KAFKA_BACKEND": "zookeeper"}, _no_docker)


def test_docker_ping_without_an_engine_is_false(monkeypatch: pytest.MonkeyPatch) -> None:
    # A Docker CLI without an engine (this machine) or an unreachable host: no engine answers.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert docker_available(timeout=1) is False
    assert choose_backend({}, lambda: docker_available(timeout=1)) == "local"
