"""Ingest: persist records and XOR batches, decoded in bulk and folded into the tables.

Bad input never stops the acker: an undecodable, misrouted or srid-0 message is counted as
``quarantined`` and kept byte for byte in ``ns.dlq`` (broker.acker.replay.quarantine_record). In an
XorBatch for the right partition only the bad pairs are: the good ones are folded.
"""

from __future__ import annotations

import logging

import numpy as np
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from broker.acker.domain import (
    ReplayPartitions,
    domain_errors,
    placement_errors,
    placements_of,
    topic_of,
)
from broker.acker.owned import OwnedPartitions
from broker.acker.payloads import PayloadCache
from broker.acker.replay import quarantine_record
from broker.acker.state import PartitionState
from broker.errors import DecodeError
from broker.headers import OUTCOME_COMPLETED, scope_of
from broker.ledger.adaptive import AdaptiveTimeouts
from broker.ledger.clock import Clock, Ticker
from broker.ledger.outages import ANY, BEAT_BOUND_MS
from broker.ledger.table import Removed
from broker.retry import MAX_RETRY_AFTER_MS
from broker.schemas import (
    OUTAGE_BEAT_KEY,
    PERSIST_ADAPTIVE,
    PERSIST_FLAGS,
    PERSIST_PREFIX_LEN,
    OutageBeat,
    PersistPrefixes,
    XorBatch,
    decode_placement,
    read_persist_prefixes,
)
from broker.topics import Namespace

log = logging.getLogger(__name__)


def _ticks(ticker: Ticker, stops: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Stops on tick bounds (ms) as ticks."""
    return [(ticker.current_tick(a), ticker.current_tick(b)) for a, b in stops]


class Ingest:
    """Folds one partition's batch of input messages into its state."""

    def __init__(
        self,
        ns: Namespace,
        clock: Clock,
        ticker: Ticker,
        orphan_ttl_ms: int,
        cache: PayloadCache,
        owned: OwnedPartitions,
        adaptive: AdaptiveTimeouts | None = None,
        replay_partitions: ReplayPartitions | None = None,
    ) -> None:
        self.ns = ns
        # A data topic's replay topic's partition count, checked for each record's
        # key_hash_partition at registration (None: not checked).
        self.replay_partitions = replay_partitions
        # Latency per source topic and the deadlines it gives records with timeout "auto".
        self.adaptive = adaptive or AdaptiveTimeouts()
        # srid -> the adaptive deadline given since the last commit that passed (its entry is
        # logged by the next commit): what a rewind would otherwise give again, shorter.
        self.given: dict[int, int] = {}
        self.clock = clock
        self.ticker = ticker
        self.orphan_ttl_ms = orphan_ttl_ms
        # The same wait in ticks (rounded up): a touch read before its persist record keeps
        # the unregistered entry this long past the touched deadline (LedgerTable.touch).
        self.orphan_ttl_ticks = -(-orphan_ttl_ms // ticker.tick_ms)
        self.cache = cache
        # Quarantine records are queued there with their ledger partition; the commit produces
        # them in its transaction, or they are dropped with the partition if it leaves first.
        self.owned = owned
        self.partitions = 0  # P, known once the service has checked the topics
        # Per input partition, the offset after the last message this process read, and below
        # which offset the batch being folded was read before (a rewind or a rejoin reads
        # what no transaction committed again): its quarantines are logged once.
        self._read_to: dict[tuple[str, int], int] = {}
        self._logged_below = -1

    def _reading(self, batch: list[Message]) -> None:
        """A batch of one input partition, in offset order, is about to be folded."""
        where = (batch[0].topic(), batch[0].partition())
        self._logged_below = self._read_to.get(where, -1)
        self._read_to[where] = max(self._logged_below, batch[-1].offset() + 1)

    def orphan_tick(self) -> int:
        return self.ticker.tick_of(self.clock.now_ms() + self.orphan_ttl_ms)

    def quarantine(self, st: PartitionState, msg: Message, why: str, value: bytes | None = None) -> None:
        """Keep ``msg`` (or, given ``value``, the bad part of it) in the DLQ with the reason."""
        st.count("quarantined")
        # Counted again: the counts of what no transaction committed are taken back with it.
        if msg.offset() >= self._logged_below:
            log.warning("quarantined %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), why)
        value = msg.value() if value is None else value
        self.owned.queue(
            msg.partition(),  # persist[i] and acks[i] belong to ledger partition i
            quarantine_record(self.ns, msg.topic(), msg.partition(), msg.offset(), msg.key(), value, why),
        )

    def register(self, st: PartitionState, lp: int, batch: list[Message], *, again: bool = False) -> None:
        """Register persist records (their roots' creation events) without decoding them.

        The srid, root_xor and deadline come from each value's fixed prefix
        (``broker.schemas``), read for the whole batch at once with numpy; the value is kept
        as bytes for a replay. A value whose prefix does not name its key, whose record does
        not start with that srid, of another ledger partition or outside the rule's domain is
        quarantined, as is a value that turns out undecodable when a replay needs it. A record
        whose prefix marks its timeout adaptive gets its deadline from the latency estimate
        of its topic instead (``_adaptive_deadlines``).

        ``again``: records registered before, by an owner whose changelog leaves their entries
        out (broker.acker.unlogged) - counted then, and quarantined then if bad: neither again.
        """
        if not again:
            self._reading(batch)
        values = [m.value() for m in batch]
        msgs = batch
        if None in values:  # tombstones: completions (ours or a previous owner's)
            msgs = [m for m, v in zip(batch, values, strict=True) if v is not None]
            values = [v for v in values if v is not None]
            if not msgs:
                return
        keys = [m.key() for m in msgs]
        if None in keys:
            keys = [k or b"" for k in keys]
        pre = read_persist_prefixes(values)
        srids, deadline_ms, flags = pre.srids, pre.deadlines_ms, pre.flags
        bad_key = np.fromiter(map(len, keys), np.int64, len(keys)) != 8
        if bad_key.any():
            keys = [bytes(8) if b else k for k, b in zip(keys, bad_key.tolist(), strict=True)]
        other = np.frombuffer(b"".join(keys), ">i8") != srids
        misrouted = (srids == 0) | (srids % self.partitions != lp)
        adaptive = (flags & PERSIST_ADAPTIVE) != 0
        # A record starts with its srid (its first Avro field), names its key, belongs to this
        # ledger partition and has the fields the rule decides by in its domain
        # (broker.acker.domain); anything else is quarantined, never registered.
        bad = pre.short | bad_key | other | ~pre.body_srid_ok | misrouted | (flags > PERSIST_FLAGS)
        outside = domain_errors(pre)
        bad |= np.fromiter((w is not None for w in outside), bool, len(outside))
        # A record whose topic and key_hash_partition no replay could go to (broker.acker.domain).
        rows = np.flatnonzero(~bad)
        placements = placements_of(pre, values, rows)
        unplaced = placement_errors(pre, values, rows, self.replay_partitions, placements)
        # Its data topic: what an outage beat's scope names (broker.ledger.outages).
        tids = np.full(len(msgs), -1, np.int32)
        tids[rows] = self._topic_ids(st, placements)
        if unplaced:
            bad[list(unplaced)] = True
            for i, why in unplaced.items():
                outside[i] = why
        if bad.any():
            for i in np.flatnonzero(bad & (not again)).tolist():
                self.quarantine(st, msgs[i], self._why(i, lp, pre, bad_key, other, misrouted, outside))
            keep = ~bad
            srids, deadline_ms, adaptive, tids = srids[keep], deadline_ms[keep], adaptive[keep], tids[keep]
            roots, attempts, created = pre.roots[keep], pre.attempts[keep], pre.created_ms[keep]
            kept = keep.tolist()
            msgs = [m for m, k in zip(msgs, kept, strict=True) if k]
            values = [v for v, k in zip(values, kept, strict=True) if k]
            if not msgs:
                return
        else:
            roots, attempts, created = pre.roots, pre.attempts, pre.created_ms
        # One sample per batch for the age of the oldest pending entry (RegistrationTimes):
        # the persist record's own timestamp, the source's send time unless the topic
        # stamps append times.
        ts_type, ts = msgs[0].timestamp()
        st.registrations.note(msgs[0].offset(), ts if ts_type != TIMESTAMP_NOT_AVAILABLE else self.clock.now_ms())
        offsets = np.array([m.offset() for m in msgs], dtype=np.int64)
        st.topics.note(offsets, tids, gaps=again)
        auto_mask = self._adaptive_deadlines(st, srids, offsets, values, adaptive, deadline_ms)
        given = auto_mask
        if st.stops.until_ms:
            # Created while a task's outage stopped the clock: the timeout starts when it
            # moves again (broker.ledger.outages) - a deadline of the acker's, logged.
            held = st.stops.held_back(created, deadline_ms, st.topics.topics_of(tids))
            if held.any():
                deadline_ms = deadline_ms + held
                given = held > 0 if auto_mask is None else auto_mask | (held > 0)
        # An adaptive deadline is the acker's, not the persist record's: logged (``given``).
        result = st.table.register(
            srids, roots, offsets, self.ticker.ticks_of(deadline_ms), given, orphan_ttl=self.orphan_ttl_ticks
        )
        dup = int(result.duplicates.sum())
        if not again:
            st.count("registered", len(msgs) - dup)
        if auto_mask is not None and not again:
            st.count("adaptive", int(np.count_nonzero(auto_mask & ~result.duplicates)))
        if dup and not again:
            st.count("duplicate_roots", dup)
            log.warning("refused %d duplicate persist records in partition %d", dup, lp)
        new = srids.tolist()
        if dup or len(result.completed):  # only what is still pending and was not there before
            done = set(result.completed.srids.tolist())
            keep = [s not in done and not d for s, d in zip(new, result.duplicates.tolist(), strict=True)]
            new = [s for s, k in zip(new, keep, strict=True) if k]
            values = [v for v, k in zip(values, keep, strict=True) if k]
        self.cache.put_many(new, values)
        replays = np.flatnonzero(attempts > 1)
        if replays.size:  # the attempt a replay's completion ends at (PartitionState.count_ended)
            st.replay_attempts.update(zip(srids[replays].tolist(), attempts[replays].tolist(), strict=True))
        self.completed(st, result.completed)

    @staticmethod
    def _topic_ids(st: PartitionState, placements: list[bytes]) -> np.ndarray:
        """The data topic id (``EntryTopics``) of each placement; each distinct one (a batch
        has few) decoded once."""
        ids_of: dict[bytes, int] = {}
        for p in set(placements):
            decoded = decode_placement(p)
            ids_of[p] = st.topics.id_of(None if decoded is None else decoded[0])
        return np.fromiter(map(ids_of.__getitem__, placements), np.int32, len(placements))

    def _adaptive_deadlines(
        self, st: PartitionState, srids: np.ndarray, offsets: np.ndarray, values: list[bytes], adaptive: np.ndarray,
        deadline_ms: np.ndarray,
    ) -> np.ndarray | None:
        """Give the records with an adaptive timeout their deadline, ``now + clamp(quantile x
        safety factor, floor, ceiling)`` of their topic's latency (in ``deadline_ms``, in
        place), and note when they were registered, for their latency when they leave.
        Returns the mask of auto records (None: none in the batch, nothing done).

        A deadline once given is never shortened (docs/design.md §6): one given since the last
        commit that passed (``given``) is not in the changelog yet, so a rewind reads its record
        again - registered again, it keeps the later of its two deadlines."""
        if not adaptive.any():
            if len(st.auto_runs):  # a run of fixed records ends the auto run before it
                st.auto_runs.note(offsets, np.full(offsets.size, -1, np.int32), self.clock.now_ms())
            return None
        now = self.clock.now_ms()
        topic_id = self.adaptive.topic_id
        tids = np.full(offsets.size, -1, np.int32)
        for i in np.flatnonzero(adaptive).tolist():  # only the adaptive ones: their topic
            tids[i] = topic_id(topic_of(values[i]))
        auto = tids >= 0
        deadline_ms[auto] = self.adaptive.deadlines(tids[auto], now)
        given = self.given
        for i in np.flatnonzero(auto).tolist():
            srid, ms = int(srids[i]), int(deadline_ms[i])
            deadline_ms[i] = given[srid] = max(ms, given.get(srid, ms))
        st.auto_runs.note(offsets, tids, now)
        return auto

    def left(self, st: PartitionState, offsets: np.ndarray) -> None:
        """Entries at these persist offsets left the table now (completed or timed out): the
        latency of the auto ones is a sample of their topic's estimate."""
        if len(st.auto_runs):
            self.adaptive.observe_offsets(st.auto_runs, offsets, self.clock.now_ms())

    @staticmethod
    def _why(i: int, lp: int, pre: PersistPrefixes, bad_key: np.ndarray, other: np.ndarray,
             misrouted: np.ndarray, outside: list[str | None]) -> str:
        """Why the ``i``-th persist record of a batch is quarantined."""
        if pre.short[i]:
            return f"persist value shorter than its {PERSIST_PREFIX_LEN}-byte prefix"
        if bad_key[i]:
            return "persist key is not an 8-byte srid"
        if other[i]:
            return "persist key and the srid of its value's prefix differ"
        if not pre.body_srid_ok[i]:
            return "persist record does not start with its prefix's srid"
        if misrouted[i]:
            return f"srid {int(pre.srids[i])} does not belong to ledger partition {lp}"
        if outside[i] is not None:
            return f"persist record outside the rule's domain: {outside[i]}"
        return f"unknown persist flags {int(pre.flags[i]):#04x}"

    def fold(self, st: PartitionState, lp: int, batch: list[Message]) -> None:
        """Fold a batch of ``ns.acks[lp]`` in log order, so that what a message does never
        depends on where a poll cut the log: the XOR batches between two outage beats
        together (``_fold_xor_batches``), each beat where it is - a task in an outage touches
        what it holds, then beats, and the beat stops the clock of the deadlines touched."""
        self._reading(batch)
        run: list[Message] = []
        for msg in batch:
            if msg.key() == OUTAGE_BEAT_KEY:
                if run:
                    self._fold_xor_batches(st, lp, run)
                    run = []
                self.outage_beat(st, msg)
            else:
                run.append(msg)
        if run:
            self._fold_xor_batches(st, lp, run)

    def _fold_xor_batches(self, st: PartitionState, lp: int, batch: list[Message]) -> None:
        """Fold XOR batches: the deadline extensions (touches), then the (srid, xor) pairs,
        explicit fail marks and superseded marks of the same messages."""
        srids, xors, failed, touched, touched_deadlines, superseded = [], [], [], [], [], []
        P = self.partitions
        for msg in batch:
            try:
                xb = XorBatch.decode(msg.value())
                if xb.ledger_partition != lp:
                    raise DecodeError(f"batch for ledger partition {xb.ledger_partition} sent to {lp}")
            except DecodeError as exc:
                self.quarantine(st, msg, str(exc))
                continue
            bad_s = (xb.srids == 0) | (xb.srids % P != lp)
            bad_f = (xb.failed == 0) | (xb.failed % P != lp)
            bad_r = (xb.rejected == 0) | (xb.rejected % P != lp)
            if bad_s.any() or bad_f.any() or bad_r.any():
                rest = self._quarantine_pairs(st, msg, lp, xb, bad_s, bad_f, bad_r)
                if rest is None:
                    continue
                xb = rest
            if xb.touched.size:
                bad_t = (xb.touched == 0) | (xb.touched % P != lp)
                if bad_t.any():
                    empty = xb.touched[:0]
                    bad = XorBatch(xb.ledger_partition, empty, empty, empty, xb.producer,
                                   xb.touched[bad_t], xb.touched_deadlines[bad_t])
                    self.quarantine(st, msg, f"{int(bad_t.sum())} touch(es) of srid 0 or of other ledger "
                                    f"partitions than {lp}; the rest of the batch was folded", bad.encode())
                touched.append(xb.touched[~bad_t])
                touched_deadlines.append(xb.touched_deadlines[~bad_t])
            if xb.superseded.size:
                bad_m = (xb.superseded == 0) | (xb.superseded % P != lp)
                if bad_m.any():
                    empty = xb.superseded[:0]
                    bad = XorBatch(xb.ledger_partition, empty, empty, empty, xb.producer, superseded=xb.superseded[bad_m])
                    self.quarantine(st, msg, f"{int(bad_m.sum())} superseded mark(s) of srid 0 or of other ledger "
                                    f"partitions than {lp}; the rest of the batch was folded", bad.encode())
                superseded.append(xb.superseded[~bad_m])
            srids.append(xb.srids)
            xors.append(xb.xors)
            if xb.failed.size:
                failed.append(xb.failed)
                if xb.retry_after_ms.size:
                    self._retry_afters(st, xb, self.clock.now_ms())
            if xb.rejected.size:
                # A rejection is a fail mark whose attempt is the last (docs/design.md §6).
                failed.append(xb.rejected)
                st.rejections.update(zip(xb.rejected.tolist(), xb.rejected_reasons, strict=True))
                st.count("rejections", int(xb.rejected.size))
        orphan_tick = self.orphan_tick()
        if touched:
            # A touch pushes the deadline of a pending entry, or of one whose persist record
            # is still to come (kept for its registration, LedgerTable.touch); one for a
            # failed or decided entry is ignored - and counted. Before the events: a task
            # sends an input's touches with its event, which may complete the tree.
            t = np.concatenate(touched)
            deadlines = np.clip(np.concatenate(touched_deadlines), 0, 2**62)  # no overflow in ticks
            applied = st.table.touch(t, self.ticker.ticks_of(deadlines), self.orphan_ttl_ticks)
            st.count("touched", applied)
            st.count("touches_ignored", int(t.size) - applied)
        if srids:
            s = np.concatenate(srids)
            if s.size:
                st.count("folded", int(s.size))
                self.completed(st, st.table.fold(s, np.concatenate(xors), orphan_tick))
                st.count("completed_late", st.table.take_late_completed())
        if failed:
            f = np.concatenate(failed)
            st.count("fail_marks", int(f.size))
            st.table.mark_failed(f, orphan_tick)
            now = self.clock.now_ms()
            st.recent_fails.append((now, f))
            # Its back-off runs from its fold, as a retry-after does (``_retry_afters``).
            for srid in f.tolist():
                st.failed_at.setdefault(srid, now)
        if superseded:
            # Replays whose original completed late (broker.acker.superseding): never
            # replayed or dead-lettered from now on; an unknown one waits for its persist record.
            m = np.concatenate(superseded)
            if m.size:
                st.count("superseded_marks", int(m.size))
                st.table.mark_superseded(m, orphan_tick)

    @staticmethod
    def _retry_afters(st: PartitionState, xb: XorBatch, now_ms: int) -> None:
        """Keep when the fail marks' replays may go, as their task asked
        (``ctx.fail(retry_after_ms=...)``; -1: not asked), until their decisions: a time on
        the acker's clock, not a delay, so that a re-decision or a new owner waits no longer.
        A delay past ``MAX_RETRY_AFTER_MS`` is held to it: a sender's bug must not park a
        record in the ledger for good."""
        asked = xb.retry_after_ms >= 0
        at = now_ms + np.minimum(xb.retry_after_ms[asked], MAX_RETRY_AFTER_MS)
        st.retry_at.update(zip(xb.failed[asked].tolist(), at.tolist(), strict=True))
        st.count("retry_afters", int(asked.sum()))

    def outage_beat(self, st: PartitionState, msg: Message) -> None:
        """A task in an outage: the partition's timeout clock stops for the time its beat adds
        (broker.ledger.outages) - at most ``BEAT_BOUND_MS`` either side of the beat's own
        timestamp, so a beat with a start too early, a cover too long (or a clock far off)
        cannot stop the clock for long - for the entries of the topics its scope names and
        those of a topic not known (a beat without a scope: for every entry).
        Read in order with the events, so before any expiry at a tick after it was sent."""
        try:
            beat = OutageBeat.decode(msg.value())
            scope = scope_of(msg.headers())
        except (DecodeError, ValueError) as exc:
            self.quarantine(st, msg, str(exc))
            return
        ts_type, ts = msg.timestamp()
        sent = ts if ts_type != TIMESTAMP_NOT_AVAILABLE else self.clock.now_ms()
        start = max(beat.since_ms, sent - BEAT_BOUND_MS)
        until = min(beat.until_ms, sent + BEAT_BOUND_MS)
        st.count("outage_beats")
        if scope is not None:
            st.count("outage_scoped_beats")
        if until <= start:
            return
        # On tick bounds, so that the stops of beats meet where they touch.
        ticker = self.ticker
        changes = st.stops.cover(beat.task, beat.since_ms, ticker.ms_of(ticker.tick_of(until)),
                                 ticker.ms_of(ticker.current_tick(start)), scope)
        # Each class of entries (a scoped topic, the other known topics, the unknown) as its
        # own stops moved: an entry is in one class, so one beat moves it once. With no
        # scoped stop every class has the same stops: one.
        scoped = st.stops.scoped
        for holder, stopped in changes.items():
            if not scoped and holder != ANY:
                continue
            moved = st.table.stop_clock(ticker.current_tick(stopped.start_ms), _ticks(ticker, stopped.before),
                                        _ticks(ticker, stopped.after), st.topics.holds(holder, scoped) if scoped else None)
            st.count("outage_held", moved)
        if changes:
            st.count("outage_stopped_ms", max(s.added_ms for s in changes.values()))

    def _quarantine_pairs(
        self, st: PartitionState, msg: Message, lp: int, xb: XorBatch, bad_s: np.ndarray, bad_f: np.ndarray,
        bad_r: np.ndarray,
    ) -> XorBatch | None:
        """Quarantine the events, fail marks and rejections of srid 0 or of another ledger
        partition; return the rest of the batch (None: nothing is left). One bad srid is the
        sender's bug, not its neighbours': quarantining the whole batch would leave their
        trees to timeouts and replays."""
        counts = ((int(bad_s.sum()), "event(s)"), (int(bad_f.sum()), "fail mark(s)"), (int(bad_r.sum()), "rejection(s)"))
        why = " and ".join(f"{n} {what}" for n, what in counts if n)
        why += f" of srid 0 or of other ledger partitions than {lp}"
        if bad_s.all() and bad_f.all() and bad_r.all():  # all bad: keep the message byte for byte
            self.quarantine(st, msg, why)
            return None
        # Only the bad ones, re-encoded as an XorBatch (same partition and producer) to inspect.
        reasons, asked = xb.rejected_reasons, xb.retry_after_ms
        bad = XorBatch(
            xb.ledger_partition, xb.srids[bad_s], xb.xors[bad_s], xb.failed[bad_f], xb.producer,
            rejected=xb.rejected[bad_r], rejected_reasons=tuple(r for r, b in zip(reasons, bad_r.tolist(), strict=True) if b),
            retry_after_ms=asked[bad_f] if asked.size else asked,
        )
        self.quarantine(st, msg, f"{why}; the rest of the batch was folded", bad.encode())
        return XorBatch(
            lp, xb.srids[~bad_s], xb.xors[~bad_s], xb.failed[~bad_f], xb.producer, xb.touched, xb.touched_deadlines,
            xb.superseded, xb.rejected[~bad_r],
            tuple(r for r, b in zip(reasons, bad_r.tolist(), strict=True) if not b),
            asked[~bad_f] if asked.size else asked,
        )

    def completed(self, st: PartitionState, done: Removed) -> None:
        if len(done):
            self.left(st, done.offsets)
            srids = done.srids.tolist()
            st.count("completed", len(srids))
            st.count_completed(srids)
            st.tombstones.append((done.srids, OUTCOME_COMPLETED))
            self.cache.discard_many(srids)
