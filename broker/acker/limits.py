"""How large a record the acker's producer may write: what the topics take, not less.

Every record the acker writes is made of a persist record it read: a replay (the new persist
record and the ``<topic>.replay`` record: the old one's key, value and headers, one failure
more in the history), a dead letter (the value, key and user headers, plus the ``rb-*``
headers: reason, attempts, the history as JSON). So none is larger than the largest persist
record plus those headers. With librdkafka's default ``message.max.bytes`` (1 000 000 B)
below a topic's ``max.message.bytes`` (Kafka's default 1 048 588 B), a dead letter of a
near-max record was refused by the client although ``ns.dlq`` could hold it, and went there
without its value. The producer's limit is set above what persist takes instead: whether a
record fits is the broker's decision, per topic (a refusal is handled by
broker.acker.refusals: a replay becomes a dead letter, a dead letter loses its value).
"""

from __future__ import annotations

KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
"""The broker's ``message.max.bytes`` default: assumed when persist's cannot be read."""
HEADROOM_BYTES = 64 * 1024
"""The dead-letter headers and a replay's history entry on top of a persist record (the
history of a record with many attempts included twice: Avro in the value, JSON in a header)."""


def producer_limit(persist_max_message_bytes: int | None) -> int:
    """The acker's producer ``message.max.bytes`` for a persist topic that takes records
    (batches) up to ``persist_max_message_bytes`` (None: unknown)."""
    return (persist_max_message_bytes or KAFKA_DEFAULT_MAX_MESSAGE_BYTES) + HEADROOM_BYTES
