"""A service started while its cluster cannot be reached waits for it (``--wait-for-kafka-ms``)
and starts once it answers, instead of exiting: here the cluster's bootstrap address starts
answering (a TCP relay to the test's Kafka) a few seconds after the acker was started."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from broker import topics
from broker.dev.testing import unique_name
from broker.settings import KafkaSettings

pytestmark = pytest.mark.integration


def relay(listener: socket.socket, target: tuple[str, int], stop: threading.Event) -> None:
    """Forward every connection accepted on ``listener`` to ``target``, both ways."""

    def pipe(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            client, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:  # closed by the test
            return
        upstream = socket.create_connection(target)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pipe, args=(a, b), daemon=True).start()


def test_an_acker_started_before_its_cluster_answers_waits_and_starts(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("wait"))
    topics.create(settings, ns, 2)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))  # the port is ours; nothing accepts on it until listen()
    port = listener.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    acker = subprocess.Popen(
        [sys.executable, "-m", "broker", "acker", "--namespace", ns.name, "--bootstrap", f"127.0.0.1:{port}",
         "--wait-for-kafka-ms", "60000"],
        stderr=subprocess.PIPE, text=True, env=env,
    )
    stop = threading.Event()
    try:
        time.sleep(3)  # refused meanwhile: the acker waits
        assert acker.poll() is None, acker.stderr.read() if acker.stderr else ""
        host, kafka_port = bootstrap.rsplit(":", 1)
        listener.listen()
        threading.Thread(target=relay, args=(listener, (host, int(kafka_port)), stop), daemon=True).start()
        assert acker.stderr is not None
        lines: list[str] = []
        deadline = time.monotonic() + 90
        while not any(f"serving {ns.name}" in line for line in lines):
            assert time.monotonic() < deadline and acker.poll() is None, "".join(lines)
            lines.append(acker.stderr.readline())
        assert any("trying again for up to 60s" in line for line in lines), "".join(lines)
        acker.send_signal(signal.SIGTERM)
        assert acker.wait(60) == 0
    finally:
        if acker.poll() is None:
            acker.kill()
            acker.wait()
        stop.set()
        listener.close()
