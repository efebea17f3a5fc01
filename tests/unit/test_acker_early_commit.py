"""When the acker commits (``Acker._commit_due``): every ``commit_interval_ms``, and after
half of it when its poll waited for input and completed trees wait for their tombstones - an
early commit. How long an entry stays out of the changelog does not depend on which."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from broker.acker.service import EARLY_COMMIT, Due
from broker.headers import OUTCOME_COMPLETED, OUTCOME_REPLAY
from broker.ledger.clock import ManualClock
from tests.unit import test_acker_timeouts as world
from tests.unit.test_acker_timeouts import fake_kafka

__all__ = ["fake_kafka"]  # the fixture, used by name

INTERVAL_MS = 100


@pytest.mark.parametrize(
    ("since_ms", "idle", "waiting", "due"),
    [
        (INTERVAL_MS, False, False, Due.INTERVAL),  # the interval: always
        (INTERVAL_MS, True, True, Due.INTERVAL),
        (INTERVAL_MS * EARLY_COMMIT, True, True, Due.EARLY),  # early: idle, completions waiting
        (INTERVAL_MS * EARLY_COMMIT, False, True, None),  # busy: keeps to the interval
        (INTERVAL_MS * EARLY_COMMIT, True, False, None),  # nothing completed: nothing to hurry
        (INTERVAL_MS * EARLY_COMMIT, True, "replay", None),  # decisions keep to the interval
        (INTERVAL_MS * EARLY_COMMIT - 1, True, True, None),  # too soon
    ],
)
def test_an_idle_acker_commits_completions_early_a_busy_one_keeps_to_the_interval(
    fake_kafka: None, since_ms: float, idle: bool, waiting: bool | str, due: Due | None
) -> None:
    acker, consumer, _ = world.make_acker(ManualClock(world.T0))
    acker.config = dataclasses.replace(acker.config, commit_interval_ms=INTERVAL_MS)
    consumer.batches.append([world.persist_msg(world.persisted(world.S1, world.R1, world.T0))])
    world.run_steps(acker)  # owns partition 0, S1 registered and committed
    if waiting:
        outcome = OUTCOME_COMPLETED if waiting is True else OUTCOME_REPLAY
        acker.states[0].tombstones.append((np.array([world.S1]), outcome))
        acker.owned.consumed(acker.ns.acks, 0, acker.owned.positions.get((acker.ns.acks, 0), 0))  # as the fold that completed it would
    now = acker._last_commit + since_ms / 1000 + 1e-6  # (float seconds)
    assert acker._commit_due(now, idle) is due


def _logged(producer: world.FakeProducer, srid: int) -> bool:
    return any(p.topic == world.NS.ledger and p.key == srid.to_bytes(8, "big") for p in producer.committed)


def test_an_entry_is_left_out_of_the_changelog_for_unlogged_ms_however_many_commits(fake_kafka: None) -> None:
    """An entry with nothing but its persist record stays out of the changelog for
    ``unlogged_ms`` of the acker's clock, however many commits come between; then the next
    commit logs it."""
    clock = ManualClock(world.T0)
    acker, consumer, producer = world.make_acker(clock, unlogged_ms=600)
    consumer.batches.append([world.persist_msg(world.persisted(world.S1, world.R1, world.T0)), world.persist_msg(world.persisted(world.S2, world.R2, world.T0), 1)])
    world.run_steps(acker)
    consumer.batches.append([world.acks_msg(0, 0, [world.S2], [world.R2])])  # S2 completes
    world.run_steps(acker)
    for _ in range(10):
        clock.advance(50)
        acker.commit()
    assert not _logged(producer, world.S1)  # 500 ms, 10 commits
    clock.advance(100)
    acker.commit()
    assert _logged(producer, world.S1)  # registered 600 ms ago: logged
