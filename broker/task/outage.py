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

import contextlib
import logging
import time
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from broker.headers import tracking_of
from broker.retry import RetryPolicy
from broker.task.acks import TaskAcks
from broker.task.config import TaskCounters
from broker.task.records import Offsets, TaskRecord
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


class OutageHold:
    """What the task does while its dependency is down (the module doc, steps 1-3): puts the
    input back, keeps every partition paused, touches what it put back, beats, and resumes
    when the next try is due. The outage's own state is ``outage``'s; the consumer is the
    task's current one (``consumer``: it is replaced on a fall-back of the group protocol)."""

    __slots__ = ("_acks", "_consumer", "_counters", "_touch_timeout_ms", "outage")

    def __init__(
        self, outage: Outage, acks: TaskAcks, counters: TaskCounters, consumer: Callable[[], Consumer],
        touch_timeout_ms: int,
    ) -> None:
        self.outage = outage
        self._acks = acks
        self._counters = counters
        self._consumer = consumer
        self._touch_timeout_ms = touch_timeout_ms

    def put_back(self, records: list[TaskRecord], rest: list[Message], offsets: Offsets) -> None:
        """``records`` and the messages of the batch not taken yet (``rest``, in reverse order)
        are read again after a back-off - their partitions sought back to the first of them,
        their offsets committed no further - and every assigned partition pauses meanwhile."""
        starts: dict[tuple[str, int], int] = {}
        srids: list[int] = []
        for r in records:
            key = (r.topic, r.partition)
            starts[key] = min(starts.get(key, r.offset), r.offset)
            if r.tracking is not None:
                srids.append(r.tracking.srid)
        for msg in rest:
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            if msg.error() is not None or offset is None or topic is None or partition is None:
                continue
            starts[(topic, partition)] = min(starts.get((topic, partition), offset), offset)
            tracking = tracking_of(tuple(msg.headers() or ()))
            if tracking is not None:
                srids.append(tracking.srid)
        rest.clear()
        consumer = self._consumer()
        for (topic, partition), offset in starts.items():
            offsets[(topic, partition)] = offset
            try:
                consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:
                # Not read again here: the committed offset stops before it, so its next owner
                # (or this task, after a restart) reads it; meanwhile it may time out and be replayed.
                log.warning("could not seek %s[%d] back to %d for the outage: %s", topic, partition, offset, exc)
        first = self.outage.since is None
        delay = self.outage.put_back(srids)
        self._counters.outage_tries += 1
        if first:
            self._counters.outages += 1
            log.warning("outage: %d input(s) put back (%s[%d]@%d first), inputs paused; trying again in %.2fs",
                        len(srids), records[0].topic, records[0].partition, records[0].offset, delay)
        self._pause_all()
        self._touch_held()
        self._beat()

    def wait_out(self) -> None:
        """While paused: touch what was put back now and then, keep every partition paused
        (those assigned meanwhile too), and resume them when the next try is due."""
        if self.outage.touch_due():
            self._touch_held()
        self._beat()
        if self.outage.resume_due():
            self.outage.paused = False
            consumer = self._consumer()
            with contextlib.suppress(KafkaException):
                consumer.resume(consumer.assignment())
        else:
            self._pause_all()

    def _beat(self) -> None:
        """Stop the timeout clock of what waits unread behind the paused task: the records of
        the source topics it reads, or every record if it reads a later hop."""
        due = self.outage.beat_due(int(time.time() * 1000))
        if due is not None:
            with contextlib.suppress(KafkaException):
                self._acks.outage_beat(*due)
            self._counters.outage_beats += 1

    def assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions were assigned: paused while the outage holds, else resumed - librdkafka
        keeps a partition's pause across its revocation and a later assignment, so one revoked
        while paused and assigned again after the outage would never be fetched."""
        with contextlib.suppress(KafkaException):
            (consumer.pause if self.outage.paused else consumer.resume)(partitions)

    def _pause_all(self) -> None:
        consumer = self._consumer()
        with contextlib.suppress(KafkaException):
            consumer.pause(consumer.assignment())

    def _touch_held(self) -> None:
        deadline = int(time.time() * 1000) + self._touch_timeout_ms
        for srid in self.outage.held:
            self._acks.touch(srid, deadline)
        self._counters.touches += len(self.outage.held)
