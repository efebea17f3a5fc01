"""Back-off between attempts (``SourceConfig.retry``, carried in the persist record; docs/design.md
§6): a failed or timed-out attempt waits deferred in its table until its back-off has passed,
then is replayed; while it waits a timed-out one still completes if its tree does; a key's
replays keep their order whatever their delays. The real ``Acker`` on a stepped clock over the
in-memory Kafka of tests/unit/log_cluster.py (the harness of test_acker_windows).

Ground truth is what the acker wrote to the logs: replays' persist records, tombstones."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from broker import ids
from broker.retry import RetryPolicy
from broker.schemas import PersistedRecord, XorBatch
from tests.unit.test_acker_windows import NS, World


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    yield World(monkeypatch)


SLOW = RetryPolicy(initial_ms=2_000, multiplier=3.0, max_ms=60_000, jitter=0.0)
A, B, C = 0x1F3A_5C7E_9B2D_5000, 0x1F3A_5C7E_9B2D_5001, 0x1F3A_5C7E_9B2D_5002
ROOT = 0x3243_F6A8_885A_5000


def send(world: World, srid: int, *, retry: RetryPolicy | None = SLOW, key: bytes = b"customer-7",
         attempt: int = 1, khp: int = 3) -> None:
    record = PersistedRecord(
        srid=srid, origin=srid, attempt=attempt, root_xor=ROOT + srid % 100, record_id=ROOT + srid % 100,
        topic="orders", key_hash_partition=khp, key=key, value=b"order", created_ms=world.clock.now_ms(),
        timeout_ms=1_000, max_attempts=5, retry=retry,
    )
    world.cluster.append(NS.persist, 0, ids.encode_id(srid), record.encode())


def fail(world: World, srid: int) -> None:
    empty = np.array([], np.int64)
    world.cluster.append(NS.acks, 0, None, XorBatch(0, empty, empty, np.array([srid])).encode())


def replayed(world: World) -> list[int]:
    """The originals of the replays the acker wrote (its records have a history), in the order
    it wrote them."""
    return [r.origin for r in world.replays() if r.history]


def test_a_timeout_is_replayed_once_its_back_off_has_passed(world: World) -> None:
    send(world, A)
    world.step(2)
    world.clock.advance(1_200)
    world.step(2)  # timed out: it waits 2 s
    assert not replayed(world) and not world.outcomes()
    world.clock.advance(1_500)
    world.step(2)
    assert not replayed(world)
    world.clock.advance(700)
    world.step(3)
    assert replayed(world) == [A]
    (again,) = [r for r in world.replays() if r.history]
    assert again.retry == SLOW  # every attempt carries the policy
    assert again.history[-1].at_ms - again.history[-1].at_ms % 100 <= world.clock.now_ms()


def test_a_timeout_that_completes_while_it_waits_is_never_replayed(world: World) -> None:
    send(world, A)
    world.step(2)
    world.clock.advance(1_200)
    world.step(2)
    world.ack(A, ROOT + A % 100)  # its tree completes during the back-off
    world.step(2)
    world.clock.advance(5_000)
    world.step(3)
    assert not replayed(world) and world.outcomes() == {A: "completed"}


def test_without_a_policy_a_failure_is_replayed_at_once(world: World) -> None:
    send(world, A, retry=None)
    world.step(2)
    fail(world, A)
    world.step(3)
    assert replayed(world) == [A]


def test_a_keys_replays_keep_their_order_whatever_their_delays(world: World) -> None:
    """A (attempt 3: an 18 s back-off) fails before B and C of the same key (attempt 1: 2 s);
    D, another key, does not wait for them."""
    d = 0x1F3A_5C7E_9B2D_5004
    send(world, A, attempt=3)
    send(world, B)
    send(world, C)
    send(world, d, khp=1, key=b"customer-9")
    world.step(2)
    for s in (A, B, C, d):
        fail(world, s)
    world.step(3)
    world.clock.advance(2_100)
    world.step(3)
    assert replayed(world) == [d]  # B and C wait behind A
    world.clock.advance(16_000)
    world.step(3)
    assert replayed(world) == [d, A, B, C]


def fail_after(world: World, srid: int, retry_after_ms: int) -> None:
    """A fail mark with the delay the task asked for (``ctx.fail(retry_after_ms=...)``)."""
    empty = np.array([], np.int64)
    batch = XorBatch(0, empty, empty, np.array([srid]), retry_after_ms=np.array([retry_after_ms], np.int64))
    world.cluster.append(NS.acks, 0, None, batch.encode())


def test_a_retry_after_beats_the_policy_shorter_or_longer(world: World) -> None:
    """The policy waits 2 s; A asked for 0.5 s, B for 10 s, C for nothing: the policy's."""
    send(world, A)
    send(world, B, key=b"customer-8", khp=2)
    send(world, C, key=b"customer-9", khp=1)
    world.step(2)
    fail_after(world, A, 500)
    fail_after(world, B, 10_000)
    fail(world, C)
    world.step(3)
    assert not replayed(world)
    world.clock.advance(700)
    world.step(3)
    assert replayed(world) == [A]
    world.clock.advance(1_500)
    world.step(3)
    assert replayed(world) == [A, C]
    world.clock.advance(6_000)
    world.step(3)
    assert B not in replayed(world)  # 8.2 s of its 10 s (A's and C's replays timed out meanwhile)
    world.clock.advance(2_000)
    world.step(3)
    assert B in replayed(world)
    assert all(r.retry == SLOW for r in world.replays())  # the next failure has the policy again


def test_a_retry_after_waits_without_a_policy_and_0_replays_at_once(world: World) -> None:
    send(world, A, retry=None)
    send(world, B, retry=SLOW, key=b"customer-8", khp=2)
    world.step(2)
    fail_after(world, A, 3_000)
    fail_after(world, B, 0)
    world.step(3)
    assert replayed(world) == [B]
    world.clock.advance(2_000)
    world.step(3)
    assert replayed(world) == [B]
    world.clock.advance(1_200)
    world.step(3)
    assert replayed(world) == [B, A]


def test_a_retry_after_survives_a_takeover(world: World) -> None:
    """When the task asked the replay to go is in the waiting entry's changelog record: a new
    owner replays it then too - without it, no policy would replay it at once."""
    send(world, A, retry=None)
    world.step(2)
    fail_after(world, A, 5_000)
    folded_ms = world.clock.now_ms()
    world.step(3)
    assert not replayed(world)
    world.clock.advance(1_000)
    world.acker = world.new_acker()  # kill -9
    world.step(3)
    # Restored, so that a decision put off past a takeover (a payload not readable yet, a
    # record newer than one not read) still waits for it.
    assert world.acker.states[0].retry_at == {A: folded_ms + 5_000}
    world.clock.advance(3_700)
    world.step(3)
    assert not replayed(world)  # 4.7 s of its 5 s
    world.clock.advance(700)
    world.step(3)
    assert replayed(world) == [A]  # 5 s from its failure, not again from the takeover
    assert world.outcomes() == {A: "replay"}


def test_the_metrics_counters_attempts_at_the_end_failures_by_class_and_why_replays_wait(world: World) -> None:
    """A fails (transient) and waits its back-off, B times out and waits too, C is rejected at
    its first attempt, D fails on its last (attempt 5): the attempts each ended at, the
    failures by class, and the replays backing off apart from those held back by their turn."""
    d = 0x1F3A_5C7E_9B2D_5004
    send(world, A)
    send(world, B, key=b"customer-8", khp=2)
    send(world, C, key=b"customer-9", khp=1)
    send(world, d, key=b"customer-6", khp=0, attempt=5)
    world.step(2)
    fail(world, A)
    fail(world, d)
    empty = np.array([], np.int64)
    world.cluster.append(NS.acks, 0, None, XorBatch(0, empty, empty, empty, rejected=np.array([C]),
                                                    rejected_reasons=("bad",)).encode())
    world.step(2)
    world.clock.advance(1_200)
    world.step(3)  # B timed out
    (st,) = world.acker.states.values()
    assert (len(st.replay_turns), st.backing_off) == (2, 2)
    world.clock.advance(2_100)
    world.step(3)
    assert sorted(replayed(world)) == sorted([A, B]) and st.backing_off == 0
    for replay in [r for r in world.replays() if r.history]:
        world.ack(replay.srid, replay.root_xor)
    world.step(3)
    c = world.acker.counters()
    assert (c["failed"], c.get("failed_rejected"), c["timed_out"]) == (3, 1, 1)
    assert (c["replays_backed_off"], c.get("replays_waited", 0)) == (2, 0)
    assert (c["ended_completed_le_2"], c["ended_completed_attempts"]) == (2, 4)
    assert (c["ended_dlq_le_1"], c["ended_dlq_le_5"], c["ended_dlq_attempts"]) == (1, 1, 6)


# ---------------------------------------------------------------- issue 57: where inputs meet


def test_a_retry_after_for_a_record_waiting_its_back_off_is_honoured_as_by_a_new_owner(world: World) -> None:
    """A times out and waits its 2 s back-off; its task then fails it asking for 10 s: the
    live acker waits the 10 s, as a new owner (no turns in memory) does."""
    send(world, A)
    world.step(2)
    world.clock.advance(1_200)
    world.step(3)  # timed out: waits until 3.2 s
    fail_after(world, A, 10_000)  # folded at 1.2 s: its replay at 11.2 s
    world.step(3)
    world.clock.advance(2_500)
    world.step(3)
    assert not replayed(world)
    world.clock.advance(6_000)
    world.step(3)
    assert not replayed(world)  # 9.7 s
    world.clock.advance(1_700)
    world.step(3)
    assert replayed(world) == [A]


def test_a_record_that_completes_while_it_waits_lets_its_keys_turn_go(world: World) -> None:
    """A (attempt 3: an 18 s back-off) times out, then completes late while it waits; B, same
    key, fails after: it waits its own 2 s, not A's turn - and nothing counts A as waiting."""
    send(world, A, attempt=3)
    world.step(2)
    world.clock.advance(1_200)
    world.step(3)  # A waits until 19.2 s
    world.ack(A, ROOT + A % 100)
    send(world, B)
    world.step(3)
    fail(world, B)
    world.step(3)
    (st,) = world.acker.states.values()
    assert (len(st.replay_turns), st.backing_off) == (1, 1)  # B's only
    world.clock.advance(2_200)
    world.step(3)
    assert replayed(world) == [B] and world.outcomes()[A] == "completed"
    assert (len(st.replay_turns), st.backing_off, dict(st.replays_waiting)) == (0, 0, {})


def test_a_failure_waits_its_own_back_off_behind_no_later_record_of_its_key(world: World) -> None:
    """A fails and is replayed at 2.1 s; B, same key, sent before that replay, fails while the
    replay waits its 6 s: B waits its own 2 s - only an earlier record of its key that still
    waits may hold it back."""
    send(world, A)
    world.step(2)
    fail(world, A)
    world.step(3)
    world.clock.advance(1_900)
    send(world, B)  # sent at 1.9 s
    world.step(2)
    world.clock.advance(200)
    world.step(3)
    (again,) = [r for r in world.replays() if r.history]  # A's second attempt, sent at 2.1 s
    world.step(3)
    fail(world, again.srid)  # waits until 8.1 s
    world.step(3)
    world.clock.advance(400)
    fail(world, B)  # at 2.5 s: waits until 4.5 s
    world.step(3)
    world.clock.advance(2_100)
    world.step(3)
    assert replayed(world) == [A, B]
    world.clock.advance(3_600)
    world.step(3)
    assert replayed(world) == [A, B, A]


def test_a_failures_back_off_runs_from_its_fold_across_a_takeover(world: World) -> None:
    """A fails at 0 s and waits its 2 s back-off; the acker is killed at 1.5 s: the new owner
    replays A at 2 s, as the first would have - not 2 s after it took over (the fold's time is
    in A's changelog record)."""
    send(world, A)
    world.step(2)
    fail(world, A)
    world.step(3)  # folded at 0 s: its replay at 2 s
    assert not replayed(world)
    world.clock.advance(1_500)
    world.acker = world.new_acker()  # kill -9
    world.step(3)
    assert not replayed(world)
    world.clock.advance(700)
    world.step(3)
    assert replayed(world) == [A]  # at 2.2 s (its own back-off), not at 3.5 s
