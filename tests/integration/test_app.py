"""``App`` on a real Kafka: every role in one process, and one role per process through
``replaybroker run MODULE:app --role ROLE`` - the same app module (tests/integration/
app_pipeline.py). Ground truth: the persist topic's tombstones (completed or dead-lettered,
each origin once) and what the leaf wrote to the outside world (a file)."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from broker.completions import OutcomeTail
from broker.dev.testing import stop_processes, unique_name

pytestmark = pytest.mark.integration

ORDERS, TEXTS = 200, 60


@pytest.fixture
def pipeline(bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The app module, fresh, in a namespace of its own, writing to a file of this test."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", bootstrap)
    monkeypatch.setenv("APP_TEST_NAMESPACE", unique_name("app"))
    monkeypatch.setenv("APP_TEST_WRITTEN", str(tmp_path / "written"))
    sys.modules.pop("tests.integration.app_pipeline", None)
    yield importlib.import_module("tests.integration.app_pipeline")
    sys.modules.pop("tests.integration.app_pipeline", None)


def _send_and_wait(module: ModuleType, tail: OutcomeTail) -> dict[int, int]:
    """Orders (JSON) and texts (bytes, the raw topic's serde): id -> origin; waits for every
    outcome."""
    app = module.app
    with app.source(max_attempts=2) as source:
        sent = {i: source.send(module.orders, f"c-{i % 7}", {"id": i}).origin for i in range(ORDERS)}
        sent.update({i: source.send(module.raw, f"t-{i}", str(i)).origin for i in range(1000, 1000 + TEXTS)})
    deadline = time.monotonic() + 120
    while not set(sent.values()) <= set(tail.log.completed_origins()) | tail.log.dlq_origins():
        assert time.monotonic() < deadline, "not every record has an outcome"
        tail.poll(0.2)
    return sent


def _check(sent: dict[int, int], tail: OutcomeTail, written_file: Path) -> None:
    failing = {i for i in range(ORDERS) if i % 50 == 7}
    completed, dlq = tail.log.completed_origins(), tail.log.dlq_origins()
    assert {i for i, o in sent.items() if o in dlq} == failing
    assert {i for i, o in sent.items() if o in completed} == set(sent) - failing
    assert all(completed[o] == 1 for o in sent.values() if o in completed), "completed twice"
    written = {int(line) for line in written_file.read_text().split()}
    assert written == set(sent) - failing


def test_an_app_runs_every_role_in_one_process(pipeline: ModuleType, tmp_path: Path) -> None:
    app = pipeline.app
    assert app.roles == ["acker", "task:enrich", "task:parse", "task:leaf"]
    app.setup()
    tail = OutcomeTail(app.settings, app.ns)
    try:
        with app.run_in_background():
            sent = _send_and_wait(pipeline, tail)
        _check(sent, tail, tmp_path / "written")
    finally:
        tail.close()


def test_an_apps_roles_run_one_per_process(pipeline: ModuleType, tmp_path: Path) -> None:
    app = pipeline.app
    app.setup()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "run", "tests.integration.app_pipeline:app", "--role", role],
            stdout=(tmp_path / f"{role.replace(':', '-')}.log").open("wb"), stderr=subprocess.STDOUT,
            env=os.environ.copy(),
        )
        for role in app.roles
    ]
    tail = OutcomeTail(app.settings, app.ns)
    try:
        sent = _send_and_wait(pipeline, tail)
        _check(sent, tail, tmp_path / "written")
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert [proc.wait(60) for proc in procs] == [0] * len(procs), "a role did not stop cleanly"
    finally:
        tail.close()
        stop_processes(procs)
