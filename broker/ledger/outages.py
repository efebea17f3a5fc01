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

Scoped: a beat names the source topics whose records wait behind its task (``rb-scope``; the
task's input topics read with their replay topic, broker.task.outage.beat_scope), and holds
only the entries the acker can attribute to them. An entry knows its record's data topic -
the ``topic`` of its persist record, which a replay keeps - through ``EntryTopics`` (runs of
persist offsets). The partition keeps its stops per scope: the unscoped ones (``stops``), and
per topic the scoped ones (``scoped``); an entry is held by the union of the stops that can
concern it, each class of entries with its own:

    entries of topic t (a scoped stop names t)   stops | scoped[t]
    entries of another known topic  (OTHER)      stops
    entries whose topic is unknown  (ANY)        stops | every scoped stop

What the acker cannot know is which topics a record's tree passes after its root: a task
whose inputs are at a later hop (a topic not read with its replay topic) cannot name the
source topics behind it, so it sends no scope and its beat holds every entry, as before. An
entry whose topic the acker does not know - restored from the changelog by a new owner
(whose table holds no topics), past ``MAX_TOPICS`` topics, or below the runs kept - is held
by every beat. So a scope only ever lets go of entries the acker knows are of a topic no
beat names.

Durable: the partition's last stops (``[since_ms, until_ms)`` each, per scope) and the tasks it heard from travel in its
``__counters__`` record (``as_counters`` / ``from_counters``), written in the transaction of the
deadlines the stop moved (they are DIRTY, so logged), so a beat folded again after a rewind or
by a new owner adds nothing twice - and a stop once given is never taken back. The scoped
stops have keys of their own, which an older acker leaves aside (it reads every beat as
unscoped: holding more, never less).

Pure: no clock, no I/O; times are the beats' own (epoch ms).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

#: Keys of the stop's state in a ``__counters__`` record's counters (not counts: ``replaybroker
#: status`` reads them apart).
PREFIX = "outage."
STOP_PREFIX = "outage.stop:"  # + since_ms -> until_ms of one stop
SINCE_PREFIX = "outage.since_ms:"  # + task
LAST_PREFIX = "outage.until_ms:"  # + task
SCOPE_PREFIX = "outage.scoped:"  # + topic + ":" + since_ms -> until_ms of one stop of beats scoped to the topic
FLOOR_KEY = "outage.floor_ms"  # below it no stop is added again (``ClockStops.floor_ms``)

#: The stops kept: a record created before the oldest of them and registered only now (its
#: persist record read that late) is not held back by it.
MAX_STOPS = 16

#: A beat stops the clock at most this long either side of its own timestamp: its cover is a
#: few seconds ahead (broker.task.outage.BEAT_COVER_MS), its start at most a gap of lost beats
#: back; a beat "since" long ago, or covering far ahead, is a writer's bug (or forged).
BEAT_BOUND_MS = 10_000

#: A task not heard from for this long after its last beat's cover is forgotten, and a topic's
#: scoped stops that ended this long before the newest beat's cover (their entries are long decided).
FORGET_MS = 600_000

#: Topics with scoped stops of their own, and topics ``EntryTopics`` tells apart: a beat that
#: would name more holds every entry (as an unscoped one), an entry of a topic past them is of
#: an unknown topic - a stream of made-up names must not grow the acker without bound.
MAX_SCOPED = 64
MAX_TOPICS = 1_024

#: The classes of entries that are not of a scoped topic (the module doc): of a known topic
#: that no scoped stop names, and of a topic not known. Neither is a topic name.
OTHER = ""
ANY = "*"


class Stopped(NamedTuple):
    """What a beat changed in the stops of one class of entries: from ``start_ms`` on (no stop
    covered it), the stops were ``before`` and are ``after`` (each in order, their parts
    after ``start_ms``). A deadline moves as the clock standing still over ``after`` rather
    than ``before`` moves it (``LedgerTable.stop_clock``)."""

    start_ms: int
    before: list[tuple[int, int]]
    after: list[tuple[int, int]]

    @property
    def added_ms(self) -> int:
        """How much longer the clock stands still."""
        return sum(b - a for a, b in self.after) - sum(b - a for a, b in self.before)


def _merged(stops: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of intervals, disjoint and in order."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(stops):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _added(union: list[tuple[int, int]], since_ms: int, until_ms: int) -> Stopped | None:
    """What ``[since_ms, until_ms)`` adds to the stops ``union`` (None: nothing)."""
    start = since_ms  # the first instant of the beat no stop covers yet
    for a, b in union:
        if a <= start < b:
            start = b
    if start >= until_ms:
        return None
    after = _merged([*union, (since_ms, until_ms)])
    return Stopped(start, [(max(a, start), b) for a, b in union if b > start],
                   [(max(a, start), b) for a, b in after if b > start])


class ClockStops:
    """One ledger partition's stopped clock: when it stood still (per scope the last
    ``MAX_STOPS`` stops, each ``[since_ms, until_ms)``, oldest first), and for which tasks."""

    __slots__ = ("floor_ms", "scoped", "stops", "tasks")

    def __init__(self, stops: list[tuple[int, int]] | None = None,
                 tasks: dict[str, tuple[int, int]] | None = None, floor_ms: int = 0,
                 scoped: dict[str, list[tuple[int, int]]] | None = None) -> None:
        self.stops: list[tuple[int, int]] = stops or []  # of the beats for every entry: disjoint, in order
        self.scoped: dict[str, list[tuple[int, int]]] = scoped or {}  # topic -> of the beats scoped to it
        self.tasks: dict[str, tuple[int, int]] = tasks or {}  # task -> (since_ms, until_ms) of its last beat
        # Below here stops were let go (past ``MAX_STOPS``, a topic forgotten): nothing is added there again.
        self.floor_ms = floor_ms

    @property
    def until_ms(self) -> int:
        """The clock stands (or stood) still up to here, for some entries (0: it never stopped)."""
        return max([s[-1][1] for s in (self.stops, *self.scoped.values()) if s], default=0)

    def union(self, holder: str) -> list[tuple[int, int]]:
        """The stops that hold the entries of class ``holder``: a scoped topic, ``OTHER`` or
        ``ANY`` (the module doc)."""
        if holder == OTHER:
            return self.stops
        scoped = list(self.scoped.values()) if holder == ANY else [self.scoped.get(holder, [])]
        return _merged([*self.stops, *(s for stops in scoped for s in stops)])

    def holder(self, topic: str | None) -> str:
        """The class of an entry of ``topic`` (None: not known)."""
        return ANY if topic is None else topic if topic in self.scoped else OTHER

    def beat(self, task: str, since_ms: int, until_ms: int, stop_from_ms: int | None = None) -> Stopped | None:
        """An unscoped beat (``cover`` for every entry): what it changed for the entries of an
        unknown topic, which every stop holds - with no scoped stop, for every entry."""
        return self.cover(task, since_ms, until_ms, stop_from_ms).get(ANY)

    def cover(self, task: str, since_ms: int, until_ms: int, stop_from_ms: int | None = None,
              scope: frozenset[str] | None = None) -> dict[str, Stopped]:
        """A task's beat: in an outage since ``since_ms``, covered up to ``until_ms`` (the stop
        from ``stop_from_ms`` if given: the beat's start as bounded), for the entries of the
        topics ``scope`` (None: every entry). The stops of its scope become the union of theirs
        and the beat's, whatever order the beats of its tasks arrive in. Returns what changed
        per class of entries (``holder``; none: the beat covers nothing new): the first
        instant its union gained, and its stops from there on before and after (``Stopped``)."""
        prev = self.tasks.get(task)
        self.tasks[task] = (since_ms, until_ms if prev is None or prev[0] != since_ms else max(prev[1], until_ms))
        for name in [n for n, (_, u) in self.tasks.items() if u < until_ms - FORGET_MS]:
            del self.tasks[name]
        for topic in [t for t, s in self.scoped.items() if s[-1][1] < until_ms - FORGET_MS]:
            self.floor_ms = max(self.floor_ms, self.scoped.pop(topic)[-1][1])
        if scope is not None and len(self.scoped.keys() | scope) > MAX_SCOPED:
            scope = None  # held as every entry: never less
        since_ms = max(since_ms if stop_from_ms is None else stop_from_ms, self.floor_ms)
        if until_ms <= since_ms:
            return {}
        holders = [ANY, OTHER, *self.scoped] if scope is None else [ANY, *sorted(scope)]
        unions = {h: self.union(h) for h in holders}
        keys: list[str | None] = [None] if scope is None else [*sorted(scope)]
        for key in keys:
            merged = _merged([*(self.stops if key is None else self.scoped.get(key, [])), (since_ms, until_ms)])
            if len(merged) > MAX_STOPS:
                self.floor_ms = max(self.floor_ms, merged[-MAX_STOPS - 1][1])
            if key is None:
                self.stops = merged[-MAX_STOPS:]
            else:
                self.scoped[key] = merged[-MAX_STOPS:]
        return {h: added for h in holders if (added := _added(unions[h], since_ms, until_ms)) is not None}

    def held_back(self, created_ms: np.ndarray, deadlines_ms: np.ndarray,
                  topics: Sequence[str | None] | None = None) -> np.ndarray:
        """How much later the timeouts of records created at ``created_ms`` (due at
        ``deadlines_ms``, of the data ``topics``: None, not known) end, registered now, than
        their deadlines say: each stop of their class after a record's creation holds it back
        as it held back the entries pending then - the whole stop if it was due after the stop
        began, and from its creation to the stop's end if created during it (the module doc);
        what a stop added counts for the next."""
        created = np.asarray(created_ms, np.int64)
        deadline = np.asarray(deadlines_ms, np.int64)
        held = np.zeros(len(created), np.int64)
        classes = [ANY] * len(created) if topics is None else [self.holder(t) for t in topics]
        for holder in set(classes):
            rows = np.array([c == holder for c in classes], bool)
            c, d, h = created[rows], deadline[rows], held[rows]
            for since, until in self.union(holder):
                start = np.maximum(c, since)
                h += np.where((start < until) & (d + h > since), until - start, 0)
            held[rows] = h
        return held

    def in_outage(self, now_ms: int) -> dict[str, int]:
        """The tasks whose last beat still covers ``now_ms``, and since when they are in an outage."""
        return {name: since for name, (since, until) in self.tasks.items() if until > now_ms}

    def as_counters(self) -> dict[str, int]:
        """The state as ``__counters__`` entries (empty: the clock never stopped)."""
        out = {f"{STOP_PREFIX}{since}": until for since, until in self.stops}
        for topic, stops in self.scoped.items():
            out.update({f"{SCOPE_PREFIX}{topic}:{since}": until for since, until in stops})
        if self.floor_ms:
            out[FLOOR_KEY] = self.floor_ms
        for name, (since, until) in self.tasks.items():
            out[SINCE_PREFIX + name] = since
            out[LAST_PREFIX + name] = until
        return out

    @classmethod
    def from_counters(cls, counters: Mapping[str, int]) -> tuple[ClockStops, dict[str, int]]:
        """The state kept in ``counters``, and the counters without it (a record written before
        the scopes holds only unscoped stops: read as such)."""
        rest = {k: v for k, v in counters.items() if not k.startswith(PREFIX)}
        stops = sorted((int(k[len(STOP_PREFIX):]), v) for k, v in counters.items() if k.startswith(STOP_PREFIX))
        scoped: dict[str, list[tuple[int, int]]] = {}
        for k, v in counters.items():
            if k.startswith(SCOPE_PREFIX):
                topic, _, since = k[len(SCOPE_PREFIX):].rpartition(":")
                scoped.setdefault(topic, []).append((int(since), v))
        tasks = {
            k[len(SINCE_PREFIX):]: (v, counters.get(LAST_PREFIX + k[len(SINCE_PREFIX):], v))
            for k, v in counters.items() if k.startswith(SINCE_PREFIX)
        }
        return cls(stops, tasks, counters.get(FLOOR_KEY, 0), {t: sorted(s) for t, s in scoped.items()}), rest


def outages_in(counters: Mapping[str, int], now_ms: int) -> dict[str, int]:
    """The tasks in an outage at ``now_ms`` by a ``__counters__`` record's counters, and since when."""
    return ClockStops.from_counters(counters)[0].in_outage(now_ms)


class EntryTopics:
    """Which data topic each registered entry of one ledger partition is of: runs of persist
    offsets, ``(first offset, topic id)`` in offset order (-1: not known), as
    ``broker.ledger.adaptive.AutoRegistrations`` keeps the auto ones. An entry's persist offset
    (a column of the table) finds its run by binary search, so an entry costs nothing, a run of
    one topic's records a few bytes. A run covers the offsets up to the next one: every record
    there was registered from the same read (a read of some records only - the again-read of a
    restore - marks its gaps unknown). Runs below the oldest pending entry are dropped at each
    commit; a new owner starts with none (its entries restored from the changelog are of an
    unknown topic)."""

    __slots__ = ("_end", "_ids", "_n", "_starts", "_tids", "names")

    def __init__(self) -> None:
        self._starts = np.empty(16, np.int64)
        self._tids = np.empty(16, np.int32)
        self._n = 0
        self._end = -1  # one past the last offset noted: a rewind's second read is ignored
        self._ids: dict[str, int] = {}
        self.names: list[str] = []

    def __len__(self) -> int:
        return self._n

    def id_of(self, topic: str | None) -> int:
        """The id of a data topic (-1: None, or past ``MAX_TOPICS``: not known)."""
        if topic is None:
            return -1
        tid = self._ids.get(topic)
        if tid is None:
            if len(self.names) >= MAX_TOPICS:
                return -1
            tid = self._ids[topic] = len(self.names)
            self.names.append(topic)
        return tid

    def note(self, offsets: np.ndarray, tids: np.ndarray, *, gaps: bool = False) -> None:
        """Persist records at ``offsets`` (ascending) of topics ``tids`` were registered.
        ``gaps``: not every record between them was (their topics are not known)."""
        keep = offsets >= self._end
        offsets, tids = np.asarray(offsets[keep], np.int64), np.asarray(tids[keep], np.int32)
        if offsets.size == 0:
            return
        if gaps:  # an unknown run after each record the next one does not follow
            after = np.flatnonzero(offsets[1:] != offsets[:-1] + 1)
            offsets = np.insert(offsets, after + 1, offsets[after] + 1)
            tids = np.insert(tids, after + 1, -1)
            offsets, tids = np.append(offsets, offsets[-1] + 1), np.append(tids, -1)
        self._end = int(offsets[-1]) + 1
        first = np.concatenate(([0], np.flatnonzero(tids[1:] != tids[:-1]) + 1))
        starts, run_tids = offsets[first], tids[first]
        if self._n and run_tids[0] == self._tids[self._n - 1]:
            starts, run_tids = starts[1:], run_tids[1:]  # continues the last run
        k = starts.size
        if self._n + k > self._starts.size:
            size = max(2 * self._starts.size, self._n + k)
            self._starts = np.resize(self._starts, size)
            self._tids = np.resize(self._tids, size)
        self._starts[self._n : self._n + k] = starts
        self._tids[self._n : self._n + k] = run_tids
        self._n += k

    def lookup(self, offsets: np.ndarray) -> np.ndarray:
        """Topic id of the entries at ``offsets`` (-1: not known)."""
        i = np.searchsorted(self._starts[: self._n], offsets, side="right") - 1
        return np.where(i >= 0, self._tids[np.maximum(i, 0)], -1) if self._n else np.full(len(offsets), -1, np.int32)

    def topics_of(self, tids: np.ndarray) -> list[str | None]:
        """The names of topic ids (None: -1, not known)."""
        names = self.names
        return [names[t] if t >= 0 else None for t in tids.tolist()]

    def holds(self, holder: str, scoped: Mapping[str, object]) -> Callable[[np.ndarray], np.ndarray]:
        """Which of the entries at some persist offsets are of the class ``holder``
        (``ClockStops.holder``; ``scoped``: the topics with scoped stops)."""
        if holder == ANY:
            return lambda offsets: self.lookup(offsets) < 0
        if holder == OTHER:
            named = np.array([self._ids[t] for t in scoped if t in self._ids], np.int32)
            return lambda offsets: ~np.isin(tids := self.lookup(offsets), named) & (tids >= 0)
        tid = self._ids.get(holder, -2)  # a topic never registered here: none of its entries is
        return lambda offsets: self.lookup(offsets) == tid

    def drop_below(self, offset: int) -> None:
        """Forget the runs that end before ``offset``, the oldest pending entry's (-1: nothing
        pending, every run goes)."""
        if offset < 0:
            self._n = 0
            return
        i = int(np.searchsorted(self._starts[: self._n], offset, side="right")) - 1
        if i > 0:
            n = self._n - i
            self._starts[:n] = self._starts[i : self._n]
            self._tids[:n] = self._tids[i : self._n]
            self._n = n

    @property
    def nbytes(self) -> int:
        return int(self._starts.nbytes + self._tids.nbytes)
