"""An App's console role on a real Kafka: it serves the namespace's pages next to the other
roles, and stops with them."""

from __future__ import annotations

import base64
import re
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from broker.acker import Acker, AckerConfig
from broker.app import App
from broker.dev.kafka_local import free_port
from broker.dev.testing import unique_name
from broker.settings import KafkaSettings
from tests.integration.ground_truth import group_owners

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


def test_the_overview_shows_which_ackers_keep_standbys(bootstrap: str, tmp_path: Path) -> None:
    # Ground truth: how each acker was started, and the partitions Kafka's group coordinator
    # assigned to each (by group.instance.id, which the standby mark does not touch).
    settings = KafkaSettings.from_env(bootstrap)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"operator={TOKEN}\n")
    app = App(unique_name("cstb"), settings=settings, ledger_partitions=4)
    app.acker(instance_id="a1", standby=True)
    port = free_port()
    app.console(port=port, tokens_file=str(tokens), index=str(tmp_path / "index.sqlite"), sample_every_s=1)
    admin = AdminClient(settings.client_config())
    with app.run_in_background(["acker", "console"]), \
            Acker(settings, app.ns, AckerConfig(instance_id="a2")).run_in_background():
        group, persist = f"{app.ns.name}.acker", re.escape(app.ns.persist)
        deadline = time.monotonic() + 90
        while True:  # until both own some of the 4 (the range assignor) and the page says so
            owners = group_owners(admin, group, app.ns.persist)
            owned = {name: sum(1 for o in owners.values() if o == f"{group}.{name}") for name in ("a1", "a2")}
            expected = [rf"<td>{name}</td><td>[^<]*</td><td>[^<]*{persist}: {owned[name]} [^<]*</td><td>{standby}</td>"
                        for name, standby in (("a1", "yes"), ("a2", "no"))]
            try:
                _, body = get(port, "/")
            except OSError:
                body = ""
            rows = re.findall(r'<tr class="acker">(.*?)</tr>', body)
            if (len(owners) == 4 and min(owned.values()) > 0 and len(rows) == 2
                    and all(any(re.fullmatch(e, r) for r in rows) for e in expected)):
                break
            assert time.monotonic() < deadline, f"the Overview's ackers: {rows}; Kafka's owners: {owners}"
            time.sleep(0.5)
        assert "2 acker instance(s)" in body and '<span id="standbys">1</span> keeping standbys' in body
