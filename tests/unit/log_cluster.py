"""An in-memory Kafka for the acker's model tests: partitioned logs, transactions that append
on commit (so everything in a log is committed), committed group offsets, and consumers that
read the logs from positions - enough for the real ``Acker`` to restore from its changelog,
rewind after an aborted commit, and be replaced by a new instance that takes over from the
committed offsets, on a stepped clock.

The group consumer hands out at most ``Cluster.max_batch`` messages per poll, so what the
world writes faster than that is a backlog, as behind a real consumer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
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
                 headers: list[tuple[str, bytes | None]] | None = None, err: KafkaError | None = None) -> None:
        self._t, self._p, self._o, self._k, self._v, self._h, self._e = topic, partition, offset, key, value, headers, err

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
        return (TIMESTAMP_NOT_AVAILABLE, 0)  # the acker falls back to its clock


@dataclass
class Cluster:
    partitions: int = 2
    max_batch: int = 4
    logs: dict[Key, list[Message]] = field(default_factory=lambda: defaultdict(list))
    starts: dict[Key, int] = field(default_factory=dict)  # log start offsets moved by delete_records
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)  # (group, topic, p) -> offset
    fail_commits: int = 0  # the next commits that fail (abortable), then succeed
    producers: list[ClusterProducer] = field(default_factory=list)
    consumers: list[ClusterConsumer] = field(default_factory=list)

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               headers: list[tuple[str, bytes | None]] | None = None) -> int:
        log = self.logs[(topic, partition)]
        log.append(Message(topic, partition, len(log), key, value, headers))
        return len(log) - 1

    def high(self, topic: str, partition: int) -> int:
        return len(self.logs[(topic, partition)])

    def low(self, topic: str, partition: int) -> int:
        return self.starts.get((topic, partition), 0)

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """DeleteRecords (or retention): the log now starts at ``before``; offsets stay."""
        self.starts[(topic, partition)] = max(self.low(topic, partition), before)

    def records(self, topic: str) -> list[Message]:
        return [m for (t, _), log in sorted(self.logs.items()) if t == topic for m in log]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Make every Kafka client of the acker service one of this cluster's."""
        monkeypatch.setattr(broker.acker.service, "Producer", lambda conf: ClusterProducer(self, conf))
        monkeypatch.setattr(broker.acker.service, "Consumer", lambda conf: ClusterConsumer(self, conf))
        monkeypatch.setattr(broker.acker.service, "check", lambda *_a, **_k: self.partitions)
        monkeypatch.setattr(broker.acker.service, "delete_retention_ms", lambda *_a: 3_600_000)
        monkeypatch.setattr(broker.acker.service, "set_group_timeouts", lambda *_a: None)
        # A restore finishes inside its first slice however loaded the machine (the wall clock
        # is the one thing these tests do not step): the steps a test counts stay the same.
        monkeypatch.setattr(broker.acker.assignment, "RESTORE_SLICE_S", 10.0)
        monkeypatch.setattr(broker.acker.service, "RESTORE_SLICE_S", 10.0)
        monkeypatch.setattr(broker.acker.service, "max_message_bytes", lambda *_a: None)
        monkeypatch.setattr(broker.acker.service, "consumer_group_protocol", lambda *_a: True)
        counts = {"superseded": self.partitions}
        monkeypatch.setattr(
            broker.acker.service, "partition_counts",
            lambda _s, names: {n: counts.get(n.rsplit(".", 1)[-1], 4) for n in names},
        )


class ClusterProducer:
    """A transactional producer: records and offsets land together at commit, or never."""

    def __init__(self, cluster: Cluster, conf: dict[str, Any]) -> None:
        self.cluster, self.conf = cluster, conf
        self.pending: list[tuple[str, int, bytes | None, bytes | None, Any]] = []
        self.pending_offsets: list[TopicPartition] = []
        self.group = ""
        cluster.producers.append(self)

    def init_transactions(self, *_: Any) -> None:
        pass

    def begin_transaction(self) -> None:
        self.pending, self.pending_offsets = [], []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = -1,
                on_delivery: Any = None, callback: Any = None, timestamp: int = 0,
                headers: list[tuple[str, bytes | None]] | None = None) -> None:  # confluent-kafka's order (kafka_io.PRODUCE_ARGS)
        assert partition >= 0, "the acker names every partition"
        self.pending.append((topic, partition, key, value, headers))

    def send_offsets_to_transaction(self, positions: list[TopicPartition], group: Any, *_: Any) -> None:
        self.pending_offsets = list(positions)
        self.group = getattr(group, "group", "")

    def commit_transaction(self, *_: Any) -> None:
        if self.cluster.fail_commits > 0:
            self.cluster.fail_commits -= 1
            raise KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT, "commit failed (injected)"))
        for topic, partition, key, value, headers in self.pending:
            self.cluster.append(topic, partition, key, value, headers)
        for tp in self.pending_offsets:
            self.cluster.offsets[(self.group, tp.topic, tp.partition)] = tp.offset
        self.pending, self.pending_offsets = [], []

    def abort_transaction(self, *_: Any) -> None:
        self.pending, self.pending_offsets = [], []

    def flush(self, *_: Any) -> int:
        return 0

    def poll(self, *_: Any) -> int:
        return 0

    def list_topics(self, topic: str | None = None, **_: Any) -> Any:
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=dict.fromkeys(range(4)))})


class ClusterConsumer:
    """Reads the cluster's logs from positions. The group consumer (group ``*.acker``) is
    assigned every partition of its subscription at its first poll, from the group's
    committed offsets, and hands out at most ``cluster.max_batch`` messages per call."""

    def __init__(self, cluster: Cluster, conf: dict[str, Any]) -> None:
        self.cluster, self.conf = cluster, conf
        self.group = str(conf.get("group.id", ""))
        self.is_group = self.group.endswith(".acker")
        self.eof = conf.get("enable.partition.eof") in (True, "true")
        self.positions: dict[Key, int] = {}
        self.delivered: dict[Key, int] = {}
        self.eof_sent: set[Key] = set()
        self.paused: set[Key] = set()
        self.topics: list[str] = []
        self.on_assign: Any = None
        self.assigned = False
        self.fetched = False
        self.rest: list[Message] = []
        cluster.consumers.append(self)

    # -- group
    def subscribe(self, topics: list[str], on_assign: Any = None, **_: Any) -> None:
        self.topics, self.on_assign = topics, on_assign

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

    incremental_assign = assign

    def unassign(self, *_: Any) -> None:
        if not self.is_group:
            self.positions = {}

    incremental_unassign = unassign

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
            self.on_assign(self, [TopicPartition(t, p) for t in self.topics for p in range(self.cluster.partitions)])
        self.fetched = True
        limit = min(num_messages, self.cluster.max_batch) if self.is_group else num_messages
        out: list[Message] = []
        for key in sorted(self.positions):
            if key in self.paused:
                continue
            log = self.cluster.logs[key]
            self.positions[key] = max(self.positions[key], self.cluster.low(*key))
            while len(out) < limit and self.positions[key] < len(log):
                out.append(log[self.positions[key]])
                self.positions[key] += 1
                self.delivered[key] = self.positions[key]
            if self.eof and self.positions[key] >= len(log) and key not in self.eof_sent and len(out) < limit:
                out.append(Message(key[0], key[1], len(log), None, None, err=KafkaError(KafkaError._PARTITION_EOF)))
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

    def commit(self, *_: Any, **__: Any) -> None:
        raise AssertionError("the acker commits offsets in its transactions")

    def close(self) -> None:
        pass
