"""Superseded replays on a real Kafka: a task holds the first attempt of a record longer than
its timeout, then completes it. The acker has replayed it meanwhile; the late ack completes
the original after all, the acker marks the replay superseded, and the task skips the replay.

Ground truth comes from the topics: the output topic (how many outputs the origin got), the
persist tombstones (each attempt's outcome), ``ns.superseded`` (the marker) and ``ns.dlq``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from broker import ids, topics
from broker.completions import read_outcomes
from broker.dev.testing import unique_name
from broker.headers import H_ORIGIN, outcome_of
from broker.kafka_io import read_to_end
from broker.schemas import PersistedRecord
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from tests.integration.test_replay import Pipeline, pipelines  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

TIMEOUT_MS = 4_000
HOLD_S = 6.0  # longer than the timeout (plus a tick and a commit), shorter than the replay's deadline


def test_a_slow_original_completes_late_and_its_replay_is_skipped(pipelines: Any) -> None:  # noqa: F811
    p: Pipeline = pipelines(ledger_partitions=2, data_partitions=2, timeout_ms=TIMEOUT_MS)
    out = f"{p.ns.name}.out"
    topics.create(p.settings, p.ns, 2, {out: 1})
    handled: list[tuple[int, int]] = []  # (attempt, srid) the handler ran for

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        tracking = record.tracking
        assert tracking is not None
        handled.append((tracking.attempt, tracking.srid))
        if record.value == b"slow" and tracking.attempt == 1:
            time.sleep(HOLD_S)  # past the deadline: the acker replays it meanwhile
        ctx.output(out, record.key, record.value)

    p.start_acker()
    task = Task(p.settings, p.ns, [p.topic, p.replay], unique_name("task"), handler, TaskConfig(poll_timeout_ms=50))
    p.task = task
    p._spawn(task.run, "task")
    p.warm_up()  # the task and the acker own their partitions: the clock starts with the record

    origin = p.source.send(p.topic, b"k", b"slow").origin
    p.source.flush()
    # The origin completes through its replay's tree, which the task acks after writing its
    # outputs: once it is complete, every output of both attempts is in the output topic.
    p.wait(p.completed({origin}), "the slow record's completion")

    # The output topic: ONE output for the origin.
    outputs = [m for m in read_to_end(p.settings, out, 1) if dict(m.headers() or ()).get(H_ORIGIN) == ids.encode_id(origin)]
    attempts = sorted(a for a, _ in handled if a > 0)
    assert len(outputs) == 1, f"{len(outputs)} outputs for one origin (handler ran for attempts {attempts})"

    # ns.persist: the original was replayed (tombstone "replay"), its replay completed once,
    # nothing was dead-lettered; the replay is attempt 2 of the same origin.
    log = read_outcomes(p.settings, p.ns)
    attempts_of = {
        rec.srid: rec.attempt
        for rec in (PersistedRecord.decode(m.value()) for m in read_to_end(p.settings, p.ns.persist, 2) if m.value())
        if rec.origin == origin
    }
    assert sorted(attempts_of.values()) == [1, 2]
    original, replay = sorted(attempts_of, key=attempts_of.__getitem__)
    assert log.completed_origins()[origin] == 1
    assert origin not in log.dlq_origins()
    tombstones = {
        ids.decode_id(m.key()): outcome_of(m.headers())
        for m in read_to_end(p.settings, p.ns.persist, 2) if m.value() is None
    }
    assert (tombstones.get(original), tombstones.get(replay)) == (b"replay", b"completed")
    assert not read_to_end(p.settings, p.ns.dlq, 1)

    # ns.superseded: the marker, replay srid -> original srid.
    markers = {ids.decode_id(m.key()): ids.decode_id(m.value()) for m in read_to_end(p.settings, p.ns.superseded, 2)}
    assert markers == {replay: original}

    # The task skipped the replay (the handler ran for attempt 1 only) and counted it; the
    # acker counted the late completion.
    assert (1, original) in handled and all(a == 1 for a, _ in handled)
    assert task.counters.skipped == 1
    assert p.acker is not None
    p.wait(lambda: p.acker is not None and p.acker.counters()["superseded"] == 1, "the acker's superseded count")
    c = p.acker.counters()
    assert (c["superseded"], c["dlq"], c["superseded_settled"]) == (1, 0, 0)


def test_a_last_attempt_that_completes_after_its_timeout_is_completed_not_dead_lettered(
    pipelines: Any,  # noqa: F811
) -> None:
    """A record on its last attempt (max_attempts 1) whose task holds it past its timeout,
    then writes its output and acks it. The acker's dead letter waits ``watch_ms`` with the
    entry's value kept: the late ack completes it - a record that was processed is never
    dead-lettered. (Before: dead-lettered at the timeout, its output written all the same.)"""
    p: Pipeline = pipelines(ledger_partitions=2, data_partitions=2, timeout_ms=TIMEOUT_MS, max_attempts=1)
    out = f"{p.ns.name}.out"
    topics.create(p.settings, p.ns, 2, {out: 1})
    handled: list[int] = []

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        tracking = record.tracking
        assert tracking is not None
        handled.append(tracking.attempt)
        if record.value == b"slow":
            time.sleep(HOLD_S)  # past the deadline: the acker decides meanwhile
        ctx.output(out, record.key, record.value)

    p.start_acker()
    task = Task(p.settings, p.ns, [p.topic, p.replay], unique_name("task"), handler, TaskConfig(poll_timeout_ms=50))
    p.task = task
    p._spawn(task.run, "task")
    p.warm_up()

    origin = p.source.send(p.topic, b"k", b"slow").origin
    p.source.flush()
    log = p.tail.log

    def outputs() -> list[Any]:
        return [m for m in read_to_end(p.settings, out, 1) if dict(m.headers() or ()).get(H_ORIGIN) == ids.encode_id(origin)]

    p.wait(lambda: origin in log.completed_origins() or origin in log.dlq_origins(), "the slow record's outcome")
    p.wait(lambda: bool(outputs()), "the slow record's output")

    # Ground truth from the topics: its output was written (after the timeout) once; the
    # persist tombstone says completed; nothing in the DLQ.
    assert len(outputs()) == 1 and handled.count(1) == 2  # the warm-up and the slow record, once each
    outcomes = read_outcomes(p.settings, p.ns)
    assert origin not in outcomes.dlq_origins(), "a record whose output was written was dead-lettered"
    assert outcomes.completed_origins()[origin] == 1
    assert not read_to_end(p.settings, p.ns.dlq, 1)
    assert p.acker is not None
    c = p.acker.counters()
    assert (c["timed_out"], c["dlq_held"], c["completed_late"], c["dlq"], c["replayed"]) == (1, 1, 1, 0, 0)
