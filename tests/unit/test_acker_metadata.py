"""The acker's loop never waits for the cluster's metadata (broker.acker.replay_topics): the
partition count of a replay topic is looked up beside it, and while the answer is not in, the
decision that needs it waits and everything else goes on. The real ``Acker`` on a stepped
clock over the in-memory Kafka of tests/unit/log_cluster.py (the harness of test_acker_windows).

Ground truth is what the acker wrote to the logs: tombstones and replays."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

import pytest

from tests.unit.test_acker_windows import ROOT, World, X

Y, ROOT_Y = X + 1, ROOT + 1


class SlowMetadata:
    """``partition_counts`` of a cluster whose metadata does not answer until ``answer()`` (or,
    at the latest, after 10 s: a loop that waited for it then goes on, too late)."""

    def __init__(self) -> None:
        self.answered = threading.Event()
        self.asked: list[list[str]] = []

    def __call__(self, names: list[str]) -> Mapping[str, int | None]:
        if any(n.endswith(".replay") for n in names):
            self.asked.append(list(names))
            self.answered.wait(10)
        return dict.fromkeys(names, 4)

    def answer(self) -> None:
        self.answered.set()


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    yield World(monkeypatch)


def test_a_decision_waits_for_metadata_that_does_not_answer_and_the_rest_goes_on(
        world: World) -> None:
    """X (a new data topic: its registration asks for its replay topic) fails while the
    metadata does not answer: it is not replayed yet, and Y completes meanwhile; once the
    metadata answers, X is replayed."""
    slow = SlowMetadata()
    world.cluster.partition_counts = slow  # type: ignore[method-assign]  # the port's look-up
    world.acker = world.new_acker()
    world.send(X, ROOT, max_attempts=3)
    world.send(Y, ROOT_Y, max_attempts=3)
    world.step(2)
    world.fail(X)
    world.ack(Y, ROOT_Y)
    world.step(3)
    assert slow.asked and world.outcomes() == {Y: "completed"}  # before the answer
    slow.answer()
    for _ in range(10):  # the answer comes in on the lookup's thread: a commit or a few later
        world.clock.advance(600)
        world.step(3)
        if X in world.outcomes():
            break
    assert world.outcomes() == {Y: "completed", X: "replay"}
    assert [r.origin for r in world.replays()] == [X]


def test_a_keys_record_decided_once_the_metadata_answers_waits_behind_the_one_that_waited_for_it(
        world: World) -> None:
    """X and then Y, of one key (data topic, record key), both fail. X is decided while the
    metadata does not answer, so it waits; the answer comes in, and Y is decided before X's
    wait is over. Y must not go first: the key's replays keep the order it was sent in."""
    slow = SlowMetadata()
    world.cluster.partition_counts = slow  # type: ignore[method-assign]  # the port's look-up
    world.acker = world.new_acker()
    world.send(X, ROOT, max_attempts=3)
    world.clock.advance(1)
    world.send(Y, ROOT_Y, max_attempts=3)
    world.step(2)
    world.fail(X)
    world.step(3)
    assert world.outcomes() == {}  # X waits for the answer
    slow.answer()
    for _ in range(100):  # the answer comes in on the lookup's thread
        if not any(t.name.startswith("lookup ") for t in threading.enumerate()):
            break
        threading.Event().wait(0.01)
    world.fail(Y)
    world.step(3)
    for _ in range(10):
        world.clock.advance(600)
        world.step(3)
        if {X, Y} <= world.outcomes().keys():
            break
    assert world.outcomes() == {X: "replay", Y: "replay"}
    assert [r.origin for r in world.replays()] == [X, Y]
