"""``replaybroker demo``: source -> task (fan-out 1-3) -> task (leaf) -> acker, end to end.

Everything is real: the embedded (or given) Kafka, the acker as its own process
(``replaybroker acker``), the two tasks as consumer groups. Failure injection: task A fails
``--fail-rate`` of its inputs and silently drops (never acks) ``--drop-rate`` of them, on their
first attempt only - so the failed ones are replayed at once and the dropped ones after their
timeout, both through ``<topic>.replay``.

The summary is checked against the demo's own ground truth (the origins it sent), not against
the acker's counters: ``lost`` = sent origins neither completed nor dead-lettered at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from broker import topics
from broker.completions import OutcomeTail
from broker.dev.faults import skip_ack
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskContext, TaskRecord

log = logging.getLogger(__name__)


def _fraction(srid: int, salt: bytes) -> float:
    """A deterministic draw in [0, 1) per srid, so one decision per attempt."""
    digest = hashlib.blake2b(srid.to_bytes(8, "big", signed=True) + salt, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _environment(settings: KafkaSettings | None) -> dict[str, str] | None:
    """The acker's environment: this one, with the connection of ``settings`` if given."""
    if settings is None:
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_SASL_")}
    env["KAFKA_SECURITY_PROTOCOL"] = settings.security_protocol
    for name, value in (
        ("KAFKA_SASL_MECHANISM", settings.sasl_mechanism),
        ("KAFKA_SASL_USERNAME", settings.sasl_username),
        ("KAFKA_SASL_PASSWORD", settings.sasl_password.get() if settings.sasl_password else None),
    ):
        if value:
            env[name] = value
    return env


def run_demo(
    bootstrap: str,
    records: int = 10_000,
    *,
    fail_rate: float = 0.0,
    drop_rate: float = 0.0,
    timeout_ms: int = 30_000,
    max_attempts: int = 5,
    partitions: int = 4,
    deadline_ms: int | None = None,
    progress: bool = False,
    keep: bool = True,
    namespace: str | None = None,
    roles: Mapping[str, KafkaSettings] | None = None,
) -> dict[str, Any]:
    """Run the demo in a fresh namespace; ``keep=False`` deletes its topics afterwards.

    ``roles`` gives the ``source``, ``task`` and ``acker`` each their own connection (their
    own principal on a secured cluster); the topics are created and watched with the
    settings of the environment."""
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(namespace or f"demo-{uuid.uuid4().hex[:8]}")
    orders, enriched = f"{ns.name}.orders", f"{ns.name}.enriched"
    data_topics = {orders: partitions, enriched: partitions}
    topics.create(settings, ns, partitions, data_topics)
    try:
        return _run(settings, ns, bootstrap, records, orders, enriched, fail_rate, drop_rate,
                    timeout_ms, max_attempts, deadline_ms, progress, roles or {})
    finally:
        if not keep:
            topics.delete(settings, topics.layout(ns, partitions, data_topics))


def _run(
    settings: KafkaSettings, ns: topics.Namespace, bootstrap: str, records: int, orders: str,
    enriched: str, fail_rate: float, drop_rate: float, timeout_ms: int, max_attempts: int,
    deadline_ms: int | None, progress: bool, roles: Mapping[str, KafkaSettings],
) -> dict[str, Any]:

    workdir = Path(tempfile.mkdtemp(prefix="replaybroker-demo-"))
    acker_log = open(workdir / "acker.log", "wb")  # noqa: SIM115 - handed to the child
    acker = subprocess.Popen(
        [sys.executable, "-m", "broker.cli", "acker", "--bootstrap", bootstrap,
         "--namespace", ns.name, "--instance-id", f"{ns.name}-acker"],
        stdout=acker_log,
        stderr=subprocess.STDOUT,
        env=_environment(roles.get("acker")),
    )

    def fan_out(record: TaskRecord, ctx: TaskContext) -> None:
        tracking = record.tracking
        if tracking is not None and tracking.attempt == 1:
            draw = _fraction(tracking.srid, b"inject")
            if draw < fail_rate:
                ctx.fail("injected failure")
                return
            if draw < fail_rate + drop_rate:
                skip_ack(ctx)
                return
        n = 1 + int(_fraction(tracking.origin if tracking else 0, b"fan") * 3)
        for i in range(n):
            ctx.emit(enriched, record.key, (record.value or b"") + b"|part-%d" % i)

    def leaf(record: TaskRecord, ctx: TaskContext) -> None:
        return None

    task_settings = roles.get("task", settings)
    task_a = Task(task_settings, ns, [orders, topics.replay_topic(orders)], f"{ns.name}.fan-out", fan_out)
    task_b = Task(task_settings, ns, [enriched, topics.replay_topic(enriched)], f"{ns.name}.leaf", leaf)
    threads = [threading.Thread(target=t.run, daemon=True) for t in (task_a, task_b)]
    for thread in threads:
        thread.start()

    tail = OutcomeTail(settings, ns)
    source = Source(roles.get("source", settings), ns, SourceConfig(timeout_ms=timeout_ms, max_attempts=max_attempts))
    sent: set[int] = set()
    started = time.monotonic()
    try:
        for i in range(records):
            result = source.send(orders, f"customer-{i % 997}", b'{"order": %d, "amount": %d}' % (i, i % 500))
            sent.add(result.origin)
            if i % 2000 == 0:
                tail.poll(0)
        source.flush()
        sent_s = time.monotonic() - started
        limit = deadline_ms / 1000 if deadline_ms is not None else 60 + timeout_ms / 1000 * (2 + (1 if drop_rate else 0))
        last_report = 0.0
        while time.monotonic() - started < limit:
            tail.poll(0.2)
            resolved = len(tail.log.completed_origins()) + len(tail.log.dlq_origins() - set(tail.log.completed_origins()))
            if progress and time.monotonic() - last_report > 2:
                last_report = time.monotonic()
                print(f"  {resolved}/{records} resolved, {tail.log.replays()} replays", file=sys.stderr)
            if resolved >= records and acker.poll() is None:
                break
            if acker.poll() is not None:
                break
        seconds = time.monotonic() - started
    finally:
        task_a.stop()
        task_b.stop()
        for thread in threads:
            thread.join(30)
        with contextlib.suppress(ProcessLookupError):
            acker.send_signal(signal.SIGTERM)
        try:
            acker.wait(30)
        except subprocess.TimeoutExpired:
            acker.kill()
            acker.wait()
        acker_log.close()
        tail.poll(1.0)
        tail.close()

    completed = tail.log.completed_origins()
    dlq = tail.log.dlq_origins()
    done = set(completed) | dlq
    summary = {
        "namespace": ns.name,
        "records": records,
        "completed": len(set(completed) & sent),
        "completed_twice": sum(1 for o, n in completed.items() if n > 1),
        "pending": len(tail.log.pending_origins() & sent),
        "replayed": tail.log.replays(),
        "dlq": len(dlq & sent),
        "lost": len(sent - done),
        "seconds": round(seconds, 3),
        "send_seconds": round(sent_s, 3),
        "completed_per_s": round(len(completed) / seconds, 1) if seconds else None,
        "fail_rate": fail_rate,
        "drop_rate": drop_rate,
        "timeout_ms": timeout_ms,
        "acker_exit_code": acker.returncode,
        "acker_log": str(workdir / "acker.log"),
    }
    return summary


def main_demo(args: argparse.Namespace, bootstrap: str) -> int:
    """``replaybroker demo`` on ``bootstrap`` (the command has chosen it and said which)."""
    if getattr(args, "spark", False):
        from spark_jobs.demo import run_spark_demo

        summary = run_spark_demo(
            bootstrap,
            records=args.records,
            # Failure injection is the point of the Spark demo: 5 % unless told otherwise.
            fail_rate=0.05 if args.fail_rate is None else args.fail_rate,
            keep=args.keep,
            timeout_ms=args.timeout_ms,
            master=getattr(args, "master", None),
            sink=getattr(args, "sink", None) or "parquet",
        )
    else:
        summary = run_demo(
            bootstrap,
            args.records,
            fail_rate=args.fail_rate or 0.0,
            drop_rate=args.drop_rate,
            timeout_ms=args.timeout_ms,
            max_attempts=args.max_attempts,
            progress=not args.json,
            keep=args.keep,
        )
    if args.json:
        sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    else:
        width = max(map(len, summary))
        for name, value in summary.items():
            print(f"{name:>{width}}: {value}")
    return 0 if summary["lost"] == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
