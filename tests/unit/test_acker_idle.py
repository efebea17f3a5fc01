"""An idle acker costs little: with nothing to read it waits in its poll until the next commit
may be due (``Acker._poll_timeout_s``) and polls briefly while something moves without input;
a commit that finds every partition idle makes the next ones skip, until something is read,
a partition comes or goes, or a second passed (``Acker._still_quiet``)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from broker.acker import Acker, AckerConfig
from broker.acker.service import LONG_POLL_MAX_S
from broker.acker.state import PartitionState
from broker.ledger.clock import ManualClock
from broker.settings import KafkaSettings
from tests.unit.fakes import WHOLE_RESTORE, FakeConsumer, FakeKafka
from tests.unit.test_acker_timeouts import (  # noqa: F401 - the fixture
    NS,
    R1,
    S1,
    T0,
    acks_msg,
    fake_kafka,
    make_acker,
    outcomes,
    persist_msg,
    persisted,
    run_steps,
)

SHORT_S = 0.02


def _acker(commit_interval_ms: int = 100) -> tuple[Acker, FakeConsumer, list[float]]:
    config = AckerConfig(commit_interval_ms=commit_interval_ms, instance_id="unit", stats_interval_ms=10**12,
                         poll_timeout_ms=int(SHORT_S * 1000), **WHOLE_RESTORE)
    acker = Acker(KafkaSettings("fake:9092"), NS, config, clock=ManualClock(T0), kafka=FakeKafka())
    consumer = FakeConsumer.last
    assert consumer is not None
    waits: list[float] = []
    polled = consumer.poll

    def poll(timeout: float = -1, *rest: Any) -> Any:
        waits.append(timeout)
        return polled(timeout, *rest)

    consumer.poll = poll  # type: ignore[method-assign]
    return acker, consumer, waits


def test_an_acker_with_nothing_to_read_polls_until_its_next_commit(fake_kafka: None) -> None:  # noqa: F811
    acker, _, waits = _acker()
    run_steps(acker, 6)
    assert acker.states, "restored and serving"
    # after the restore's steps (short polls), every poll waits out what is left of the interval
    idle = waits[-3:]
    assert all(SHORT_S < w <= LONG_POLL_MAX_S for w in idle), waits
    assert max(idle) > 0.05, waits  # the whole interval at least once after a commit


def test_an_acker_that_read_something_polls_until_its_early_commit(fake_kafka: None) -> None:  # noqa: F811
    acker, consumer, waits = _acker()
    run_steps(acker, 4)
    consumer.batches.append([persist_msg(persisted(1, 1, T0))])
    acker.step()  # reads the persist record: it is read, not yet committed
    assert acker.owned.read
    acker._last_commit = time.monotonic()
    acker.step()
    # half of the 100 ms interval: the early commit's point (Acker._commit_due)
    assert SHORT_S < waits[-1] <= 0.05 + 1e-9, waits


@pytest.mark.parametrize("moving", ["restore", "resume", "paused acks"])
def test_an_acker_polls_briefly_while_something_moves_without_input(fake_kafka: None, moving: str) -> None:  # noqa: F811
    acker, _, _ = _acker(commit_interval_ms=10_000)
    run_steps(acker, 4)
    now = time.monotonic()
    acker._last_commit = now
    assert acker._poll_timeout_s(now) == LONG_POLL_MAX_S  # (capped: a long interval)
    if moving == "restore":
        acker.restores.pending.append(object())  # type: ignore[arg-type]
    elif moving == "resume":
        acker.assignment.to_resume = [object()]  # type: ignore[list-item]
    else:
        acker.reading.paused.add(0)
    assert acker._poll_timeout_s(now) == SHORT_S


def _counting_idle(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times a commit asked a partition whether it is idle."""
    asked = [0]
    idle = PartitionState.idle

    def counted(self: PartitionState) -> bool:
        asked[0] += 1
        return idle(self)

    monkeypatch.setattr(PartitionState, "idle", counted)
    return asked


def test_a_quiet_acker_skips_its_commits_until_it_reads(fake_kafka: None, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)  # every step commits (interval 0)
    asked = _counting_idle(monkeypatch)
    run_steps(acker, 3)
    assert acker.states and asked[0] > 0  # restored, and a commit looked at every partition
    looked = asked[0]
    run_steps(acker, 20)
    assert asked[0] == looked, "quiet: no commit looked at any partition again"
    # a record arrives: the next commit looks, and the record completes as always
    consumer.batches.append([persist_msg(persisted(S1, R1, T0))])
    consumer.batches.append([acks_msg(0, 0, [S1], [R1])])
    run_steps(acker, 3)
    assert asked[0] > looked
    assert outcomes(producer) == {S1: b"completed"}


def test_a_quiet_acker_looks_again_after_a_second_or_a_change_of_partitions(
    fake_kafka: None, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    acker, _, _ = make_acker(ManualClock(T0))
    asked = _counting_idle(monkeypatch)
    run_steps(acker, 5)
    looked = asked[0]
    acker.assignment.drop({0})  # revoked or lost
    run_steps(acker)
    assert asked[0] > looked
    looked = asked[0]
    run_steps(acker, 3)
    assert asked[0] == looked
    acker.config = dataclasses.replace(acker.config, quiet_recheck_ms=0)
    run_steps(acker, 3)
    assert asked[0] > looked


def test_an_acker_with_a_pending_record_is_never_quiet(fake_kafka: None, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    clock = ManualClock(T0)
    acker, consumer, producer = make_acker(clock)
    consumer.batches.append([persist_msg(persisted(S1, R1, T0, timeout_ms=30_000))])
    run_steps(acker, 5)
    assert acker.counters()["pending"] == 1
    clock.advance(31_000)  # nothing read since: the timeout is still decided at the next commit
    run_steps(acker)
    assert outcomes(producer) == {S1: b"replay"}
