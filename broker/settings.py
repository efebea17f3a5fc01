"""Typed, frozen settings. Every service takes the same ``KafkaSettings`` so connection and
security (SASL/SSL) are configured once and dumped to the librdkafka dict in one place."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.errors import ConfigurationError


class Secret:
    """A string that never shows in ``repr``/``str`` or logs."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class KafkaSettings:
    """Connection settings shared by every client the broker creates.

    ``extra`` is passed through to librdkafka as is (e.g. ``{"ssl.key.location": ...}``).
    """

    bootstrap_servers: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    ssl_ca_location: str | None = None
    client_id: str = "replaybroker"
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap_servers:
            raise ConfigurationError("bootstrap_servers is empty")

    @classmethod
    def from_env(cls, bootstrap_servers: str | None = None, **overrides: Any) -> KafkaSettings:
        """Read ``KAFKA_BOOTSTRAP_SERVERS``, ``KAFKA_SECURITY_PROTOCOL``, ``KAFKA_SASL_MECHANISM``,
        ``KAFKA_SASL_USERNAME``, ``KAFKA_SASL_PASSWORD``, ``KAFKA_SSL_CA_LOCATION``."""
        env = os.environ
        servers = bootstrap_servers or env.get("KAFKA_BOOTSTRAP_SERVERS")
        if not servers:
            raise ConfigurationError(
                "no Kafka bootstrap servers: pass --bootstrap or set KAFKA_BOOTSTRAP_SERVERS"
            )
        password = env.get("KAFKA_SASL_PASSWORD")
        values: dict[str, Any] = {
            "bootstrap_servers": servers,
            "security_protocol": env.get("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT"),
            "sasl_mechanism": env.get("KAFKA_SASL_MECHANISM"),
            "sasl_username": env.get("KAFKA_SASL_USERNAME"),
            "sasl_password": Secret(password) if password else None,
            "ssl_ca_location": env.get("KAFKA_SSL_CA_LOCATION"),
        }
        values.update(overrides)
        return cls(**values)

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """The librdkafka dict for any client, with ``overrides`` applied last."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
            "client.id": self.client_id,
            "log_level": 4,  # librdkafka: warnings and worse
        }
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password:
            conf["sasl.password"] = self.sasl_password.get()
        if self.ssl_ca_location:
            conf["ssl.ca.location"] = self.ssl_ca_location
        conf.update(self.extra)
        conf.update(overrides)
        return conf

    def producer_config(self, **overrides: Any) -> dict[str, Any]:
        """Idempotent producer, murmur2 partitioner (agrees with the Java client; docs/design.md §7)."""
        base: dict[str, Any] = {
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "compression.type": "lz4",
        }
        base.update(overrides)
        return self.client_config(**base)

    def consumer_config(self, group_id: str | None, **overrides: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "partition.assignment.strategy": "cooperative-sticky",
        }
        if group_id is not None:
            base["group.id"] = group_id
        base.update(overrides)
        return self.client_config(**base)
