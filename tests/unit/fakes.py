"""In-memory stand-ins for the Kafka clients, scripted batch by batch, and the Kafka port
over them (``FakeKafka``): what the unit tests of the acker and the task hand in as ``kafka=``."""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

from confluent_kafka import (
    OFFSET_INVALID,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    TopicPartition,
)


@dataclass
class Produced:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes | None]


class FakeProducer:
    """Transactions in memory: what was committed is in ``committed``."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.pending: list[Produced] = []
        self.committed: list[Produced] = []
        self.transactions = 0
        self.offsets: list[dict[tuple[str, int], int]] = []  # what each transaction committed

    def init_transactions(self, *_: Any) -> None:
        pass

    def begin_transaction(self) -> None:
        self.pending = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = -1,
                on_delivery: Any = None, callback: Any = None, timestamp: int = 0,
                headers: list[tuple[str, bytes | None]] | None = None) -> None:  # confluent-kafka's order (kafka_io.PRODUCE_ARGS)
        self.pending.append(Produced(topic, partition, key, value, dict(headers or ())))

    def send_offsets_to_transaction(self, positions: list[TopicPartition], *_: Any) -> None:
        self.offsets.append({(tp.topic, tp.partition): tp.offset for tp in positions})

    def commit_transaction(self, *_: Any) -> None:
        self.committed += self.pending
        self.pending = []
        self.transactions += 1

    def abort_transaction(self, *_: Any) -> None:
        self.pending = []

    def flush(self, *_: Any) -> int:
        return 0

    def list_topics(self, topic: str | None = None, **_: Any) -> Any:
        """Every topic exists, with 4 partitions (as ``partition_counts`` says below)."""
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=dict.fromkeys(range(4)))})

    def poll(self, *_: Any) -> int:
        return 0


class FakeMessage:
    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None) -> None:
        self._t, self._p, self._o, self._k, self._v = topic, partition, offset, key, value

    def error(self) -> None:
        return None

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

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (TIMESTAMP_NOT_AVAILABLE, 0)  # the acker falls back to its clock


class FakeConsumer:
    """Hands out scripted batches; assigns every partition on the first consume after
    ``subscribe`` (once); an empty changelog to restore from.

    Every scripted message is "in the log" from the start: the high watermark of a partition
    is past its last scripted message, delivered or still queued, and the position is past
    the last one delivered - so a consumer with batches still queued is behind, as a real
    one is with a backlog. Like librdkafka, the cached watermarks are unknown until the
    first fetch (here: the first consume) and the position until a message is delivered."""

    partitions = 2
    last: FakeConsumer | None = None
    by_group: ClassVar[dict[str, FakeConsumer]] = {}

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.batches: deque[list[FakeMessage]] = deque()
        self.topics: list[str] = []
        self.on_assign: Any = None
        self.assigned = False
        self.rest: list[FakeMessage] | None = None
        self.delivered: dict[tuple[str, int], int] = {}  # next offset after the last delivered
        self.fetched = False
        self.failing: dict[str, int] = {}  # call -> how many more times it fails transiently
        self.paused: set[tuple[str, int]] = set()
        self.metadata_asked = 0
        FakeConsumer.by_group[conf.get("group.id", "")] = self
        if conf.get("group.id", "").endswith(".acker"):
            FakeConsumer.last = self

    def subscribe(self, topics: list[str], on_assign: Any = None, **_: Any) -> None:
        self.topics, self.on_assign = topics, on_assign

    def consume(self, *_: Any) -> list[FakeMessage]:
        if self.rest is not None:  # the rest of the batch poll() took the first message of
            rest, self.rest = self.rest, None
            return rest
        if self.on_assign is not None and not self.assigned:
            self.assigned = True
            self.on_assign(self, [TopicPartition(t, p) for t in self.topics for p in range(self.partitions)])
        self.fetched = True
        if self.paused:  # the acker restores its partitions first (in a step or two here)
            return []
        batch = self.batches.popleft() if self.batches else []
        for m in batch:
            self.delivered[(m.topic(), m.partition())] = m.offset() + 1
        return batch

    def poll(self, *_: Any) -> FakeMessage | None:
        batch = self.consume()
        if not batch:
            return None
        self.rest = batch[1:]
        return batch[0]

    def _fail_once(self, call: str) -> None:
        if self.failing.get(call):
            self.failing[call] -= 1
            raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, f"Failed to {call}"))

    def committed(self, partitions: list[TopicPartition], **_: Any) -> list[TopicPartition]:
        self._fail_once("get committed offsets")
        return [TopicPartition(tp.topic, tp.partition, OFFSET_INVALID) for tp in partitions]

    def log_end(self, topic: str, partition: int) -> int:
        queued = [m for batch in self.batches for m in batch] + list(self.rest or ())
        return max(
            [self.delivered.get((topic, partition), 0)]
            + [m.offset() + 1 for m in queued if (m.topic(), m.partition()) == (topic, partition)]
        )

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> None:
        self.metadata_asked += 1  # a metadata refresh after a stale-leader error

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        if cached and not self.fetched:
            return (OFFSET_INVALID, OFFSET_INVALID)
        if not cached:
            self._fail_once("get watermark offsets")
        return (0, self.log_end(tp.topic, tp.partition))

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(tp.topic, tp.partition, self.delivered.get((tp.topic, tp.partition), OFFSET_INVALID))
            for tp in partitions
        ]

    def seek(self, *_: Any) -> None:
        pass

    def consumer_group_metadata(self) -> object:
        return object()

    def assign(self, *_: Any) -> None:
        pass

    def unassign(self, *_: Any) -> None:
        pass

    incremental_assign = assign
    incremental_unassign = unassign

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused.update((tp.topic, tp.partition) for tp in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused.difference_update((tp.topic, tp.partition) for tp in partitions)

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        return partitions

    def close(self) -> None:
        pass


@dataclass
class FakeKafka:
    """The acker's Kafka port over the scripted fakes: clients of ``producers`` and
    ``consumers`` (classes or factories taking the librdkafka settings), P =
    ``FakeConsumer.partitions``, every other topic (each ``<topic>.replay``) ``counts``' or
    ``default_count`` partitions (None: it does not exist)."""

    producers: Any = None  # default FakeProducer
    consumers: Any = None  # default FakeConsumer
    counts: dict[str, int | None] = dataclasses.field(default_factory=dict)
    default_count: int | None = 4
    partitions: int | None = None  # check(): default FakeConsumer.partitions
    persist_max_bytes: int | None = None
    protocol: bool | None = True  # consumer_group_protocol()
    protocol_asked: list[str] = dataclasses.field(default_factory=list)
    timeouts_set: list[tuple[str, int | None, int | None]] = dataclasses.field(default_factory=list)

    def producer(self, config: Any) -> Any:
        return (self.producers or FakeProducer)(config)

    def consumer(self, config: Any) -> Any:
        return (self.consumers or FakeConsumer)(config)

    def check(self, ns: Any, data_topics: Any = ()) -> int:
        return FakeConsumer.partitions if self.partitions is None else self.partitions

    def partition_counts(self, names: Any) -> dict[str, int | None]:
        return {n: self.counts.get(n, self.default_count) for n in names}

    def watermarks(self, topic: str, partitions: list[int], *, committed: bool = True) -> dict[int, tuple[int, int]]:
        return {}  # none in a batch: the restorer is asked one by one, from the fake

    def delete_retention_ms(self, topic: str) -> int | None:
        return 3_600_000

    def max_message_bytes(self, topic: str) -> int | None:
        return self.persist_max_bytes

    def consumer_group_protocol(self, group: str) -> bool | None:
        self.protocol_asked.append(group)
        return self.protocol

    def set_group_timeouts(self, group: str, session_ms: int | None, heartbeat_ms: int | None) -> str | None:
        self.timeouts_set.append((group, session_ms, heartbeat_ms))
        return None


WHOLE_RESTORE: dict[str, Any] = {"assign_restore_ms": 10_000, "restore_slice_ms": 10_000, "restore_slice_max_ms": 10_000}
"""``AckerConfig`` fields under which a restore finishes inside its first slice however loaded
the machine (the wall clock is the one thing these tests do not step): the steps a test
counts stay the same."""


def reset_fakes() -> None:
    """Forget the consumers of the previous test (``FakeConsumer.last``, ``by_group``)."""
    FakeConsumer.last = None
    FakeConsumer.by_group.clear()
