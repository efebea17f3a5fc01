"""The acker's loop never waits for the cluster's metadata (broker.acker.replay_topics): the
partition count of a replay topic is looked up beside it, and while the answer is not in, the
decision that needs it waits and everything else goes on. The real ``Acker`` on a stepped
clock over the in-memory Kafka of tests/unit/log_cluster.py (the harness of test_acker_windows).

Ground truth is what the acker wrote to the logs: tombstones and replays."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from types import SimpleNamespace

import pytest

from broker.acker.replay_topics import UNKNOWN, ReplayTopics
from tests.unit.log_cluster import ClusterProducer
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


def _lookups_answered() -> None:
    """Until the look-ups started so far have answered (on their own threads)."""
    for _ in range(100):
        if not any(t.name.startswith("lookup ") for t in threading.enumerate()):
            return
        threading.Event().wait(0.01)


def _step_until_decided(world: World, srids: set[int]) -> None:
    """Move the clock on a little at a time until every one of ``srids`` has its outcome
    (at most ten turns: what has none then fails the test's assertions)."""
    for _ in range(10):
        world.clock.advance(600)
        world.step(3)
        if srids <= world.outcomes().keys():
            return


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
    _step_until_decided(world, {X})  # the answer comes in on the lookup's thread: a commit or a few later
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
    _lookups_answered()  # the answer comes in on the lookup's thread
    world.fail(Y)
    world.step(3)
    _step_until_decided(world, {X, Y})
    assert world.outcomes() == {X: "replay", Y: "replay"}
    assert [r.origin for r in world.replays()] == [X, Y]


def test_a_new_owner_replays_a_keys_records_in_the_order_they_were_sent(world: World) -> None:
    """X and then Y, of one key, fail. The first owner decides X while its metadata does not
    answer: X waits for its turn, which only that owner knows. It is killed; the new owner's
    metadata answers at once, and Y fails there before X's wait is over. The new owner does
    not know X's key from its changelog entry, yet Y must not go first."""
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
    world.acker = world.new_acker()  # kill -9: the next owner restores X deferred
    world.step(2)
    _lookups_answered()  # its own look-up answers on its thread
    world.fail(Y)
    world.step(3)
    _step_until_decided(world, {X, Y})
    assert world.outcomes() == {X: "replay", Y: "replay"}
    assert [r.origin for r in world.replays()] == [X, Y]


def test_a_keys_record_whose_turn_has_come_waits_while_an_earlier_one_waits_again(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """X and then Y, of one key, fail together while the metadata does not answer: X waits
    for it, Y behind X. At their turn the metadata still has not answered when X asks, and
    has when Y asks (it comes in on the lookup's thread at any moment): X waits again, and Y,
    whose own turn has come, must wait behind it instead of going first."""
    answers = iter([UNKNOWN, UNKNOWN, UNKNOWN])  # X, Y, then X again
    monkeypatch.setattr(ReplayTopics, "partitions", lambda self, topic: next(answers, 4))
    world.send(X, ROOT, max_attempts=3)
    world.clock.advance(1)
    world.send(Y, ROOT_Y, max_attempts=3)
    world.step(2)
    world.fail(X)
    world.fail(Y)
    world.step(3)
    assert world.outcomes() == {}  # X waits for the answer, Y behind it
    _step_until_decided(world, {X, Y})
    assert world.outcomes() == {X: "replay", Y: "replay"}
    assert [r.origin for r in world.replays()] == [X, Y]


def test_a_commit_does_not_wait_for_the_replay_topics_metadata(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit asks the replay topic's partition count again (it may have been deleted since
    the decision): once answered, then never again. X's replay commits without the answer; the
    count answered before stands (or, never answered, is not checked - its decision was)."""
    answered, fired = threading.Event(), threading.Event()

    def list_topics(self: object, topic: str | None = None, **_: object) -> object:
        if topic is not None and topic.endswith(".replay"):
            answered.wait()
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=dict.fromkeys(range(4)))})

    monkeypatch.setattr(ClusterProducer, "list_topics", list_topics)
    timer = threading.Timer(5.0, lambda: (fired.set(), answered.set()))  # the old loop waited 10 s for it
    timer.start()
    try:
        world.send(X, ROOT, max_attempts=3)
        world.step(2)
        world.fail(X)
        world.step(3)
        assert world.outcomes() == {X: "replay"} and not fired.is_set()
    finally:
        timer.cancel()
        answered.set()
