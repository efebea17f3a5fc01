"""Rejections (docs/design.md §6, "Rejection"): an input the task rejects - ``ctx.reject``, an
exception of ``TaskConfig.fatal`` - is dead-lettered with its reason whatever attempts it had
left, held like any last attempt while an earlier attempt's window is open, and a new owner
dead-letters it with the same reason. The real ``Acker`` on a stepped clock over the in-memory
Kafka of tests/unit/log_cluster.py (the harness of test_acker_windows).

Ground truth is what the acker wrote to the logs: persist tombstones, ``ns.dlq`` records."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from tests.unit.test_acker_windows import CHILD, NS, ROOT, WATCH_MS, World, X

_NONE = np.array([], np.int64)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    yield World(monkeypatch)


def reject(world: World, srid: int, why: str) -> None:
    from broker.schemas import XorBatch

    batch = XorBatch(0, _NONE, _NONE, _NONE, "unit", rejected=np.array([srid]), rejected_reasons=(why,))
    world.cluster.append(NS.acks, 0, None, batch.encode())


def dlq_reasons(world: World) -> list[str]:
    return [(dict(m.headers() or ()).get("rb-reason") or b"").decode() for m in world.cluster.records(NS.dlq)]


def test_a_rejected_first_attempt_is_dead_lettered_at_once_with_its_reason(world: World) -> None:
    world.send(X, ROOT, max_attempts=5)
    world.step(2)
    reject(world, X, "ValueError: not json")
    world.step(3)
    assert world.outcomes() == {X: "dlq"} and not world.replays()
    assert dlq_reasons(world) == ["rejected: ValueError: not json"]
    assert world.dead_letters() == [X]


def test_a_rejection_waits_for_an_earlier_attempts_window_and_its_late_completion_wins(world: World) -> None:
    """X (max 5) times out and is replayed as Z; Z is rejected - but X's window is open, and
    X's tree completes inside it: Z is settled as completed, nothing is dead-lettered."""
    world.send(X, ROOT, max_attempts=5)
    world.ack(X, ROOT ^ CHILD)
    world.step(2)
    world.clock.advance(1_200)
    world.step(2)
    (z,) = world.replays()
    world.step(2)
    reject(world, z.srid, "no such sku")
    world.step(3)
    assert not world.dead_letters() and world.outcomes() == {X: "replay"}, "dead-lettered inside X's window"
    world.ack(X, CHILD)
    world.step(3)
    assert world.outcomes() == {X: "replay", z.srid: "completed"} and not world.dead_letters()


def test_a_held_rejection_keeps_its_reason_through_a_takeover(world: World) -> None:
    world.send(X, ROOT, max_attempts=5)
    world.step(2)
    world.clock.advance(1_200)
    world.step(2)
    (z,) = world.replays()
    watch_end = z.history[-1].at_ms + WATCH_MS
    world.step(2)
    reject(world, z.srid, "PermissionError: forbidden")
    world.step(3)
    assert not world.dead_letters()

    world.acker = world.new_acker()  # kill -9: the next owner restores the held rejection
    world.step(3)
    world.clock.advance(watch_end + 1_000 - world.clock.now_ms())
    world.step(3)
    assert world.outcomes() == {X: "replay", z.srid: "dlq"} and len(world.replays()) == 1
    assert dlq_reasons(world) == ["rejected: PermissionError: forbidden"]
