"""The console's Kafka access, in one place: the tailer that fills the index, the audit log,
the status samples. Everything else goes through ``broker.dlq``, ``broker.status`` and
``broker.trace``.

The audit log is the topic ``NS.console.audit``: one JSON record per operator action (who,
when, what, result), written before the action's result is shown.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from broker.acker.clients import STANDBY_MARK
from broker.console.index import Index
from broker.dlq import RUN_PREFIX, DlqEntry, Marker, redriven_topic
from broker.errors import ReplayBrokerError
from broker.kafka_io import partition_counts
from broker.settings import KafkaSettings
from broker.status import status
from broker.topics import Namespace

log = logging.getLogger(__name__)


def audit_topic(ns: Namespace) -> str:
    return f"{ns.name}.console.audit"


class Tailer:
    """Reads ``ns.dlq``, ``ns.dlq.redriven`` and ``ns.console.audit`` (read_committed) into
    the index, from where the index says it stopped; new partitions (and the marker topic
    once a redrive created it) are picked up at the next look (``refresh_s``)."""

    def __init__(self, settings: KafkaSettings, ns: Namespace, index: Index, *, refresh_s: float = 5.0) -> None:
        self.settings, self.ns, self.index, self.refresh_s = settings, ns, index, refresh_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self.caught_up = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="console-tailer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _assignment(self) -> list[TopicPartition]:
        topics = [self.ns.dlq, redriven_topic(self.ns), audit_topic(self.ns)]
        counts = partition_counts(self.settings, topics)
        out = []
        for topic in topics:
            at = self.index.positions(topic)
            out += [TopicPartition(topic, p, at.get(p, OFFSET_BEGINNING)) for p in range(counts[topic] or 0)]
        return out

    def _run(self) -> None:
        config = self.settings.consumer_config(
            None,
            defaults={"group.id": f"{self.ns.name}.console", "enable.partition.eof": True, "fetch.wait.max.ms": 100},
            required={"enable.auto.commit": False, "isolation.level": "read_committed"},
        )
        consumer = Consumer(config)
        assigned: set[tuple[str, int]] = set()
        next_look = 0.0
        eof: set[tuple[str, int]] = set()
        try:
            while not self._stop.is_set():
                if time.monotonic() >= next_look:
                    try:
                        wanted = self._assignment()
                    except ReplayBrokerError as exc:
                        self.error = str(exc)
                        wanted = []
                    new = [tp for tp in wanted if (tp.topic, tp.partition) not in assigned]
                    if new:
                        consumer.incremental_assign(new)
                        assigned |= {(tp.topic, tp.partition) for tp in new}
                    next_look = time.monotonic() + self.refresh_s
                msgs = consumer.consume(500, 0.2)
                self._fold(msgs, eof)
                if assigned and eof >= assigned:
                    self.caught_up.set()
        except Exception as exc:
            self.error = f"tailing {self.ns.dlq}: {exc}"
            log.exception("the console's tailer stopped")
            raise
        finally:
            with contextlib.suppress(Exception):
                consumer.close()

    def _fold(self, msgs: list[Any], eof: set[tuple[str, int]]) -> None:
        entries: list[DlqEntry] = []
        markers: list[tuple[bytes, Marker | None]] = []
        runs: list[tuple[bytes, dict[str, Any]]] = []
        audits: list[tuple[int, int, dict[str, Any]]] = []
        positions: dict[tuple[str, int], int] = {}
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    eof.add((m.topic(), m.partition()))
                continue
            eof.discard((m.topic(), m.partition()))
            positions[(m.topic(), m.partition())] = m.offset() + 1
            if m.topic() == self.ns.dlq:
                entries.append(DlqEntry.from_message(m))
            elif m.topic() == audit_topic(self.ns):
                event = audit_event(m.value())
                if event is not None:
                    audits.append((m.partition(), m.offset(), event))
            else:
                key, value = m.key(), m.value()
                if key is None:
                    continue
                if key.startswith(RUN_PREFIX):
                    with contextlib.suppress(orjson.JSONDecodeError):
                        run = orjson.loads(value) if value is not None else None
                        if isinstance(run, dict):
                            runs.append((key, run))
                    continue
                markers.append((key, None if value is None else Marker.decode(value)))
        if entries or markers or positions:
            self.index.add(entries, markers, [(t, p, o) for (t, p), o in positions.items()], runs, audits)


def audit_event(value: bytes | None) -> dict[str, Any] | None:
    """An audit record's event, None for anything else (the topic is writable by others)."""
    if value is None:
        return None
    try:
        event = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("action"), str) else None


class AuditLog(Protocol):
    def ensure_topic(self) -> None: ...

    def close(self) -> None: ...

    def record(self, who: str, action: str, what: dict[str, Any], result: str) -> tuple[int, int, dict[str, Any]]:
        """Writes the event -> (its partition, its offset, the event)."""
        ...


class Audit:
    """Operator actions, in ``NS.console.audit``: recorded and flushed before the action's
    result is shown, so what the page says happened is in Kafka."""

    def __init__(self, settings: KafkaSettings, ns: Namespace) -> None:
        self.settings, self.topic = settings, audit_topic(ns)
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    def ensure_topic(self) -> None:
        if partition_counts(self.settings, [self.topic])[self.topic] is not None:
            return
        admin = AdminClient(self.settings.client_config())
        future = admin.create_topics([NewTopic(self.topic, 1, 1)], operation_timeout=30)[self.topic]
        try:
            future.result(timeout=60)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise

    def record(self, who: str, action: str, what: dict[str, Any], result: str) -> tuple[int, int, dict[str, Any]]:
        event = {"at_ms": int(time.time() * 1000), "who": who, "action": action, "what": what, "result": result}
        written: list[Any] = []
        with self._lock:
            if self._producer is None:
                self._producer = Producer(self.settings.producer_config(defaults={"linger.ms": 0}))
            self._producer.produce(self.topic, key=who.encode(), value=orjson.dumps(event),
                                   on_delivery=lambda err, msg: written.append((err, msg)))
            if self._producer.flush(30) != 0 or not written or written[0][0] is not None:
                raise ReplayBrokerError(f"the audit record of {action} was not written to {self.topic}")
        msg = written[0][1]
        return msg.partition(), msg.offset(), event

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.flush(10)


#: The counters the Overview charts as per-second rates: the status' own, then the acker
#: counters of replays held back - by a back-off, by a key's turn or a replay rate, by a
#: task's Retry-After.
RATES = ("completed", "replayed", "dlq")
WAITS = ("replays_backed_off", "replays_waited", "retry_afters")


def acker_member(ns: Namespace, client_id: str, group_instance_id: str | None, host: str,
                 topic_partitions: Iterable[TopicPartition]) -> dict[str, Any]:
    """One member of the acker group as the Overview shows it: its instance (the
    ``ns.acker.`` prefix left out), whether it keeps standbys (``STANDBY_MARK`` on its
    client.id, broker.acker.clients) and the partitions it owns per topic."""
    standby = client_id.endswith(STANDBY_MARK)
    name = group_instance_id or (client_id[: -len(STANDBY_MARK)] if standby else client_id)
    owned: dict[str, int] = {}
    for tp in topic_partitions:
        owned[tp.topic] = owned.get(tp.topic, 0) + 1
    return {"client_id": client_id, "instance": name.removeprefix(f"{ns.name}.acker."), "host": host,
            "partitions": owned, "owned": max(owned.values(), default=0), "standby": standby}


def ackers(settings: KafkaSettings, ns: Namespace, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The acker group's members now (``acker_member``)."""
    group = f"{ns.name}.acker"
    admin = AdminClient(settings.client_config())
    description = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group].result(timeout=timeout_s)
    out = [acker_member(ns, m.client_id, m.group_instance_id, m.host,
                        getattr(m.assignment, "topic_partitions", None) or [])
           for m in description.members]
    out.sort(key=lambda m: (m["host"], m["instance"]))
    return out


class Sampler:
    """``broker.status`` every ``every_s``, the last hour kept: the Overview's charts."""

    def __init__(self, settings: KafkaSettings, ns: Namespace, *, every_s: float = 10.0) -> None:
        self.settings, self.ns, self.every_s = settings, ns, every_s
        self.samples: deque[tuple[float, dict[str, Any]]] = deque(maxlen=max(2, int(3600 / every_s) + 1))
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="console-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def sample(self) -> None:
        try:
            sample = status(self.settings, self.ns.name)
            self.error = None
        except ReplayBrokerError as exc:
            self.error = str(exc)
            return
        try:
            sample["ackers"] = ackers(self.settings, self.ns)
        except Exception as exc:  # noqa: BLE001 - the group's description is shown as missing, the status still is
            sample["ackers"] = None
            sample["ackers_error"] = str(exc)
        self.samples.append((time.time(), sample))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every_s)

    def latest(self) -> dict[str, Any] | None:
        return self.samples[-1][1] if self.samples else None

    def series(self) -> dict[str, list[tuple[float, float]]]:
        """Per-second rates of ``RATES`` and ``WAITS``, and ``pending``, over the samples kept."""
        points = list(self.samples)
        out: dict[str, list[tuple[float, float]]] = {name: [] for name in (*RATES, *WAITS, "pending")}
        for (t0, a), (t1, b) in itertools.pairwise(points):
            gap = max(t1 - t0, 1e-3)
            for name in RATES:
                out[name].append((t1, max(0.0, (b.get(name, 0) - a.get(name, 0)) / gap)))
            ca, cb = a.get("counters", {}), b.get("counters", {})
            for name in WAITS:
                out[name].append((t1, max(0.0, (cb.get(name, 0) - ca.get(name, 0)) / gap)))
        for t, s in points:
            out["pending"].append((t, float(s.get("pending", 0))))
        return out
