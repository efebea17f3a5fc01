"""Kafka for integration tests (ours and our users'): one broker chosen at runtime.

1. ``KAFKA_BOOTSTRAP_SERVERS`` is set -> use that cluster;
2. else a Docker engine answers -> a testcontainers Kafka container: the locally built
   ``replaybroker/kafka`` (``docker/build``; the embedded broker's Kafka 4.x, KRaft, on the host
   network), or the image ``REPLAYBROKER_KAFKA_IMAGE`` names (an upstream one such as
   ``apache/kafka:4.1.0``, run by testcontainers' ``KafkaContainer``, where a registry is at hand);
3. else -> the embedded local Kafka (``broker.kafka_local``).

``REPLAYBROKER_KAFKA_BACKEND`` (``env``, ``testcontainers``, ``local``) forces one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

BACKENDS = ("env", "testcontainers", "local")


def docker_available(timeout: float = 3.0) -> bool:
    """True when a Docker engine answers a ping (a CLI without an engine is not enough)."""
    try:
        import docker

        client = docker.from_env(timeout=int(timeout))  # type: ignore[attr-defined]
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - any failure means "no engine"
        return False


def choose_backend(
    env: Mapping[str, str] | None = None, docker_ping: Callable[[], bool] = docker_available
) -> str:
    """Which Kafka the tests use; pure so the choice itself is unit-tested."""
    env = os.environ if env is None else env
    forced = env.get("REPLAYBROKER_KAFKA_BACKEND")
    if forced:
        if forced not in BACKENDS:
            raise ValueError(f"REPLAYBROKER_KAFKA_BACKEND={forced!r}; expected one of {BACKENDS}")
        return forced
    if env.get("KAFKA_BOOTSTRAP_SERVERS"):
        return "env"
    if docker_ping():
        return "testcontainers"
    return "local"


@dataclass(frozen=True)
class KafkaCluster:
    bootstrap_servers: str
    backend: str


@contextlib.contextmanager
def kafka_cluster(backend: str | None = None) -> Iterator[KafkaCluster]:
    """Yield a running Kafka for the duration of a test session."""
    backend = backend or choose_backend()
    log.warning("Kafka for tests: %s", backend)
    if backend == "env":
        yield KafkaCluster(os.environ["KAFKA_BOOTSTRAP_SERVERS"], backend)
    elif backend == "testcontainers":
        from broker.dev.kafka_image import IMAGE, kafka_container

        image = os.environ.get("REPLAYBROKER_KAFKA_IMAGE", IMAGE)
        ours = image.split(":")[0] == IMAGE.split(":")[0]
        with kafka_container(image) if ours else _upstream_container(image) as started:
            yield KafkaCluster(started.get_bootstrap_server(), backend)
    elif backend == "local":
        from broker.dev.kafka_local import LocalKafka

        with tempfile.TemporaryDirectory(prefix="replaybroker-kafka-") as run_dir:
            kafka = LocalKafka(run_dir)
            kafka.start()
            try:
                yield KafkaCluster(kafka.bootstrap, backend)
            finally:
                kafka.stop()
    else:
        raise ValueError(f"unknown Kafka backend {backend!r}")


def _upstream_container(image: str) -> Any:
    """testcontainers' ``KafkaContainer`` (KRaft) of an upstream image, e.g.
    ``apache/kafka:4.1.0`` or ``confluentinc/cp-kafka:7.9.0``, tuned like the embedded broker."""
    from testcontainers.community.kafka import KafkaContainer

    container = KafkaContainer(image).with_kraft()
    for name, value in {
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_LOG_CLEANER_BACKOFF_MS": "200",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
    }.items():
        container.with_env(name, value)
    return container


def unique_name(prefix: str = "t") -> str:
    """A topic / group / namespace name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def create_topics(
    bootstrap_servers: str,
    topics: Mapping[str, int],
    config: Mapping[str, str] | None = None,
    *,
    replication: int = 1,
) -> None:
    """Create ``{name: partitions}`` and wait until they exist."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from broker.kafka_io import wait_visible
    from broker.kafka_log import client_logging

    admin = AdminClient({"bootstrap.servers": bootstrap_servers, **client_logging()})
    futures = admin.create_topics(
        [NewTopic(n, p, replication, config=dict(config or {})) for n, p in topics.items()],
        operation_timeout=30,
    )
    for future in futures.values():
        future.result(timeout=30)
    # Creation returns before the broker's metadata shows the topics: a client asking at once
    # (a Source checking its data topic) could be told they do not exist.
    wait_visible(admin, topics)


def stop_processes(procs: Iterable[subprocess.Popen[bytes]], timeout_s: float = 30.0) -> None:
    """SIGTERM every process still running, wait for each, SIGKILL what does not exit."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
