"""The timeout clock of a ledger partition stops while a task is in an outage (docs/design.md
§6, *Outages*).

A task whose dependency is down (``TaskConfig.outage``, ``broker.task.outage``) pauses its inputs.
The records queued unread behind it - on its input topics, or still on a topic before it -
cannot complete meanwhile, and the task cannot name them: it has not read them. So it reports
the outage instead, to every ledger partition: an *outage beat* on each ``ns.acks[i]``, "in an
outage since ``since_ms``, covered until ``until_ms``" (a few seconds ahead of its clock, never
more than ``outage_max_ms`` after ``since_ms``). A partition keeps the union of the intervals
its beats covered, and each interval a beat adds stops its clock:

    a stop [a, b):  every pending entry whose deadline is after ``a`` gets ``b - a`` more

which is what a clock standing still from ``a`` to ``b`` does to them: a deadline before the
outage began is not held up by it, a deadline after it by the whole stop. A record created
while the clock stands (at ``c``, in the current stop ``[s, b)``; registered after the beats
that stopped it) starts its timeout when the clock moves again: ``b - max(c, s)`` more
(``held_back``, which also applies the earlier stops after its creation: its persist record
may be read late), and the stops after it as any entry. Worked example, beats every second
covering 3 s ahead, an outage from 10 s to 14.5 s, timeouts of 2 s:

    beat at 10 s: since 10, until 13 -> stop [10, 13)   entry due at 12 -> 15; due at 9: as it was
    record created at 10.5 s, due at 12.5 -> registered due at 12.5 + (13 - 10.5) = 15
    beat at 11 s: since 10, until 14 -> stop [13, 14)   both -> 16
    ...
    beat at 14 s: since 10, until 17 -> stop [16, 17)   both -> 19   (outage 4.5 s, stop 7 s)

The clock thus stops at most the cover longer than the outage, and a task killed in an outage
stops it at most the cover past its last beat. A beat is an input of its ledger partition like
an event: read in order, before expiry at any tick after it was sent (gated, broker.acker.lag).

Durable: the partition's last stops (``[since_ms, until_ms)`` each) and the tasks it heard from travel in its
``__counters__`` record (``as_counters`` / ``from_counters``), written in the transaction of the
deadlines the stop moved (they are DIRTY, so logged), so a beat folded again after a rewind or
by a new owner adds nothing twice - and a stop once given is never taken back.

Pure: no clock, no I/O; times are the beats' own (epoch ms).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

#: Keys of the stop's state in a ``__counters__`` record's counters (not counts: ``replaybroker
#: status`` reads them apart).
PREFIX = "outage."
STOP_PREFIX = "outage.stop:"  # + since_ms -> until_ms of one stop
SINCE_PREFIX = "outage.since_ms:"  # + task
LAST_PREFIX = "outage.until_ms:"  # + task
FLOOR_KEY = "outage.floor_ms"  # below it no stop is added again (``ClockStops.floor_ms``)

#: The stops kept: a record created before the oldest of them and registered only now (its
#: persist record read that late) is not held back by it.
MAX_STOPS = 16

#: A beat stops the clock at most this long either side of its own timestamp: its cover is a
#: few seconds ahead (broker.task.outage.BEAT_COVER_MS), its start at most a gap of lost beats
#: back; a beat "since" long ago, or covering far ahead, is a writer's bug (or forged).
BEAT_BOUND_MS = 10_000

#: A task not heard from for this long after its last beat's cover is forgotten.
FORGET_MS = 600_000


class Stopped(NamedTuple):
    """What a beat changed in a partition's stops: from ``start_ms`` on (no stop covered it),
    the stops were ``before`` and are ``after`` (each in order, their parts after ``start_ms``).
    A deadline moves as the clock standing still over ``after`` rather than ``before`` moves
    it (``LedgerTable.stop_clock``)."""

    start_ms: int
    before: list[tuple[int, int]]
    after: list[tuple[int, int]]

    @property
    def added_ms(self) -> int:
        """How much longer the clock stands still."""
        return sum(b - a for a, b in self.after) - sum(b - a for a, b in self.before)


class ClockStops:
    """One ledger partition's stopped clock: when it stood still (the last ``MAX_STOPS``
    stops, each ``[since_ms, until_ms)``, oldest first), and for which tasks."""

    __slots__ = ("floor_ms", "stops", "tasks")

    def __init__(self, stops: list[tuple[int, int]] | None = None,
                 tasks: dict[str, tuple[int, int]] | None = None, floor_ms: int = 0) -> None:
        self.stops: list[tuple[int, int]] = stops or []  # disjoint, in order
        self.tasks: dict[str, tuple[int, int]] = tasks or {}  # task -> (since_ms, until_ms) of its last beat
        # Below here the stops were let go (past ``MAX_STOPS``): nothing is added there again.
        self.floor_ms = floor_ms

    @property
    def until_ms(self) -> int:
        """The clock stands (or stood) still up to here (0: it never stopped)."""
        return self.stops[-1][1] if self.stops else 0

    def beat(self, task: str, since_ms: int, until_ms: int, stop_from_ms: int | None = None) -> Stopped | None:
        """A task's beat: in an outage since ``since_ms``, covered up to ``until_ms`` (the stop
        from ``stop_from_ms`` if given: the beat's start as bounded). The partition's stops
        become the union of theirs and the beat's, whatever order the beats of its tasks
        arrive in. Returns what changed (None: the beat covers nothing new): the first instant
        the union gained, and the stops from there on before and after (``Stopped``)."""
        prev = self.tasks.get(task)
        self.tasks[task] = (since_ms, until_ms if prev is None or prev[0] != since_ms else max(prev[1], until_ms))
        for name in [n for n, (_, u) in self.tasks.items() if u < until_ms - FORGET_MS]:
            del self.tasks[name]
        since_ms = max(since_ms if stop_from_ms is None else stop_from_ms, self.floor_ms)
        if until_ms <= since_ms:
            return None
        start = since_ms  # the first instant of the beat no stop covers yet
        for a, b in self.stops:
            if a <= start < b:
                start = b
        if start >= until_ms:
            return None
        merged: list[tuple[int, int]] = []
        for a, b in sorted([*self.stops, (since_ms, until_ms)]):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        before = [(max(a, start), b) for a, b in self.stops if b > start]
        self.stops = merged[-MAX_STOPS:]
        if len(merged) > MAX_STOPS:
            self.floor_ms = max(self.floor_ms, merged[-MAX_STOPS - 1][1])
        return Stopped(start, before, [(max(a, start), b) for a, b in merged if b > start])

    def held_back(self, created_ms: np.ndarray, deadlines_ms: np.ndarray) -> np.ndarray:
        """How much later the timeouts of records created at ``created_ms`` (due at
        ``deadlines_ms``) end, registered now, than their deadlines say: each stop after a
        record's creation holds it back as it held back the entries pending then - the whole
        stop if it was due after the stop began, and from its creation to the stop's end if
        created during it (the module doc); what a stop added counts for the next."""
        created = np.asarray(created_ms, np.int64)
        deadline = np.asarray(deadlines_ms, np.int64)
        held = np.zeros(len(created), np.int64)
        for since, until in self.stops:
            start = np.maximum(created, since)
            held += np.where((start < until) & (deadline + held > since), until - start, 0)
        return held

    def in_outage(self, now_ms: int) -> dict[str, int]:
        """The tasks whose last beat still covers ``now_ms``, and since when they are in an outage."""
        return {name: since for name, (since, until) in self.tasks.items() if until > now_ms}

    def as_counters(self) -> dict[str, int]:
        """The state as ``__counters__`` entries (empty: the clock never stopped)."""
        out = {f"{STOP_PREFIX}{since}": until for since, until in self.stops}
        if self.floor_ms:
            out[FLOOR_KEY] = self.floor_ms
        for name, (since, until) in self.tasks.items():
            out[SINCE_PREFIX + name] = since
            out[LAST_PREFIX + name] = until
        return out

    @classmethod
    def from_counters(cls, counters: Mapping[str, int]) -> tuple[ClockStops, dict[str, int]]:
        """The state kept in ``counters``, and the counters without it."""
        rest = {k: v for k, v in counters.items() if not k.startswith(PREFIX)}
        stops = sorted((int(k[len(STOP_PREFIX):]), v) for k, v in counters.items() if k.startswith(STOP_PREFIX))
        tasks = {
            k[len(SINCE_PREFIX):]: (v, counters.get(LAST_PREFIX + k[len(SINCE_PREFIX):], v))
            for k, v in counters.items() if k.startswith(SINCE_PREFIX)
        }
        return cls(stops, tasks, counters.get(FLOOR_KEY, 0)), rest


def outages_in(counters: Mapping[str, int], now_ms: int) -> dict[str, int]:
    """The tasks in an outage at ``now_ms`` by a ``__counters__`` record's counters, and since when."""
    return ClockStops.from_counters(counters)[0].in_outage(now_ms)
