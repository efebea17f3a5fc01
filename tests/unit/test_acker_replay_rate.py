"""The replay rate (``AckerConfig.replay_rate_per_s``, docs/design.md §6): replays over it wait
in their table, deferred to their turn - in persist order, a second's worth at once - instead of
landing on a pipeline together; a waiting timeout still completes if its tree does; a new owner
replays what waited. The real ``Acker`` on a stepped clock over the in-memory Kafka of
tests/unit/log_cluster.py (the harness of test_acker_windows).

Ground truth is what the acker wrote to the logs: replays' persist records, tombstones."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from tests.unit.test_acker_windows import World

ROOTS = [0x3243_F6A8_885A_3000 + i for i in range(8)]
SRIDS = [0x1F3A_5C7E_9B2D_4000 + i for i in range(8)]


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    w = World(monkeypatch)
    w.config = dataclasses.replace(w.config, replay_rate_per_s=2.0)
    w.acker = w.new_acker()
    yield w


def timed_out_together(world: World, n: int) -> None:
    for srid, root in zip(SRIDS[:n], ROOTS[:n], strict=True):
        world.send(srid, root, max_attempts=3)
    world.step(2)
    world.clock.advance(1_200)  # every one timed out in the same tick
    world.step(2)


def originals(world: World) -> list[int]:
    """The originals replayed (their second attempts), in the order the replays were written."""
    return [r.origin for r in world.replays() if r.attempt == 2]


def test_replays_over_the_rate_wait_their_turn_in_persist_order(world: World) -> None:
    timed_out_together(world, 6)
    assert originals(world) == SRIDS[:2]  # a second's worth at once
    assert world.acker.counters()["replays_waited"] == 4
    world.clock.advance(500)
    world.step(2)
    assert originals(world) == SRIDS[:3]
    world.clock.advance(1_000)
    world.step(2)
    assert originals(world) == SRIDS[:5]
    world.clock.advance(2_000)
    world.step(2)
    assert originals(world) == SRIDS[:6]  # every one, in the order they were persisted
    assert {s: world.outcomes()[s] for s in SRIDS[:6]} == dict.fromkeys(SRIDS[:6], "replay")


def test_a_waiting_timeout_still_completes_and_is_not_replayed(world: World) -> None:
    timed_out_together(world, 4)
    world.ack(SRIDS[3], ROOTS[3])  # the last one's tree completes while it waits its turn
    world.step(2)
    world.clock.advance(5_000)
    world.step(3)
    assert originals(world) == SRIDS[:3]
    assert world.outcomes()[SRIDS[3]] == "completed"


def test_what_waits_survives_a_takeover(world: World) -> None:
    timed_out_together(world, 5)
    assert originals(world) == SRIDS[:2]
    world.acker = world.new_acker()  # kill -9: the waiting ones are in the changelog
    world.step(3)
    world.clock.advance(10_000)
    world.step(3)
    world.clock.advance(10_000)
    world.step(3)
    assert sorted(originals(world)) == sorted(SRIDS[:5])
    assert {s: world.outcomes()[s] for s in SRIDS[:5]} == dict.fromkeys(SRIDS[:5], "replay")
