"""The dead-letter queue ``ns.dlq``: list what is in it, redrive dead-lettered records.

``ns.dlq`` holds two kinds of entries (broker.acker.replay writes both):

- a dead-lettered **record**: a source record that failed ``max_attempts`` times. Original
  key, value and user headers, then ``rb-reason``, ``rb-attempts``, ``rb-topic``,
  ``rb-key-hash-partition``, ``rb-partitioner``, ``rb-history`` (JSON: every attempt's srid,
  reason and time) and ``rb-origin``;
- **quarantined input**: the bytes of a message the acker could not use (undecodable,
  misrouted), with ``rb-reason`` ``quarantine: ...`` and ``rb-source`` ``topic/partition/offset``.
  It is not a source record, so it is never redriven. A failed record whose persist record
  could not be read (``rb-reason`` ``payload lost: ...``, key = its srid, no value) has the
  same shape and is listed with them: without its value there is nothing to redrive.

Redrive re-injects a dead-lettered record as a FRESH source record with the SAME origin
(sinks deduplicate by origin): new srid, attempt 1, through the replay path - to the replay
topic of its data topic, beside the replays and not into live traffic - at the original
key-hash partition, history carried over plus a note. A rate (records per second) paces it,
so ten thousand dead letters do not land on a pipeline at once. What was
redriven is remembered in the compacted topic ``ns.dlq.redriven``, keyed by the srid of the
dead-lettered attempt (unique per DLQ entry; a redriven record that dead-letters again is a
new entry with a new srid, and can be redriven again). One redrive run:

1. creates a transactional ``Source`` whose id is fixed per namespace: ``init_transactions``
   fences any other redrive of the namespace still running and waits out its transaction;
2. reads the markers (read_committed) and the DLQ to their ends, and selects the entries;
3. per chunk, ONE transaction holds the persist records, the data records and the markers,
   so a crash either injects a chunk and remembers it, or does neither. Running it twice
   therefore never injects twice, and a run that was cut short continues where it stopped;
4. records the run in ``ns.dlq.redriven`` too (key ``run:...``): who, when, the filter, how
   many (``replaybroker dlq runs`` lists them).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import getpass
import socket
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import (
    Message,
)
from confluent_kafka.admin import AdminClient, NewTopic

from broker import ids
from broker.errors import ConfigurationError, TopologyError
from broker.headers import (
    AUTO_B,
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
)
from broker.kafka_io import kafka_errors, partition_counts, read_to_end
from broker.schemas import Failure
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.topics import COMPACTED, Namespace, check

RECORD, QUARANTINE, UNKNOWN = "record", "quarantine", "unknown"
REDRIVE_NOTE = "redrive"  # reason prefix of the note a redrive appends to the history
REDRIVE_CHUNK = 1000  # entries per redrive transaction
RUN_PREFIX = b"run:"  # keys of the runs recorded in ns.dlq.redriven (the markers' are srids)


def redriven_topic(ns: Namespace) -> str:
    """Compacted markers of what was redriven: key = srid of the dead-lettered attempt."""
    return f"{ns.dlq}.redriven"


# --------------------------------------------------------------------------- entries


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "replace")


def preview(data: bytes | None, limit: int = 80) -> str | None:
    """Text for a human: UTF-8 text when it is text, else ``0x`` + hex; cut at ``limit``."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
        if any((c < " " and c not in "\t\n\r") or c == "\x7f" for c in text):
            raise UnicodeDecodeError("utf-8", data, 0, len(data), "control characters: binary")
    except UnicodeDecodeError:
        text = "0x" + data.hex()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _int(value: bytes | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _history(raw: bytes | None) -> tuple[Failure, ...] | None:
    """None when absent or malformed."""
    if raw is None:
        return None
    try:
        items = orjson.loads(raw)
        return tuple(
            Failure(int(f["srid"]), int(f["attempt"]), str(f["reason"]), int(f["at_ms"])) for f in items
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class DlqEntry:
    """One message of ``ns.dlq``, decoded. ``kind`` is ``record``, ``quarantine`` or
    ``unknown`` (neither: headers missing or malformed; never redriven)."""

    partition: int
    offset: int
    timestamp_ms: int
    kind: str
    reason: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()  # the user's own headers
    # dead-lettered records
    origin: int | None = None
    attempts: int | None = None
    topic: str | None = None
    key_hash_partition: int | None = None
    partitioner: str | None = None
    history: tuple[Failure, ...] = ()
    auto_timeout: bool = False  # its timeout was adaptive (timeout_ms="auto"): a redrive keeps that
    # quarantined input: where it was read
    source: str | None = None

    @property
    def where(self) -> str:
        return f"{self.partition}@{self.offset}"

    @property
    def marker_key(self) -> bytes:
        """Names this entry in ``ns.dlq.redriven``: the srid of the dead-lettered attempt."""
        if self.history:
            return ids.encode_id(self.history[-1].srid)
        return f"dlq:{self.where}".encode()

    @classmethod
    def from_message(cls, msg: Message) -> DlqEntry:
        headers = list(msg.headers() or ())
        # The acker appends its headers after the user's: peel them off the end, so a user
        # header that happens to share a name is kept as the user's.
        rb: dict[str, bytes | None] = {}
        while headers and headers[-1][0] in DLQ_HEADERS and headers[-1][0] not in rb:
            name, value = headers.pop()
            rb[name] = value
        if H_SOURCE in dict(headers) and not rb:
            # quarantined input: rb-reason, rb-source and nothing of the user's
            found = dict(headers)
            rb = {H_REASON: found.get(H_REASON)}
            headers = []
            source = _text(found.get(H_SOURCE))
        else:
            source = None
        common: dict[str, Any] = {
            "partition": msg.partition() or 0,
            "offset": msg.offset() or 0,
            "timestamp_ms": msg.timestamp()[1],
            "reason": _text(rb.get(H_REASON)) or "",
            "key": msg.key(),
            "value": msg.value(),
            "headers": tuple(headers),
        }
        if source is not None:
            return cls(kind=QUARANTINE, source=source, **common)
        origin_raw = rb.get(H_ORIGIN)
        history = _history(rb.get(H_HISTORY))
        try:
            origin = ids.decode_id(origin_raw or b"")
        except ValueError:
            origin = None
        topic = _text(rb.get(H_TOPIC))
        partition = _int(rb.get(H_KEY_HASH_PARTITION))
        if origin is None or not topic or partition is None or history is None:
            return cls(kind=UNKNOWN, **common)
        return cls(
            kind=RECORD,
            origin=origin,
            attempts=_int(rb.get(H_ATTEMPTS)),
            topic=topic,
            key_hash_partition=partition,
            partitioner=_text(rb.get(H_PARTITIONER)) or "kafka",
            history=history,
            auto_timeout=rb.get(H_TIMEOUT) == AUTO_B,
            **common,
        )


def _iso(ms: int | None) -> str | None:
    if ms is None or ms <= 0:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Marker:
    """What a redrive remembers about one DLQ entry."""

    origin: int | None
    new_srid: int
    dlq: str
    at_ms: int

    def encode(self) -> bytes:
        return orjson.dumps(
            {"origin": self.origin, "new_srid": self.new_srid, "dlq": self.dlq, "at_ms": self.at_ms}
        )

    @classmethod
    def decode(cls, data: bytes) -> Marker | None:
        try:
            d = orjson.loads(data)
            return cls(d.get("origin"), int(d["new_srid"]), str(d["dlq"]), int(d["at_ms"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None


def entry_json(entry: DlqEntry, marker: Marker | None = None, value_limit: int = 200) -> dict[str, Any]:
    out: dict[str, Any] = {
        "dlq_partition": entry.partition,
        "dlq_offset": entry.offset,
        "timestamp_ms": entry.timestamp_ms,
        "timestamp": _iso(entry.timestamp_ms),
        "kind": entry.kind,
        "reason": entry.reason,
        "key": preview(entry.key, value_limit),
        "value": preview(entry.value, value_limit),
        "value_bytes": None if entry.value is None else len(entry.value),
    }
    if entry.kind == QUARANTINE and entry.source:
        parts = entry.source.rsplit("/", 2)  # topic/partition/offset (topic names have no "/")
        out["source"] = (
            {"topic": parts[0], "partition": _int(parts[1].encode()), "offset": _int(parts[2].encode())}
            if len(parts) == 3
            else {"raw": entry.source}
        )
    if entry.kind == RECORD:
        at = [f.at_ms for f in entry.history]
        out.update(
            {
                "origin": entry.origin,
                "attempts": entry.attempts,
                "topic": entry.topic,
                "key_hash_partition": entry.key_hash_partition,
                "partitioner": entry.partitioner,
                "timeout": "auto" if entry.auto_timeout else None,
                "history": [
                    {"srid": f.srid, "attempt": f.attempt, "reason": f.reason, "at_ms": f.at_ms, "at": _iso(f.at_ms)}
                    for f in entry.history
                ],
                "first_failure": _iso(min(at)) if at else None,
                "last_failure": _iso(max(at)) if at else None,
                "headers": {k: preview(v, value_limit) for k, v in entry.headers},
                "redriven": None
                if marker is None
                else {"new_srid": marker.new_srid, "at_ms": marker.at_ms, "at": _iso(marker.at_ms)},
            }
        )
    return out


def format_entry(entry: DlqEntry, marker: Marker | None = None) -> str:
    d = entry_json(entry, marker, value_limit=80)
    lines = [f"{entry.where}  {d['timestamp']}  {entry.kind}  reason: {entry.reason}"]
    lines.append(f"    key: {d['key']!r}  value ({d['value_bytes']} bytes): {d['value']!r}")
    if entry.kind == QUARANTINE:
        lines.append(f"    quarantined from {entry.source}")
    elif entry.kind == RECORD:
        lines.append(
            f"    origin {entry.origin}  attempts {entry.attempts}  topic {entry.topic}  "
            f"key-hash partition {entry.key_hash_partition} ({entry.partitioner})"
        )
        for f in d["history"]:
            lines.append(f"    #{f['attempt']} srid {f['srid']} at {f['at']}: {f['reason']}")
        if marker is not None:
            lines.append(f"    redriven at {_iso(marker.at_ms)} as srid {marker.new_srid}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- reading


def _partitions(settings: KafkaSettings, topic: str) -> int | None:
    return partition_counts(settings, [topic])[topic]


@kafka_errors("reading the DLQ")
def read_entries(settings: KafkaSettings, ns: Namespace, limit: int | None = None) -> list[DlqEntry]:
    """Every committed DLQ entry (oldest first per partition, partitions in order)."""
    n = _partitions(settings, ns.dlq)
    if n is None:
        raise TopologyError(f"topic {ns.dlq} does not exist")
    entries = [DlqEntry.from_message(m) for m in read_to_end(settings, ns.dlq, n)]
    entries.sort(key=lambda e: (e.partition, e.offset))
    return entries if limit is None else entries[:limit]


@kafka_errors("reading the redrive markers")
def read_markers(settings: KafkaSettings, ns: Namespace) -> dict[bytes, Marker]:
    """marker key -> Marker, from ``ns.dlq.redriven`` (empty when the topic does not exist)."""
    topic = redriven_topic(ns)
    n = _partitions(settings, topic)
    markers: dict[bytes, Marker] = {}
    if n is None:
        return markers
    for msg in read_to_end(settings, topic, n):
        key, value = msg.key(), msg.value()
        if key is None or key.startswith(RUN_PREFIX):
            continue
        marker = Marker.decode(value) if value is not None else None
        if marker is None:
            markers.pop(key, None)
        else:
            markers[key] = marker
    return markers


@kafka_errors("listing the DLQ")
def list_entries(
    settings: KafkaSettings, namespace: str, limit: int | None = None
) -> list[tuple[DlqEntry, Marker | None]]:
    ns = Namespace(namespace)
    markers = read_markers(settings, ns)
    return [(e, markers.get(e.marker_key) if e.kind == RECORD else None) for e in read_entries(settings, ns, limit)]


# --------------------------------------------------------------------------- redrive


@dataclass(frozen=True)
class RedriveFilter:
    """Which DLQ records a redrive takes: all of these that are given (None: any)."""

    reason_prefix: str | None = None
    origins: Sequence[int] | None = None
    topics: Sequence[str] | None = None  # the record's data topic
    keys: Sequence[bytes] | None = None
    since_ms: int | None = None  # dead-lettered at or after (the DLQ record's timestamp)
    until_ms: int | None = None  # ... and before

    def matches(self, entry: DlqEntry) -> bool:
        return (
            (self.reason_prefix is None or entry.reason.startswith(self.reason_prefix))
            and (not self.origins or entry.origin in self.origins)
            and (not self.topics or entry.topic in self.topics)
            and (not self.keys or entry.key in self.keys)
            and (self.since_ms is None or entry.timestamp_ms >= self.since_ms)
            and (self.until_ms is None or entry.timestamp_ms < self.until_ms)
        )

    def as_json(self) -> dict[str, Any]:
        """What was asked for, as a run record shows it (only what was given)."""
        given = {
            "reason_prefix": self.reason_prefix,
            "origins": list(self.origins) if self.origins else None,
            "topics": list(self.topics) if self.topics else None,
            "keys": [preview(k) for k in self.keys] if self.keys else None,
            "since": _iso(self.since_ms),
            "until": _iso(self.until_ms),
        }
        return {k: v for k, v in given.items() if v is not None}


@dataclass
class RedrivePlan:
    selected: list[DlqEntry] = field(default_factory=list)
    quarantined: int = 0  # quarantined input or unreadable entries: never redriven
    already_redriven: int = 0
    not_matching: int = 0  # excluded by the filter


def plan_redrive(
    entries: Iterable[DlqEntry],
    markers: dict[bytes, Marker],
    *,
    reason_prefix: str | None = None,
    origins: Sequence[int] | None = None,
    where: RedriveFilter | None = None,
) -> RedrivePlan:
    """Pure selection: records (never quarantined input) not redriven yet that match
    ``where`` (``reason_prefix`` and ``origins`` are its first two fields)."""
    if where is None:
        where = RedriveFilter(reason_prefix, origins)
    plan = RedrivePlan()
    seen: set[bytes] = set()
    for entry in entries:
        if entry.kind != RECORD:
            plan.quarantined += 1
        elif entry.marker_key in markers or entry.marker_key in seen:
            plan.already_redriven += 1
        elif not where.matches(entry):
            plan.not_matching += 1
        else:
            seen.add(entry.marker_key)
            plan.selected.append(entry)
    return plan


@dataclass
class Redriven:
    entry: DlqEntry
    srid: int
    key_hash_partition: int


@dataclass
class RedriveResult:
    plan: RedrivePlan
    redriven: list[Redriven] = field(default_factory=list)
    dry_run: bool = False
    seconds: float = 0.0
    run: dict[str, Any] | None = None  # the run's record in ns.dlq.redriven (None: a dry run)

    def summary(self) -> dict[str, Any]:
        return {
            "redriven": len(self.redriven) if not self.dry_run else 0,
            "seconds": round(self.seconds, 3),
            "run": self.run,
            "selected": len(self.plan.selected),
            "skipped_quarantined": self.plan.quarantined,
            "skipped_already_redriven": self.plan.already_redriven,
            "skipped_not_matching": self.plan.not_matching,
            "dry_run": self.dry_run,
            "records": [
                {
                    "origin": r.entry.origin,
                    "dlq": r.entry.where,
                    "topic": r.entry.topic,
                    "key_hash_partition": r.key_hash_partition,
                    "new_srid": r.srid,
                }
                for r in self.redriven
            ]
            if not self.dry_run
            else [{"origin": e.origin, "dlq": e.where, "topic": e.topic} for e in self.plan.selected],
        }


@kafka_errors("creating the redrive marker topic")
def ensure_redriven_topic(settings: KafkaSettings, ns: Namespace, timeout_s: float = 30.0) -> str:
    topic = redriven_topic(ns)
    if _partitions(settings, topic) is not None:
        return topic
    admin = AdminClient(settings.client_config())
    future = admin.create_topics([NewTopic(topic, 1, 1, config=dict(COMPACTED))], operation_timeout=30)[topic]
    try:
        future.result(timeout=60)
    except Exception as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise
    deadline = time.monotonic() + timeout_s
    while _partitions(settings, topic) is None:
        if time.monotonic() > deadline:
            raise TopologyError(f"{topic} not visible after creation")
        time.sleep(0.1)
    return topic


@kafka_errors("redriving the DLQ")
def redrive(
    settings: KafkaSettings,
    namespace: str,
    *,
    reason_prefix: str | None = None,
    origins: Sequence[int] | None = None,
    where: RedriveFilter | None = None,
    rate_per_s: float | None = None,
    timeout_ms: int | None = None,
    max_attempts: int | None = None,
    dry_run: bool = False,
    chunk: int = REDRIVE_CHUNK,
    only: Collection[bytes] | None = None,
    keep_going: Callable[[int], bool] | None = None,
    who: str | None = None,
    run_id: str | None = None,
) -> RedriveResult:
    """Re-inject selected DLQ records as fresh source records with their origin, through the
    replay path, at most ``rate_per_s`` a second (None: as fast as it goes); see the module
    doc for why running it twice does not inject twice.

    ``only``: marker keys (``DlqEntry.marker_key``) a selected entry must also have - a plan
    shown before, so what runs is what was shown. ``keep_going(redriven so far)`` is asked
    after each committed chunk; False stops the run there (recorded as ``cancelled``), and
    running it again later continues with what is left. ``who`` names the run's author,
    ``run_id`` the console run this pass is of (in the run's record as ``console_run``)."""
    if rate_per_s is not None and not rate_per_s > 0:
        raise ConfigurationError(f"a redrive rate must be a positive number of records per second, not {rate_per_s!r}")
    where = where or RedriveFilter(reason_prefix, origins)
    ns = Namespace(namespace)
    check(settings, ns)
    began = time.monotonic()
    if dry_run:
        plan = plan_redrive(read_entries(settings, ns), read_markers(settings, ns), where=where)
        return RedriveResult(plan, dry_run=True, seconds=time.monotonic() - began)
    marker_topic = ensure_redriven_topic(settings, ns)
    defaults = SourceConfig()
    config = SourceConfig(
        timeout_ms=timeout_ms or defaults.timeout_ms, max_attempts=max_attempts or defaults.max_attempts
    )
    # Fence first (step 1), read after: whatever an earlier run committed is visible now.
    source = Source(settings, ns, config, transactional_id=f"{ns.name}.dlq-redrive")
    try:
        source.init_transactions()
        plan = plan_redrive(read_entries(settings, ns), read_markers(settings, ns), where=where)
        if only is not None:
            wanted = set(only)
            kept = [e for e in plan.selected if e.marker_key in wanted]
            plan.not_matching += len(plan.selected) - len(kept)
            plan.selected = kept
        result = RedriveResult(plan)
        cancelled = False
        pace = _Pace(rate_per_s)
        # A transaction per second's worth at a rate: what is committed is what went out.
        size = chunk if rate_per_s is None else max(1, min(chunk, int(rate_per_s)))
        for start in range(0, len(plan.selected), size):
            done: list[Redriven] = []
            with source.transaction():
                for entry in plan.selected[start : start + size]:
                    pace.wait()
                    done.append(_redrive_one(source, ns, marker_topic, entry, keep_auto=timeout_ms is None))
            result.redriven.extend(done)
            if keep_going is not None and not keep_going(len(result.redriven)):
                cancelled = len(result.redriven) < len(plan.selected)
                break
        result.seconds = time.monotonic() - began
        result.run = _record_run(source, marker_topic, where, rate_per_s, plan, result, who=who, cancelled=cancelled,
                                 run_id=run_id)
        return result
    finally:
        with contextlib.suppress(Exception):
            source.close()


class _Pace:
    """At most ``rate`` calls of ``wait`` a second, evenly spaced (None: no limit)."""

    def __init__(self, rate: float | None) -> None:
        self.gap = 0.0 if rate is None else 1.0 / rate
        self.next = time.monotonic()

    def wait(self) -> None:
        if not self.gap:
            return
        now = time.monotonic()
        if self.next > now:
            time.sleep(self.next - now)
        self.next = max(self.next, now) + self.gap


def _record_run(
    source: Source, marker_topic: str, where: RedriveFilter, rate_per_s: float | None, plan: RedrivePlan,
    result: RedriveResult, *, who: str | None = None, cancelled: bool = False, run_id: str | None = None,
) -> dict[str, Any]:
    """The run, in ``ns.dlq.redriven`` (its own transaction, after the records): who, when,
    the filter and how many."""
    now_ms = int(time.time() * 1000)
    run = {
        "who": who or f"{getpass.getuser()}@{socket.gethostname()}",
        "state": "cancelled" if cancelled else "completed",
        "at": _iso(now_ms),
        "filter": where.as_json(),
        "rate_per_s": rate_per_s,
        "redriven": len(result.redriven),
        "selected": len(plan.selected),
        "skipped_already_redriven": plan.already_redriven,
        "skipped_not_matching": plan.not_matching,
        "seconds": round(result.seconds, 3),
    }
    if run_id is not None:
        run["console_run"] = run_id
    key = RUN_PREFIX + f"{now_ms:013d}:{uuid.uuid4().hex[:8]}".encode()
    with source.transaction():
        source.produce(marker_topic, key, orjson.dumps(run))
    return run


@kafka_errors("reading the redrive runs")
def read_runs(settings: KafkaSettings, namespace: str) -> list[dict[str, Any]]:
    """The recorded redrive runs of a namespace, oldest first (none before the first run)."""
    topic = redriven_topic(Namespace(namespace))
    n = _partitions(settings, topic)
    if n is None:
        return []
    runs = []
    for msg in read_to_end(settings, topic, n):
        key, value = msg.key(), msg.value()
        if key is not None and key.startswith(RUN_PREFIX) and value is not None:
            with contextlib.suppress(orjson.JSONDecodeError):
                runs.append((key, orjson.loads(value)))
    return [run for _, run in sorted(runs, key=lambda kv: kv[0])]


def _redrive_one(source: Source, ns: Namespace, marker_topic: str, entry: DlqEntry, *, keep_auto: bool = True) -> Redriven:
    """One entry, as a fresh source record with its origin. A record whose timeout was
    adaptive is sent with ``timeout_ms="auto"`` again, unless the redrive gave a timeout."""
    assert entry.origin is not None and entry.topic is not None and entry.key_hash_partition is not None
    now_ms = int(time.time() * 1000)
    last = entry.history[-1] if entry.history else None
    note = Failure(
        last.srid if last else 0,
        entry.attempts or (last.attempt if last else 0),
        f"{REDRIVE_NOTE}: from {ns.dlq} {entry.where} ({entry.reason}); attempts restart at 1",
        now_ms,
    )
    sent = source.resend(
        entry.topic,
        entry.key,
        entry.value,
        entry.headers,
        origin=entry.origin,
        key_hash_partition=entry.key_hash_partition,
        partitioner=entry.partitioner or "kafka",
        history=(*entry.history, note),
        timeout_ms="auto" if keep_auto and entry.auto_timeout else None,
        replay=True,
    )
    marker = Marker(entry.origin, sent.srid, f"{ns.dlq} {entry.where}", now_ms)
    source.produce(marker_topic, entry.marker_key, marker.encode())
    return Redriven(entry, sent.srid, sent.key_hash_partition)
