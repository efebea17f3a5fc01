"""A task skips a superseded replay (``TaskConfig.skip_superseded``, docs/design.md §6).

A replay whose original attempt completed late is marked in ``ns.superseded``
(broker.markers): the task acks it as a leaf - its record id alone, no work, nothing emitted
- so the replay's tree completes and no output is written twice. Only a replay (attempt > 1)
is looked up: a first attempt is never superseded.

A marker can only be read once the original's late ack is folded, and a batch that took
longer than ``slow_batch_ms`` may have outlived its inputs' timeouts: their replays can
arrive before their markers. So a replay of one of a slow batch's inputs waits for its marker
- within one window, ``superseded_wait_ms`` from the batch's end, shared by all of them: a
slow batch whose originals do not complete stalls the task that long once, not once per
replay. Each origin waits once; another slow batch opens a new window.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from broker.headers import Tracking
from broker.markers import SupersededMarkers
from broker.task.acks import Events
from broker.task.config import TaskCounters


class SupersededSkip:
    """The markers a task has read, and the window of its last slow batch."""

    __slots__ = ("_began", "_clock", "_counters", "_flush", "_origins", "_slow_origins", "_slow_s", "_slow_until",
                 "_wait_s", "markers")

    def __init__(
        self, markers: SupersededMarkers, counters: TaskCounters, flush: Callable[[], object], *,
        slow_batch_ms: int, superseded_wait_ms: int, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``flush``: sends out what the task produced - the late ack of an original must be
        out before the task waits for the marker that ack leads to."""
        self.markers = markers
        self._counters = counters
        self._flush = flush
        self._slow_s = slow_batch_ms / 1000
        self._wait_s = superseded_wait_ms / 1000
        self._clock = clock
        self._began = 0.0
        self._origins: list[int] = []  # the tracked inputs' origins of the batch being handled
        # The origins of the last slow batch's inputs, and until when (monotonic) a replay of
        # one of them waits for its marker.
        self._slow_origins: set[int] = set()
        self._slow_until = 0.0

    def begin_batch(self) -> list[int]:
        """A batch begins: take the markers fetched since the last one. Returns the list the
        origins of its tracked inputs go to, as they are read."""
        self.markers.poll()
        self._began = self._clock()
        self._origins = []
        return self._origins

    def end_batch(self) -> None:
        """The batch is handled: if it was slow, the replays of its inputs wait for their
        markers within the window that begins now."""
        now = self._clock()
        if now - self._began > self._slow_s:
            self._slow_origins = set(self._origins)
            self._slow_until = now + self._wait_s
        self._origins = []

    def skip(self, tracking: Tracking, events: Events) -> bool:
        """Whether the replay ``tracking`` is superseded; then it is acked as a leaf in
        ``events``. ``tracking``: a replay's (attempt > 1)."""
        if tracking.srid not in self.markers.srids and not (self._slow_origins and self._waited_for(tracking)):
            return False
        events.srids.append(tracking.srid)
        events.xors.append(tracking.record_id)
        self._counters.skipped += 1
        return True

    def _waited_for(self, tracking: Tracking) -> bool:
        """Whether the marker of a slow batch's input's replay arrived within the window."""
        left = self._slow_until - self._clock()
        if left <= 0:
            self._slow_origins = set()
            return False
        if tracking.origin not in self._slow_origins:
            return False
        self._slow_origins.discard(tracking.origin)
        self._counters.superseded_waits += 1
        self._flush()
        return self.markers.wait_for(tracking.srid, left)

    def close(self) -> None:
        self.markers.close()
