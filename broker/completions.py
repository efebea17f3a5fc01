"""Watching outcomes: every srid leaves ``ns.persist`` with a tombstone that says
why (``broker.headers.outcome_of``) - ``completed`` (its tree completed; no header), ``replay`` (superseded by a new attempt)
or ``dlq`` (dead-lettered). No extra topic: the ledger's own tombstones are the feed.

``OutcomeLog`` folds the persist topic into per-origin outcomes; the demo and the tests use it
as an independent view of what the acker decided.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field

from confluent_kafka import Message

from broker import ids
from broker.errors import DecodeError
from broker.headers import outcome_of
from broker.kafka_io import kafka_errors, partition_counts, read_to_end
from broker.schemas import PersistedRecord
from broker.settings import KafkaSettings
from broker.topics import Namespace


@dataclass
class OutcomeLog:
    """srid -> origin from persist records; outcomes from tombstones (in log order)."""

    origin_of: dict[int, int] = field(default_factory=dict)
    attempt_of: dict[int, int] = field(default_factory=dict)
    # origin -> list of (srid, outcome, tombstone timestamp ms)
    outcomes: dict[int, list[tuple[int, str, int]]] = field(default_factory=lambda: defaultdict(list))
    live: set[int] = field(default_factory=set)
    unknown_tombstones: int = 0

    def add(self, msg: Message) -> None:
        key = msg.key()
        if key is None or len(key) != 8:
            return
        srid = ids.decode_id(key)
        value = msg.value()
        if value is not None:
            try:
                record = PersistedRecord.decode(value)
            except DecodeError:
                return
            self.origin_of[srid] = record.origin
            self.attempt_of[srid] = record.attempt
            self.live.add(srid)
            return
        outcome = outcome_of(msg.headers()).decode()
        origin = self.origin_of.get(srid)
        self.live.discard(srid)
        if origin is None:
            self.unknown_tombstones += 1
            return
        self.outcomes[origin].append((srid, outcome, msg.timestamp()[1]))

    def completed_origins(self) -> dict[int, int]:
        """origin -> number of completions (exactly one is right)."""
        return {
            o: n for o, events in self.outcomes.items()
            if (n := sum(1 for _, outcome, _ in events if outcome == "completed"))
        }

    def dlq_origins(self) -> set[int]:
        return {o for o, events in self.outcomes.items() if any(e[1] == "dlq" for e in events)}

    def replays(self, origins: Collection[int] | None = None) -> int:
        """Attempts replayed, of every origin or of ``origins``."""
        events = self.outcomes.values() if origins is None else (self.outcomes.get(o, ()) for o in origins)
        return sum(1 for origin_events in events for e in origin_events if e[1] == "replay")

    def pending_origins(self) -> set[int]:
        return {self.origin_of[s] for s in self.live}


@kafka_errors("reading the outcomes")
def read_outcomes(settings: KafkaSettings, ns: Namespace) -> OutcomeLog:
    log = OutcomeLog()
    partitions = partition_counts(settings, [ns.persist])[ns.persist] or 0
    for msg in read_to_end(settings, ns.persist, partitions):
        log.add(msg)
    return log


class OutcomeTail:
    """Tails ``ns.persist`` (read_committed) into an ``OutcomeLog`` as outcomes happen."""

    def __init__(self, settings: KafkaSettings, ns: Namespace) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.log = OutcomeLog()
        partitions = partition_counts(settings, [ns.persist])[ns.persist] or 0
        self._consumer = Consumer(settings.consumer_config(None, defaults={"group.id": f"{ns.name}.outcomes"}))
        self._consumer.assign([TopicPartition(ns.persist, p, OFFSET_BEGINNING) for p in range(partitions)])

    def poll(self, timeout_s: float = 0.2) -> int:
        msgs = self._consumer.consume(10_000, timeout_s)
        for msg in msgs:
            if msg.error() is None:
                self.log.add(msg)
        return len(msgs)

    def close(self) -> None:
        self._consumer.close()
