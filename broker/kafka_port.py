"""The one door of a service to Kafka: its clients and the admin and metadata look-ups it makes.

A service is handed a ``KafkaPort`` when it is built (default: ``KafkaClients``, the real
clients of its ``KafkaSettings``) and reaches Kafka through nothing else: a test hands it an
in-memory cluster (``tests/unit/log_cluster.py``) instead of replacing module names, and a
call that moves to another module still goes through the port.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Protocol

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from broker import kafka_io, topics
from broker.settings import KafkaSettings
from broker.topics import Namespace

__all__ = ["GroupSetup", "KafkaClients", "KafkaPort", "setup_consumer_group"]


class KafkaPort(Protocol):
    def producer(self, config: Mapping[str, Any]) -> Producer:
        """A producer with librdkafka settings ``config``."""
        ...

    def consumer(self, config: Mapping[str, Any]) -> Consumer:
        """A consumer with librdkafka settings ``config``."""
        ...

    def check(self, ns: Namespace, data_topics: Iterable[str] = ()) -> int:
        """The namespace's ledger partition count P, its topics checked (``topics.check``)."""
        ...

    def partition_counts(self, names: Iterable[str]) -> dict[str, int | None]:
        """Partition count of each topic; None for one that does not exist."""
        ...

    def watermarks(self, topic: str, partitions: list[int], *, committed: bool = True) -> dict[int, tuple[int, int]]:
        """Low and high watermark of each of ``partitions`` of ``topic``, in one batch."""
        ...

    def delete_retention_ms(self, topic: str) -> int | None:
        """``delete.retention.ms`` of ``topic``, or None when it cannot be read."""
        ...

    def max_message_bytes(self, topic: str) -> int | None:
        """``max.message.bytes`` of ``topic``, or None when it cannot be read."""
        ...

    def consumer_group_protocol(self, group: str) -> bool | None:
        """Whether the cluster has the consumer group protocol (None: cannot tell)."""
        ...

    def set_group_timeouts(self, group: str, session_ms: int | None, heartbeat_ms: int | None) -> str | None:
        """Set a consumer-protocol group's session and heartbeat; None when set, else why not."""
        ...


class KafkaClients:
    """The real clients and look-ups of a cluster (``broker.kafka_io``, ``broker.topics``).
    Watermarks come from one admin client for the port's life, made when first needed."""

    __slots__ = ("_admin", "settings")

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._admin: AdminClient | None = None

    def producer(self, config: Mapping[str, Any]) -> Producer:
        return Producer(dict(config))

    def consumer(self, config: Mapping[str, Any]) -> Consumer:
        return Consumer(dict(config))

    def check(self, ns: Namespace, data_topics: Iterable[str] = ()) -> int:
        return topics.check(self.settings, ns, data_topics)

    def partition_counts(self, names: Iterable[str]) -> dict[str, int | None]:
        return kafka_io.partition_counts(self.settings, names)

    def watermarks(self, topic: str, partitions: list[int], *, committed: bool = True) -> dict[int, tuple[int, int]]:
        if self._admin is None:
            self._admin = AdminClient(self.settings.client_config())
        return kafka_io.watermarks(self.settings, topic, partitions, committed=committed, admin=self._admin)

    def delete_retention_ms(self, topic: str) -> int | None:
        return kafka_io.delete_retention_ms(self.settings, topic)

    def max_message_bytes(self, topic: str) -> int | None:
        return kafka_io.max_message_bytes(self.settings, topic)

    def consumer_group_protocol(self, group: str) -> bool | None:
        return kafka_io.consumer_group_protocol(self.settings, group)

    def set_group_timeouts(self, group: str, session_ms: int | None, heartbeat_ms: int | None) -> str | None:
        return kafka_io.set_group_timeouts(self.settings, group, session_ms, heartbeat_ms)


class GroupSetup(NamedTuple):
    """What ``setup_consumer_group`` found: why the member must join with the classic
    protocol instead (None: it keeps the consumer protocol), and why the group's session and
    heartbeat could not be set (None: set, or none asked for)."""

    fall_back: str | None = None
    timeouts_refused: str | None = None


def setup_consumer_group(kafka: KafkaPort, group: str, session_ms: int | None, heartbeat_ms: int | None) -> GroupSetup:
    """Before a consumer-protocol member (a Task's, an acker's) subscribes: on a cluster
    without the consumer protocol it must fall back to the classic one (a 3.x cluster: the
    member would wait there forever without an error; a 4.x one with the protocol off
    refuses its heartbeat, ``kafka_io.consumer_protocol_refused``); with it, the session and
    heartbeat given are set on the group."""
    if kafka.consumer_group_protocol(group) is False:
        return GroupSetup(fall_back="the cluster has no consumer group protocol (Kafka < 4.0)")
    if session_ms is None and heartbeat_ms is None:
        return GroupSetup()
    return GroupSetup(timeouts_refused=kafka.set_group_timeouts(group, session_ms, heartbeat_ms))
