"""``LedgerTable.touch``: a deadline extension moves a pending entry's deadline forward and
nothing else - never shortens it, never changes the XOR value, never completes - a touch read
before the srid's persist record is kept for its registration, and the changelog carries the
new deadline so a restored table keeps it."""

from __future__ import annotations

import numpy as np

from broker.ledger.table import LedgerTable

S1 = 0x1F3A_5C7E_9B2D_4E61
S2 = S1 + 4
S3 = S1 + 8
A = 0x2B7E_1516_28AE_D2A6
B = 0x3243_F6A8_885A_308D
TTL = 600  # ticks an unregistered entry waits for its persist record


def arr(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def registered(*srids: int, deadline: int = 100) -> LedgerTable:
    t = LedgerTable()
    n = len(srids)
    t.register(arr(*srids), arr(*[A] * n), arr(*range(n)), arr(*[deadline] * n))
    return t


def test_a_touch_pushes_the_deadline_so_the_entry_outlives_its_first_timeout() -> None:
    t = registered(S1, S2)
    assert t.touch(arr(S1), arr(250)) == 1
    assert t.get(S1).deadline == 250  # type: ignore[union-attr]
    expired = t.expire(100)
    assert expired.timed_out.srids.tolist() == [S2]
    assert S1 in t and not t.expire(249).timed_out.srids.size
    assert t.expire(250).timed_out.srids.tolist() == [S1]


def test_a_touch_never_shortens_a_deadline_and_never_changes_the_value() -> None:
    t = registered(S1)
    t.take_dirty()
    before = t.get(S1)
    assert t.touch(arr(S1, S1), arr(40, 90)) == 1  # both earlier than 100
    after = t.get(S1)
    assert after == before  # same deadline, same value, not even dirty
    assert not t.take_dirty().upserts.srids.size


def test_a_touch_cannot_complete_a_tree() -> None:
    t = registered(S1)
    t.touch(arr(S1), arr(500))
    assert t.get(S1).value == A  # type: ignore[union-attr]
    done = t.fold(arr(S1), arr(A), 50)  # the ack completes it, as without the touch
    assert done.srids.tolist() == [S1]


def test_touches_of_failed_deferred_or_watched_entries_are_ignored() -> None:
    t = registered(S1, S2)
    t.mark_failed(arr(S2), 60)
    assert t.touch(arr(S2, 0), arr(900, 900), TTL) == 0
    assert t.get(S2).deadline == 100  # type: ignore[union-attr]
    assert len(t) == 2


def test_a_touch_before_the_persist_record_is_kept_for_its_registration() -> None:
    t = LedgerTable()
    t.fold(arr(S3), arr(B), 60 + TTL)  # S3: an event at tick 60, before its persist record
    assert t.touch(arr(S3, S2), arr(900, 300), TTL) == 2  # S2: nothing known of it yet
    # Each waits for its persist record TTL past its touched deadline (an orphan after that).
    assert (t.get(S3).deadline, t.get(S2).deadline) == (900 + TTL, 300 + TTL)  # type: ignore[union-attr]
    assert not t.get(S2).registered and t.get(S2).dirty  # type: ignore[union-attr]
    t.register(arr(S1, S2, S3), arr(A, A, A), arr(0, 1, 2), arr(100, 500, 100), orphan_ttl=TTL)
    # The later of the record's deadline and the touched one.
    assert [t.get(s).deadline for s in (S1, S2, S3)] == [100, 500, 900]  # type: ignore[union-attr]


def test_an_event_before_the_persist_record_leaves_the_record_its_deadline() -> None:
    t = LedgerTable()
    t.fold(arr(S3), arr(B), 60 + TTL)  # an orphan deadline is no touch
    t.register(arr(S3), arr(A), arr(0), arr(100), orphan_ttl=TTL)
    assert t.get(S3).deadline == 100  # type: ignore[union-attr]


def test_the_latest_deadline_of_a_srid_wins_within_a_batch() -> None:
    t = registered(S1)
    t.touch(arr(S1, S1, S1), arr(300, 700, 500))
    assert t.get(S1).deadline == 700  # type: ignore[union-attr]


def test_the_changelog_carries_the_pushed_deadline_to_a_restored_table() -> None:
    t = registered(S1)
    t.take_dirty()  # S1 is in the changelog with deadline 100
    t.touch(arr(S1), arr(400))
    delta = t.take_dirty()
    assert delta.upserts.srids.tolist() == [S1]
    assert delta.upserts.deadlines.tolist() == [400]
    replica = LedgerTable()
    up = delta.upserts
    replica.restore(up.srids, up.values, up.flags, up.offsets, up.deadlines)
    assert not replica.expire(399).timed_out.srids.size
    assert replica.expire(400).timed_out.srids.tolist() == [S1]
