"""``replaybroker trace``: where one source record is, read from the topics.

Given any attempt's srid (or the origin), ``trace`` collects every attempt of that origin and,
for each, what the topics say about it:

- **persisted**: its ``PersistedRecord`` in ``ns.persist`` (partition@offset, created,
  timeout and deadline, attempt, data topic and key-hash partition) - or none, when the
  record was compacted away after its decision;
- **ledger**: the last record of its key in ``ns.ledger``: a pending entry (running XOR,
  flags, deadline) or a tombstone (it left the ledger);
- **decision**: the tombstone in ``ns.persist`` and its ``rb-outcome`` (completed, replay,
  dlq) with its time;
- **replay**: its record on ``<data topic>.replay`` (attempts after the first);
- **dlq**: entries of ``ns.dlq`` for the origin (or keyed by one of its srids).

Cost: persist and ledger are read only in the partitions that own the srids (``srid mod P``),
but a replay's srid is fresh, so finding the replays reads the WHOLE replay topic of the
record's data topic, and the whole ``ns.dlq``. On a large replay topic this takes a while.

Attempts are found by following the links the topics hold: a persist record names its origin
and the srids of the failed attempts before it (``history``); a replay record names its srid,
origin and attempt (its ``rb-t``); a DLQ record names its origin
and every attempt. The data topic (hence which replay topic to read) comes from a persist
record or a DLQ entry; when every record naming it has been compacted away, the replays of
an origin cannot be found.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from confluent_kafka import Message

from broker import ids
from broker.dlq import RECORD, DlqEntry
from broker.errors import ConfigurationError, DecodeError
from broker.headers import AUTO, AUTO_TIMEOUT_MS, Tracking, outcome_of
from broker.kafka_io import kafka_errors, partition_counts, read_partitions, read_since, read_to_end
from broker.ledger.table import DEFERRED, FAILED, REGISTERED, SUPERSEDED, WATCH
from broker.partitioning import kafka_partition, spark_partition
from broker.schemas import LedgerEntry, PersistedRecord
from broker.settings import KafkaSettings
from broker.topics import Namespace, check, replay_topic

FLAG_NAMES = (
    (REGISTERED, "registered"), (FAILED, "failed"), (DEFERRED, "deferred"), (WATCH, "watch"), (SUPERSEDED, "superseded"),
)


def parse_id(text: str) -> int:
    """An srid or origin as signed decimal, or ``0x`` + the hex of its 8 bytes."""
    text = text.strip()
    if text.lower().startswith("0x"):
        return ids.decode_id(bytes.fromhex(text[2:].rjust(16, "0")))
    return int(text)


def id_hex(value: int) -> str:
    return "0x" + ids.encode_id(value).hex()


def _iso(ms: int | None) -> str | None:
    if ms is None or ms <= 0:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


#: The records of a data key read per partition (the newest), by ``find_key``.
KEY_SCAN_LIMIT = 100_000


@kafka_errors("finding a data key's records")
def find_key(settings: KafkaSettings, data_topic: str, key: bytes, *, since_ms: int,
             limit: int = KEY_SCAN_LIMIT) -> dict[str, Any]:
    """Where the records of one data key are: every record of ``key`` in ``data_topic`` and
    its replay topic written since ``since_ms``, newest first, each with its srid, origin and
    attempt (its ``rb-t``) to ``trace``.

    Cost: a key's records are in the partition its key hash names - by Kafka's murmur2 or
    by Spark's HashPartitioning, whichever the topic's partitioner is - so those two
    partitions of each topic are read from ``since_ms`` on (at most their newest ``limit``
    records each), never the whole topic."""
    topics = [data_topic, replay_topic(data_topic)]
    counts = partition_counts(settings, topics)
    if counts[data_topic] is None:
        raise ConfigurationError(f"no topic {data_topic!r}")
    hits: list[dict[str, Any]] = []
    read: dict[str, list[int]] = {}
    scanned, capped = 0, False
    for topic in topics:
        n = counts[topic]
        if n is None:
            continue
        read[topic] = sorted({kafka_partition(key, n), spark_partition(key, n)})
        msgs, cut = read_since(settings, topic, read[topic], since_ms, limit=limit)
        scanned, capped = scanned + len(msgs), capped or cut
        for m in msgs:
            if m.key() != key:
                continue
            tracking = Tracking.from_headers(m.headers())
            hits.append({
                "topic": topic, "partition": m.partition(), "offset": m.offset(), "at_ms": m.timestamp()[1],
                "srid": None if tracking is None else tracking.srid,
                "origin": None if tracking is None else tracking.origin,
                "attempt": None if tracking is None else tracking.attempt,
            })
    hits.sort(key=lambda h: (h["at_ms"], h["topic"], h["offset"]), reverse=True)
    return {"topic": data_topic, "partitions": read, "since_ms": since_ms, "scanned": scanned, "capped": capped,
            "hits": hits}


def flag_names(flags: int) -> list[str]:
    return [name for bit, name in FLAG_NAMES if flags & bit]


class _Reader:
    """Reads each partition of persist / ledger and each whole replay topic at most once."""

    def __init__(self, settings: KafkaSettings, ns: Namespace, partitions: int) -> None:
        self.settings, self.ns, self.P = settings, ns, partitions
        self.persist: dict[int, list[Message]] = {}
        self.ledger: dict[int, list[Message]] = {}
        self.replay: dict[str, list[Message]] = {}

    def _owned(self, cache: dict[int, list[Message]], topic: str, srid: int) -> list[Message]:
        p = ids.ledger_partition(srid, self.P)
        if p not in cache:
            cache[p] = read_partitions(self.settings, topic, [p])
        key = ids.encode_id(srid)
        return [m for m in cache[p] if m.key() == key]

    def persist_of(self, srid: int) -> list[Message]:
        return self._owned(self.persist, self.ns.persist, srid)

    def ledger_of(self, srid: int) -> list[Message]:
        return self._owned(self.ledger, self.ns.ledger, srid)

    def replays(self, data_topic: str) -> list[Message]:
        topic = replay_topic(data_topic)
        if topic not in self.replay:
            n = partition_counts(self.settings, [topic])[topic]
            self.replay[topic] = [] if n is None else read_to_end(self.settings, topic, n)
        return self.replay[topic]


def _persisted(msgs: list[Message]) -> tuple[PersistedRecord | None, Message | None, Message | None]:
    """(the decoded persist record, its message, the decision tombstone) of one srid."""
    record = value_msg = tombstone = None
    for m in msgs:
        if m.value() is None:
            tombstone = m
            continue
        try:
            record, value_msg = PersistedRecord.decode(m.value()), m
        except DecodeError:
            continue
    return record, value_msg, tombstone


@kafka_errors("tracing a record")
def trace(settings: KafkaSettings, namespace: str, ident: int) -> dict[str, Any]:
    """Every attempt of the origin of ``ident`` (an srid or the origin) and what the topics of
    ``namespace`` hold about each. Reads the owning partitions of ``ns.persist`` and
    ``ns.ledger``, and the whole replay topic and ``ns.dlq`` (see the module docstring).
    ``found`` is False when no topic names ``ident``."""
    ns = Namespace(namespace)
    P = check(settings, ns)
    reader = _Reader(settings, ns, P)
    dlq_entries = [DlqEntry.from_message(m) for m in read_to_end(settings, ns.dlq, 1)]

    attempt_of: dict[int, int | None] = {}
    data_topics: set[str] = set()
    origin: int | None = None

    def learn_record(record: PersistedRecord) -> None:
        attempt_of[record.srid] = record.attempt
        data_topics.add(record.topic)
        for f in record.history:
            attempt_of.setdefault(f.srid, f.attempt)

    # 1. the id itself: its persist record names the origin; else a replay or DLQ record may
    record, _, _ = _persisted(reader.persist_of(ident))
    if record is not None:
        origin = record.origin
        learn_record(record)
    for entry in dlq_entries:
        if entry.kind == RECORD and (entry.origin == ident or any(f.srid == ident for f in entry.history)):
            origin = entry.origin if origin is None else origin
    guessed = origin is None
    if origin is None:
        origin = ident  # perhaps the origin itself; its replays name it
    attempt_of.setdefault(origin, 1)

    # 2. follow the links until no new srid or data topic turns up
    dlq_mine: list[DlqEntry] = []
    replay_at: dict[int, Message] = {}
    seen_srids: set[int] = set()
    seen_topics: set[str] = set()
    while True:
        for srid in sorted(set(attempt_of) - seen_srids):
            seen_srids.add(srid)
            rec, _, _ = _persisted(reader.persist_of(srid))
            if rec is not None and rec.origin == origin:
                learn_record(rec)
        keys = {ids.encode_id(s) for s in attempt_of}
        dlq_mine = [e for e in dlq_entries if (e.kind == RECORD and e.origin == origin) or e.key in keys]
        for entry in dlq_mine:
            if entry.kind == RECORD and entry.topic:
                data_topics.add(entry.topic)
                for f in entry.history:
                    attempt_of.setdefault(f.srid, f.attempt)
        for topic in sorted(data_topics - seen_topics):
            seen_topics.add(topic)
            for m in reader.replays(topic):
                tracking = Tracking.from_headers(m.headers())
                if tracking is None or tracking.origin != origin:
                    continue
                replay_at[tracking.srid] = m
                attempt_of.setdefault(tracking.srid, tracking.attempt)
        if set(attempt_of) <= seen_srids and data_topics <= seen_topics:
            break

    if guessed and ident not in replay_at and ident == origin:
        # Nothing said which attempt ``ident`` is (its persist record compacted away, no DLQ
        # entry, no replay naming it): a tombstone alone does not tell.
        attempt_of[ident] = None
    attempts = [_attempt(reader, srid, attempt, replay_at.get(srid)) for srid, attempt in attempt_of.items()]
    attempts = [a for a in attempts if a["known"] or a["srid"] == ident]
    found = any(a["known"] for a in attempts) or bool(dlq_mine)
    attempts.sort(key=lambda a: (a["attempt"] or 0, a["srid"]))
    return {
        "namespace": namespace,
        "query": ident,
        "query_hex": id_hex(ident),
        "found": found,
        "origin": origin if found else None,
        "origin_hex": id_hex(origin) if found else None,
        "ledger_partitions": P,
        "data_topics": sorted(data_topics),
        "attempts": attempts if found else [],
        "dlq": [_dlq_json(e) for e in dlq_mine],
        "read": {
            ns.persist: sorted(reader.persist),
            ns.ledger: sorted(reader.ledger),
            **{t: "all" for t in reader.replay},
            ns.dlq: "all",
        },
    }


def _attempt(reader: _Reader, srid: int, attempt: int | None, replay: Message | None) -> dict[str, Any]:
    record, value_msg, tombstone = _persisted(reader.persist_of(srid))
    persisted = None
    if record is not None and value_msg is not None:
        auto = record.timeout_ms == AUTO_TIMEOUT_MS  # the acker gives the deadline (design §6)
        deadline = None if auto else record.created_ms + record.timeout_ms
        attempt = record.attempt
        persisted = {
            "partition": value_msg.partition(),
            "offset": value_msg.offset(),
            "created_ms": record.created_ms,
            "created": _iso(record.created_ms),
            "timeout_ms": AUTO if auto else record.timeout_ms,
            "deadline_ms": deadline,
            "deadline": "set by the acker (ledger entry)" if deadline is None else _iso(deadline),
            "max_attempts": record.max_attempts,
            "topic": record.topic,
            "key_hash_partition": record.key_hash_partition,
            "partitioner": record.partitioner,
        }
    decision = None
    if tombstone is not None:
        at = tombstone.timestamp()[1]
        decision = {
            "outcome": outcome_of(tombstone.headers()).decode("utf-8", "replace"),
            "partition": tombstone.partition(),
            "offset": tombstone.offset(),
            "at_ms": at,
            "at": _iso(at),
        }
    ledger_msgs = reader.ledger_of(srid)
    ledger: dict[str, Any] = {"state": "none"}
    if ledger_msgs:
        last = ledger_msgs[-1]
        where = {"partition": last.partition(), "offset": last.offset()}
        if last.value() is None:
            ledger = {"state": "gone", **where}
        else:
            try:
                entry = LedgerEntry.decode(last.value())
                ledger = {
                    # a watch is no pending record: a replayed attempt kept for its window (§6)
                    "state": "watch" if entry.flags & WATCH else "pending",
                    **where,
                    "value_hex": id_hex(entry.value),
                    "flags": entry.flags,
                    "flag_names": flag_names(entry.flags),
                    "persist_offset": entry.persist_offset,
                    "deadline_ms": entry.deadline_ms,
                    "deadline": _iso(entry.deadline_ms),
                }
            except DecodeError as exc:
                ledger = {"state": "undecodable", **where, "error": str(exc)}
    replay_json = None
    if replay is not None:
        replay_json = {"topic": replay.topic(), "partition": replay.partition(), "offset": replay.offset(),
                       "at_ms": replay.timestamp()[1], "at": _iso(replay.timestamp()[1])}
    return {
        "srid": srid,
        "srid_hex": id_hex(srid),
        "attempt": attempt,
        "ledger_partition": ids.ledger_partition(srid, reader.P),
        "known": bool(record or tombstone or ledger_msgs or replay),
        "persisted": persisted,
        "decision": decision,
        "ledger": ledger,
        "replay": replay_json,
    }


def _dlq_json(entry: DlqEntry) -> dict[str, Any]:
    return {
        "partition": entry.partition,
        "offset": entry.offset,
        "kind": entry.kind,
        "reason": entry.reason,
        "attempts": entry.attempts,
        "srids": [f.srid for f in entry.history],
        "at_ms": entry.timestamp_ms,
        "at": _iso(entry.timestamp_ms),
    }


# --------------------------------------------------------------------------- one screen


def _where(d: dict[str, Any]) -> str:
    return f"{d['partition']}@{d['offset']}"


def render(result: dict[str, Any]) -> str:
    """The trace as one screen of text."""
    ns = result["namespace"]
    if not result["found"]:
        return f"no record {result['query']} ({result['query_hex']}) in namespace {ns}"
    lines = [
        f"origin {result['origin']} ({result['origin_hex']})  namespace {ns}  "
        f"{len(result['attempts'])} attempt(s)  P={result['ledger_partitions']}",
    ]
    for a in result["attempts"]:
        mark = "  <- queried" if a["srid"] == result["query"] else ""
        number = "?" if a["attempt"] is None else a["attempt"]
        lines.append(f"attempt {number}  srid {a['srid']} ({a['srid_hex']})  ledger partition "
                     f"{a['ledger_partition']}{mark}")
        p = a["persisted"]
        if p is None:
            lines.append("  persisted:  not persisted / compacted away")
        else:
            lines.append(
                f"  persisted:  {ns}.persist {_where(p)}  created {p['created']}  timeout {p['timeout_ms']}"
                f"{'' if p['timeout_ms'] == AUTO else ' ms'}  "
                f"deadline {p['deadline']}"
            )
            lines.append(
                f"              topic {p['topic']} key-hash partition {p['key_hash_partition']} "
                f"({p['partitioner']})  max attempts {p['max_attempts']}"
            )
        led = a["ledger"]
        if led["state"] in ("pending", "watch"):
            lines.append(
                f"  ledger:     {led['state']}  value {led['value_hex']}  flags {','.join(led['flag_names']) or '-'}"
                f"  deadline {led['deadline']}  ({ns}.ledger {_where(led)})"
            )
        elif led["state"] == "gone":
            lines.append(f"  ledger:     gone (tombstone {ns}.ledger {_where(led)})")
        elif led["state"] == "undecodable":
            lines.append(f"  ledger:     undecodable entry {ns}.ledger {_where(led)}: {led['error']}")
        else:
            lines.append("  ledger:     no entry (left within one commit, or compacted away)")
        d = a["decision"]
        if d is None:
            lines.append("  decision:   none yet")
        else:
            lines.append(f"  decision:   {d['outcome']} at {d['at']}  ({ns}.persist {_where(d)})")
        r = a["replay"]
        if r is not None:
            lines.append(f"  replay:     {r['topic']} {_where(r)} at {r['at']}")
        elif (a["attempt"] or 0) > 1:
            lines.append("  replay:     no replay record found")
    for e in result["dlq"]:
        lines.append(f"dlq {ns}.dlq {_where(e)} at {e['at']}  {e['kind']}  reason: {e['reason']}"
                     + (f"  attempts {e['attempts']}" if e["attempts"] is not None else ""))
    if not result["dlq"]:
        lines.append("dlq: no entry")
    return "\n".join(lines)
