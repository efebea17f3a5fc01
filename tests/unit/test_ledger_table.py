"""LedgerTable, table-driven: each case is a script of operations and what each must return.

Ids are fixed 64-bit constants so that no subset of them XORs to 0 by accident.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from broker.ids import new_ids
from broker.ledger.table import (
    DEFERRED,
    DURABLE_FLAGS,
    FAILED,
    REGISTERED,
    SUPERSEDED,
    WATCH,
    Entry,
    LedgerTable,
)

# srids (two of one ledger partition mod 4, plus the extremes of int64)
S1 = 0x1F3A_5C7E_9B2D_4E61
S2 = S1 + 4
S_MIN = -(2**63)
S_MAX = 2**63 - 1
# record ids
A = 0x2B7E_1516_28AE_D2A6
B = 0x3243_F6A8_885A_308D
C = 0x1319_8A2E_0370_7344
D = -0x5A4F_2E1C_9B3D_7A11
E = 0x0A40_9382_2299_F31D
F = -0x082E_FA98_EC4E_6C89

ORPHAN = 50  # orphan deadline (tick) used by every fold / fail step
TIMEOUT = 300  # deadline (tick) of every persist record

Step = tuple[str, Any, Any]


def root(srid: int, *children: int, offset: int = 7) -> tuple[int, int, int, int]:
    """A persist record: (srid, root_xor, offset, deadline)."""
    x = 0
    for c in children:
        x ^= c
    return (srid, x, offset, TIMEOUT)


def event(srid: int, record: int, *children: int) -> tuple[int, int]:
    """A task's event for input ``record``: ack and anchoring in one value."""
    x = record
    for c in children:
        x ^= c
    return (srid, x)


# fan-out tree of S1: source emits A, B; A -> C, D; B -> E; C, D, E are leaves
FANOUT_EVENTS = [event(S1, A, C, D), event(S1, B, E), event(S1, C), event(S1, D), event(S1, E)]

CASES: dict[str, list[Step]] = {
    "leaf only": [
        ("register", [root(S1, A)], ([], [False])),
        ("entry", S1, {"registered": True, "value": A}),
        ("fold", [event(S1, A)], [S1]),
        ("entry", S1, None),
    ],
    "fan-out, events in tree order": [
        ("register", [root(S1, A, B)], ([], [False])),
        ("fold", FANOUT_EVENTS[:4], []),
        ("fold", FANOUT_EVENTS[4:], [S1]),
    ],
    "fan-out, one batch, reverse order": [
        ("register", [root(S1, A, B)], ([], [False])),
        ("fold", FANOUT_EVENTS[::-1], [S1]),
    ],
    "events before the root": [
        ("fold", FANOUT_EVENTS, []),
        ("entry", S1, {"registered": False, "deadline": ORPHAN}),
        ("register", [root(S1, A, B, offset=11)], ([S1], [False])),
        ("entry", S1, None),
    ],
    "two trees interleaved in one batch": [
        ("register", [root(S1, A), root(S2, B)], ([], [False, False])),
        ("fold", [event(S2, B, C), event(S1, A), event(S2, C)], [S1, S2]),
    ],
    "duplicated task event only delays": [
        ("register", [root(S1, A, B)], ([], [False])),
        ("fold", [*FANOUT_EVENTS, event(S1, C)], []),  # C's event twice: as if missing
        ("fold", [event(S1, C)], [S1]),  # a third copy makes the count odd again
    ],
    "explicit failure before registration": [
        ("fail", [S1], None),
        ("fold", FANOUT_EVENTS, []),
        ("take_failed", None, []),  # not registered: nothing to replay yet
        ("register", [root(S1, A, B, offset=9)], ([], [False])),  # value 0, but failed
        ("entry", S1, {"registered": True, "failed": True, "value": 0}),
        ("take_failed", None, [(S1, 9)]),
        ("entry", S1, None),
    ],
    "explicit failure after registration": [
        ("register", [root(S1, A, B, offset=5)], ([], [False])),
        ("fail", [S1], None),
        ("fold", FANOUT_EVENTS, []),  # failure wins over completion
        ("take_failed", None, [(S1, 5)]),
        ("take_failed", None, []),
    ],
    "duplicate root is refused": [
        ("register", [root(S1, A, B)], ([], [False])),
        ("register", [root(S1, A, B)], ([], [True])),  # folding it would give value 0
        ("entry", S1, {"registered": True, "value": A ^ B}),
        ("fold", FANOUT_EVENTS, [S1]),
    ],
    "duplicate root inside one batch": [
        ("register", [root(S1, A), root(S1, A), root(S2, B)], ([], [False, True, False])),
        ("entry", S1, {"value": A}),
    ],
    "late event after completion is an orphan that expires": [
        ("register", [root(S1, A)], ([], [False])),
        ("fold", [event(S1, A)], [S1]),
        ("fold", [event(S1, A)], []),
        ("entry", S1, {"registered": False, "value": A, "deadline": ORPHAN}),
        ("expire", ORPHAN - 1, ([], [])),
        ("expire", ORPHAN, ([], [S1])),
        ("entry", S1, None),
    ],
    "timeout of a registered entry": [
        ("register", [root(S1, A, offset=3), root(S2, B, offset=4)], ([], [False, False])),
        ("fold", [event(S2, B)], [S2]),
        ("expire", TIMEOUT - 1, ([], [])),
        ("expire", TIMEOUT, ([(S1, 3)], [])),
        ("fold", [event(S1, A)], []),  # too late: an orphan now
    ],
    "root registered after its orphan deadline passed": [
        ("fold", [event(S1, A)], []),
        ("expire", ORPHAN, ([], [S1])),
        ("register", [root(S1, A)], ([], [False])),  # the early event is lost: times out
        ("expire", TIMEOUT, ([(S1, 7)], [])),
    ],
    "extreme srids": [
        ("register", [root(S_MIN, A), root(S_MAX, B)], ([], [False, False])),
        ("fold", [event(S_MIN, A)], [S_MIN]),
        ("entry", S_MIN, None),
        ("fold", [event(S_MIN, C)], []),  # reuses INT64_MIN's own tombstone slot
        ("entry", S_MIN, {"registered": False, "value": C}),
        ("fold", [event(S_MAX, B)], [S_MAX]),
    ],
}


def _run(table: LedgerTable, steps: list[Step]) -> None:
    for i, (op, arg, expected) in enumerate(steps):
        where = f"step {i} {op}"
        if op == "register":
            s, x, o, d = (np.array(col) for col in zip(*arg, strict=True))
            completed, duplicates = table.register(s, x, o, d.astype(np.int32))
            got: Any = (sorted(completed.srids.tolist()), duplicates.tolist())
        elif op == "fold":
            s, x = (np.array(col, dtype=np.int64) for col in zip(*arg, strict=True))
            got = sorted(table.fold(s, x, ORPHAN).srids.tolist())
        elif op == "fail":
            table.mark_failed(np.array(arg), ORPHAN)
            got = None
        elif op == "take_failed":
            failed = table.take_failed()
            got = sorted(zip(failed.srids.tolist(), failed.offsets.tolist(), strict=True))
        elif op == "expire":
            timed_out, orphans = table.expire(arg)
            t = sorted(zip(timed_out.srids.tolist(), timed_out.offsets.tolist(), strict=True))
            got = (t, sorted(orphans.srids.tolist()))
        elif op == "entry":
            entry = table.get(arg)
            if expected is None:
                assert entry is None, where
            else:
                assert entry is not None, where
                for field, value in expected.items():
                    assert getattr(entry, field) == value, f"{where}: {field}"
            continue
        else:
            raise AssertionError(f"unknown op {op}")
        assert got == expected, where


@pytest.mark.parametrize("steps", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("capacity", [8, 1024])
def test_fold_cases(steps: list[Step], capacity: int) -> None:
    _run(LedgerTable(capacity), steps)


def test_entry_fields_and_flags() -> None:
    table = LedgerTable()
    table.register(np.array([S1]), np.array([A]), np.array([17]), np.array([99], np.int32))
    assert table.get(S1) == Entry(
        srid=S1,
        value=A,
        offset=17,
        deadline=99,
        registered=True,
        failed=False,
        logged=False,
        dirty=False,  # its persist record is all of it: the changelog leaves it out
    )
    assert S1 in table
    assert S2 not in table
    assert 0 not in table
    assert len(table) == 1
    assert table.nbytes == table.capacity * (8 + 8 + 8 + 4 + 1)
    assert table.bytes_per_entry == table.nbytes
    assert LedgerTable().bytes_per_entry == float("inf")
    assert DURABLE_FLAGS == REGISTERED | FAILED | DEFERRED | WATCH | SUPERSEDED


def test_an_entry_whose_deadline_the_acker_gave_is_a_change_from_its_registration() -> None:
    """An adaptive deadline is not in the persist record: the changelog must carry it."""
    table = LedgerTable()
    table.register(np.array([S1, S2]), np.array([A, A]), np.array([3, 4]), np.array([99, 99], np.int32),
                   np.array([True, False]))
    assert table.get(S1).dirty and not table.get(S2).dirty  # type: ignore[union-attr]
    up = table.take_dirty().upserts
    assert (up.srids.tolist(), up.deadlines.tolist()) == ([S1], [99])
    assert table.unlogged_floor() == 4  # only S2 is left to ns.persist


def test_srid_zero_is_rejected() -> None:
    table = LedgerTable()
    with pytest.raises(ValueError, match="srid 0"):
        table.fold(np.array([5, 0, -5]), np.array([1, 2, 3]), ORPHAN)
    with pytest.raises(ValueError, match="srid 0"):
        table.register(np.array([0]), np.array([1]), np.array([1]), np.array([1]))
    assert len(table) == 0


def test_mismatched_columns_are_rejected() -> None:
    with pytest.raises(ValueError, match="xors"):
        LedgerTable().fold(np.array([1, 2]), np.array([1]), ORPHAN)


def test_empty_batches() -> None:
    table = LedgerTable()
    empty = np.empty(0, np.int64)
    assert len(table.fold(empty, empty, ORPHAN)) == 0
    completed, duplicates = table.register(empty, empty, empty, empty)
    assert len(completed) == 0
    assert duplicates.shape == (0,)
    table.mark_failed(empty, ORPHAN)
    table.remove(empty)
    table.restore(empty, empty, empty, empty, empty)
    assert len(table) == 0
    assert len(table.expire(10**6).timed_out) == 0


@pytest.mark.parametrize(("initial", "n"), [(8, 5_000), (1024, 40_000), (16, 200_000)])
def test_growth_past_several_rehashes(initial: int, n: int) -> None:
    table = LedgerTable(initial)
    srids = new_ids(n)
    roots = new_ids(n)
    batches = np.array_split(np.arange(n), 7)
    for b in batches:
        completed, duplicates = table.register(
            srids[b], roots[b], b.astype(np.int64), np.full(b.size, TIMEOUT, np.int32)
        )
        assert len(completed) == 0
        assert not duplicates.any()
    assert len(table) == n
    assert table.capacity >= initial * 8
    assert n <= 0.75 * table.capacity
    for i in (0, n // 2, n - 1):
        entry = table.get(int(srids[i]))
        assert entry is not None
        assert (entry.value, entry.offset) == (int(roots[i]), i)
    # every tree completes with one leaf event carrying its root id, in shuffled order
    order = np.random.default_rng(0).permutation(n)
    done = table.fold(srids[order], roots[order], ORPHAN)
    assert sorted(done.srids.tolist()) == sorted(srids.tolist())
    assert np.array_equal(np.sort(done.offsets), np.arange(n))
    assert len(table) == 0


def test_deletes_then_reinsert_reuses_tombstones() -> None:
    """Constant churn: completing and re-creating entries must not grow the table."""
    table = LedgerTable(1024)
    rng = np.random.default_rng(1)
    live = new_ids(600)
    table.fold(live, np.ones(600, np.int64), ORPHAN)
    capacity = table.capacity
    for _ in range(200):
        # remove 100 (as changelog tombstones would), insert 100 new, re-insert 20 removed
        gone = rng.choice(live, 100, replace=False)
        table.remove(gone)
        fresh = np.concatenate([new_ids(80), gone[:20]])
        table.fold(fresh, np.ones(100, np.int64), ORPHAN)
        live = np.concatenate([np.setdiff1d(live, gone), fresh])
        assert len(table) == live.size
    assert table.capacity == capacity
    assert sorted(table.entries().srids.tolist()) == sorted(live.tolist())
    for srid in live[:50]:
        assert srid in table
    assert table.get(int(gone[-1])) is None


def test_drained_table_shrinks() -> None:
    table = LedgerTable(8)
    srids = new_ids(20_000)
    table.fold(srids, np.ones(srids.size, np.int64), ORPHAN)
    big = table.capacity
    table.remove(srids[100:])
    # the next insertions that need a rebuild give the memory back
    for _ in range(10):
        table.fold(new_ids(2_000), np.ones(2_000, np.int64), ORPHAN)
        table.remove(np.setdiff1d(table.entries().srids, srids[:100]))
    assert table.capacity < big
    assert len(table) == 100
    assert all(int(s) in table for s in srids[:100])


def test_fibonacci_hash_spreads_one_ledger_partition() -> None:
    """srids of one ledger partition share srid mod P; their home slots must not."""
    table = LedgerTable(1 << 12)
    srids = new_ids(3_000)
    srids = srids - (srids % 16) + 3  # all in ledger partition 3 of 16
    srids = srids[srids != 0]
    homes = table.hashtable.home(srids)
    assert np.unique(homes).size > 0.6 * srids.size  # uniform: ~0.71; low 12 bits: 0.09


def test_expire_skips_scan_until_earliest_deadline() -> None:
    table = LedgerTable()
    table.register(np.array([S1]), np.array([A]), np.array([1]), np.array([100], np.int32))
    table.fold(np.array([S2]), np.array([B]), 40)
    assert len(table.expire(39).orphans) == 0
    assert table.expire(40).orphans.srids.tolist() == [S2]
    assert len(table.expire(99).timed_out) == 0
    assert table.expire(100).timed_out.srids.tolist() == [S1]


def test_int32_max_deadline_never_expires() -> None:
    table = LedgerTable(8)
    table.register(np.array([S1]), np.array([A]), np.array([1]), np.array([2**40]))
    table.fold(np.array([S2]), np.array([B]), 2**40)  # clamped to INT32_MAX as well
    for now in (2**31 - 2, 2**31 - 1, 2**40):
        timed_out, orphans = table.expire(now)
        assert len(timed_out) == len(orphans) == 0
    assert len(table) == 2
    assert table.get(S1) is not None


@pytest.mark.parametrize("n", [10_000, 100_000, 1_000_000, 3_000_000])
def test_bytes_per_entry_at_most_48_at_every_size(n: int) -> None:
    """Capacity follows the entries (no power of two): 29 B/slot at load >= 0.6 -> <= 48 B."""
    table = LedgerTable()
    srids = new_ids(n)
    for start in range(0, n, 1_000_000):  # as broker/bench/fold.py fills it
        stop = min(start + 1_000_000, n)
        table.register(srids[start:stop], new_ids(stop - start), np.arange(start, stop, dtype=np.int64),
                       np.full(stop - start, TIMEOUT, np.int32))
    assert len(table) == n
    assert table.bytes_per_entry <= 48
    assert table.capacity % 8 == 0


def test_load_stays_between_rebuild_bounds_while_growing() -> None:
    table = LedgerTable(8)
    capacities = set()
    for _ in range(300):
        table.fold(new_ids(97), np.ones(97, np.int64), ORPHAN)
        capacities.add(table.capacity)
        if table.capacity > 1024:  # past the initial size: load in [0.6, 0.75]
            assert 0.6 <= len(table) / table.capacity <= 0.75
    assert len(capacities) > 10  # it grew in many small steps
    assert any(c & (c - 1) for c in capacities)  # not powers of two
    assert all(c % 8 == 0 for c in capacities)


def test_odd_initial_capacity_is_rounded_to_a_multiple_of_8() -> None:
    table = LedgerTable(13)
    assert table.capacity == 16
    srids = new_ids(12)
    table.fold(srids, np.ones(12, np.int64), ORPHAN)
    assert table.capacity % 8 == 0
    assert sorted(table.take_dirty().upserts.srids.tolist()) == sorted(srids.tolist())


def test_probes_wrap_at_a_non_power_of_two_capacity() -> None:
    """Keys whose home is the last slot must wrap to slot 0 and still be found."""
    table = LedgerTable(40)
    assert table.capacity == 40
    pool = new_ids(20_000)
    last = pool[table.hashtable.home(pool) == table.capacity - 1][:6]
    assert last.size == 6
    table.fold(last, np.ones(6, np.int64), ORPHAN)
    assert table.capacity == 40
    assert set(np.flatnonzero(table.hashtable.keys).tolist()) == {39, 0, 1, 2, 3, 4}
    for srid in last:
        assert srid in table
    table.remove(last[:3])  # tombstones at the end and start of the wrapped run
    assert all(int(s) not in table for s in last[:3])
    assert all(int(s) in table for s in last[3:])
    table.fold(last[:2], np.ones(2, np.int64), ORPHAN)  # reuses the tombstones
    assert all(int(s) in table for s in last[:2])
    assert len(table) == 5


def test_nbytes_counts_queued_srids() -> None:
    table = LedgerTable(64)
    srids = new_ids(10)
    table.register(srids, new_ids(10), np.arange(10), np.full(10, TIMEOUT, np.int32))
    table.log_older(10)
    table.take_dirty()  # now LOGGED: leaving queues a changelog tombstone
    base = table.nbytes
    assert base == table.capacity * 29
    table.mark_failed(srids[:4], ORPHAN)
    assert table.nbytes == base + 4 * 8
    table.take_failed()  # 4 LOGGED entries leave: queued for take_dirty
    assert table.nbytes == base + 4 * 8
    assert len(table.take_dirty().tombstones) == 4
    assert table.nbytes == base


def test_rebuild_wraps_entries_pushed_past_the_last_slot() -> None:
    """The rebuild places entries in home order; those pushed past slot C-1 wrap to slot 0."""
    table = LedgerTable(8)
    pool = new_ids(50_000)
    probe = LedgerTable(40)  # the capacity the rebuild below picks: 25 / 0.625
    last = pool[probe.hashtable.home(pool) == 39][:5]
    others = pool[probe.hashtable.home(pool) < 30][:20]
    table.fold(last, np.ones(5, np.int64), ORPHAN)
    assert table.capacity == 8
    table.fold(others, np.ones(20, np.int64), ORPHAN)  # rebuild: need 25
    assert table.capacity == 40
    slots = {int(table.hashtable.lookup(np.array([s]))[0]) for s in last}
    assert 39 in slots and len(slots - {39}) == 4 and max(slots - {39}) < 30  # 4 wrapped
    assert all(int(s) in table for s in np.concatenate([last, others]))
    assert len(table) == 25
    assert sorted(table.entries().srids.tolist()) == sorted(np.concatenate([last, others]).tolist())


def test_rebuild_wrap_does_not_overwrite_a_live_int64_min_srid() -> None:
    """INT64_MIN is also the tombstone key: the wrapped entries must see it as live."""
    probe = LedgerTable(40)  # the capacity the rebuild below picks: 25 / 0.625
    pool = new_ids(100_000)
    homes = probe.hashtable.home(pool)
    low = np.array([pool[homes == h][0] for h in range(20)])  # homes 0..19
    last = pool[homes == 39][:3]
    assert int(probe.hashtable.home(np.array([S_MIN]))[0]) == 20  # INT64_MIN hashes to C/2
    table = LedgerTable(32)
    before = np.concatenate([low, [S_MIN], last])
    table.fold(before, np.ones(24, np.int64), ORPHAN)
    assert table.capacity == 32
    table.fold(new_ids(1), np.ones(1, np.int64), ORPHAN)  # rebuild: 0..20 full, 2 wrap past 20
    assert table.capacity == 40
    assert len(table) == 25
    assert all(int(s) in table for s in before)
    entry = table.get(S_MIN)
    assert entry is not None and entry.value == 1


def test_take_failed_holds_the_srids_it_is_told_to_hold() -> None:
    t = LedgerTable()
    srids = np.array([11, 22, 33], dtype=np.int64)
    t.register(srids, np.array([1, 2, 3], dtype=np.int64), np.array([0, 1, 2], dtype=np.int64),
               np.array([100, 100, 100], dtype=np.int32))
    t.mark_failed(srids, 50)
    first = t.take_failed(np.array([22, 33], dtype=np.int64))
    assert first.srids.tolist() == [11]
    assert 22 in t and 33 in t and t.get(22).failed  # held, still FAILED (durable flag)
    second = t.take_failed()
    assert sorted(second.srids.tolist()) == [22, 33]
    assert len(t) == 0


# --------------------------------------------------------------------------- deferred decisions


def _registered(t: LedgerTable, srids: list[int], deadline: int = TIMEOUT) -> np.ndarray:
    s = np.array(srids, dtype=np.int64)
    t.register(s, s ^ 0x55, np.arange(len(srids), dtype=np.int64), np.full(len(srids), deadline, np.int32))
    return s


def test_a_deferred_entry_waits_for_its_tick_and_keeps_its_reason() -> None:
    t = LedgerTable()
    s = _registered(t, [11, 22, 33], deadline=10)
    assert len(t.expire(10).timed_out) == 3  # taken out to be decided; the decision waits:
    t.defer(s, np.array([100, 101, 102]), np.array([20, 20, 30]), np.array([False, False, True]))
    assert len(t) == 3
    entry = t.get(33)
    assert entry is not None and (entry.registered, entry.failed, entry.deferred) == (True, True, True)
    assert (entry.offset, entry.deadline, entry.dirty, entry.complete) == (102, 30, True, False)
    assert len(t.take_failed()) == 0  # a deferred FAILED entry waits for its tick
    assert len(t.expire(10**6).timed_out) == 0  # and never times out again
    nothing = t.take_deferred(19)
    assert len(nothing.timed_out) == len(nothing.failed) == 0
    due = t.take_deferred(25)
    assert (sorted(due.timed_out.srids.tolist()), due.failed.srids.tolist()) == ([11, 22], [])
    assert sorted(due.timed_out.offsets.tolist()) == [100, 101]
    due = t.take_deferred(30)
    assert (due.timed_out.srids.tolist(), due.failed.srids.tolist(), due.failed.offsets.tolist()) == ([], [33], [102])
    assert len(t) == 0 and len(t.take_deferred(10**6).failed) == 0


def test_a_deferred_entry_counts_as_due_at_its_tick() -> None:
    """``due`` tells the lag gate that something waits for a tick (it then asks an idle input
    for its watermark, so its read-up-to time can reach the tick). Found by the fate model: a
    held dead letter put back after a rewind never counted, the gate never asked, and the
    record was never decided."""
    t = LedgerTable()
    s = _registered(t, [11], deadline=10)
    assert len(t.expire(10).timed_out) == 1  # the table is empty now
    t.defer(s, np.array([100]), np.array([20]))
    assert (t.due(19), t.due(20)) == (0, 1)


def test_a_deferred_timeout_keeps_its_value_and_completes_with_its_tree() -> None:
    """A timed-out entry whose decision waits (a payload read put off, a last attempt's dead
    letter held) still folds: the events that arrive late complete it, and it is neither
    replayed nor dead-lettered. A failed one never completes."""
    t = LedgerTable()
    _registered(t, [11, 22, 33])
    gone = t.expire(TIMEOUT).timed_out
    assert gone.values is not None
    t.defer(gone.srids, gone.offsets, 5, gone.srids == 33, gone.values)
    assert t.take_late_completed() == 0
    # 11's tree completes late: its root's partner event arrives.
    assert t.fold(np.array([11]), np.array([11 ^ 0x55]), ORPHAN).srids.tolist() == [11]
    assert t.take_late_completed() == 1 and t.take_late_completed() == 0
    assert 11 not in t
    # A duplicated event cancels itself: no early completion of 22.
    assert len(t.fold(np.array([22, 22]), np.array([7, 7]), ORPHAN)) == 0 and 22 in t
    # A failure wins: 33 at 0 stays, to be decided as failed.
    assert len(t.fold(np.array([33]), np.array([33 ^ 0x55]), ORPHAN)) == 0
    # A persist record again is a duplicate root, not a completion.
    assert len(t.register(np.array([22]), np.array([22 ^ 0x55]), np.array([9]), np.array([TIMEOUT], np.int32)).completed) == 0
    due = t.take_deferred(5)
    assert due.timed_out.srids.tolist() == [22] and due.failed.srids.tolist() == [33]
    assert due.timed_out.values is not None and due.timed_out.values.tolist() == [22 ^ 0x55]  # on to its decision


def test_deferring_an_entry_that_left_keeps_it_in_the_changelog() -> None:
    """An entry taken out to be decided and put back within one interval is an upsert, not
    a tombstone: the changelog keeps it, so a restart decides it."""
    t = LedgerTable()
    _registered(t, [11, 22])
    t.log_older(2**62)  # logged for their age: LOGGED
    t.take_dirty()
    gone = t.expire(TIMEOUT).timed_out
    keep = gone.srids == 11
    t.defer(gone.srids[keep], gone.offsets[keep], TIMEOUT + 50, values=gone.values[keep])
    delta = t.take_dirty()
    assert delta.tombstones.tolist() == [22]  # decided
    up = delta.upserts
    assert up.srids.tolist() == [11] and up.flags.tolist() == [REGISTERED | DEFERRED]
    assert up.deadlines.tolist() == [TIMEOUT + 50] and up.offsets.tolist() == [0]
    # ... and a table restored from that changelog decides it at the same tick
    replica = LedgerTable()
    replica.restore(up.srids, up.values, up.flags, up.offsets, up.deadlines)
    assert len(replica.expire(TIMEOUT + 100).timed_out) == 0
    assert len(replica.take_deferred(TIMEOUT + 49).timed_out) == 0
    assert replica.take_deferred(TIMEOUT + 50).timed_out.srids.tolist() == [11]
    # the decision leaves a tombstone
    t.take_deferred(TIMEOUT + 50)
    assert t.take_dirty().tombstones.tolist() == [11]


def test_take_deferred_ignores_srids_that_left_or_changed_since() -> None:
    t = LedgerTable()
    t.defer(np.array([11, 22, 33], dtype=np.int64), np.array([1, 2, 3]), 5)
    t.remove(np.array([11]))  # a changelog tombstone (standby catch-up)
    t.restore(np.array([22]), np.array([0]), np.array([REGISTERED], np.uint8), np.array([2]), np.array([99]))
    due = t.take_deferred(5)
    assert due.timed_out.srids.tolist() == [33]
    assert 22 in t and t.expire(99).timed_out.srids.tolist() == [22]


def test_defer_keeps_the_last_occurrence_and_counts_its_queue_in_nbytes() -> None:
    t = LedgerTable(64)
    base = t.nbytes
    t.defer(np.array([11, 11], dtype=np.int64), np.array([1, 2]), np.array([7, 3]), np.array([True, False]))
    entry = t.get(11)
    assert entry is not None and (entry.offset, entry.deadline, entry.failed) == (2, 3, False)
    assert t.nbytes == base + 8
    assert t.take_deferred(3).timed_out.srids.tolist() == [11]
    assert t.nbytes == base
    with pytest.raises(ValueError, match="one length"):
        t.defer(np.array([11]), np.array([1, 2]), 3)


def test_take_deferred_takes_the_oldest_first_up_to_a_limit_and_leaves_the_rest_untouched() -> None:
    t = LedgerTable()
    srids = np.array([55, 11, 44, 22, 33], dtype=np.int64)
    offsets = np.array([5, 1, 4, 2, 3], dtype=np.int64)
    t.defer(srids, offsets, np.array([10, 10, 10, 10, 99]))
    t.take_dirty()
    assert (t.deferred_due(9), t.deferred_due(10), t.deferred_due(99)) == (0, 4, 5)
    first = t.take_deferred(10, limit=2)
    assert (first.timed_out.srids.tolist(), first.next_offset) == ([11, 22], 4)  # 33 is not due
    assert t.take_dirty().upserts.srids.tolist() == []  # what waits was not rewritten
    assert t.deferred_due(10) == 2
    rest = t.take_deferred(10, limit=5)
    assert (sorted(rest.timed_out.srids.tolist()), rest.next_offset) == ([44, 55], -1)
    assert t.take_deferred(99, limit=0).next_offset == 3 and 33 in t
