"""Lag gates expiry: a ledger partition's entries time out only once the acker has read its
inputs far enough that every event that could still complete them has been folded.

Why. A deadline is a time (the source's ``created_ms + timeout_ms``) but the acks that meet
it are messages in ``ns.acks``, which the acker may read long after they were written: after
an outage, a slow restore, a rebalance, or while its consumer lag exceeds the timeout. Judged
by the clock alone, the first commit after such a gap expires entries whose completing acks
are still unread; each false timeout spends an attempt, and repeated gaps dead-letter
records that completed. So expiry is gated by how far the inputs have been read, not by how
much time has passed.

Mechanism: watermark samples. At every commit the gate notes, per input partition
(``ns.persist[i]`` and ``ns.acks[i]``) of an owned ledger partition with entries,
``(now, high watermark)``: every message appended before ``now`` lies below that offset. (A
partition with an empty table has nothing to expire: its inputs are sampled once every
``refresh_ms``, for their lag figures; a sample missed only delays a read-up-to time.) Once
the consumer's position reaches a sample's offset (less ``slack``), every event appended
before the sample's time has been folded, and that time becomes the partition's *read-up-to*
time. A partition's entries expire when their deadline
is at or before the read-up-to time of its two inputs (each partition on its own: every attempt
of a key's records lives in one ledger partition):

- caught up: this commit's own sample is reached at once, read-up-to = now - expiry is
  exactly what it was without the gate;
- a steady lag of L: read-up-to ~ now - L, timeouts come late by the lag, never falsely;
- back after a gap, or just assigned: nothing is reached until the backlog that was there
  when the acker came back has been read; an input whose watermark is unknown (nothing
  fetched yet) has no sample, which counts as behind.

Both inputs count: acks complete entries; and an event read before its persist record is
kept as an orphan only ``orphan_ttl_ms``, so dropping orphans while persist is behind could
drop the event a later-read persist record needed. Explicit fail marks are not gated: a fail
mark is a fact, not the absence of one (broker.acker.decisions).

The numbers come from the consumer without a round trip: ``get_watermark_offsets(tp,
cached=True)`` is the high watermark of the last fetch response, ``position()`` the next
offset the application gets. What librdkafka 2.x does with them (probed on Kafka 4):

- ``position()`` is unknown (-1001) after an assign or a seek until a message is delivered;
  the offset assigned or sought stands in for it (the log start for OFFSET_BEGINNING);
- ``position()`` steps over transaction markers, so a consumer that read everything has
  position == high watermark exactly; the cached value is the high watermark, not the last
  stable offset, so an open transaction on an input holds expiry until it ends (on the safe
  side);
- the cached value outlives unassign/assign: a partition given back by a rebalance still
  shows its end from the earlier assignment. A sample is therefore taken only once a fetch of
  the current assignment is proven - the position is known, or the cached watermarks moved
  since the assignment. An idle partition proves neither: while it has entries due, it gets
  a real watermark query (one round trip), ``refresh_ms`` after they fell due and at most
  every ``refresh_ms``;
- a paused partition is not fetched, so its cached value stands still: a paused input takes
  no samples, and once resumed it is unproven again until a fetch comes back (a message is
  delivered, or the watermarks move), as after an assignment (broker.acker.reading pauses).

Limits. A cached watermark is as old as the last fetch response - normally under
``fetch.wait.max.ms`` plus a round trip, an ack appended that close before a deadline can
still be late, as it could before. If the acker cannot fetch from an input's leader but can
still commit (a partial network partition), the cached value stays old and expiry is judged
against it. Clock skew is not lag: see broker.ledger.clock.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from broker.acker.live import LiveClients
from broker.acker.state import PartitionState
from broker.ledger.clock import Ticker
from broker.topics import Namespace

log = logging.getLogger(__name__)

MAX_SAMPLES = 256
"""Unreached samples kept per input; thinned beyond (a coarser series only delays expiry)."""


@dataclass
class _Input:
    """One input partition's read progress since it was assigned (or sought)."""

    start: int  # the offset assigned or sought (OFFSET_BEGINNING: the log start)
    snapshot: tuple[int, int]  # the cached watermarks then - maybe from an earlier assignment
    proven: bool = False  # a fetch of this assignment came back: the cached values are ours
    paused: bool = False  # not fetched (broker.acker.reading): its cached watermark stands still
    resumed_at: int | None = None  # the position when it was resumed, until a fetch proves it
    samples: deque[tuple[int, int]] = field(default_factory=deque)  # (ms, high), unreached
    read_ms: int | None = None  # every message appended before this time has been read
    queried_ms: int | None = None  # the last real watermark query (rate limit)
    lag: int | None = None  # high watermark - position at the last commit (None: unknown)
    position: int | None = None
    high: int | None = None

    def sample(self, now_ms: int, high: int) -> None:
        # A later time for the same (or a lower: truncated) end is the stronger statement.
        while self.samples and self.samples[-1][1] >= high:
            self.samples.pop()
        self.samples.append((now_ms, high))
        if len(self.samples) > MAX_SAMPLES:
            last = self.samples[-1]
            self.samples = deque(list(self.samples)[:-1:2])
            self.samples.append(last)

    def reach(self, position: int, slack: int) -> None:
        while self.samples and self.samples[0][1] - slack <= position:
            ms, _ = self.samples.popleft()
            self.read_ms = ms if self.read_ms is None else max(self.read_ms, ms)


class ExpiryGate:
    """Per owned ledger partition, the time up to which its entries may expire."""

    def __init__(
        self,
        ns: Namespace,
        live: LiveClients,
        *,
        slack: int = 0,
        refresh_ms: int = 1_000,
        query_timeout_s: float = 1.0,
        log_interval_s: float = 10.0,
    ) -> None:
        self.ns = ns
        self.live = live  # the group consumer as it is now (replaced by a rejoin)
        self.slack = slack
        self.refresh_ms = refresh_ms
        self.query_timeout_s = query_timeout_s
        self.log_interval_s = log_interval_s
        self.inputs: dict[tuple[str, int], _Input] = {}
        self.holds = 0  # (partition, commit) pairs at which due entries were held back
        self.held = 0  # entries held back at the last commit
        self._last_log = -float("inf")
        self._observed_all_ms = -(2**62)  # the last commit that sampled every input (``ticks``)

    @property
    def consumer(self) -> Consumer:
        return self.live.consumer

    # ------------------------------------------------------------------ assignment

    def assigned(self, partitions: Iterable[TopicPartition]) -> None:
        """Partitions (re)assigned or sought to ``tp.offset``: their progress starts over. An
        offset < 0 (no committed offset) means the beginning, as the service reads it."""
        for tp in partitions:
            if tp.topic in (self.ns.persist, self.ns.acks):
                start = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                self.inputs[(tp.topic, tp.partition)] = _Input(start, self._cached(tp))

    def paused(self, tp: TopicPartition) -> None:
        """``tp`` is not fetched any more: no samples of it until it is resumed and fetched."""
        inp = self.inputs.get((tp.topic, tp.partition))
        if inp is not None:
            inp.paused = True

    def resumed(self, tp: TopicPartition) -> None:
        """``tp`` is fetched again: its cached watermark is as old as the pause until a fetch
        comes back (a message is delivered, or the watermarks move) - as after an assignment."""
        inp = self.inputs.get((tp.topic, tp.partition))
        if inp is not None:
            inp.paused, inp.proven = False, False
            inp.snapshot = self._cached(tp)
            inp.resumed_at = self._position(tp.topic, tp.partition)

    def forget(self, lps: Iterable[int]) -> None:
        lps = set(lps)
        self.inputs = {k: v for k, v in self.inputs.items() if k[1] not in lps}

    # ------------------------------------------------------------------ expiry

    def ticks(self, states: Mapping[int, PartitionState], ticker: Ticker, now_ms: int) -> dict[int, int | None]:
        """The expiry tick of each owned ledger partition (None: expire nothing yet): the
        read-up-to time of its inputs. Every attempt of a key's records lives in one ledger
        partition (docs/design.md §6), so each partition's own tick keeps a key's timeouts in
        the order they were sent, and a lagging partition holds back only its own."""
        full = now_ms - self._observed_all_ms >= self.refresh_ms
        if full:
            self._observed_all_ms = now_ms
        # An empty table has nothing to expire: at P=1000 its inputs' samples were most of an
        # idle acker's commit (a position and a cached watermark per input).
        self._observe(now_ms, None if full else {lp for lp, st in states.items() if len(st.table)})
        now_tick = ticker.current_tick(now_ms)
        due = {lp: st.table.due(now_tick) for lp, st in states.items()}
        anything_due = any(due.values())
        read: dict[int, int | None] = {}
        for lp in states:
            read_ms = self._read_ms(lp)
            if anything_due and (read_ms is None or read_ms < now_ms) and self._query_unproven(lp, now_ms):
                read_ms = self._read_ms(lp)
            read[lp] = read_ms
        ticks = {lp: None if ms is None else ticker.current_tick(min(now_ms, ms)) for lp, ms in read.items()}
        held = sum(due[lp] - (0 if ticks[lp] is None else st.table.due(ticks[lp] or 0))
                   for lp, st in states.items() if due[lp])
        if held:
            self.holds += 1
            behind = min(read, key=lambda lp: read[lp] or -1)  # the partition read least far
            self._log_held(behind, held, read[behind], now_ms)
        self.held = held
        return ticks

    def _read_ms(self, lp: int) -> int | None:
        times = [self.inputs[(t, lp)].read_ms if (t, lp) in self.inputs else None for t in (self.ns.persist, self.ns.acks)]
        return None if None in times else min(t for t in times if t is not None)

    def _observe(self, now_ms: int, lps: set[int] | None = None) -> None:
        """Sample the cached high watermark of every input (of the ledger partitions ``lps``)
        and move it along by its position."""
        keys = list(self.inputs) if lps is None else [k for k in self.inputs if k[1] in lps]
        if not keys:
            return
        try:
            positions = {(tp.topic, tp.partition): tp.offset for tp in self.consumer.position(
                [TopicPartition(t, p) for t, p in keys]
            )}
        except KafkaException:
            positions = {}
        for key in keys:
            inp = self.inputs[key]
            low, high = self._cached(TopicPartition(*key))
            position = positions.get(key, -1)
            if not inp.proven and ((position >= 0 and position != inp.resumed_at) or (low, high) != inp.snapshot):
                inp.proven = True
            if inp.proven and not inp.paused and high >= 0:
                inp.sample(now_ms, high)
            self._advance(inp, position, low if inp.proven else -1, high if inp.proven else -1)

    def _advance(self, inp: _Input, position: int, low: int, high: int) -> None:
        if position < 0:
            if inp.start >= 0:
                position = inp.start  # nothing delivered since the assign/seek
            elif inp.start == OFFSET_BEGINNING and low >= 0:
                position = low
        inp.position = position if position >= 0 else None
        inp.high = high if high >= 0 else None
        inp.lag = None if inp.position is None or inp.high is None else max(0, inp.high - inp.position)
        if inp.position is not None:
            inp.reach(inp.position, self.slack)

    def _query_unproven(self, lp: int, now_ms: int) -> bool:
        """An input with no fetch proven since its assignment (an idle partition given back)
        gets a real watermark query, rate-limited. Returns whether one was made."""
        queried = False
        for topic in (self.ns.persist, self.ns.acks):
            inp = self.inputs.get((topic, lp))
            if inp is None or inp.proven:
                continue
            if inp.queried_ms is None:
                # Give the fetches of the new assignment one interval to prove themselves:
                # right after a rebalance that costs no round trip per partition.
                inp.queried_ms = now_ms
                continue
            if now_ms - inp.queried_ms < self.refresh_ms:
                continue
            inp.queried_ms = now_ms
            try:
                low, high = self.consumer.get_watermark_offsets(
                    TopicPartition(topic, lp), timeout=self.query_timeout_s, cached=False
                )
            except KafkaException as exc:
                log.debug("watermark query of %s[%d] failed: %s", topic, lp, exc)
                continue
            # The broker answered after ``now_ms``: everything appended before it is below.
            inp.sample(now_ms, int(high))
            # The cached value equals a fresh one: from here on it moves with the fetches.
            inp.proven = self._cached(TopicPartition(topic, lp))[1] == int(high)
            position = self._position(topic, lp)
            self._advance(inp, position, int(low), int(high))
            queried = True
        return queried

    def _position(self, topic: str, lp: int) -> int:
        try:
            return int(self.consumer.position([TopicPartition(topic, lp)])[0].offset)
        except KafkaException:
            return -1

    def _cached(self, tp: TopicPartition) -> tuple[int, int]:
        try:
            low, high = self.consumer.get_watermark_offsets(tp, cached=True)
        except KafkaException:
            return (-1, -1)  # not known to the client yet
        return int(low), int(high)

    def _log_held(self, lp: int, n: int, read_ms: int | None, now_ms: int) -> None:
        now = time.monotonic()
        if now - self._last_log < self.log_interval_s:
            return
        self._last_log = now
        parts = []
        for topic in (self.ns.persist, self.ns.acks):
            inp = self.inputs.get((topic, lp))
            if inp is None:
                parts.append(f"{topic} not assigned")
            else:
                lag = "unknown" if inp.lag is None else str(inp.lag)
                parts.append(f"{topic} lag {lag} (position {inp.position}, high watermark {inp.high})")
        behind = "never caught up since assigned" if read_ms is None else f"read up to {now_ms - read_ms} ms ago"
        log.warning(
            "expiry held back by ledger partition %d: %d entries due, its inputs %s; %s "
            "(logged at most every %.0fs)",
            lp, n, behind, "; ".join(parts), self.log_interval_s,
        )
