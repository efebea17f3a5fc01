"""A dependency that is down is not the record's fault (``TaskConfig.outage``).

When the handler raises one of the ``outage`` exceptions, the task does not fail the input -
a failure would spend one of its attempts, and every record arriving during the outage would
spend all of them in a second. It puts the input back instead, with everything after it in
the batch:

1. each of their partitions is sought back to its first record not handled, the offsets
   committed for it stop there, and every assigned partition is paused (every record needs
   the dependency: reading on would only fail the next one);
2. while paused, the records put back are touched (``ctx.touch``) so that their deadlines do
   not run out while they wait, and partitions assigned meanwhile are paused too;
3. after a back-off (``outage_retry``: exponential, with jitter) the partitions are resumed
   and the same input is tried again - one call to the dependency per try, not one per
   record;
4. the first input handled without an outage exception ends the outage; one that is still in
   it ``outage_max_ms`` after the outage began is failed as before (a replay or, after its
   attempts, the DLQ) and the next outage exception begins a new one.

Nothing goes downstream for an input put back, and no attempt is spent. The records queued
behind the paused partitions, not read yet (or not even at this hop yet), cannot be touched:
the task names none of them. It reports the outage instead: every ``BEAT_EVERY_MS`` while it
lasts an outage beat to every ledger partition says since when, covering ``BEAT_COVER_MS``
ahead (never past ``outage_max_ms`` after it began), and the acker stops their timeout clock
for that long (broker.ledger.outages, docs/design.md §6).

The beat names the source topics whose records wait behind the task (``beat_scope``): a
topic read with its replay topic is a source topic - replays go to a source topic's replay
topic, so a pair is what a first hop reads - and a replay topic holds its source topic's
records. An input that is neither is a later hop, whose records come from source topics the
task cannot name: its beat has no scope, and holds every record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from broker.retry import RetryPolicy
from broker.topics import REPLAY_SUFFIX, replay_topic

log = logging.getLogger(__name__)

#: How often a task in an outage sends its beat, and how far ahead a beat covers: more than
#: one beat ahead, so that a try that blocks a while (a connect timeout) leaves no gap; a task
#: killed in an outage stops the clock at most this long after its last beat.
BEAT_EVERY_MS = 1_000
BEAT_COVER_MS = 3_000


def beat_scope(topics: Iterable[str]) -> tuple[str, ...] | None:
    """The source topics whose records wait behind a task reading ``topics`` (the module
    doc), or None: an input at a later hop, records of any topic may."""
    names = set(topics)
    scope: set[str] = set()
    for topic in names:
        if topic.endswith(REPLAY_SUFFIX):
            scope.add(topic[: -len(REPLAY_SUFFIX)])
        elif replay_topic(topic) in names:
            scope.add(topic)
        else:
            return None
    return tuple(sorted(scope)) or None


class Outage:
    """The task's outage, if it is in one: since when, how many tries, what it holds back."""

    __slots__ = ("_clock", "_last_beat", "_last_touch", "_max_ms", "_max_s", "_policy", "_touch_s", "held",
                 "next_try", "paused", "since", "since_ms", "tries")

    def __init__(self, policy: RetryPolicy, max_ms: int, touch_every_ms: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._policy = policy
        self._max_ms = max_ms
        self._max_s = max_ms / 1000
        self._touch_s = touch_every_ms / 1000
        self._clock = clock
        self.since: float | None = None  # monotonic, when the current outage began
        self.since_ms: int | None = None  # the same, wall clock (for status and metrics)
        self.tries = 0  # tries of the current outage so far
        self.next_try = 0.0
        self.paused = False
        self.held: list[int] = []  # srids put back, touched while they wait
        self._last_touch = 0.0
        self._last_beat: float | None = None

    def holds_on(self) -> bool:
        """Whether an outage exception now puts its input back (False: it has lasted
        ``outage_max_ms``, the input is failed, and the outage is over)."""
        now = self._clock()
        if self.since is not None and now - self.since >= self._max_s:
            log.warning("outage for %.1fs, past outage_max_ms: failing the input as any failure", now - self.since)
            self.over()
            return False
        return True

    def put_back(self, srids: list[int]) -> float:
        """Inputs put back: pause for the next back-off; returns it in seconds."""
        now = self._clock()
        if self.since is None:
            self.since, self.since_ms = now, int(time.time() * 1000)
        self.tries += 1
        delay = self._policy.delay_ms(self.tries) / 1000
        self.next_try, self.paused, self.held = now + delay, True, srids
        self._last_touch = now
        return delay

    def touch_due(self) -> bool:
        if not self.held or self._clock() - self._last_touch < self._touch_s:
            return False
        self._last_touch = self._clock()
        return True

    def beat_due(self, now_ms: int) -> tuple[int, int] | None:
        """``(since_ms, until_ms)`` of the beat to send now (None: none due): at once when an
        outage begins, then every ``BEAT_EVERY_MS``; covering ``BEAT_COVER_MS`` past
        ``now_ms`` (wall clock), never past ``outage_max_ms`` after the outage began."""
        if self.since is None or self.since_ms is None:
            return None
        now = self._clock()
        if self._last_beat is not None and now - self._last_beat < BEAT_EVERY_MS / 1000:
            return None
        self._last_beat = now
        return self.since_ms, min(now_ms + BEAT_COVER_MS, self.since_ms + self._max_ms)

    def resume_due(self) -> bool:
        return self.paused and self._clock() >= self.next_try

    def over(self) -> float:
        """The outage ended (an input went through, or one was given up): how long it was."""
        lasted = 0.0 if self.since is None else self._clock() - self.since
        if self.since is not None:
            log.warning("outage over after %.1fs and %d tries", lasted, self.tries)
        self.since = self.since_ms = self._last_beat = None
        self.tries, self.paused, self.held = 0, False, []
        return lasted

    def seconds(self) -> float:
        """How long the current outage has lasted (0: none)."""
        return 0.0 if self.since is None else self._clock() - self.since
