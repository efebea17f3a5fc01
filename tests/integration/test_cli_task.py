"""``replaybroker task`` as a service on a real Kafka: a handler module from the working
directory, run in its own process, processes the data topic and its replay topic; its acks
complete the records, its outputs are in the output topic, a failed first attempt is
replayed to it, and SIGTERM stops it cleanly.

Ground truth from the topics: the outputs (one per record, from the last attempt's tree)
and the persist tombstones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from broker import ids, topics
from broker.completions import read_outcomes
from broker.dev.testing import unique_name
from broker.headers import H_ORIGIN
from broker.kafka_io import read_to_end
from tests.integration.test_replay import Pipeline, pipelines  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

HANDLERS = textwrap.dedent(
    """
    import os

    OUT = os.environ["RB_TEST_OUT"]

    def upper(record, ctx):
        if record.value.startswith(b"flaky") and record.tracking.attempt == 1:
            ctx.fail("flaky on its first attempt")
            return
        ctx.output(OUT, record.key, record.value.upper())
    """
)


def test_the_task_command_runs_a_handler_module_as_a_service(pipelines: Any, tmp_path: Path) -> None:  # noqa: F811
    p: Pipeline = pipelines(ledger_partitions=2, data_partitions=2, timeout_ms=30_000)
    out = f"{p.ns.name}.out"
    topics.create(p.settings, p.ns, 2, {out: 1})
    (tmp_path / "rb_task_handlers.py").write_text(HANDLERS)
    p.start_acker()
    env = {**os.environ, "RB_TEST_OUT": out, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    task = subprocess.Popen(
        [sys.executable, "-m", "broker", "task", "--bootstrap", p.settings.bootstrap_servers,
         "--namespace", p.ns.name, "--handler", "rb_task_handlers:upper", "--topics", p.topic,
         "--group", unique_name("cli-task")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        sent = [p.source.send(p.topic, f"k{i}", (b"flaky-%d" if i % 5 == 0 else b"order-%d") % i) for i in range(20)]
        p.source.flush()
        origins = {s.origin for s in sent}
        p.wait(lambda: task.poll() is None and p.completed(origins)(), "every record completed by the task process")
    finally:
        task.send_signal(signal.SIGTERM)
        try:
            output, _ = task.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            task.kill()
            output, _ = task.communicate()
    assert task.returncode == 0, output[-2000:]

    by_origin: dict[int, list[bytes]] = {}
    for m in read_to_end(p.settings, out, 1):
        origin = ids.decode_id(dict(m.headers() or ()).get(H_ORIGIN) or b"")
        by_origin.setdefault(origin, []).append(m.value())
    expected = {s.origin: [((b"flaky-%d" if i % 5 == 0 else b"order-%d") % i).upper()] for i, s in enumerate(sent)}
    assert {o: v for o, v in by_origin.items() if o in origins} == expected
    log = read_outcomes(p.settings, p.ns)
    assert all(log.completed_origins()[o] == 1 for o in origins)
    assert not log.dlq_origins() & origins
    replays = read_to_end(p.settings, p.replay, 2)
    assert len(replays) == 4  # the flaky ones, replayed to the same process's replay subscription
