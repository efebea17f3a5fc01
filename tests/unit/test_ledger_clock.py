"""Clock and Ticker: deadlines round up, now rounds down, so nothing expires early."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.ledger.clock import (
    INT32_MAX,
    INT32_MIN,
    Clock,
    ManualClock,
    SystemClock,
    Ticker,
)
from broker.ledger.table import LedgerTable


def test_manual_clock_steps() -> None:
    clock = ManualClock(1_000)
    assert clock.now_ms() == 1_000
    assert clock.advance(250) == 1_250
    assert clock.now_ms() == 1_250
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)


def test_clocks_satisfy_protocol() -> None:
    assert isinstance(ManualClock(), Clock)
    assert isinstance(SystemClock(), Clock)
    assert SystemClock().now_ms() > 1_600_000_000_000  # wall time in ms, not seconds


@pytest.mark.parametrize(
    ("ms", "deadline_tick", "current_tick"),
    [
        (10_000, 0, 0),
        (10_001, 1, 0),
        (10_099, 1, 0),
        (10_100, 1, 1),
        (10_101, 2, 1),
        (9_999, 0, -1),
        (9_900, -1, -1),
    ],
)
def test_ticker_rounding(ms: int, deadline_tick: int, current_tick: int) -> None:
    ticker = Ticker(tick_ms=100, epoch_ms=10_000)
    assert ticker.tick_of(ms) == deadline_tick
    assert ticker.current_tick(ms) == current_tick


def test_ticker_defaults_and_start() -> None:
    clock = ManualClock(123_456)
    ticker = Ticker.starting_at(clock)
    assert ticker.tick_ms == 100
    assert ticker.current_tick(clock.now_ms()) == 0
    with pytest.raises(ValueError, match="tick_ms"):
        Ticker(tick_ms=0)


def test_ticker_clamps_to_int32() -> None:
    ticker = Ticker(tick_ms=1, epoch_ms=0)
    assert ticker.tick_of(10**15) == INT32_MAX
    assert ticker.current_tick(-(10**15)) == INT32_MIN
    ms = np.array([10**15, -(10**15), 5], dtype=np.int64)
    assert ticker.ticks_of(ms).tolist() == [INT32_MAX, INT32_MIN, 5]


@given(
    tick_ms=st.integers(1, 10_000),
    epoch_ms=st.integers(0, 2**41),
    deadline_ms=st.integers(0, 2**41),
    now_ms=st.integers(0, 2**41),
)
def test_nothing_expires_early_and_at_most_one_tick_late(
    tick_ms: int, epoch_ms: int, deadline_ms: int, now_ms: int
) -> None:
    ticker = Ticker(tick_ms=tick_ms, epoch_ms=epoch_ms)
    d = ticker.tick_of(deadline_ms)
    n = ticker.current_tick(now_ms)
    if INT32_MIN < d < INT32_MAX and INT32_MIN < n < INT32_MAX:
        expired = d <= n
        if expired:
            assert deadline_ms <= now_ms
        if now_ms >= deadline_ms + tick_ms:
            assert expired
    # the vectorised forms agree with the scalar ones
    assert int(ticker.ticks_of(np.array([deadline_ms]))[0]) == d
    assert ticker.ms_of(d) >= deadline_ms or d in (INT32_MIN, INT32_MAX)
    assert int(ticker.ms_of_ticks(np.array([d], dtype=np.int32))[0]) == ticker.ms_of(d)


def test_clock_drives_table_expiry() -> None:
    """The service loop in miniature: persist at t, timeout 30 s, tick every 100 ms."""
    clock = ManualClock(5_000_000)
    ticker = Ticker.starting_at(clock)
    table = LedgerTable()
    deadline = ticker.tick_of(clock.now_ms() + 30_000)
    table.register(
        np.array([42]), np.array([7]), np.array([3]), np.array([deadline], dtype=np.int32)
    )
    clock.advance(29_999)
    assert len(table.expire(ticker.current_tick(clock.now_ms())).timed_out) == 0
    clock.advance(1)
    expired = table.expire(ticker.current_tick(clock.now_ms()))
    assert expired.timed_out.srids.tolist() == [42]
    assert expired.timed_out.offsets.tolist() == [3]
