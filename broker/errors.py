"""One root exception, one subclass per area.

Exceptions that concern a record carry it (``record``) so the caller can quarantine it.
``retriable`` drives retry loops: a retriable error may succeed when tried again unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class ReplayBrokerError(Exception):
    """Root of every error raised by the broker."""

    retriable: bool = False


class ConfigurationError(ReplayBrokerError):
    """Settings or topic layout are wrong; the service refuses to start."""


class TopologyError(ConfigurationError):
    """Topics are missing or not co-partitioned."""


class KafkaUnreachable(ReplayBrokerError):
    """No broker of the cluster answered in time."""

    retriable = True


class KafkaClientError(ReplayBrokerError):
    """A call to Kafka failed: the client, the broker or the cluster refused it (a setting
    librdkafka does not know, a fenced or failed transaction, a topic that cannot be created,
    a look-up that timed out). ``error`` is librdkafka's ``KafkaError`` (``code()``,
    ``str()``, ``fatal()``), the ``KafkaException`` is the ``__cause__``. ``retriable``: the
    KafkaError says the same call may succeed when tried again (``retriable()``, or a code
    of a leader or coordinator that moves, ``broker.kafka_errors.Meaning.TRANSIENT``), never for a fatal
    error."""

    def __init__(self, message: str, *, error: Any = None, retriable: bool = False) -> None:
        super().__init__(message)
        self.error = error
        self.retriable = retriable

    @property
    def reason(self) -> str:
        """What Kafka said, without the operation that failed: the KafkaError's text."""
        return str(self.error.str()) if self.error is not None else str(self)


class LocalKafkaError(ReplayBrokerError):
    """The embedded Kafka could not be resolved, formatted, started or stopped."""


class LocalSparkError(ReplayBrokerError):
    """The local standalone Spark cluster could not be started, or did not answer."""


class BackgroundError(ReplayBrokerError):
    """A service run in the background (``run_in_background()`` of ``Acker``, ``Task``,
    ``Bridge``, ``App``) stopped with an exception: raised when its block is left, the
    service's exception as the ``__cause__``."""


class BridgeFenced(ReplayBrokerError):
    """Another bridge took this one's transactional id or group instance id: this one stops
    (writing on would fence the newer one in turn)."""


class DeliveryError(ReplayBrokerError):
    """A record could not be delivered to Kafka.

    ``failures`` lists every record the error is about (e.g. ``broker.source.SendFailure``:
    srid, topic, key, value... of each source record to send again) - all of them, not the
    first: one error may stand for many records that failed together. ``sent``: what was sent
    before the error, when a batch stopped at it (``Source.send_many``: its ``SendResult``s)."""

    retriable = True

    def __init__(
        self, message: str, *, record: Any = None, failures: Sequence[Any] = (), sent: Sequence[Any] = ()
    ) -> None:
        super().__init__(message)
        self.record = record
        self.failures = list(failures)
        self.sent = list(sent)


class DecodeError(ReplayBrokerError):
    """A Kafka message could not be decoded; it goes to quarantine, never kills a service."""

    def __init__(self, message: str, *, record: Any = None) -> None:
        super().__init__(message)
        self.record = record


class BackpressureTimeout(ReplayBrokerError):
    """``Source.send`` waited ``waited_s`` for a slot and none freed: ``pending`` of this
    source's records were still pending (persisted, neither completed nor dead-lettered) with
    ``max_pending`` = ``limit``. Nothing of that call was sent; it may be tried again."""

    retriable = True

    def __init__(self, message: str, *, limit: int, pending: int, waited_s: float) -> None:
        super().__init__(message)
        self.limit = limit
        self.pending = pending
        self.waited_s = waited_s


class SerializationError(ReplayBrokerError):
    """A value could not be serialized or deserialized by its serde (``broker.serde``);
    ``value`` is what was given. Raised in a task's handler, it fails the input."""

    def __init__(self, message: str, *, value: Any = None) -> None:
        super().__init__(message)
        self.value = value
