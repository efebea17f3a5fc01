"""A static acker killed with kill -9 and restarted at once with the same instance id: the
group refuses the successor while the predecessor's session lasts (librdkafka reports the
broker's UNRELEASED_INSTANCE_ID as a fatal error of the consumer). The successor waits it out
quietly - no ERROR line, one warning for the wait - takes its partitions back, and every
record completes once (issue 30, item 8: 7-12 fatal errors per chaos run, each logged as an
error)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker import topics
from broker.completions import OutcomeTail
from broker.dev.testing import stop_processes, unique_name
from broker.ranges import expand
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskContext, TaskRecord

pytestmark = pytest.mark.integration

P = 2
ASSIGNED = re.compile(r"assigned ledger partitions \d+ \[[\d, -]*\] \(owning \d+ (\[[\d, -]*\])\)")


def _start_acker(bootstrap: str, ns: str, log_path: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "broker.cli", "acker", "--bootstrap", bootstrap, "--namespace", ns,
            "--instance-id", "static-1"]
    return subprocess.Popen(args, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)


def _owns_all(log_path: Path) -> bool:
    owned = [m.group(1) for m in ASSIGNED.finditer(log_path.read_text(errors="replace"))]
    return bool(owned) and len(expand(owned[-1])) == P


def _wait(condition: Callable[[], bool], timeout_s: float, what: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
            raise AssertionError(f"timed out waiting for {what} (acker exit {proc.returncode}):\n{tail}")
        time.sleep(0.2)


def _complete(settings: KafkaSettings, ns: topics.Namespace, data: str, tail: OutcomeTail, n: int, tag: str) -> set[int]:
    """Send ``n`` records; return their origins once every one has completed."""
    with Source(settings, ns, SourceConfig(timeout_ms=600_000)) as source:
        sent = {source.send(data, f"k{i}", b"%s-%d" % (tag.encode(), i)).origin for i in range(n)}
    deadline = time.monotonic() + 120
    while not sent <= set(tail.log.completed_origins()):
        assert time.monotonic() < deadline, f"{len(sent - set(tail.log.completed_origins()))} of {n} never completed"
        tail.poll(0.2)
    return sent


def test_a_restarted_static_acker_waits_out_its_instance_id_quietly(bootstrap: str, tmp_path: Path) -> None:
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("static"))
    data = f"{ns.name}.orders"
    topics.create(settings, ns, P, {data: P})
    first, second = tmp_path / "acker-1.log", tmp_path / "acker-2.log"

    def ack(record: TaskRecord, ctx: TaskContext) -> None:
        return None

    task = Task(settings, ns, [data, topics.replay_topic(data)], unique_name("leaf"), ack)
    thread = threading.Thread(target=task.run, daemon=True)
    tail = OutcomeTail(settings, ns)
    acker = _start_acker(bootstrap, ns.name, first)
    try:
        thread.start()
        _wait(lambda: _owns_all(first), 60, "the acker to own every partition", acker, first)
        before = _complete(settings, ns, data, tail, 300, "before")

        acker.kill()  # SIGKILL: it never leaves the group; its session holds the instance id
        acker.wait()
        acker = _start_acker(bootstrap, ns.name, second)  # at once, with the same instance id
        # Records sent while the successor waits complete once it is in.
        after = _complete(settings, ns, data, tail, 300, "after")
        assert _owns_all(second)

        lines = second.read_text(errors="replace").splitlines()
        errors = [line for line in lines if " ERROR " in line or " CRITICAL " in line]
        assert errors == [], "\n".join(errors)
        waits = [line for line in lines if "is still a member of the group" in line]
        assert len(waits) <= 1, "\n".join(waits)  # one line per wait period (none if the broker let it in)
        completed = tail.log.completed_origins()
        assert all(completed[o] == 1 for o in before | after)
        assert tail.log.replays() == 0
    finally:
        task.stop()
        thread.join(30)
        tail.close()
        stop_processes([acker])
