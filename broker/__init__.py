"""Replay broker: record-level fault tolerance for Kafka + Spark pipelines.

A record travels through the rooms in this order (docs/design.md):

1. ``source`` - ``Source.send`` persists the record to ``ns.persist`` (keyed by srid, with its
   key-hash partition from ``partitioning``) and produces the data record (``bridge`` does
   so for the records of an existing topic);
2. ``task`` - ``Task`` consumes it, emits children (tracking headers from ``headers``) and
   sends one XOR event per input to ``ns.acks``;
3. ``acker`` - folds persist records and events into the ``ledger`` (pure core: hash table,
   XOR rules, timeouts), tombstones completed records, and on timeout or failure asks
   ``replay`` for a replay or a dead letter, all in one transaction;
4. ``completions``, ``status``, ``dlq`` - read what was decided, from the topics.

Shared vocabulary: ``ids``, ``headers``, ``schemas``, ``partitioning``, ``topics``,
``settings``, ``errors``, ``serde`` (values as bytes, JSON, Avro); Kafka plumbing: ``kafka_io``,
``delivery``, ``backpressure``, ``markers``; ``background``: a service's loop on a thread
(development); ``metrics``, ``acls``, ``trace``. ``cli`` is the ``replaybroker``
command; ``dev`` (embedded Kafka, Maven jars, test helpers, demo) is for development only and
no service imports it; ``bench`` measures the design's figures.

The names a pipeline is written with are exported here (``__all__``) and imported on first
use, so ``import broker`` stays light (a Spark executor importing ``broker.ids`` loads no
Kafka client)::

    from broker import App, JsonSerde, TaskContext, TaskRecord

``App`` (``app``) declares a pipeline and runs its roles; ``Source``, ``Task`` and ``Acker``
are the lower-level API it builds on. Every error they raise is a ``ReplayBrokerError``
(``errors``); what Kafka itself refuses is a ``KafkaClientError`` with the ``KafkaError``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.acker.config import AckerConfig
    from broker.acker.service import Acker
    from broker.app import App, Topic
    from broker.bridge import Bridge, BridgeConfig
    from broker.delivery import SendFailure
    from broker.errors import (
        BackgroundError,
        BackpressureTimeout,
        BridgeFenced,
        ConfigurationError,
        DecodeError,
        DeliveryError,
        KafkaClientError,
        KafkaUnreachable,
        ReplayBrokerError,
        SerializationError,
        TopologyError,
    )
    from broker.retry import RetryPolicy
    from broker.serde import AvroSerde, BytesSerde, JsonSerde, Serde
    from broker.settings import KafkaSettings
    from broker.source import SendResult, Source, SourceConfig
    from broker.task import Task, TaskConfig, TaskContext, TaskRecord
    from broker.topics import Namespace

_EXPORTS = {
    "Acker": "broker.acker.service",
    "AckerConfig": "broker.acker.config",
    "App": "broker.app",
    "AvroSerde": "broker.serde",
    "BackgroundError": "broker.errors",
    "BackpressureTimeout": "broker.errors",
    "Bridge": "broker.bridge",
    "BridgeConfig": "broker.bridge",
    "BridgeFenced": "broker.errors",
    "BytesSerde": "broker.serde",
    "ConfigurationError": "broker.errors",
    "DecodeError": "broker.errors",
    "DeliveryError": "broker.errors",
    "JsonSerde": "broker.serde",
    "KafkaClientError": "broker.errors",
    "KafkaSettings": "broker.settings",
    "KafkaUnreachable": "broker.errors",
    "Namespace": "broker.topics",
    "ReplayBrokerError": "broker.errors",
    "RetryPolicy": "broker.retry",
    "SendFailure": "broker.delivery",
    "SendResult": "broker.source",
    "Serde": "broker.serde",
    "SerializationError": "broker.errors",
    "Source": "broker.source",
    "SourceConfig": "broker.source",
    "Task": "broker.task",
    "TaskConfig": "broker.task",
    "TaskContext": "broker.task",
    "TaskRecord": "broker.task",
    "Topic": "broker.app",
    "TopologyError": "broker.errors",
}

__all__ = [
    "Acker",
    "AckerConfig",
    "App",
    "AvroSerde",
    "BackgroundError",
    "BackpressureTimeout",
    "Bridge",
    "BridgeConfig",
    "BridgeFenced",
    "BytesSerde",
    "ConfigurationError",
    "DecodeError",
    "DeliveryError",
    "JsonSerde",
    "KafkaClientError",
    "KafkaSettings",
    "KafkaUnreachable",
    "Namespace",
    "ReplayBrokerError",
    "RetryPolicy",
    "SendFailure",
    "SendResult",
    "Serde",
    "SerializationError",
    "Source",
    "SourceConfig",
    "Task",
    "TaskConfig",
    "TaskContext",
    "TaskRecord",
    "Topic",
    "TopologyError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = value = _version()
        return value
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'broker' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


def _version() -> str:
    """The installed distribution's version, looked up when first asked for:
    ``importlib.metadata`` costs every command ~0.3 s of imports on a small machine."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("replaybroker")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+unknown"
