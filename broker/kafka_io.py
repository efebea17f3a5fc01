"""Kafka plumbing every service shares: producing with bounded back-off, reading a topic to
its end, the admin look-ups (partition counts, topic configs, waiting for new topics), and
retrying look-ups that fail transiently.

A full producer queue (``BufferError``) means Kafka is slower than we produce, or away. We
wait for it with growing pauses that serve delivery callbacks, log once when it lasts, and
give up with a retriable ``DeliveryError`` after ``max_block_s``: a service never spins
forever on a broker that does not come back.

Look-ups with a round trip (watermarks, committed offsets, metadata) fail transiently while
a partition's leader moves or a coordinator loads: ``NOT_LEADER_FOR_PARTITION`` from
``get_watermark_offsets`` under load killed an acker in CI. ``retrying`` tries them again
with growing pauses for a bounded time, then raises. librdkafka's ``retriable()`` is False
for these errors (it only flags errors of its own retry machinery): ``broker.kafka_errors``
lists them (``Meaning.TRANSIENT``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    OffsetSpec,
    ResourceType,
)

from broker.errors import DeliveryError, KafkaClientError, TopologyError
from broker.kafka_errors import Meaning, kafka_error, means
from broker.settings import KafkaSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_FOR_S = 30.0
"""How long ``retrying`` keeps trying; in an assignment callback this stays well inside
``max.poll.interval.ms``."""
_FIRST_RETRY_S = 0.05
_MAX_RETRY_S = 2.0

MAX_BLOCK_S = 60.0
"""How long ``produce`` waits for room in a full producer queue before it gives up."""
_FIRST_PAUSE_S = 0.005
_MAX_PAUSE_S = 0.25
_WARN_AFTER_S = 1.0


PRODUCE_ARGS = ("topic", "value", "key", "partition", "on_delivery", "callback", "timestamp", "headers")
"""``Producer.produce``'s parameters in confluent-kafka's positional order (``callback`` is an
old name of ``on_delivery``, ``timestamp`` 0 is now). The per-record produce calls pass them
by position: keywords cost each call a noticeable share of a record's produce
(docs/benchmarks.md). ``tests/unit/test_kafka_io.py`` checks the order on the installed
library; the unit tests' fake producers take the same order."""


def produce(producer: Producer, topic: str, *, max_block_s: float = MAX_BLOCK_S, **kwargs: Any) -> None:
    """``producer.produce`` that waits, bounded, while the local queue is full."""
    try:
        producer.produce(topic, **kwargs)
        return
    except BufferError:
        pass
    started = time.monotonic()
    pause = _FIRST_PAUSE_S
    warned = False
    while True:
        producer.poll(pause)  # serves delivery callbacks: this is what frees the queue
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            waited = time.monotonic() - started
            if waited >= max_block_s:
                raise DeliveryError(
                    f"producer queue full for {waited:.0f}s while producing to {topic}: "
                    "Kafka is not taking records"
                ) from None
            if not warned and waited >= _WARN_AFTER_S:
                log.warning("producer queue full for %.1fs (topic %s); waiting", waited, topic)
                warned = True
            pause = min(pause * 2, _MAX_PAUSE_S)


def is_transient(exc: KafkaException) -> bool:
    err = kafka_error(exc)
    if err is None or err.fatal():
        return False
    return bool(err.retriable() or means(err, Meaning.TRANSIENT))


def client_error(exc: KafkaException, what: str) -> KafkaClientError:
    """``exc`` as the public API raises it (``raise client_error(exc, ...) from exc``):
    ``what`` failed, with Kafka's reason, its KafkaError and whether it is retriable."""
    err = kafka_error(exc)
    reason = err.str() if err is not None else str(exc)
    return KafkaClientError(f"{what}: {reason}", error=err, retriable=is_transient(exc))


@contextlib.contextmanager
def kafka_errors(what: str) -> Iterator[None]:
    """Around a whole operation of the public API (a service's run, a topic admin call),
    never per record: a ``KafkaException`` leaves it as a ``KafkaClientError`` (its cause
    kept), so a caller catches ``ReplayBrokerError`` alone. Also a decorator."""
    try:
        yield
    except KafkaException as exc:
        raise client_error(exc, what) from exc


def retrying(
    call: Callable[[], T],
    what: str,
    *,
    retry_for_s: float = RETRY_FOR_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``call()``, tried again with growing pauses while it fails transiently, for at most
    ``retry_for_s``; any other error, or the last transient one, is raised."""
    started = clock()
    pause = _FIRST_RETRY_S
    attempt = 1
    while True:
        try:
            return call()
        except KafkaException as exc:
            if not is_transient(exc) or clock() - started + pause > retry_for_s:
                raise
            log.warning("%s failed transiently (%s), attempt %d; retrying in %.2fs", what, exc, attempt, pause)
        sleep(pause)
        pause = min(pause * 2, _MAX_RETRY_S)
        attempt += 1


def watermarks(
    settings: KafkaSettings, topic: str, partitions: Iterable[int], *, committed: bool = True,
    admin: AdminClient | None = None,
) -> dict[int, tuple[int, int]]:
    """Low and high watermark of each of ``partitions`` of ``topic`` (``committed``: the
    high one is the last stable offset), in two requests whatever their number - one per
    partition costs a round trip each, seconds at 1 000 partitions. Transient errors (a
    leader not elected yet, right after a topic is created) are waited out (``retrying``)."""
    admin = admin or AdminClient(settings.client_config())
    level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    tps = [TopicPartition(topic, p) for p in partitions]

    def ask(spec: OffsetSpec) -> dict[int, int]:
        futures = admin.list_offsets({tp: spec for tp in tps}, isolation_level=level, request_timeout=30)
        try:
            return {tp.partition: int(f.result(timeout=40).offset) for tp, f in futures.items()}
        except concurrent.futures.TimeoutError:  # no broker answered at all
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"list_offsets of {topic}")) from None

    if not tps:
        return {}
    low = retrying(lambda: ask(OffsetSpec.earliest()), f"the low watermarks of {topic}")
    high = retrying(lambda: ask(OffsetSpec.latest()), f"the high watermarks of {topic}")
    return {p: (low[p], high[p]) for p in low}


def read_to_end(
    settings: KafkaSettings, topic: str, partitions: int, timeout_s: float = 120.0, *, settled: bool = False
) -> list[Message]:
    """Every committed message of ``topic`` (partitions ``0 .. partitions-1``), in offset
    order per partition; ``read_partitions`` reads a chosen few."""
    return read_partitions(settings, topic, range(partitions), timeout_s, settled=settled)


def read_partitions(
    settings: KafkaSettings, topic: str, partitions: Iterable[int], timeout_s: float = 120.0, *, settled: bool = False
) -> list[Message]:
    """Every committed message of the given partitions of ``topic``, in offset order per
    partition.

    Reads to the last stable offset: a transaction committed just before may still be
    invisible there (its markers are written after the commit returns), and a partition whose
    stable offset is still its low watermark is not read at all. ``settled`` reads on until
    each partition's end (its high watermark) as the read began - every transaction written
    before it decided - for a caller that knows none is left open (else it waits
    ``timeout_s``): the ground truth of a test.

    Starts at each partition's low watermark, not OFFSET_BEGINNING (which costs an extra
    offset lookup, ~0.5 s), with short fetch waits and polls: a ``consume`` waits its whole
    timeout unless its batch fills."""
    config = settings.consumer_config(
        None, defaults={"group.id": "replaybroker.read", "enable.partition.eof": True, "fetch.wait.max.ms": 10}
    )
    consumer = Consumer(config)
    out: list[Message] = []
    try:
        starts = []
        ends: dict[int, int] = {}
        # The last stable offsets, or with ``settled`` the high watermarks.
        for p, (low, high) in watermarks(settings, topic, partitions, committed=not settled).items():
            if high > low:
                starts.append(TopicPartition(topic, p, low))
                ends[p] = high if settled else 0
        consumer.assign(starts)
        eof: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(eof) < len(starts):
            if time.monotonic() > deadline:
                raise TopologyError(f"could not read {topic} to its end")
            for msg in consumer.consume(1_000, 0.05):
                err = msg.error()
                if err is None:
                    out.append(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    if (msg.offset() or 0) >= ends[msg.partition() or 0]:
                        eof.add(msg.partition() or 0)
                else:
                    raise KafkaException(err)
    finally:
        consumer.close()
    return out


def read_since(
    settings: KafkaSettings, topic: str, partitions: Iterable[int], since_ms: int, *, limit: int,
    timeout_s: float = 60.0,
) -> tuple[list[Message], bool]:
    """The committed messages of the given partitions of ``topic`` written at or after
    ``since_ms`` (their timestamps, found by ``offsets_for_times``), at most the newest
    ``limit`` of each partition -> (the messages in offset order per partition, whether a
    partition held more than ``limit``)."""
    config = settings.consumer_config(
        None, defaults={"group.id": "replaybroker.read", "enable.partition.eof": True, "fetch.wait.max.ms": 10}
    )
    consumer = Consumer(config)
    out: list[Message] = []
    capped = False
    try:
        marks = watermarks(settings, topic, partitions)
        found = consumer.offsets_for_times([TopicPartition(topic, p, since_ms) for p in marks], timeout=timeout_s)
        starts = []
        for tp in found:
            low, high = marks[tp.partition]
            start = high if tp.offset < 0 else max(tp.offset, low)  # < 0: nothing written since
            if high - start > limit:
                start, capped = high - limit, True
            if high > start:
                starts.append(TopicPartition(topic, tp.partition, start))
        consumer.assign(starts)
        eof: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(eof) < len(starts):
            if time.monotonic() > deadline:
                raise TopologyError(f"could not read {topic} to its end")
            for msg in consumer.consume(1_000, 0.05):
                err = msg.error()
                if err is None:
                    out.append(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    eof.add(msg.partition() or 0)
                else:
                    raise KafkaException(err)
    finally:
        consumer.close()
    return out, capped


def partition_counts(
    settings: KafkaSettings, topics: Iterable[str], *, admin: AdminClient | None = None
) -> dict[str, int | None]:
    """Partition count of each topic; None for a topic that does not exist. A cluster that
    does not answer is asked again for ``settings.start_wait_s``. ``admin``: the client to ask
    (default: a new one of ``settings``), as for every admin look-up here."""
    admin = admin or AdminClient(settings.client_config())
    metadata = retrying(lambda: admin.list_topics(timeout=30), "listing topics", retry_for_s=settings.start_wait_s)
    counts: dict[str, int | None] = {}
    for name in topics:
        meta = metadata.topics.get(name)
        counts[name] = None if meta is None or meta.error is not None else len(meta.partitions)
    return counts


ADMIN_REQUEST_TIMEOUT_S = 10.0
"""How long one admin request waits for its answer; ``configs_of`` asks again."""


def configs_of(
    settings: KafkaSettings, resources: list[ConfigResource], what: str, *, admin: AdminClient | None = None
) -> list[dict[str, ConfigEntry]]:
    """The configs of each of ``resources``, in one request; a cluster that does not answer
    (or answers with a transient error) is asked again for ``settings.start_wait_s``."""
    admin = admin or AdminClient(settings.client_config())  # referenced until the answer is in

    def describe() -> list[dict[str, ConfigEntry]]:
        futures = admin.describe_configs(resources, request_timeout=ADMIN_REQUEST_TIMEOUT_S)
        return [dict(futures[r].result(timeout=ADMIN_REQUEST_TIMEOUT_S + 5)) for r in resources]

    return retrying(describe, what, retry_for_s=settings.start_wait_s)


def _topic_config(settings: KafkaSettings, topic: str, name: str, admin: AdminClient | None) -> int | None:
    """The integer config ``name`` of ``topic``, or None when it cannot be read."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    try:
        return int(configs_of(settings, [resource], f"reading {name} of {topic}", admin=admin)[0][name].value)
    except (KafkaException, KeyError, ValueError, TypeError) as exc:
        log.warning("cannot read %s of %s (%s)", name, topic, exc)
        return None


def delete_retention_ms(settings: KafkaSettings, topic: str, *, admin: AdminClient | None = None) -> int | None:
    """``delete.retention.ms`` of ``topic`` (how long compaction keeps its tombstones), or
    None when it cannot be read - the caller must then assume the least."""
    return _topic_config(settings, topic, "delete.retention.ms", admin)


def max_message_bytes(settings: KafkaSettings, topic: str, *, admin: AdminClient | None = None) -> int | None:
    """``max.message.bytes`` of ``topic`` (the largest record batch it takes; the broker's
    ``message.max.bytes`` unless the topic overrides it), or None when it cannot be read."""
    return _topic_config(settings, topic, "max.message.bytes", admin)


def wait_visible(admin: AdminClient, topics: Mapping[str, int], timeout_s: float = 30.0) -> None:
    """Creation returns before every broker's metadata shows the topic; wait until it does."""
    deadline = time.monotonic() + timeout_s
    while True:
        metadata = admin.list_topics(timeout=10).topics
        missing = [
            t for t, n in topics.items()
            if t not in metadata or metadata[t].error is not None or len(metadata[t].partitions) != n
        ]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TopologyError(f"topics not visible after creation: {', '.join(missing)}")
        time.sleep(0.1)


def consumer_group_protocol(settings: KafkaSettings, group: str, *, admin: AdminClient | None = None) -> bool | None:
    """Whether the cluster runs Kafka 4.0's consumer group protocol (KIP-848 GA). Told by a
    read of ``group``'s configs: the GROUP config resource came with it (a 3.x broker refuses
    the read as malformed, and librdkafka needs a ConsumerGroupHeartbeat version that only
    4.0 has - on 3.9 a consumer-protocol member waits forever, with no error). None when it
    cannot be told (no answer, not authorized)."""
    resource = ConfigResource(ResourceType.GROUP, group)
    try:
        configs_of(settings, [resource], f"reading the configs of group {group}", admin=admin)
        return True
    except KafkaException as exc:
        if means(exc, Meaning.NO_GROUP_CONFIGS):
            return False
        log.warning("cannot tell whether the cluster has the consumer group protocol (%s)", exc)
        return None


# A cluster of Kafka >= 4.0 with the consumer protocol switched off
# (group.coordinator.rebalance.protocols=classic) refuses its heartbeat: librdkafka reports
# "Fatal error: Broker: API version not supported: ConsumerGroupHeartbeat fatal error: ...".
_UNSUPPORTED = KafkaError(KafkaError.UNSUPPORTED_VERSION).str()

CONSUMER_PROTOCOL: Mapping[str, Any] = {"group.protocol": "consumer", "group.remote.assignor": "range"}
"""A group consumer of the consumer protocol with the broker's range assignor: it gives
partition i of every subscribed topic of one partition count to one member (co-partitioned
topics stay together), and a rebalance moves only the partitions that change owner."""
GROUP_SIDE = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")
"""Client settings librdkafka refuses with the consumer protocol: the session and heartbeat
are the group's configs (``set_group_timeouts``), the assignor is the broker's."""


def consumer_protocol_refused(err: KafkaError) -> bool:
    """Whether the group refused the consumer protocol itself."""
    return err.code() == KafkaError.UNSUPPORTED_VERSION or protocol_refused_text(err.str())


def protocol_refused_text(text: str) -> bool:
    """Whether a librdkafka error or log line is the refusal of the consumer protocol."""
    return "ConsumerGroupHeartbeat" in text and _UNSUPPORTED in text


def set_group_timeouts(settings: KafkaSettings, group: str, session_ms: int | None, heartbeat_ms: int | None) -> str | None:
    """Set a consumer-protocol group's session timeout and heartbeat interval (KIP-848: they
    are the group's, not the clients'); None leaves one as it is. Returns None when set, else
    why not - the broker's bounds (group.consumer.min/max.session.timeout.ms) or a missing
    ALTER_CONFIGS right; the group then keeps the broker's defaults."""
    values = {"consumer.session.timeout.ms": session_ms, "consumer.heartbeat.interval.ms": heartbeat_ms}
    entries = [
        ConfigEntry(name, str(value), incremental_operation=AlterConfigOpType.SET)
        for name, value in values.items() if value is not None
    ]
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    admin = AdminClient(settings.client_config())  # referenced until the answer is in

    def alter() -> None:
        future = admin.incremental_alter_configs([resource], request_timeout=ADMIN_REQUEST_TIMEOUT_S)[resource]
        future.result(timeout=ADMIN_REQUEST_TIMEOUT_S + 5)

    try:
        retrying(alter, f"setting the timeouts of group {group}", retry_for_s=settings.start_wait_s)
        return None
    except KafkaException as exc:
        err = kafka_error(exc)
        return str(err.str()) if err is not None else str(exc.args[0] if exc.args else exc)

