"""An in-memory Kafka for the acker's model tests: partitioned logs, transactions that append
on commit (so everything in a log is committed), committed group offsets, and consumers that
read the logs from positions - enough for the real ``Acker`` to restore from its changelog,
rewind after an aborted commit, and be replaced by a new instance that takes over from the
committed offsets, on a stepped clock.

The group consumer hands out at most ``Cluster.max_batch`` messages per poll, so what the
world writes faster than that is a backlog, as behind a real consumer.

Also, as a broker does: create timestamps on every record (``Cluster.clock``, when set), a log
start that DeleteRecords moves (``delete_records``), compaction that keeps the last record of
each key (``compact``), transactions of other producers left open on a partition (a
``read_committed`` consumer reads up to the first open offset: ``open_transaction``,
``end_transaction``), and a group of several members among which the partitions are shared
in ranges (``rebalance``: revocations first, then assignments, through the members' callbacks).

It is a service's Kafka port (``broker.kafka_port.KafkaPort``): an ``Acker``, a ``Task``, a
``Source`` or a ``Bridge`` is handed it (``kafka=cluster``). Each consumer group has its own
members and committed offsets; a producer without a ``transactional.id`` appends at once.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    TopicPartition,
)

import broker.acker.assignment
import broker.acker.service

Key = tuple[str, int]


class Message:
    """A record of a log, or a partition-EOF event (``error()``)."""

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes | None]] | None = None, err: KafkaError | None = None,
                 timestamp_ms: int = 0) -> None:
        self._t, self._p, self._o, self._k, self._v, self._h, self._e = topic, partition, offset, key, value, headers, err
        self._ts = timestamp_ms
        self.seq = 0  # its place among every append to the cluster (``Cluster.appended``)

    def error(self) -> KafkaError | None:
        return self._e

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self._h

    def timestamp(self) -> tuple[int, int]:
        if self._ts <= 0:
            return (TIMESTAMP_NOT_AVAILABLE, 0)  # the acker falls back to its clock
        return (TIMESTAMP_CREATE_TIME, self._ts)


@dataclass
class Cluster:
    partitions: int = 2
    max_batch: int = 4
    # A log's records by offset; None where one was deleted, compacted away or aborted.
    logs: dict[Key, list[Message | None]] = field(default_factory=lambda: defaultdict(list))
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)  # (group, topic, p) -> offset
    fail_commits: int = 0  # the next commits that fail (abortable), then succeed
    producers: list[ClusterProducer] = field(default_factory=list)
    consumers: list[ClusterConsumer] = field(default_factory=list)
    clock: Callable[[], int] | None = None  # create timestamps (ms); None: not available
    starts: dict[Key, int] = field(default_factory=lambda: defaultdict(int))  # log start offsets
    open_from: dict[Key, int] = field(default_factory=dict)  # first offset of an open transaction
    # The offsets of the open transaction's own records: an abort drops these, never the other
    # producers' records written between them (an acker's committed tombstones, say).
    open_offsets: dict[Key, list[int]] = field(default_factory=dict)
    # Each group's live members, in join order.
    groups: dict[str, list[ClusterConsumer]] = field(default_factory=lambda: defaultdict(list))
    transactions: int = 0  # transactions committed with offsets (by any member)
    appended: int = 0  # records appended to any log: the order of appends across logs (``Message.seq``)

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               headers: list[tuple[str, bytes | None]] | None = None, timestamp_ms: int | None = None) -> int:
        log = self.logs[(topic, partition)]
        if timestamp_ms is None or timestamp_ms <= 0:
            timestamp_ms = self.clock() if self.clock is not None else 0
        msg = Message(topic, partition, len(log), key, value, headers, timestamp_ms=timestamp_ms)
        self.appended += 1
        msg.seq = self.appended
        log.append(msg)
        return len(log) - 1

    def high(self, topic: str, partition: int) -> int:
        return len(self.logs[(topic, partition)])

    def marks(self, topic: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
        """Watermarks in one batch (an admin client's list_offsets)."""
        return {p: (self.low(topic, p), self.high(topic, p)) for p in partitions}

    def low(self, topic: str, partition: int) -> int:
        return self.starts[(topic, partition)]

    def stable(self, topic: str, partition: int) -> int:
        """The last stable offset: a ``read_committed`` consumer reads up to here."""
        return self.open_from.get((topic, partition), self.high(topic, partition))

    def records(self, topic: str) -> list[Message]:
        return [m for (t, p), log in sorted(self.logs.items()) if t == topic
                for m in log[:self.stable(t, p)] if m is not None]

    # -- what the broker does to a log besides appending
    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """DeleteRecords: the log starts at ``before`` (never past the stable offset)."""
        key = (topic, partition)
        before = min(before, self.stable(topic, partition))
        for o in range(self.starts[key], before):
            self.logs[key][o] = None
        self.starts[key] = max(self.starts[key], before)

    def compact(self, topic: str, partition: int) -> None:
        """Compaction up to the stable offset: a record is removed once its key has a later one
        (tombstones stay: their retention is not modelled)."""
        key = (topic, partition)
        log, last = self.logs[key], {}
        for o in range(self.starts[key], self.stable(topic, partition)):
            m = log[o]
            if m is not None and m.key() is not None:
                if m.key() in last:
                    log[last[m.key()]] = None
                last[m.key()] = o

    def open_transaction(self, topic: str, partition: int, records: list[tuple[bytes | None, bytes | None]]) -> None:
        """Another producer's transaction on the partition, open until ``end_transaction``."""
        key = (topic, partition)
        first = self.high(topic, partition)
        mine = self.open_offsets.setdefault(key, [])
        for k, v in records:
            mine.append(self.append(topic, partition, k, v))
        self.open_from.setdefault(key, first)

    def end_transaction(self, topic: str, partition: int, *, commit: bool) -> None:
        key = (topic, partition)
        first = self.open_from.pop(key, None)
        if first is None:
            return
        log = self.logs[key]
        mine = self.open_offsets.pop(key, [])
        if not commit:
            for o in mine:
                log[o] = None
        self.append(topic, partition, None, None)  # the transaction's marker takes an offset
        log[-1] = None

    # -- the group
    def join(self, member: ClusterConsumer) -> None:
        self.groups[member.group].append(member)
        self.rebalance(member.group)

    def leave(self, member: ClusterConsumer, *, clean: bool) -> None:
        """``member`` leaves the group: a clean stop revokes its partitions first (its
        callback commits), a kill -9 does not (they are handed on as they are)."""
        members = self.groups[member.group]
        if member not in members:
            return
        if clean and member.owned:
            member.revoke(sorted(member.owned))
        member.owned = set()
        members.remove(member)
        self.rebalance(member.group)

    def kill(self) -> None:
        """kill -9 of every member: each leaves without revoking, for a new instance to take over."""
        for members in self.groups.values():
            for member in list(members):
                self.leave(member, clean=False)

    def rebalance(self, group: str) -> None:
        """Share the ledger partitions (every topic has P here) among the group's members in
        ranges (the range assignor: partition i of every topic to one member); revocations
        before assignments."""
        members = self.groups[group]
        n = len(members)
        if not n:
            return
        share = -(-self.partitions // n)
        target = {m: set(range(i * share, min((i + 1) * share, self.partitions))) for i, m in enumerate(members)}
        for m in members:
            gone = m.owned - target[m]
            if gone:
                m.revoke(sorted(gone))
        for m in members:
            new = target[m] - m.owned
            if new:
                m.grant(sorted(new))

    # -- the Kafka port of a service (broker.kafka_port.KafkaPort)
    superseded_partitions: int | None = None  # ns.superseded (default: P); other topics have 4
    topic_partitions: dict[str, int] = field(default_factory=dict)  # other counts of named topics

    def producer(self, config: Any) -> ClusterProducer:
        return ClusterProducer(self, dict(config))

    def consumer(self, config: Any) -> ClusterConsumer:
        return ClusterConsumer(self, dict(config))

    def check(self, ns: Any, data_topics: Any = ()) -> int:
        return self.partitions

    def partition_counts(self, names: Any) -> dict[str, int | None]:
        superseded = self.partitions if self.superseded_partitions is None else self.superseded_partitions
        return {n: self.topic_partitions.get(n, superseded if n.rsplit(".", 1)[-1] == "superseded" else 4)
                for n in names}

    def watermarks(self, topic: str, partitions: list[int], *, committed: bool = True) -> dict[int, tuple[int, int]]:
        return self.marks(topic, partitions)

    def delete_retention_ms(self, topic: str) -> int | None:
        return 3_600_000

    def max_message_bytes(self, topic: str) -> int | None:
        return None

    def consumer_group_protocol(self, group: str) -> bool | None:
        return True

    def set_group_timeouts(self, group: str, session_ms: int | None, heartbeat_ms: int | None) -> str | None:
        return None

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """For a test whose ``AckerConfig`` lacks ``fakes.WHOLE_RESTORE`` (test_fate_model): the
        loop's restore slice made as long. The cluster itself is handed to the services it
        serves (``kafka=``)."""
        monkeypatch.setattr(broker.acker.service, "restore_slice", lambda *_a: 10.0)


class ClusterProducer:
    """A transactional producer: records and offsets land together at commit, or never.
    Without a ``transactional.id``, a record lands at once (its partition: the one named, else
    its key's)."""

    def __init__(self, cluster: Cluster, conf: dict[str, Any]) -> None:
        self.cluster, self.conf = cluster, conf
        self.pending: list[tuple[str, int, bytes | None, bytes | None, Any, int]] = []
        self.pending_offsets: list[TopicPartition] = []
        self.group = ""
        self.transactional = "transactional.id" in conf
        cluster.producers.append(self)

    def init_transactions(self, *_: Any) -> None:
        pass

    def begin_transaction(self) -> None:
        self.pending, self.pending_offsets = [], []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = -1,
                on_delivery: Any = None, callback: Any = None, timestamp: int = 0,
                headers: list[tuple[str, bytes | None]] | None = None) -> None:  # confluent-kafka's order (kafka_io.PRODUCE_ARGS)
        ts = timestamp or (self.cluster.clock() if self.cluster.clock is not None else 0)
        if not self.transactional:
            if partition < 0:
                partition = zlib.crc32(key or b"") % self.cluster.partitions
            self.cluster.append(topic, partition, key, value, headers, ts)
            return
        assert partition >= 0, "the acker names every partition"
        self.pending.append((topic, partition, key, value, headers, ts))

    def send_offsets_to_transaction(self, positions: list[TopicPartition], group: Any, *_: Any) -> None:
        self.pending_offsets = list(positions)
        self.group = getattr(group, "group", "")

    def commit_transaction(self, *_: Any) -> None:
        if self.cluster.fail_commits > 0:
            self.cluster.fail_commits -= 1
            raise KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT, "commit failed (injected)"))
        for topic, partition, key, value, headers, ts in self.pending:
            self.cluster.append(topic, partition, key, value, headers, ts)
        for tp in self.pending_offsets:
            self.cluster.offsets[(self.group, tp.topic, tp.partition)] = tp.offset
        self.cluster.transactions += bool(self.pending_offsets)
        self.pending, self.pending_offsets = [], []

    def abort_transaction(self, *_: Any) -> None:
        self.pending, self.pending_offsets = [], []

    def flush(self, *_: Any) -> int:
        return 0

    def poll(self, *_: Any) -> int:
        return 0

    def __len__(self) -> int:
        return 0  # nothing waits for delivery

    def list_topics(self, topic: str | None = None, **_: Any) -> Any:
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=dict.fromkeys(range(4)))})


class ClusterConsumer:
    """Reads the cluster's logs from positions. The group consumer (group ``*.acker``) is
    assigned every partition of its subscription at its first poll, from the group's
    committed offsets, and hands out at most ``cluster.max_batch`` messages per call."""

    def __init__(self, cluster: Cluster, conf: dict[str, Any]) -> None:
        self.cluster, self.conf = cluster, conf
        self.group = str(conf.get("group.id", ""))
        self.is_group = self.group.endswith(".acker")  # a task's consumer: once it subscribes
        self.eof = conf.get("enable.partition.eof") in (True, "true")
        self.positions: dict[Key, int] = {}
        self.delivered: dict[Key, int] = {}
        self.eof_sent: set[Key] = set()
        self.paused: set[Key] = set()
        self.topics: list[str] = []
        self.on_assign: Any = None
        self.on_revoke: Any = None
        self.assigned = False
        self.owned: set[int] = set()  # the ledger partitions the group gave this member
        self.fetched = False
        self.rest: list[Message] = []
        cluster.consumers.append(self)

    # -- group
    def subscribe(self, topics: list[str], on_assign: Any = None, on_revoke: Any = None, **_: Any) -> None:
        self.topics, self.on_assign, self.on_revoke = topics, on_assign, on_revoke
        self.is_group = True

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in sorted(self.positions)]

    def grant(self, lps: list[int]) -> None:
        """The group assigns ``lps`` (of every subscribed topic) to this member."""
        self.owned.update(lps)
        tps = [TopicPartition(t, p) for t in self.topics for p in lps]
        self.on_assign(self, tps)
        # A callback that assigned nothing (a task's) is assigned from the committed offsets
        # once it returns, as confluent-kafka does.
        left = [tp for tp in tps if (tp.topic, tp.partition) not in self.positions]
        self.incremental_assign(self.committed(left))

    def revoke(self, lps: list[int]) -> None:
        """The group takes ``lps`` back; the callback commits and unassigns."""
        self.owned.difference_update(lps)
        tps = [TopicPartition(t, p) for t in self.topics for p in lps]
        if self.on_revoke is not None:
            self.on_revoke(self, tps)
        self.incremental_unassign(tps)

    def committed(self, partitions: list[TopicPartition], **_: Any) -> list[TopicPartition]:
        return [
            TopicPartition(tp.topic, tp.partition, self.cluster.offsets.get((self.group, tp.topic, tp.partition), OFFSET_INVALID))
            for tp in partitions
        ]

    def consumer_group_metadata(self) -> Any:
        return SimpleNamespace(group=self.group)

    # -- assignment
    def assign(self, tps: list[TopicPartition]) -> None:
        if not self.is_group:
            self.positions, self.delivered, self.eof_sent = {}, {}, set()
        for tp in tps:
            self._move(tp)

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self._move(tp)

    def unassign(self, *_: Any) -> None:
        if not self.is_group:
            self.positions = {}

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            key = (tp.topic, tp.partition)
            self.positions.pop(key, None)
            self.delivered.pop(key, None)
            # a pause outlives the assignment, as in librdkafka

    def seek(self, tp: TopicPartition) -> None:
        self._move(tp)

    def _move(self, tp: TopicPartition) -> None:
        key = (tp.topic, tp.partition)
        offset = 0 if tp.offset in (OFFSET_BEGINNING, OFFSET_INVALID) or tp.offset < 0 else tp.offset
        self.positions[key] = max(offset, self.cluster.low(*key))  # below the log start: from the start
        self.delivered.pop(key, None)
        self.eof_sent.discard(key)

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused.update((tp.topic, tp.partition) for tp in tps)

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused.difference_update((tp.topic, tp.partition) for tp in tps)

    # -- reading
    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        if self.rest:
            out, self.rest = self.rest[:num_messages], self.rest[num_messages:]
            return out
        if self.is_group and self.on_assign is not None and not self.assigned:
            self.assigned = True
            self.cluster.join(self)
        self.fetched = True
        limit = min(num_messages, self.cluster.max_batch) if self.is_group else num_messages
        out: list[Message] = []
        for key in sorted(self.positions):
            if key in self.paused:
                continue
            log = self.cluster.logs[key]
            end = self.cluster.stable(*key)  # read_committed
            self.positions[key] = max(self.positions[key], self.cluster.low(*key))
            while len(out) < limit and self.positions[key] < end:
                msg = log[self.positions[key]]
                self.positions[key] += 1
                self.delivered[key] = self.positions[key]
                if msg is not None:
                    out.append(msg)
            if self.eof and self.positions[key] >= end and key not in self.eof_sent and len(out) < limit:
                out.append(Message(key[0], key[1], end, None, None, err=KafkaError(KafkaError._PARTITION_EOF)))
                self.eof_sent.add(key)
        return out

    def poll(self, *_: Any) -> Message | None:
        batch = self.consume(self.cluster.max_batch if self.is_group else 1)
        if not batch:
            return None
        self.rest = batch[1:]
        return batch[0]

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.delivered.get((tp.topic, tp.partition), OFFSET_INVALID))
                for tp in tps]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        if cached and not self.fetched:
            return (OFFSET_INVALID, OFFSET_INVALID)
        return (self.cluster.low(tp.topic, tp.partition), self.cluster.high(tp.topic, tp.partition))

    def offsets_for_times(self, tps: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        return tps

    def list_topics(self, *_: Any, **__: Any) -> Any:
        return SimpleNamespace(topics={})

    def commit(self, *_: Any, offsets: list[TopicPartition] | None = None, **__: Any) -> None:
        assert not self.group.endswith(".acker"), "the acker commits offsets in its transactions"
        for tp in offsets or []:
            self.cluster.offsets[(self.group, tp.topic, tp.partition)] = tp.offset

    def close(self) -> None:
        pass
