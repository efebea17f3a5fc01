"""The Kafka image (``replaybroker/kafka``) and a testcontainers container of it.

The image holds the embedded broker's Kafka: the jars Maven resolved (``kafka_classpath``) and
its ``server.properties`` (``kafka_local.SERVER_PROPERTIES``), ports and cluster id filled in
at start by the image's entrypoint from ``KAFKA_PORT``, ``KAFKA_CONTROLLER_PORT``,
``KAFKA_HOST`` and ``KAFKA_CLUSTER_ID``. It runs on the host network only: the ports it is
given are the ports clients use.

``python -m broker.dev.kafka_image DIR`` writes the image's build context (``docker/build``
adds ``docker/kafka/Dockerfile`` and its entrypoint) and prints the Kafka version.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from broker.dev.kafka_local import READY_TIMEOUT_S, SERVER_PROPERTIES, free_port, wait_ready
from broker.dev.maven import kafka_classpath
from broker.errors import LocalKafkaError

IMAGE = "replaybroker/kafka:latest"
DATA_DIR = "/var/lib/kafka/data"

# The broker logs to stdout (``docker logs``), its cleaner's progress included.
LOG4J2_PROPERTIES = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
"""


def write_context(directory: Path) -> str:
    """Jars (hard links where possible), ``server.properties.in`` and ``log4j2.properties``
    into ``directory``; returns the Kafka version."""
    version, jars = kafka_classpath()
    libs = directory / "libs"
    if libs.exists():
        shutil.rmtree(libs)
    libs.mkdir(parents=True)
    for jar in jars:
        target = libs / Path(jar).name
        try:
            os.link(jar, target)
        except OSError:
            shutil.copy2(jar, target)
    properties = SERVER_PROPERTIES.format(port="@PORT@", controller_port="@CONTROLLER_PORT@", data_dir=DATA_DIR)
    (directory / "server.properties.in").write_text(properties.replace("127.0.0.1", "@HOST@"))
    (directory / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
    (directory / "VERSION").write_text(version + "\n")
    return version


def _container_class() -> Any:
    # testcontainers starts a reaper container (testcontainers/ryuk) from a registry unless told
    # not to; containers here are stopped by the context manager instead.
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    from testcontainers.core.container import DockerContainer

    class KafkaImageContainer(DockerContainer):
        """``replaybroker/kafka`` on the host network, on two free loopback ports; ``start``
        returns once an admin client created a topic."""

        def __init__(self, image: str = IMAGE, **kwargs: Any) -> None:
            super().__init__(image, network_mode="host", **kwargs)
            self.port, self.controller_port = free_port(), free_port()
            while self.controller_port == self.port:
                self.controller_port = free_port()
            self.with_env("KAFKA_PORT", str(self.port))
            self.with_env("KAFKA_CONTROLLER_PORT", str(self.controller_port))

        def get_bootstrap_server(self) -> str:
            return f"127.0.0.1:{self.port}"

        def start(self) -> KafkaImageContainer:
            import docker.errors

            try:
                self.get_docker_client().client.images.get(self.image)
            except docker.errors.ImageNotFound:
                raise LocalKafkaError(f"no image {self.image}: build it with docker/build") from None
            super().start()
            try:
                wait_ready(self.get_bootstrap_server(), self._exit_code, time.monotonic() + READY_TIMEOUT_S)
            except LocalKafkaError as exc:
                logs = b"".join(self.get_logs()).decode(errors="replace").splitlines()[-20:]
                self.stop()
                raise LocalKafkaError(f"{exc}; last log lines:\n" + "\n".join(logs)) from exc
            return self

        def _exit_code(self) -> int | None:
            container = self.get_wrapped_container()
            container.reload()
            return None if container.status in ("created", "running") else int(container.attrs["State"]["ExitCode"])

    return KafkaImageContainer


def kafka_container(image: str = IMAGE) -> Any:
    """A not yet started ``KafkaImageContainer`` of ``image``."""
    return _container_class()(image)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m broker.dev.kafka_image CONTEXT_DIR", file=sys.stderr)
        return 2
    directory = Path(argv[0])
    directory.mkdir(parents=True, exist_ok=True)
    print(write_context(directory))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
