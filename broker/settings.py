"""Typed, frozen settings. Every service takes the same ``KafkaSettings`` so connection and
security (SASL/SSL) are configured once and dumped to the librdkafka dict in one place."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from broker.errors import ConfigurationError
from broker.kafka_log import client_logging


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

    ``extra`` is passed through to librdkafka as is (e.g. ``{"ssl.key.location": ...}``); it
    wins over the services' tunable defaults, never over what their guarantee depends on
    (``client_config``).
    """

    bootstrap_servers: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    ssl_ca_location: str | None = None
    client_id: str = "replaybroker"
    extra: Mapping[str, Any] = field(default_factory=dict)
    # How long a service's start-up look-ups (the topic layout and configs, the group
    # protocol) ask again a cluster that does not answer - a broker restarting, a leader
    # moving - before the service gives up (``replaybroker SERVICE --wait-for-kafka-ms``).
    start_wait_s: float = 120.0

    def __post_init__(self) -> None:
        if not self.bootstrap_servers:
            raise ConfigurationError("bootstrap_servers is empty")
        if self.start_wait_s < 0:
            raise ConfigurationError(f"start_wait_s must not be negative, not {self.start_wait_s}")

    @classmethod
    def from_env(
        cls, bootstrap_servers: str | None = None, *, env_file: str | Path | None = ".env", **overrides: Any
    ) -> KafkaSettings:
        """The connection settings of a service, in this order of precedence:

        1. ``bootstrap_servers`` and ``overrides`` (a command's flags, such as ``--bootstrap``);
        2. the environment: ``KAFKA_BOOTSTRAP_SERVERS``, ``KAFKA_SECURITY_PROTOCOL``,
           ``KAFKA_SASL_MECHANISM``, ``KAFKA_SASL_USERNAME``, ``KAFKA_SASL_PASSWORD``,
           ``KAFKA_SSL_CA_LOCATION``, ``KAFKA_CLIENT_ID``;
        3. the same variables in ``env_file`` (``.env`` of the current directory, if any);
        4. the defaults of ``KafkaSettings``.
        """
        env = env_settings(env_file)
        servers = bootstrap_servers or env.bootstrap_servers
        if not servers:
            raise ConfigurationError(
                "no Kafka bootstrap servers: give bootstrap_servers, or set KAFKA_BOOTSTRAP_SERVERS "
                "(in the environment or the env_file)"
            )
        password = env.sasl_password.get_secret_value() if env.sasl_password else None
        values: dict[str, Any] = {
            "bootstrap_servers": servers,
            "security_protocol": env.security_protocol,
            "sasl_mechanism": env.sasl_mechanism,
            "sasl_username": env.sasl_username,
            "sasl_password": Secret(password) if password else None,
            "ssl_ca_location": env.ssl_ca_location,
            "client_id": env.client_id,
        }
        values.update(overrides)
        return cls(**values)

    def describe(self) -> dict[str, Any]:
        """The effective connection as librdkafka receives it, secrets masked: what a service
        prints at start with ``-v``."""
        conf = {k: v for k, v in self.client_config().items() if isinstance(v, str | int | float | bool)}
        for key in list(conf):
            if _secret_key(key):
                conf[key] = MASK
        return conf

    def client_config(
        self,
        *,
        defaults: Mapping[str, Any] | None = None,
        user: Mapping[str, Any] | None = None,
        required: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The librdkafka dict for any client. Applied in this order:

        1. the connection (bootstrap, security, client id) and the logging of every client
           (``broker.kafka_log``: librdkafka's logs and errors through Python logging);
        2. ``defaults``: the caller's tunables (linger, fetch sizes and waits, timeouts ...);
        3. the user's overrides: ``extra``, then ``user`` (a service's own mapping, such as
           ``TaskConfig.consumer``) - they win over everything above;
        4. ``required``: what the caller's guarantee depends on (idempotence, read_committed,
           manual commits ...). A user override that contradicts one of these raises
           ``ConfigurationError`` naming the key: it would be overwritten, or break the
           guarantee, without a word.
        """
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
            "client.id": self.client_id,
            "log_level": 4,  # librdkafka: warnings and worse
            **client_logging(),
        }
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password:
            conf["sasl.password"] = self.sasl_password.get()
        if self.ssl_ca_location:
            conf["ssl.ca.location"] = self.ssl_ca_location
        conf.update(defaults or {})
        required = required or {}
        for where, overrides in (("KafkaSettings.extra", self.extra), ("the service's config", user or {})):
            for key, value in overrides.items():
                if key in required and not _same(key, value, required[key]):
                    raise ConfigurationError(
                        f"{where} sets {key}={value!r}, but {key} must be {required[key]!r}: {_why(key)}"
                    )
            conf.update(overrides)
        conf.update(required)
        return conf

    def producer_config(
        self,
        *,
        defaults: Mapping[str, Any] | None = None,
        user: Mapping[str, Any] | None = None,
        required: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Idempotent producer (required unless the caller's ``required`` says otherwise),
        murmur2 partitioner (agrees with the Java client; docs/design.md §7)."""
        return self.client_config(
            defaults={**PRODUCER_DEFAULTS, **(defaults or {})},
            user=user,
            required={**PRODUCER_REQUIRED, **(required or {})},
        )

    def consumer_config(
        self,
        group_id: str | None,
        *,
        defaults: Mapping[str, Any] | None = None,
        user: Mapping[str, Any] | None = None,
        required: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Offsets are committed by the code, never automatically; ``group_id`` is required
        (the group is part of the design: ``ns.acker``, a task's group ...)."""
        base_required: dict[str, Any] = {**CONSUMER_REQUIRED}
        if group_id is not None:
            base_required["group.id"] = group_id
        return self.client_config(
            defaults={**CONSUMER_DEFAULTS, **(defaults or {})},
            user=user,
            required={**base_required, **(required or {})},
        )


MASK = "**********"


def _secret_key(key: str) -> bool:
    return "password" in key or key.endswith((".secret", "secret.key")) or "key.pem" in key


class KafkaEnv(BaseSettings):
    """The ``KAFKA_*`` variables, from the environment and from a ``.env`` file (the
    environment wins). Only ``KafkaSettings.from_env`` reads it."""

    model_config = SettingsConfigDict(env_prefix="KAFKA_", extra="ignore", frozen=True)

    bootstrap_servers: str | None = None
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    client_id: str = "replaybroker"


def env_settings(env_file: str | Path | None = ".env") -> KafkaEnv:
    """``KafkaEnv`` from the environment, then ``env_file`` if it exists."""
    return KafkaEnv(_env_file=env_file)  # type: ignore[call-arg]


# What every producer and consumer of the broker relies on, and the tunable defaults.
PRODUCER_REQUIRED: Mapping[str, Any] = {"enable.idempotence": True, "acks": "all"}
PRODUCER_DEFAULTS: Mapping[str, Any] = {"partitioner": "murmur2_random", "linger.ms": 5, "compression.type": "lz4"}
CONSUMER_REQUIRED: Mapping[str, Any] = {"enable.auto.commit": False}
CONSUMER_DEFAULTS: Mapping[str, Any] = {
    "auto.offset.reset": "earliest",
    "isolation.level": "read_committed",
    "partition.assignment.strategy": "cooperative-sticky",
}

# Why a required setting may not be overridden, for the ConfigurationError.
_WHY = {
    "enable.idempotence": "without it a retried produce can duplicate or reorder records",
    "acks": "a record acknowledged by the leader alone can be lost with it",
    "enable.auto.commit": "offsets are committed after the input is processed, never before",
    "enable.auto.offset.store": "offsets are stored only for input that was processed",
    "isolation.level": "records of aborted transactions must not be read",
    "partition.assignment.strategy": "the assignor decides which partitions one member processes together",
    "transactional.id": "it fences the instance's predecessor",
    "group.id": "the consumer group is part of the design",
    "auto.offset.reset": "a new group must read its input from the start",
    "enable.partition.eof": "reading to the end of a partition depends on it",
    "delivery.report.only.error": "the service's delivery reports depend on it",
    "allow.auto.create.topics": "a topic must never be created with the broker's defaults",
}


def _why(key: str) -> str:
    return _WHY.get(key, "the service depends on it")


def _normal(key: str, value: Any) -> str:
    text = str(value).strip().lower()
    if key == "acks" and text == "-1":
        return "all"
    return text


def _same(key: str, a: Any, b: Any) -> bool:
    """Equal as librdkafka reads them: ``True`` is ``"true"``, ``acks=-1`` is ``all``."""
    return _normal(key, a) == _normal(key, b)
