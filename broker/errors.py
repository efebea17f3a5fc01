"""One root exception, one subclass per area.

Exceptions that concern a record carry it (``record``) so the caller can quarantine it.
``retriable`` drives retry loops: a retriable error may succeed when tried again unchanged.
"""

from __future__ import annotations

from typing import Any


class ReplayBrokerError(Exception):
    """Root of every error raised by the broker."""

    retriable: bool = False


class ConfigurationError(ReplayBrokerError):
    """Settings or topic layout are wrong; the service refuses to start."""


class TopologyError(ConfigurationError):
    """Topics are missing or not co-partitioned."""


class LocalKafkaError(ReplayBrokerError):
    """The embedded Kafka could not be resolved, formatted, started or stopped."""


class DeliveryError(ReplayBrokerError):
    """A record could not be delivered to Kafka."""

    retriable = True

    def __init__(self, message: str, *, record: Any = None) -> None:
        super().__init__(message)
        self.record = record


class DecodeError(ReplayBrokerError):
    """A Kafka message could not be decoded; it goes to quarantine, never kills a service."""

    def __init__(self, message: str, *, record: Any = None) -> None:
        super().__init__(message)
        self.record = record
