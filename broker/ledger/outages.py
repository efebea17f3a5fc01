"""The timeout clock of a ledger partition stops while a task is in an outage (docs/design.md
§6, *Outages*).

A task whose dependency is down (``TaskConfig.outage``, ``broker.outage``) pauses its inputs.
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

import numpy as np

#: Keys of the stop's state in a ``__counters__`` record's counters (not counts: ``replaybroker
#: status`` reads them apart).
PREFIX = "outage."
STOP_PREFIX = "outage.stop:"  # + since_ms -> until_ms of one stop
SINCE_PREFIX = "outage.since_ms:"  # + task
LAST_PREFIX = "outage.until_ms:"  # + task

#: The stops kept: a record created before the oldest of them and registered only now (its
#: persist record read that late) is not held back by it.
MAX_STOPS = 16

#: A task not heard from for this long after its last beat's cover is forgotten.
FORGET_MS = 600_000


class ClockStops:
    """One ledger partition's stopped clock: when it stood still (the last ``MAX_STOPS``
    stops, each ``[since_ms, until_ms)``, oldest first), and for which tasks."""

    __slots__ = ("stops", "tasks")

    def __init__(self, stops: list[tuple[int, int]] | None = None,
                 tasks: dict[str, tuple[int, int]] | None = None) -> None:
        self.stops: list[tuple[int, int]] = stops or []
        self.tasks: dict[str, tuple[int, int]] = tasks or {}  # task -> (since_ms, until_ms) of its last beat

    @property
    def until_ms(self) -> int:
        """The clock stands (or stood) still up to here (0: it never stopped)."""
        return self.stops[-1][1] if self.stops else 0

    def beat(self, task: str, since_ms: int, until_ms: int) -> tuple[int, int] | None:
        """A task's beat: in an outage since ``since_ms``, covered up to ``until_ms``. Returns
        the interval ``[a, b)`` the clock stops for now (None: the beat covers nothing new)."""
        prev = self.tasks.get(task)
        self.tasks[task] = (since_ms, until_ms if prev is None or prev[0] != since_ms else max(prev[1], until_ms))
        for name in [n for n, (_, u) in self.tasks.items() if u < until_ms - FORGET_MS]:
            del self.tasks[name]
        last = self.until_ms
        start = max(since_ms, last)
        if until_ms <= start:
            return None
        if self.stops and since_ms <= last:  # the current stop goes on
            self.stops[-1] = (self.stops[-1][0], until_ms)
        else:  # a new one
            self.stops = [*self.stops[-(MAX_STOPS - 1):], (since_ms, until_ms)]
        return start, until_ms

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
        return cls(stops, tasks), rest


def outages_in(counters: Mapping[str, int], now_ms: int) -> dict[str, int]:
    """The tasks in an outage at ``now_ms`` by a ``__counters__`` record's counters, and since when."""
    return ClockStops.from_counters(counters)[0].in_outage(now_ms)
