"""An App's console role on a real Kafka: it serves the namespace's pages next to the other
roles, and stops with them."""

from __future__ import annotations

import base64
import time
import urllib.request
from pathlib import Path

import pytest

from broker.app import App
from broker.dev.kafka_local import free_port
from broker.dev.testing import unique_name
from broker.settings import KafkaSettings

pytestmark = pytest.mark.integration
TOKEN = "operator-" + "o" * 24


def get(port: int, path: str) -> tuple[int, str]:
    auth = base64.b64encode(f"operator:{TOKEN}".encode()).decode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Basic {auth}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, response.read().decode()


def test_the_console_role_serves_the_namespace(bootstrap: str, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"operator={TOKEN}\n")
    app = App(unique_name("capp"), settings=KafkaSettings.from_env(bootstrap), ledger_partitions=2)
    app.topic("orders", partitions=2)
    port = free_port()
    app.console(port=port, tokens_file=str(tokens), index=str(tmp_path / "index.sqlite"), sample_every_s=1)
    with app.run_in_background(["console"]):
        deadline = time.monotonic() + 30
        while True:
            try:
                status, body = get(port, "/healthz")
                break
            except OSError:
                assert time.monotonic() < deadline, "the console did not start"
                time.sleep(0.2)
        assert (status, body) == (200, "ok\n")
        status, body = get(port, "/dead-letters")
        assert status == 200 and app.ns.name in body and '<span id="total">0</span>' in body
    with pytest.raises(OSError):
        get(port, "/healthz")
