"""Replay and dead-lettering of failed source records (docs/design.md §6).

Pure decisions: the acker produces the results inside its transaction (its payload cache and
fetcher are in ``broker.acker.payloads``). A replay of srid ``s`` is a fresh attempt ``s'``:

- ``PersistedRecord(s')``: attempt + 1, same origin, same key-hash partition, the failure
  appended to its history; it registers ``s'`` with whichever acker owns ``s' mod P``;
- the data record on ``<topic>.replay`` at the SAME partition index as the original, so per
  key order and locality survive; headers carry ``s'``, a new record id, origin, attempt;
- a tombstone for ``s`` (done by the acker); events that arrive later for ``s`` are orphans.

After ``max_attempts`` attempts the record goes to ``ns.dlq`` instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeAlias

import orjson

from broker import ids
from broker.acker.fate import Outcome, Reason
from broker.headers import (
    AUTO_B,
    AUTO_TIMEOUT_MS,
    DLQ_HEADERS,
    H_ATTEMPTS,
    H_HISTORY,
    H_KEY_HASH_PARTITION,
    H_ORIGIN,
    H_PARTITIONER,
    H_REASON,
    H_SOURCE,
    H_TIMEOUT,
    H_TOPIC,
    LOST_PREFIX,
    QUARANTINE_PREFIX,
    tracking_headers,
)
from broker.schemas import Failure, PersistedRecord
from broker.topics import Namespace, replay_topic

log = logging.getLogger(__name__)

# What an output decides: the failed srid (its replay or dead letter), or the input position
# "topic/partition/offset" of quarantined input. The acker ties a refused record back to it.
Subject: TypeAlias = int | str


@dataclass(frozen=True)
class Outgoing:
    """One record the acker must produce in its transaction."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    subject: Subject | None = None


@dataclass(frozen=True)
class Decision:
    """What to do with one failed srid: a replay (persist + data) or a DLQ record."""

    outcome: Outcome  # its tombstone's: REPLAY or DLQ
    records: tuple[Outgoing, ...]
    new_srid: int | None = None


def decide(
    ns: Namespace,
    record: PersistedRecord,
    reason: Reason,
    now_ms: int,
    ledger_partitions: int,
    replay_partitions: int | None = -1,
    refused: str | None = None,
    rejection: str | None = None,
) -> Decision:
    """Replay ``record`` (attempt + 1) or dead-letter it after ``max_attempts``.

    ``replay_partitions`` is the partition count of ``<topic>.replay`` (None: it does not
    exist; -1: not checked). A record that cannot be replayed at its key-hash partition goes
    to the DLQ at once, with the reason: a missing replay topic must not block the acker.
    So does one whose replay the broker ``refused`` for good (why, e.g. too large). A rejected
    one (``Reason.REJECTED``, ``rejection`` the task's why) is dead-lettered now, whatever
    attempts it has left.
    """
    why = reason.value if not rejection else f"{reason.value}: {rejection}"
    failure = Failure(record.srid, record.attempt, why, now_ms)
    history = (*record.history, failure)
    if record.attempt >= record.max_attempts or reason is Reason.REJECTED:
        return Decision(Outcome.DLQ, (dlq_record(ns, record, history, why),))
    if replay_partitions is None or 0 <= replay_partitions <= record.key_hash_partition or record.key_hash_partition < 0:
        why = f"{reason.value}; cannot replay: {replay_topic(record.topic)} " + (
            "does not exist" if replay_partitions is None
            else f"has {replay_partitions} partitions, the record's is {record.key_hash_partition}"
        )
        return Decision(Outcome.DLQ, (dlq_record(ns, record, history, why),))
    if refused is not None:
        why = f"{reason.value}; cannot replay: {refused}"
        return Decision(Outcome.DLQ, (dlq_record(ns, record, history, why),))
    # The replay lives in its original's ledger partition, like every attempt of an origin.
    srid, record_id = ids.new_id_in(ids.ledger_partition(record.srid, ledger_partitions), ledger_partitions), ids.new_id()
    again = replace(
        record,
        srid=srid,
        attempt=record.attempt + 1,
        root_xor=record_id,
        record_id=record_id,
        created_ms=now_ms,
        history=history,
    )
    # A replay of an auto record is auto too (its timeout_ms, in the value's prefix): the
    # acker that registers it gives its deadline.
    persist = Outgoing(
        ns.persist, ids.ledger_partition(srid, ledger_partitions), ids.encode_id(srid), again.encode(),
        (), record.srid,
    )
    data = Outgoing(
        replay_topic(record.topic),
        record.key_hash_partition,
        record.key,
        record.value,
        (*record.headers, *tracking_headers(srid, record_id, record.origin, again.attempt)),
        record.srid,
    )
    return Decision(Outcome.REPLAY, (persist, data), new_srid=srid)


def _history_json(history: Sequence[Failure]) -> bytes:
    return orjson.dumps(
        [{"srid": f.srid, "attempt": f.attempt, "reason": f.reason, "at_ms": f.at_ms} for f in history]
    )


def dlq_record(
    ns: Namespace, record: PersistedRecord, history: Sequence[Failure], reason: str
) -> Outgoing:
    """Original key, value and headers, plus why, how often, where, and the full history."""
    headers = (
        *record.headers,
        (H_REASON, reason.encode()),
        (H_ATTEMPTS, str(record.attempt).encode()),
        (H_TOPIC, record.topic.encode()),
        (H_KEY_HASH_PARTITION, str(record.key_hash_partition).encode()),
        (H_PARTITIONER, record.partitioner.encode()),
        (H_HISTORY, _history_json(history)),
        (H_ORIGIN, ids.encode_id(record.origin)),
        *(((H_TIMEOUT, AUTO_B),) if record.timeout_ms == AUTO_TIMEOUT_MS else ()),
    )
    return Outgoing(ns.dlq, 0, record.key, record.value, headers, record.srid)


def quarantine_record(
    ns: Namespace, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None, why: str
) -> Outgoing:
    """Bad input (undecodable, misrouted): kept byte for byte in the DLQ with the reason."""
    headers = (
        (H_REASON, f"{QUARANTINE_PREFIX}{why}".encode()),
        (H_SOURCE, f"{topic}/{partition}/{offset}".encode()),
    )
    return Outgoing(ns.dlq, 0, key, value, headers, f"{topic}/{partition}/{offset}")


def lost_payload_record(ns: Namespace, partition: int, offset: int, srid: int, why: str) -> Outgoing:
    """A failed record whose persist record cannot be read: its value is unknown, so the DLQ
    keeps what is known - the srid as key, the reason, where the record was. Like
    quarantined input it has ``rb-source`` and is never redriven."""
    headers = (
        (H_REASON, f"{LOST_PREFIX}{why}".encode()),
        (H_SOURCE, f"{ns.persist}/{partition}/{offset}".encode()),
    )
    return Outgoing(ns.dlq, 0, ids.encode_id(srid), None, headers, srid)


def stripped(rec: Outgoing, level: int, why: str) -> Outgoing:
    """A dead letter the DLQ refused for good (``why``), made smaller: without its value
    (level 1); without key, value, history and the record's own headers (level 2). The
    reason says what was dropped and why; origin, attempts and topic stay."""
    dropped = "value" if level == 1 else "key, value, headers and history"
    headers = []
    for name, value in rec.headers:
        if name == H_REASON:
            value = (value or b"") + f"; {dropped} dropped: {why}".encode()
        elif level > 1 and (name == H_HISTORY or name not in DLQ_HEADERS | {H_SOURCE}):
            continue
        headers.append((name, value))
    return replace(rec, key=rec.key if level == 1 else None, value=None, headers=tuple(headers))
