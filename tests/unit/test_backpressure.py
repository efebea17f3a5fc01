"""The pure accounting of ``max_pending``: a slot per origin, held through replays, freed by
the final outcome (completed or dlq) or by a persist record that was never delivered."""

from __future__ import annotations

import pytest

from broker.source.backpressure import PendingWindow


def test_completion_frees_a_slot() -> None:
    w = PendingWindow(2)
    w.sent(11, 11)
    w.sent(12, 12)
    assert w.full and len(w) == 2
    w.outcome(11, "completed")
    assert not w.full and len(w) == 1
    assert w.counters["completed"] == 1


def test_a_replayed_record_keeps_its_slot_until_its_last_attempt_completes() -> None:
    w = PendingWindow(1)
    w.sent(11, 11)
    w.outcome(11, "replay")  # superseded by a new attempt: still pending
    assert w.full
    w.persisted(21, 11)  # the new attempt, same origin
    w.outcome(21, "replay")
    w.persisted(31, 11)
    assert w.full
    w.outcome(31, "completed")
    assert len(w) == 0
    assert w.counters == {"replayed": 2, "followed": 2, "completed": 1}


@pytest.mark.parametrize("outcome", ["completed", "dlq"])
def test_a_final_outcome_frees_the_slot(outcome: str) -> None:
    w = PendingWindow(1)
    w.sent(11, 11)
    w.persisted(11, 11)  # its own persist record read back: nothing changes
    w.outcome(11, outcome)
    assert len(w) == 0 and w.counters[outcome] == 1


def test_records_of_others_are_not_counted() -> None:
    w = PendingWindow(1)
    w.persisted(99, 98)  # another source's record
    w.outcome(99, "completed")
    w.outcome(5, "dlq")  # a tombstone of a srid never seen
    assert len(w) == 0 and not w.counters
    w.sent(11, 11)
    w.outcome(11, "completed")
    w.outcome(11, "completed")  # a duplicate tombstone frees nothing more
    assert len(w) == 0 and w.counters["completed"] == 1


def test_a_record_never_persisted_frees_its_slot() -> None:
    w = PendingWindow(1)
    w.sent(11, 11)
    w.not_persisted(11)
    w.not_persisted(11)
    assert len(w) == 0 and w.counters["not_persisted"] == 1


def test_redriven_records_sharing_an_origin_hold_a_slot_each() -> None:
    w = PendingWindow(3)
    w.sent(11, 7)
    w.sent(12, 7)
    assert len(w) == 2
    w.outcome(11, "completed")
    assert len(w) == 1
    w.outcome(12, "dlq")
    assert len(w) == 0


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        PendingWindow(0)
