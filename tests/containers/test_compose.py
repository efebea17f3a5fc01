"""docker/compose.yaml runs the product: records go through while an acker container is
killed, and the topics show every record completed exactly once; Prometheus scrapes the
services and answers the shipped dashboard's queries; the console shows the namespace to a
login with the token given to compose, and to no one else.

Ground truth comes from the topics, not from the services: the first attempts in ``demo.orders``
(what the source sent), the persist tombstones and their ``rb-outcome`` (what was decided),
the sink topic ``demo.orders-enriched`` (what the task wrote).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker import ids, topics
from broker.dev.kafka_local import free_port
from broker.dev.testing import unique_name
from broker.headers import Tracking, outcome_of
from broker.kafka_io import read_to_end
from broker.settings import KafkaSettings
from broker.status import status

pytestmark = pytest.mark.containers

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 3000
RATE = 150  # records a second: the source runs ~20 s, long enough to kill an acker mid-run
PARTITIONS = 4
NAMESPACE = "demo"
CONSOLE_TOKEN = "containers-test-viewer-token"


@dataclass
class Stack:
    compose: list[str]
    env: dict[str, str]
    bootstrap: str
    prometheus: str
    metrics_ports: dict[str, int]
    console: str

    def run(self, *args: str, check: bool = True) -> str:
        done = subprocess.run([*self.compose, *args], env=self.env, capture_output=True, text=True, check=False)
        assert not check or done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}{done.stderr}"
        return done.stdout

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service).strip()

    def state(self, service: str) -> dict[str, Any]:
        out = subprocess.run(
            ["docker", "inspect", "-f", "{{json .State}}", self.container(service)],
            capture_output=True, text=True, check=True,
        ).stdout
        state: dict[str, Any] = json.loads(out)
        return state

    def logs(self) -> str:
        return self.run("logs", "--no-color", "--tail", "30", check=False)[-8000:]


@pytest.fixture(scope="module")
def stack(compose: list[str]) -> Iterator[Stack]:
    ports = {name: free_port() for name in (
        "KAFKA_PORT", "KAFKA_CONTROLLER_PORT", "ACKER1_METRICS_PORT", "ACKER2_METRICS_PORT",
        "TASK_METRICS_PORT", "PROMETHEUS_PORT", "CONSOLE_PORT",
    )}
    assert len(set(ports.values())) == len(ports), "free_port gave one port twice"
    project = unique_name("rb").replace("-", "")
    env = {
        **os.environ, **{k: str(v) for k, v in ports.items()},
        "COMPOSE_PROJECT_NAME": project, "COMPOSE_FILE": str(ROOT / "docker" / "compose.yaml"),
        "NAMESPACE": NAMESPACE, "RECORDS": str(RECORDS), "RATE": str(RATE),
        "REPLAYBROKER_CONSOLE_TOKENS": f"viewer={CONSOLE_TOKEN}",
    }
    stack = Stack(
        compose, env, f"127.0.0.1:{ports['KAFKA_PORT']}", f"http://127.0.0.1:{ports['PROMETHEUS_PORT']}",
        {"acker-1": ports["ACKER1_METRICS_PORT"], "acker-2": ports["ACKER2_METRICS_PORT"],
         "enrich": ports["TASK_METRICS_PORT"]},
        f"http://127.0.0.1:{ports['CONSOLE_PORT']}",
    )
    try:
        stack.run("up", "-d")
        yield stack
    finally:
        stack.run("down", "-v", "--timeout", "10", check=False)


def _wait(done: Callable[[], bool], what: str, stack: Stack, limit_s: float = 240.0) -> None:
    deadline = time.monotonic() + limit_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}; logs:\n{stack.logs()}"
        time.sleep(0.5)


def _origin_of(msg: Any) -> tuple[int, int]:
    tracking = Tracking.from_headers(msg.headers())
    assert tracking is not None
    return tracking.srid, tracking.origin


def test_acker_killed_mid_run_loses_nothing_and_completes_nothing_twice(stack: Stack) -> None:
    settings = KafkaSettings.from_env(stack.bootstrap, env_file=None)
    ns = topics.Namespace(NAMESPACE)

    def completed() -> int:
        try:
            return int(status(settings, NAMESPACE)["completed"])
        except Exception:  # noqa: BLE001 - the topics or the first counters do not exist yet
            return 0

    _wait(lambda: completed() >= RECORDS // 4, "a quarter of the records to complete", stack)
    subprocess.run(["docker", "kill", stack.container("acker-1")], check=True, capture_output=True)
    assert completed() < RECORDS, "the run ended before the acker was killed: raise RECORDS"

    _wait(lambda: stack.state("source")["Status"] == "exited", "the source to finish", stack)
    assert stack.state("source")["ExitCode"] == 0, stack.logs()
    _wait(lambda: completed() >= RECORDS, f"{RECORDS} completions", stack)
    final = status(settings, NAMESPACE)
    assert not stack.state("acker-1")["Running"], "the killed acker came back: nothing was taken over"
    assert stack.state("acker-2")["Running"], stack.logs()

    # What the source sent: one first attempt per record in `demo.orders`.
    first = {}
    for msg in read_to_end(settings, f"{NAMESPACE}.orders", PARTITIONS):
        n = json.loads(msg.value())["n"]
        assert n not in first, f"record {n} sent twice"
        first[n] = _origin_of(msg)[1]
    assert sorted(first) == list(range(RECORDS))
    origin_of = {srid: origin for msg in read_to_end(settings, f"{NAMESPACE}.orders.replay", PARTITIONS)
                 for srid, origin in [_origin_of(msg)]}
    origin_of.update({origin: origin for origin in first.values()})

    # What the ackers decided: the persist tombstones (srid -> outcomes).
    completions: Counter[int] = Counter()
    outcomes: dict[int, list[str]] = defaultdict(list)
    for msg in read_to_end(settings, ns.persist, PARTITIONS):
        if msg.value() is None and len(msg.key() or b"") == 8:
            srid = ids.decode_id(msg.key())
            outcome = outcome_of(msg.headers()).decode()
            outcomes[srid].append(outcome)
            if outcome == "completed":
                completions[origin_of[srid]] += 1
    lost = [n for n, origin in first.items() if completions[origin] == 0]
    twice = [n for n, origin in first.items() if completions[origin] > 1]
    assert not lost, f"{len(lost)} records never completed, e.g. {lost[:5]}"
    assert not twice, f"{len(twice)} records completed more than once, e.g. {twice[:5]}"
    assert all(len(o) == 1 for o in outcomes.values()), "an srid decided twice"
    assert not [srid for srid, o in outcomes.items() if "dlq" in o], "a dead letter"

    # What the task wrote: every record reached the sink.
    written = {json.loads(m.value())["n"] for m in read_to_end(settings, f"{NAMESPACE}.orders-enriched", PARTITIONS)}
    assert written == set(range(RECORDS))

    # And what `replaybroker status` says agrees.
    assert (final["completed"], final["pending"], final["dlq"]) == (RECORDS, 0, 0), final


def _prometheus(stack: Stack, path: str, **params: str) -> Any:
    url = f"{stack.prometheus}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


def _dashboard_queries() -> list[str]:
    dashboard = json.loads((ROOT / "docker" / "grafana" / "replaybroker-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", ())]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return exprs


def _metric_families(port: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_prometheus_scrapes_the_services_and_answers_the_dashboard(stack: Stack) -> None:
    """Grafana is not in Debian's packages: its dashboard's queries are run against
    Prometheus' HTTP API instead. Runs after the kill: acker-1's target is down."""
    up = {}

    def scraped() -> bool:
        targets = _prometheus(stack, "/api/v1/targets")["activeTargets"]
        up.update({int(t["scrapeUrl"].split(":")[2].split("/")[0]): t["health"] for t in targets})
        return up.get(stack.metrics_ports["acker-2"]) == "up" and up.get(stack.metrics_ports["enrich"]) == "up"

    _wait(scraped, "Prometheus to scrape acker-2 and the task", stack, 60)
    if not stack.state("acker-1")["Running"]:
        assert up.get(stack.metrics_ports["acker-1"]) != "up", "the killed acker still answers"

    families = _metric_families(stack.metrics_ports["acker-2"]) | _metric_families(stack.metrics_ports["enrich"])
    unknown = set()
    for expr in _dashboard_queries():
        for name in re.findall(r"\breplaybroker_\w+", expr):
            if name not in families and re.sub(r"_(bucket|sum|count)$", "", name) not in families:
                unknown.add(name)
        if expr.startswith("label_values("):
            continue
        query = (expr.replace("$acker_job", "replaybroker-acker").replace("$task_job", "replaybroker-task")
                 .replace("$__rate_interval", "1m"))
        _prometheus(stack, "/api/v1/query", query=query)  # a query Prometheus rejects fails here
    assert not unknown, f"the dashboard queries metrics no service serves: {sorted(unknown)}"

    # The core panels show the run: pending entries, decisions, task inputs.
    for query in ("sum(replaybroker_acker_pending_entries)",
                  'sum by (decision) (increase(replaybroker_acker_decisions_total{job="replaybroker-acker"}[10m]))',
                  'sum(increase(replaybroker_task_inputs_total{job="replaybroker-task"}[10m]))'):
        _wait(lambda q=query: bool(_prometheus(stack, "/api/v1/query", query=q)["result"]), query, stack, 60)


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:  # not listening yet
        return 0, str(exc)


def test_the_console_shows_the_namespace_to_its_token_only(stack: Stack) -> None:
    """Runs after the records completed: the Overview shows the count the topics give."""
    _wait(lambda: _get(f"{stack.console}/healthz")[0] == 200, "the console's /healthz", stack, 120)
    assert _get(f"{stack.console}/")[0] == 401
    assert _get(f"{stack.console}/dead-letters", "not-the-token-0123456789")[0] == 401
    settings = KafkaSettings.from_env(stack.bootstrap, env_file=None)
    completed = int(status(settings, NAMESPACE)["completed"])
    assert completed == RECORDS
    page: list[str] = [""]

    def shows_completed() -> bool:
        code, page[0] = _get(f"{stack.console}/", CONSOLE_TOKEN)
        assert code == 200, page[0][:2000]
        return f'<dd id="completed">{completed}</dd>' in page[0]

    _wait(shows_completed, f"the console's Overview to show {completed} completed", stack, 90)
    assert f'<span class="ns">{NAMESPACE}</span>' in page[0]
    code, body = _get(f"{stack.console}/dead-letters", CONSOLE_TOKEN)
    assert code == 200 and f'<span class="ns">{NAMESPACE}</span>' in body, body[:2000]
