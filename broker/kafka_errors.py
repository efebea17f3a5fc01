"""What each Kafka error means to us: the one table every service consults.

librdkafka's ``retriable()`` flags only the errors of its own retry machinery, and ``fatal()``
only an unusable client; whether an error means "ask again", "the group moved on", "a newer
producer holds our transactional id" or "this record is refused for good" depends on where
it was met. Each code is listed once, with every meaning it has; a caller asks
``means(err, Meaning.X)`` (or ``Meaning.X | Meaning.Y``: any of them). No other module lists
error codes (``tests/unit/test_kafka_errors_table.py`` scans for sets of them).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from enum import Flag, auto

from confluent_kafka import KafkaError, KafkaException

from broker.errors import KafkaClientError

__all__ = ["TABLE", "Meaning", "codes", "is_fatal", "kafka_error", "kafka_errors_in", "means"]


class Meaning(Flag):
    NONE = 0
    TRANSIENT = auto()
    """A look-up (watermarks, offsets, metadata, configs) that may succeed when tried again
    unchanged: a leader or coordinator moving, a broker away for a while."""
    COORDINATOR_AWAY = auto()
    """A group coordinator loading, moving or out of reach: an offset commit is not taken
    yet, and goes with the next one."""
    LOST_MEMBERSHIP = auto()
    """The group moved on: this member no longer owns what it read (not its fault)."""
    PRODUCER_FENCED = auto()
    """A newer producer holds our transactional id (or the coordinator bumped its epoch):
    this producer must stop writing."""
    INSTANCE_FENCED = auto()
    """A newer member holds our group instance id."""
    INSTANCE_IN_USE = auto()
    """The group refused this static member: its instance id is still another member's."""
    CUT_OFF = auto()
    """The requests did not get through in time: the coordinators or the cluster were out of
    reach (a transactional producer cut off is replaced)."""
    REFUSED_RECORD = auto()
    """A produce request refused for what (some of) its records are: alone, a record is
    refused for good; in a batch, it may be another record's fault."""
    TOO_LARGE = auto()
    """The broker refuses the whole produce batch for one record too large: sent alone, the
    others pass."""
    UNKNOWN_TOPIC = auto()
    """The topic or partition is not (or not yet) in the metadata: every record of it would
    be refused, and its partition count is looked up again."""
    TOPIC_REFUSED = auto()
    """Every record of the topic is refused (not authorized, an invalid topic)."""
    UNDELIVERABLE = auto()
    """No retry of a delivery helps within seconds (each waits out
    ``topic.metadata.propagation.max.ms``)."""
    STALE_METADATA = auto()
    """This client's metadata is out of date (a partition missing, a leader moved): asking
    for the topic's metadata again lets the next try succeed."""
    NO_GROUP_CONFIGS = auto()
    """The answer of a broker without group configs (Kafka < 4.0: 3.9 says INVALID_REQUEST,
    "Unknown resource type 32") to a DescribeConfigs of a GROUP resource."""
    ALL_BROKERS_DOWN = auto()
    """No broker of the bootstrap list answers."""
    CREDENTIALS = auto()
    """The cluster refuses our credentials or TLS: trying again does not help."""


M = Meaning
TABLE: Mapping[int, Meaning] = {
    KafkaError.NOT_LEADER_FOR_PARTITION: M.TRANSIENT | M.STALE_METADATA,
    KafkaError.LEADER_NOT_AVAILABLE: M.TRANSIENT | M.STALE_METADATA,
    KafkaError.FENCED_LEADER_EPOCH: M.TRANSIENT,
    KafkaError.UNKNOWN_LEADER_EPOCH: M.TRANSIENT,
    KafkaError.REPLICA_NOT_AVAILABLE: M.TRANSIENT,
    KafkaError.BROKER_NOT_AVAILABLE: M.TRANSIENT,
    KafkaError.OFFSET_NOT_AVAILABLE: M.TRANSIENT,
    # A look-up right after a leader change, before the metadata propagated, may see it.
    KafkaError.UNKNOWN_TOPIC_OR_PART: M.TRANSIENT | M.UNKNOWN_TOPIC | M.UNDELIVERABLE,
    KafkaError.KAFKA_STORAGE_ERROR: M.TRANSIENT,
    KafkaError.NOT_COORDINATOR: M.TRANSIENT | M.COORDINATOR_AWAY,
    KafkaError.COORDINATOR_NOT_AVAILABLE: M.TRANSIENT | M.COORDINATOR_AWAY,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS: M.TRANSIENT | M.COORDINATOR_AWAY,
    KafkaError.REQUEST_TIMED_OUT: M.TRANSIENT | M.COORDINATOR_AWAY,
    KafkaError.NETWORK_EXCEPTION: M.TRANSIENT,
    KafkaError.THROTTLING_QUOTA_EXCEEDED: M.TRANSIENT,
    KafkaError._TIMED_OUT: M.TRANSIENT | M.COORDINATOR_AWAY | M.CUT_OFF,
    KafkaError._TIMED_OUT_QUEUE: M.TRANSIENT | M.CUT_OFF,
    KafkaError._MSG_TIMED_OUT: M.CUT_OFF,
    KafkaError._TRANSPORT: M.TRANSIENT | M.COORDINATOR_AWAY | M.CUT_OFF,
    KafkaError._ALL_BROKERS_DOWN: M.TRANSIENT | M.COORDINATOR_AWAY | M.CUT_OFF | M.ALL_BROKERS_DOWN,
    KafkaError._WAIT_COORD: M.TRANSIENT | M.COORDINATOR_AWAY,
    KafkaError._UNKNOWN_PARTITION: M.TRANSIENT | M.UNKNOWN_TOPIC | M.UNDELIVERABLE | M.STALE_METADATA,
    # A request on a broker the client dropped (a node that crashed left the metadata): the
    # next try goes to the partition's new leader.
    KafkaError._DESTROY_BROKER: M.TRANSIENT,
    KafkaError._UNKNOWN_TOPIC: M.UNKNOWN_TOPIC | M.UNDELIVERABLE,
    KafkaError.TOPIC_AUTHORIZATION_FAILED: M.TOPIC_REFUSED | M.UNDELIVERABLE,
    KafkaError.TOPIC_EXCEPTION: M.TOPIC_REFUSED,
    KafkaError.MSG_SIZE_TOO_LARGE: M.REFUSED_RECORD | M.TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE: M.REFUSED_RECORD | M.TOO_LARGE,
    KafkaError.INVALID_RECORD: M.REFUSED_RECORD | M.UNDELIVERABLE,
    KafkaError.INVALID_MSG_SIZE: M.REFUSED_RECORD,
    KafkaError.INVALID_TIMESTAMP: M.REFUSED_RECORD,
    KafkaError.POLICY_VIOLATION: M.REFUSED_RECORD,
    KafkaError.UNKNOWN_MEMBER_ID: M.LOST_MEMBERSHIP,
    KafkaError.ILLEGAL_GENERATION: M.LOST_MEMBERSHIP,
    KafkaError.REBALANCE_IN_PROGRESS: M.LOST_MEMBERSHIP,
    KafkaError._ASSIGNMENT_LOST: M.LOST_MEMBERSHIP,
    # What a commit of a consumer that is not (or no longer) a group member raises.
    KafkaError._STATE: M.LOST_MEMBERSHIP,
    KafkaError.FENCED_INSTANCE_ID: M.LOST_MEMBERSHIP | M.INSTANCE_FENCED | M.INSTANCE_IN_USE,
    KafkaError.UNRELEASED_INSTANCE_ID: M.INSTANCE_IN_USE,
    KafkaError._FENCED: M.PRODUCER_FENCED,
    KafkaError.PRODUCER_FENCED: M.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH: M.PRODUCER_FENCED,
    KafkaError.INVALID_REQUEST: M.NO_GROUP_CONFIGS,
    KafkaError.UNSUPPORTED_VERSION: M.NO_GROUP_CONFIGS,
    KafkaError._UNSUPPORTED_FEATURE: M.NO_GROUP_CONFIGS,
    KafkaError._AUTHENTICATION: M.CREDENTIALS,
    KafkaError._SSL: M.CREDENTIALS,
}
del M


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The KafkaError a KafkaException (or the KafkaClientError wrapping it) carries, or None."""
    if isinstance(exc, KafkaClientError):
        return exc.error if isinstance(exc.error, KafkaError) else None
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return err if isinstance(err, KafkaError) else None


def kafka_errors_in(exc: BaseException) -> Iterator[KafkaError]:
    """The KafkaErrors in the chain of ``exc`` (its ``__cause__``\\ s), outermost first."""
    seen: BaseException | None = exc
    while seen is not None:
        err = kafka_error(seen)
        if err is not None:
            yield err
        seen = seen.__cause__


def means(err: KafkaError | BaseException | None, meaning: Meaning) -> bool:
    """Whether ``err`` (a KafkaError, or the one an exception carries) has any of ``meaning``."""
    if isinstance(err, BaseException):
        err = kafka_error(err)
    return err is not None and err.code() in codes(meaning)


@functools.cache
def codes(meaning: Meaning) -> frozenset[int]:
    """The codes with any of ``meaning``."""
    return frozenset(code for code, has in TABLE.items() if has & meaning)


def is_fatal(exc: BaseException) -> bool:
    """The client that raised ``exc`` is unusable (librdkafka's fatal error)."""
    err = kafka_error(exc)
    return err is not None and bool(err.fatal())
