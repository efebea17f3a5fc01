"""The acker service: folds persist records and XOR events into the ledger, exactly once.

One loop per process serves many ledger partitions. Inputs ``ns.persist[i]`` and
``ns.acks[i]`` are read ``read_committed`` in one consumer group; state per partition is a
``LedgerTable`` (broker.ledger), backed by the compacted changelog ``ns.ledger[i]``.

Commit (every ``commit_interval_ms``), ONE Kafka transaction holding, in this order:
1. expiry: entries past their deadline time out, orphans are dropped; failed entries are
   taken - each timed-out or failed srid is replayed or dead-lettered (broker.replay);
2. tombstones to ``ns.persist`` for completed, replayed and dead-lettered srids;
3. replay records (persist + ``<topic>.replay``), DLQ and quarantine records;
4. changelog: upserts for entries that changed and are alive, tombstones for entries that
   left (entries born and gone inside one interval never touch it), and the partition's
   counters;
5. the input offsets (``send_offsets_to_transaction``).
A crash anywhere before the commit aborts all of it; the next owner restores the changelog
and resumes from the committed offsets - each event is reflected exactly once, the cut is
consistent like a barrier snapshot, with Kafka's transaction log as the barrier.

Partition assignment uses the ``range`` assignor: it gives partition i of persist and of acks
to the same member (cooperative-sticky balances each topic on its own and would split them).
On assignment, committed offsets are fetched first (``require_stable``: this waits out any
transaction a dead owner left open), then the changelog is read to its end, then input
consumption resumes - so restored state and input positions come from the same commit.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from broker import ids
from broker.errors import DecodeError, ReplayBrokerError
from broker.ledger.clock import Clock, SystemClock, Ticker
from broker.ledger.table import LedgerTable, Removed
from broker.replay import Outgoing, PayloadCache, PersistFetcher, decide, quarantine_record
from broker.schemas import (
    COUNTERS_KEY,
    H_DEADLINE,
    H_ROOT,
    LedgerEntry,
    PersistedRecord,
    XorBatch,
    avro_long,
    decode_counters,
    encode_counters,
    encode_ledger_entry,
)
from broker.settings import KafkaSettings
from broker.topics import Namespace, check, partition_counts, replay_topic

log = logging.getLogger(__name__)

COUNTERS = (
    "registered",  # persist records folded
    "duplicate_roots",  # persist records refused because the srid was registered already
    "folded",  # (srid, xor) pairs folded
    "fail_marks",  # explicit failure marks received
    "completed",  # trees completed -> persist tombstone
    "timed_out",  # registered entries past their deadline
    "failed",  # entries failed explicitly (replayed or dead-lettered)
    "replayed",  # new attempts published to <topic>.replay
    "dlq",  # records dead-lettered after max attempts
    "orphans",  # unregistered entries dropped after the orphan TTL (late or stray events)
    "quarantined",  # undecodable or misrouted input messages, kept in the DLQ
    "payload_fetches",  # replays whose payload came from ns.persist, not the cache
)


# Persist tombstones say why the srid left: completed, replay (superseded by a new attempt)
# or dlq. Consumers watching completions read this header (broker.completions).
H_OUTCOME = "rb-outcome"
OUTCOME_COMPLETED = b"completed"


def default_instance_id() -> str:
    return socket.gethostname()


@dataclass(frozen=True)
class AckerConfig:
    commit_interval_ms: int = 100
    orphan_ttl_ms: int = 60_000
    tick_ms: int = 100
    batch_size: int = 20_000
    poll_timeout_s: float = 0.02
    # Stable per instance: a restarted instance fences its predecessor and aborts its open
    # transaction at once, instead of waiting for transaction_timeout_ms.
    instance_id: str = field(default_factory=default_instance_id)
    transaction_timeout_ms: int = 10_000
    replay_cache_entries: int = 20_000
    # Explicit failures are decided in windows that close this long after their first fail
    # mark arrived, all ledger partitions together and in the order of their records: fail
    # marks of one key travel through different ledger partitions, which Kafka does not
    # order among each other.
    fail_hold_ms: int = 150
    # Tail the changelog of every partition this instance does not own, so a takeover is
    # a catch-up read instead of a full restore (DESIGN §5: standby replicas).
    standby: bool = False
    stats_interval_s: float = 10.0
    # False folds without transactions: ONLY to show what breaks (tests); never in production.
    exactly_once: bool = True


@dataclass
class PartitionState:
    """One ledger partition: the table, its cumulative counters, and the outputs due."""

    table: LedgerTable
    counters: dict[str, int]
    # This instance's decisions, over all partitions it ever owned (shared by all states).
    totals: dict[str, int] = field(default_factory=dict)
    counters_dirty: bool = False
    tombstones: list[tuple[int, bytes]] = field(default_factory=list)  # srid, outcome
    failures: list[tuple[int, int, str]] = field(default_factory=list)  # srid, offset, reason
    recent_fails: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (ms, srids)

    def count(self, name: str, n: int = 1) -> None:
        if n:
            self.counters[name] = self.counters.get(name, 0) + n
            self.totals[name] = self.totals.get(name, 0) + n
            self.counters_dirty = True


class Acker:
    def __init__(
        self,
        settings: KafkaSettings,
        namespace: str | Namespace,
        config: AckerConfig | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.ns = namespace if isinstance(namespace, Namespace) else Namespace(namespace)
        self.config = config or AckerConfig()
        self.settings = settings
        self.clock = clock or SystemClock()
        self.ticker = Ticker.starting_at(self.clock, self.config.tick_ms)
        self.P = check(settings, self.ns)
        self.group_id = f"{self.ns.name}.acker"
        self.states: dict[int, PartitionState] = {}
        # Partitions not owned: lp -> (state, next changelog offset). Warm states of revoked
        # partitions, and with ``standby`` every other partition, tailed as it changes.
        self.standby: dict[int, tuple[PartitionState, int]] = {}
        self.last_assignment: dict[str, object] = {}
        self.totals: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._positions: dict[tuple[str, int], int] = {}
        self._outgoing: list[Outgoing] = []
        self._replay_topics: dict[str, tuple[int | None, float]] = {}
        self._stop = threading.Event()
        self._cache = PayloadCache(self.config.replay_cache_entries)
        self._fetcher = PersistFetcher(settings, self.ns)
        self._last_commit = time.monotonic()
        self._last_stats = time.monotonic()
        self.commits = 0
        producer_conf: dict[str, object] = {"linger.ms": 1, "partitioner": "murmur2_random"}
        if self.config.exactly_once:
            producer_conf["transactional.id"] = f"{self.ns.name}.acker.{self.config.instance_id}"
            producer_conf["transaction.timeout.ms"] = self.config.transaction_timeout_ms
        self._producer = Producer(settings.producer_config(**producer_conf))
        if self.config.exactly_once:
            self._producer.init_transactions(60)
        self._consumer = Consumer(
            settings.consumer_config(
                self.group_id,
                **{
                    "partition.assignment.strategy": "range",
                    "isolation.level": "read_committed",
                    "enable.auto.offset.store": False,
                    "session.timeout.ms": 10_000,
                    "heartbeat.interval.ms": 1_000,
                    "fetch.wait.max.ms": 20,
                    "max.poll.interval.ms": 60_000,
                },
            )
        )
        self._restorer = Consumer(
            settings.consumer_config(
                None,
                **{
                    "group.id": f"{self.ns.name}.acker.restore",
                    "enable.partition.eof": True,
                    "isolation.level": "read_committed",
                    # EOF is only seen when a fetch comes back empty, and the broker holds
                    # an empty fetch (and the requests queued behind it) for this long.
                    "fetch.wait.max.ms": 10,
                    # A restore reads whole partitions: big fetches, few round trips.
                    "max.partition.fetch.bytes": 16 * 1024 * 1024,
                    "fetch.max.bytes": 64 * 1024 * 1024,
                },
            )
        )
        self._standby_consumer = self._make_standby_consumer()

    # ------------------------------------------------------------------ lifecycle

    def _make_standby_consumer(self) -> Consumer | None:
        if not self.config.standby:
            return None
        return Consumer(
            self.settings.consumer_config(
                None,
                **{"group.id": f"{self.ns.name}.acker.standby", "isolation.level": "read_committed"},
            )
        )

    def stop(self) -> None:
        self._stop.set()

    def run(
        self,
        *,
        install_signals: bool = False,
        until: Callable[[Acker], bool] | None = None,
    ) -> None:
        """Serve until ``stop()``/SIGTERM/SIGINT (or ``until(self)`` is true); then commit what
        was folded and leave the group cleanly."""
        if install_signals:
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())
        self._assign_standby()
        self._consumer.subscribe(
            [self.ns.persist, self.ns.acks],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        log.info("acker %s serving %s (P=%d)", self.config.instance_id, self.ns.name, self.P)
        try:
            while not self._stop.is_set():
                self.step()
                if until is not None and until(self):
                    break
            self.commit()
        finally:
            self.close()

    def close(self) -> None:
        with contextlib.suppress(KafkaException, RuntimeError):
            self._consumer.close()  # revokes: _on_revoke commits what is left
        with contextlib.suppress(KafkaException, RuntimeError):
            self._restorer.close()
        if self._standby_consumer is not None:
            with contextlib.suppress(KafkaException, RuntimeError):
                self._standby_consumer.close()
        with contextlib.suppress(KafkaException, RuntimeError):
            self._fetcher.close()
        with contextlib.suppress(KafkaException, RuntimeError):
            self._producer.flush(10)
        self._log_stats()

    # ------------------------------------------------------------------ assignment

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lps = sorted({tp.partition for tp in partitions if tp.topic == self.ns.persist})
        acks = sorted({tp.partition for tp in partitions if tp.topic == self.ns.acks})
        if lps != acks:
            log.error("assignment is not co-partitioned: persist %s acks %s", lps, acks)
        started = time.monotonic()
        # Stable committed offsets first: waits for any transaction a dead owner left open,
        # so the changelog read below ends after everything those offsets reflect.
        committed = consumer.committed(partitions, timeout=60)
        read = warm = 0
        for lp in lps:
            standby = self.standby.pop(lp, None)
            if standby is None:
                self.states[lp], n = self._load(lp, None, OFFSET_BEGINNING)
            else:
                self.states[lp], n = self._load(lp, standby[0], standby[1])
                warm += 1
            read += n
        self._assign_standby()
        assigned = []
        for tp in committed:
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            assigned.append(TopicPartition(tp.topic, tp.partition, offset))
        consumer.assign(assigned)
        seconds = time.monotonic() - started
        self.last_assignment = {
            "partitions": lps,
            "from_standby": warm,
            "changelog_records_read": read,
            "entries": sum(len(self.states[lp].table) for lp in lps),
            "seconds": seconds,
        }
        log.info(
            "assigned ledger partitions %s: %d from standby/warm state, %d changelog records read, "
            "%d entries, %.3fs",
            lps, warm, read, self.last_assignment["entries"], seconds,
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lps = {tp.partition for tp in partitions if tp.topic == self.ns.persist}
        clean = True
        try:
            self.commit()
        except ReplayBrokerError:
            clean = False
        # After a successful commit a partition's table equals its changelog: keep it as a
        # warm standby, so getting the partition back (range rebalances are eager) costs a
        # catch-up read, not a restore. A table ahead of its changelog is dropped instead.
        clean = clean and not self._outgoing
        for lp in lps:
            st = self.states.pop(lp, None)
            if st is not None and clean and not st.failures and not st.tombstones:
                self.standby[lp] = (st, self._changelog_end(lp))
        self._drop(lps)
        self._assign_standby()

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Someone else owns them now: nothing of ours may be committed for them, and the
        # tables may be ahead of their changelogs.
        self._abort()
        self._drop({tp.partition for tp in partitions if tp.topic == self.ns.persist})
        self._assign_standby()

    def _drop(self, lps: set[int]) -> None:
        for lp in lps:
            self.states.pop(lp, None)
        self._positions = {tp: o for tp, o in self._positions.items() if tp[1] not in lps}

    def _changelog_end(self, lp: int) -> int:
        _, high = self._restorer.get_watermark_offsets(TopicPartition(self.ns.ledger, lp), timeout=30)
        return int(high)

    def _assign_standby(self) -> None:
        """With ``standby``, tail the changelog of every partition this instance does not own."""
        if self._standby_consumer is None:
            return
        for lp in range(self.P):
            if lp not in self.states and lp not in self.standby:
                self.standby[lp] = (self._empty_state(), OFFSET_BEGINNING)
        self._standby_consumer.assign(
            [TopicPartition(self.ns.ledger, lp, offset) for lp, (_, offset) in self.standby.items()]
        )

    def _poll_standby(self) -> None:
        if self._standby_consumer is None or not self.standby:
            return
        latest: dict[int, dict[bytes, bytes | None]] = defaultdict(dict)
        for msg in self._standby_consumer.consume(10_000, 0):
            if msg.error() is None and msg.partition() in self.standby:
                latest[msg.partition()][msg.key() or b""] = msg.value()
                st, _ = self.standby[msg.partition()]
                self.standby[msg.partition()] = (st, msg.offset() + 1)
        for lp, records in latest.items():
            self._apply(self.standby[lp][0], records)

    def _empty_state(self) -> PartitionState:
        return PartitionState(LedgerTable(), {}, self.totals)

    def _load(self, lp: int, st: PartitionState | None, start: int) -> tuple[PartitionState, int]:
        """Read ``ns.ledger[lp]`` from ``start`` to its end onto ``st`` (a fresh state when
        None). The last record of each key wins, so re-reading records a state already
        reflects is harmless. Returns the state and the number of records read."""
        latest: dict[bytes, bytes | None] = {}
        read = 0
        low, high = self._restorer.get_watermark_offsets(TopicPartition(self.ns.ledger, lp), timeout=30)
        if high > max(low, start):
            self._restorer.assign([TopicPartition(self.ns.ledger, lp, start)])
            try:
                done = False
                while not done:
                    # consume() waits out its whole timeout unless 10 000 messages arrive:
                    # a long one would cost every restored partition a second, however small.
                    for msg in self._restorer.consume(10_000, 0.05):
                        err = msg.error()
                        if err is None:
                            latest[msg.key() or b""] = msg.value()
                            read += 1
                        elif err.code() == KafkaError._PARTITION_EOF:
                            done = True
                        else:
                            raise KafkaException(err)
            finally:
                self._restorer.unassign()
        st = st if st is not None else self._empty_state()
        self._apply(st, latest)
        return st, read

    def _apply(self, st: PartitionState, latest: dict[bytes, bytes | None]) -> None:
        """Apply changelog records (the last per key) to a table: upserts and tombstones."""
        raw_counters = latest.pop(COUNTERS_KEY, None)
        if raw_counters:
            st.counters, _ = decode_counters(raw_counters)
        gone = [k for k, v in latest.items() if v is None and len(k) == 8]
        if gone:
            st.table.remove(np.frombuffer(b"".join(gone), dtype=">i8").astype(np.int64))
        live = [(k, v) for k, v in latest.items() if v is not None and len(k) == 8]
        if live:
            entries = [LedgerEntry.decode(v) for _, v in live]
            st.table.restore(
                np.frombuffer(b"".join(k for k, _ in live), dtype=">i8").astype(np.int64),
                np.array([e.value for e in entries], dtype=np.int64),
                np.array([e.flags for e in entries], dtype=np.uint8),
                np.array([e.persist_offset for e in entries], dtype=np.int64),
                self.ticker.ticks_of(np.array([e.deadline_ms for e in entries], dtype=np.int64)),
            )

    # ------------------------------------------------------------------ folding

    def step(self) -> int:
        """Poll once, fold what came, commit when the interval is due. Returns messages read."""
        # poll() returns as soon as one message is there; consume(n, timeout) would wait the
        # whole timeout unless n messages arrive, adding up to poll_timeout_s to every event.
        first = self._consumer.poll(self.config.poll_timeout_s)
        msgs: list[Message] = []
        if first is not None:
            msgs.append(first)
            if self.config.batch_size > 1:
                msgs.extend(self._consumer.consume(self.config.batch_size - 1, 0))
        if msgs:
            self._fold_messages(msgs)
        now = time.monotonic()
        if (now - self._last_commit) * 1000 >= self.config.commit_interval_ms:
            self.commit()
            self._poll_standby()
        if now - self._last_stats >= self.config.stats_interval_s:
            self._log_stats()
        return len(msgs)

    def _fold_messages(self, msgs: list[Message]) -> None:
        persist: dict[int, list[Message]] = defaultdict(list)
        acks: dict[int, list[Message]] = defaultdict(list)
        states, persist_topic = self.states, self.ns.persist
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", err)
                continue
            partition = msg.partition()
            if partition not in states:
                continue  # revoked while in flight
            (persist if msg.topic() == persist_topic else acks)[partition].append(msg)
        # A partition's messages come in offset order: its position is after the last one.
        for lp, batch in persist.items():
            self._positions[(persist_topic, lp)] = batch[-1].offset() + 1
            self._register(lp, batch)
        for lp, batch in acks.items():
            self._positions[(self.ns.acks, lp)] = batch[-1].offset() + 1
            self._fold(lp, batch)

    def _orphan_tick(self) -> int:
        return self.ticker.tick_of(self.clock.now_ms() + self.config.orphan_ttl_ms)

    def _quarantine(self, st: PartitionState, msg: Message, why: str) -> None:
        st.count("quarantined")
        log.warning("quarantined %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), why)
        self._outgoing.append(
            quarantine_record(self.ns, msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), why)
        )

    def _register(self, lp: int, batch: list[Message]) -> None:
        """Register persist records (their roots' creation events) without decoding them.

        The srid is the key; root_xor and the deadline come from the ``rb-root`` /
        ``rb-deadline`` headers, read in bulk with numpy. The value is only checked to start
        with the key's srid (its first Avro field) and kept as bytes for a replay; a record
        without the headers (an older producer) is decoded in full. Anything else is
        quarantined, as is a value that turns out undecodable when a replay needs it.
        """
        st = self.states[lp]
        msgs: list[Message] = []
        keys: list[bytes] = []
        roots: list[bytes] = []
        deadlines: list[bytes] = []
        values: list[bytes] = []
        for msg in batch:
            value = msg.value()
            if value is None:
                continue  # a tombstone: a completion (ours or a previous owner's)
            key = msg.key()
            root = deadline = None
            for name, header in msg.headers() or ():
                if name == H_ROOT:
                    root = header
                elif name == H_DEADLINE:
                    deadline = header
            if (
                key is not None and len(key) == 8 and root is not None and len(root) == 8
                and deadline is not None and len(deadline) == 8
            ):
                if not value.startswith(avro_long(int.from_bytes(key, "big", signed=True))):
                    self._quarantine(st, msg, "persist value does not start with the key's srid")
                    continue
            else:
                try:
                    record = self._decode_persist(msg, key, value)
                except DecodeError as exc:
                    self._quarantine(st, msg, str(exc))
                    continue
                key = ids.encode_id(record.srid)
                root = ids.encode_id(record.root_xor)
                deadline = ids.encode_id(record.created_ms + record.timeout_ms)
            msgs.append(msg)
            keys.append(key)
            roots.append(root)
            deadlines.append(deadline)
            values.append(value)
        if not msgs:
            return
        srids = np.frombuffer(b"".join(keys), dtype=">i8").astype(np.int64)
        misrouted = (srids == 0) | (srids % self.P != lp)
        if misrouted.any():
            for i in np.flatnonzero(misrouted).tolist():
                self._quarantine(st, msgs[i], f"srid {int(srids[i])} does not belong to ledger partition {lp}")
            keep = ~misrouted
            srids = srids[keep]
            kept = keep.tolist()
            msgs = [m for m, k in zip(msgs, kept, strict=True) if k]
            roots = [r for r, k in zip(roots, kept, strict=True) if k]
            deadlines = [d for d, k in zip(deadlines, kept, strict=True) if k]
            values = [v for v, k in zip(values, kept, strict=True) if k]
            if not msgs:
                return
        result = st.table.register(
            srids,
            np.frombuffer(b"".join(roots), dtype=">i8").astype(np.int64),
            np.array([m.offset() for m in msgs], dtype=np.int64),
            self.ticker.ticks_of(np.frombuffer(b"".join(deadlines), dtype=">i8").astype(np.int64)),
        )
        dup = int(result.duplicates.sum())
        st.count("registered", len(msgs) - dup)
        if dup:
            st.count("duplicate_roots", dup)
            log.warning("refused %d duplicate persist records in partition %d", dup, lp)
        done = set(result.completed.srids.tolist()) if len(result.completed) else set()
        put = self._cache.put
        for srid, value, is_dup in zip(srids.tolist(), values, result.duplicates.tolist(), strict=True):
            if not is_dup and srid not in done:
                put(srid, value)
        self._completed(st, result.completed)

    def _decode_persist(self, msg: Message, key: bytes | None, value: bytes) -> PersistedRecord:
        """The full check of a persist record without the registration headers."""
        if key is None or len(key) != 8:
            raise DecodeError("persist key is not an 8-byte srid")
        record = PersistedRecord.decode(value)
        if ids.decode_id(key) != record.srid:
            raise DecodeError("persist key and record srid differ")
        return record

    def _fold(self, lp: int, batch: list[Message]) -> None:
        st = self.states[lp]
        srids, xors, failed = [], [], []
        for msg in batch:
            try:
                xb = XorBatch.decode(msg.value())
                if xb.ledger_partition != lp:
                    raise DecodeError(f"batch for ledger partition {xb.ledger_partition} sent to {lp}")
                for arr in (xb.srids, xb.failed):
                    if arr.size and (np.any(arr == 0) or np.any(arr % self.P != lp)):
                        raise DecodeError(f"batch holds srids of other ledger partitions than {lp}")
            except DecodeError as exc:
                self._quarantine(st, msg, str(exc))
                continue
            srids.append(xb.srids)
            xors.append(xb.xors)
            if xb.failed.size:
                failed.append(xb.failed)
        orphan_tick = self._orphan_tick()
        if srids:
            s = np.concatenate(srids)
            if s.size:
                st.count("folded", int(s.size))
                self._completed(st, st.table.fold(s, np.concatenate(xors), orphan_tick))
        if failed:
            f = np.concatenate(failed)
            st.count("fail_marks", int(f.size))
            st.table.mark_failed(f, orphan_tick)
            st.recent_fails.append((self.clock.now_ms(), f))

    def _completed(self, st: PartitionState, done: Removed) -> None:
        if len(done):
            srids = done.srids.tolist()
            st.count("completed", len(srids))
            st.tombstones.extend((srid, OUTCOME_COMPLETED) for srid in srids)
            self._cache.discard_many(srids)

    # ------------------------------------------------------------------ commit

    def _collect_failures(self) -> None:
        now_ms = self.clock.now_ms()
        tick = self.ticker.current_tick(now_ms)
        # Fail marks are released in windows: once the oldest held mark (over all ledger
        # partitions) is fail_hold_ms old, every held mark is decided in this commit, so the
        # marks of one task batch - spread over ledger partitions - are decided together.
        oldest = min((ms for st in self.states.values() for ms, _ in st.recent_fails), default=None)
        release = oldest is None or now_ms - oldest >= self.config.fail_hold_ms
        for st in self.states.values():
            expired = st.table.expire(tick)
            st.count("orphans", len(expired.orphans))
            st.count("timed_out", len(expired.timed_out))
            for srid, offset in zip(expired.timed_out.srids.tolist(), expired.timed_out.offsets.tolist(), strict=True):
                st.failures.append((srid, offset, "timeout"))
            if release:
                st.recent_fails.clear()
            hold = np.concatenate([f for _, f in st.recent_fails]) if st.recent_fails else None
            failed = st.table.take_failed(hold)
            st.count("failed", len(failed))
            for srid, offset in zip(failed.srids.tolist(), failed.offsets.tolist(), strict=True):
                st.failures.append((srid, offset, "failed"))

    def _decide_failures(
        self, lp: int, st: PartitionState, decided: list[tuple[int, int, tuple[Outgoing, ...]]]
    ) -> None:
        now_ms = self.clock.now_ms()
        pending = st.failures
        st.failures = []
        for srid, offset, reason in pending:
            payload = self._cache.pop(srid)
            if payload is None:
                try:
                    payload = self._fetcher.fetch_raw(lp, offset, srid)
                    st.count("payload_fetches")
                except (DecodeError, KafkaException) as exc:
                    # Never drop a failed record: try again at the next commit.
                    log.error("cannot read payload of %d (%s); retrying", srid, exc)
                    st.failures.append((srid, offset, reason))
                    continue
            try:
                record = PersistedRecord.decode(payload)
                if record.srid != srid:
                    raise DecodeError(f"persist record holds srid {record.srid}, not {srid}")
            except DecodeError as exc:
                # Registered from its headers, but the value is no PersistedRecord: it cannot
                # be replayed. Keep it in the DLQ byte for byte and let the srid go.
                why = f"persist record of {srid} ({reason}) cannot be replayed: {exc}"
                st.count("quarantined")
                log.warning("quarantined %s[%d]@%d: %s", self.ns.persist, lp, offset, why)
                q = quarantine_record(self.ns, self.ns.persist, lp, offset, ids.encode_id(srid), payload, why)
                decided.append((0, offset, (q,)))
                st.tombstones.append((srid, b"dlq"))
                continue
            decision = decide(
                self.ns, record, reason, now_ms, self.P, self._replay_partitions(record.topic)
            )
            st.count(decision.kind if decision.kind == "dlq" else "replayed")
            decided.append((record.created_ms, offset, decision.records))
            st.tombstones.append((srid, decision.kind.encode()))

    def _replay_partitions(self, topic: str) -> int | None:
        """Partition count of ``<topic>.replay`` (None when missing), cached; a missing one is
        looked up again after a minute."""
        name = replay_topic(topic)
        cached = self._replay_topics.get(name)
        if cached is not None and (cached[0] is not None or time.monotonic() - cached[1] < 60):
            return cached[0]
        count = partition_counts(self.settings, [name])[name]
        if count is None:
            log.error("replay topic %s does not exist: its records go to the DLQ", name)
        self._replay_topics[name] = (count, time.monotonic())
        return count

    def commit(self) -> None:
        """One transaction: expiry decisions, tombstones, replays/DLQ, changelog, offsets."""
        self._last_commit = time.monotonic()
        self._collect_failures()
        out, self._outgoing = self._outgoing, []
        decided: list[tuple[int, int, tuple[Outgoing, ...]]] = []
        for lp, st in self.states.items():
            self._decide_failures(lp, st, decided)
        # Failures come out of the table in srid / slot order. Produce the replays in the
        # order the originals were persisted instead - created_ms, then the persist offset
        # (exact within a ledger partition) - so the failures of one key decided in one
        # commit keep the key's order on <topic>.replay.
        decided.sort(key=lambda d: (d[0], d[1]))
        for _, _, records in decided:
            out.extend(records)
        if any(st.failures for st in self.states.values()):
            # A payload could not be read: commit nothing now (the changelog would forget
            # the failed entry before its replay exists); everything decided so far waits.
            self._outgoing = out + self._outgoing
            return
        changelog: list[tuple[int, bytes, bytes | None]] = []
        tombstones: list[tuple[int, int, bytes]] = []
        for lp, st in self.states.items():
            tombstones.extend((lp, srid, outcome) for srid, outcome in st.tombstones)
            st.tombstones = []
            delta = st.table.take_dirty()
            up = delta.upserts
            if len(up):
                # Keys packed once (8-byte big-endian slices); values by the Avro encoder
                # that writes fastavro's bytes without a dict per entry.
                keys = up.srids.astype(">i8").tobytes()
                deadlines = self.ticker.ms_of_ticks(up.deadlines).tolist()
                for i, (value, flags, offset, deadline) in enumerate(
                    zip(up.values.tolist(), up.flags.tolist(), up.offsets.tolist(), deadlines, strict=True)
                ):
                    changelog.append(
                        (lp, keys[8 * i : 8 * i + 8], encode_ledger_entry(value, flags, offset, deadline))
                    )
            if len(delta.tombstones):
                keys = delta.tombstones.astype(">i8").tobytes()
                changelog.extend((lp, keys[i : i + 8], None) for i in range(0, len(keys), 8))
            if st.counters_dirty:
                changelog.append((lp, COUNTERS_KEY, encode_counters(st.counters, self.clock.now_ms())))
                st.counters_dirty = False
        positions = [TopicPartition(t, p, o) for (t, p), o in self._positions.items()]
        if not (out or changelog or tombstones or positions):
            return
        self._positions = {}
        try:
            if self.config.exactly_once:
                self._producer.begin_transaction()
            produce = self._producer.produce
            persist, ledger = self.ns.persist, self.ns.ledger
            outcome_headers: dict[bytes, list[tuple[str, bytes]]] = {}
            for lp, srid, outcome in tombstones:
                headers = outcome_headers.get(outcome)
                if headers is None:
                    headers = outcome_headers[outcome] = [(H_OUTCOME, outcome)]
                key = srid.to_bytes(8, "big", signed=True)
                try:
                    produce(persist, key=key, value=None, partition=lp, headers=headers)
                except BufferError:
                    self._produce(persist, key=key, value=None, partition=lp, headers=headers)
            for rec in out:
                self._produce(rec.topic, key=rec.key, value=rec.value, partition=rec.partition, headers=list(rec.headers))
            for lp, key, value in changelog:
                try:
                    produce(ledger, key=key, value=value, partition=lp)
                except BufferError:
                    self._produce(ledger, key=key, value=value, partition=lp)
            if self.config.exactly_once:
                if positions:
                    self._producer.send_offsets_to_transaction(
                        positions, self._consumer.consumer_group_metadata(), 30
                    )
                self._producer.commit_transaction(60)
            else:
                if self._producer.flush(60):
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "flush timed out"))
                if positions:
                    self._consumer.commit(offsets=positions, asynchronous=False)
        except KafkaException as exc:
            self._on_commit_error(exc)
            return
        self.commits += 1

    def _produce(self, topic: str, **kwargs: object) -> None:
        while True:
            try:
                self._producer.produce(topic, **kwargs)
                return
            except BufferError:
                self._producer.poll(0.05)

    def _abort(self) -> None:
        if self.config.exactly_once:
            with contextlib.suppress(KafkaException):
                self._producer.abort_transaction(30)

    def _on_commit_error(self, exc: KafkaException) -> None:
        err = exc.args[0] if exc.args else None
        fatal = bool(err is not None and hasattr(err, "fatal") and err.fatal())
        log.error("commit failed (%s); %s", err, "fatal, stopping" if fatal else "aborting and rewinding")
        if fatal:
            # Fenced: another instance took over with our transactional id. Stop; never
            # write again with this producer.
            self.stop()
            raise ReplayBrokerError(f"acker fenced or failed fatally: {err}") from exc
        self._abort()
        self._rewind()

    def _rewind(self) -> None:
        """After an aborted commit the in-memory state is ahead of Kafka: restore every owned
        partition from the changelog and seek the inputs back to the committed offsets."""
        lps = list(self.states)
        tps = [TopicPartition(t, lp) for lp in lps for t in (self.ns.persist, self.ns.acks)]
        committed = self._consumer.committed(tps, timeout=60)
        for lp in lps:
            self.states[lp], _ = self._load(lp, None, OFFSET_BEGINNING)
        self._positions = {}
        for tp in committed:
            self._consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))

    # ------------------------------------------------------------------ stats

    def counters(self) -> dict[str, int]:
        """This instance's decisions since it started, plus ``pending`` in what it owns now.

        (The cumulative per-partition counters, over every owner, are in the changelog:
        ``replaybroker status`` reads them.)"""
        return {**self.totals, "pending": sum(len(st.table) for st in self.states.values())}

    def _log_stats(self) -> None:
        self._last_stats = time.monotonic()
        c = self.counters()
        log.info(
            "acker %s partitions=%s %s",
            self.config.instance_id,
            sorted(self.states),
            " ".join(f"{k}={v}" for k, v in c.items()),
        )
