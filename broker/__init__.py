"""Replay broker: record-level fault tolerance for Kafka + Spark pipelines.

Sources persist every source record to a compacted topic; tasks send XOR events to a
partitioned ack topic; the acker folds them and tombstones completed records, or replays
records whose tree did not complete in time. See README.md and the package rooms:

- ``ids``, ``schemas``, ``partitioning``, ``topics``: the vocabulary shared by everything;
- ``ledger``: the acker's pure core (fold table, timeouts) - no I/O;
- ``acker``, ``replay``: the service loop around the ledger;
- ``client``: ``Source`` and ``Task``;
- ``kafka_local``: an embedded single-node Kafka started from Maven-resolved jars;
- ``cli``: the ``replaybroker`` command.
"""

__version__ = "0.1.0"
