"""Replay broker: record-level fault tolerance for Kafka + Spark pipelines.

A record travels through the rooms in this order (docs/design.md):

1. ``source`` - ``Source.send`` persists the record to ``ns.persist`` (keyed by srid, with its
   key-hash partition from ``partitioning``) and produces the data record;
2. ``task`` - ``Task`` consumes it, emits children (tracking headers from ``headers``) and
   sends one XOR event per input to ``ns.acks``;
3. ``acker`` - folds persist records and events into the ``ledger`` (pure core: hash table,
   XOR rules, timeouts), tombstones completed records, and on timeout or failure asks
   ``replay`` for a replay or a dead letter, all in one transaction;
4. ``completions``, ``status``, ``dlq`` - read what was decided, from the topics.

Shared vocabulary: ``ids``, ``headers``, ``schemas``, ``partitioning``, ``topics``,
``settings``, ``errors``; Kafka plumbing: ``kafka_io``. ``cli`` is the ``replaybroker``
command; ``dev`` (embedded Kafka, Maven jars, test helpers, demo) is for development only and
no service imports it.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("replaybroker")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
