"""Time for the ledger: an injected clock and a ms <-> tick converter.

The ledger never reads the time itself. The service asks its ``Clock`` for milliseconds and a
``Ticker`` turns them into int32 ticks (default 100 ms) for the table's ``deadline`` column.
Tests use ``ManualClock`` and step it instead of sleeping (as Storm's acker does with its
injected ``Time``).

Rounding is chosen so that nothing expires early:

- a *deadline* is rounded UP (``tick_of``): deadline ``D`` ms -> tick ``ceil(D / t)``;
- *now* is rounded DOWN (``current_tick``): now ``N`` ms -> tick ``floor(N / t)``;
- the table expires an entry when ``deadline_tick <= now_tick``, i.e.
  ``ceil(D / t) <= floor(N / t)``, which implies ``D <= N``.

An entry therefore expires at most one tick late and never early.

Clock assumptions (which clock decides what):

- a record's deadline is ``created_ms + timeout_ms``, where ``created_ms`` is the *source's*
  wall clock when it persisted the record (a replay: the acker's clock when it decided the
  replay); it travels with the record (its persist value's prefix) and through the changelog as ms;
- expiry is judged on the *acker's* clock: an entry is due when the acker's ``now`` reaches
  its deadline;
- so a skew between the two shifts every deadline by the skew: a source clock behind the
  acker's by ``s`` makes its records time out ``s`` early, ahead by ``s`` makes them ``s``
  late. A source behind by more than the timeout has its records expire as soon as they
  are registered, before any task could ack them;
- the acker's lag on its inputs does not move deadlines: expiry waits until the acks that
  could complete an entry have been read (broker.acker.lag), so a backlog - an outage, a
  slow restore, consumer lag beyond the timeout - causes no false timeouts. That gate reads
  offsets, not clocks: it cannot see, and does not prevent, false timeouts from a skew
  larger than the timeout. Keep clocks synchronised (NTP) well within the timeout.

Ticks are int32 counted from ``epoch_ms``: 2**31 ticks of 100 ms are ~6.8 years, so the epoch
must be recent (``Ticker.starting_at``). Ticks are meaningless outside the process that made
them: whatever leaves the process (the changelog) must carry milliseconds (``ms_of_ticks``)
and be converted back with the restoring process's ticker (``ticks_of``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

DEFAULT_TICK_MS = 100


@runtime_checkable
class Clock(Protocol):
    """Anything that tells the time in integer milliseconds."""

    def now_ms(self) -> int: ...


class SystemClock:
    """Wall-clock milliseconds since the Unix epoch.

    Wall time, not ``time.monotonic``: deadlines travel through the changelog to other
    processes and hosts, where a monotonic clock means nothing.
    """

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to: tests step it instead of sleeping."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now_ms = int(start_ms)

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, ms: int) -> int:
        """Move forward by ``ms`` (>= 0) and return the new time."""
        if ms < 0:
            raise ValueError(f"time does not go backwards: advance({ms})")
        self._now_ms += int(ms)
        return self._now_ms


def _clamp_i32(value: int) -> int:
    return max(INT32_MIN, min(INT32_MAX, value))


@dataclass(frozen=True)
class Ticker:
    """Converts milliseconds to int32 ticks of ``tick_ms`` counted from ``epoch_ms``.

    Results outside the int32 range are clamped (a deadline beyond ~6.8 years means "never").
    """

    tick_ms: int = DEFAULT_TICK_MS
    epoch_ms: int = 0

    def __post_init__(self) -> None:
        if self.tick_ms <= 0:
            raise ValueError(f"tick_ms must be positive, got {self.tick_ms}")

    @classmethod
    def starting_at(cls, clock: Clock, tick_ms: int = DEFAULT_TICK_MS) -> Ticker:
        """A ticker whose tick 0 holds the clock's current time, on a multiple of ``tick_ms``:
        every process's ticks then start on the same milliseconds, so a deadline that went
        through another owner's ticks (the changelog carries ``ms_of`` a tick) comes back as
        the same tick, and deadlines keep their order across owners - a key's records that
        time out together are replayed in the order they were sent (docs/design.md §6)."""
        now = clock.now_ms()
        return cls(tick_ms=tick_ms, epoch_ms=now - now % tick_ms)

    def tick_of(self, ms: int) -> int:
        """The tick of a deadline at ``ms``, rounded UP so that it never expires early."""
        return _clamp_i32(-((self.epoch_ms - ms) // self.tick_ms))

    def current_tick(self, ms: int) -> int:
        """The tick that time ``ms`` falls in, rounded DOWN: pass it to ``expire``."""
        return _clamp_i32((ms - self.epoch_ms) // self.tick_ms)

    def ms_of(self, tick: int) -> int:
        """The start of ``tick`` in milliseconds (the inverse of ``tick_of`` on tick bounds)."""
        return self.epoch_ms + int(tick) * self.tick_ms

    def ticks_of(self, ms: np.ndarray) -> np.ndarray:
        """Vectorised ``tick_of``: int64 ms -> int32 deadline ticks (rounded up, clamped)."""
        ms64 = np.asarray(ms, dtype=np.int64)
        ticks = -((self.epoch_ms - ms64) // self.tick_ms)
        return np.clip(ticks, INT32_MIN, INT32_MAX).astype(np.int32)

    def ms_of_ticks(self, ticks: np.ndarray) -> np.ndarray:
        """Vectorised ``ms_of``: int32 ticks -> int64 ms (what the changelog should carry)."""
        return np.asarray(ticks, dtype=np.int64) * self.tick_ms + self.epoch_ms
