"""One ledger partition's state: its table, its exactly-once counters, and the outputs due."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from broker.ledger.table import LedgerTable

COUNTERS = (
    "registered",  # persist records folded
    "duplicate_roots",  # persist records refused because the srid was registered already
    "folded",  # (srid, xor) pairs folded
    "fail_marks",  # explicit failure marks received
    "completed",  # trees completed -> persist tombstone
    "timed_out",  # registered entries past their deadline
    "failed",  # entries failed explicitly (replayed or dead-lettered)
    "replayed",  # new attempts published to <topic>.replay
    "dlq",  # records dead-lettered after max attempts
    "orphans",  # unregistered entries dropped after the orphan TTL (late or stray events)
    "quarantined",  # undecodable or misrouted input messages, kept in the DLQ
    "payload_fetches",  # replays whose payload came from ns.persist, not the cache
    "payload_retries",  # payload reads that failed and were put off to a later commit
    "payload_lost",  # failed records dead-lettered without their value: payload unreadable
    "refused",  # outputs the broker refused for good, decided again: replay -> DLQ, DLQ w/o value
)


@dataclass
class PartitionState:
    """One ledger partition: the table, its cumulative counters, and the outputs due."""

    table: LedgerTable
    counters: dict[str, int]
    # This instance's decisions, over all partitions it ever owned (shared by all states).
    totals: dict[str, int] = field(default_factory=dict)
    counters_dirty: bool = False
    tombstones: list[tuple[int, bytes]] = field(default_factory=list)  # srid, outcome
    failures: list[tuple[int, int, str]] = field(default_factory=list)  # srid, offset, reason
    recent_fails: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (ms, srids)
    # srid -> failed reads of its payload so far. In memory only: a new owner of the
    # partition starts counting again (a provably lost record is dead-lettered at once).
    payload_tries: dict[int, int] = field(default_factory=dict)

    def count(self, name: str, n: int = 1) -> None:
        if n:
            self.counters[name] = self.counters.get(name, 0) + n
            self.totals[name] = self.totals.get(name, 0) + n
            self.counters_dirty = True


def empty_state(totals: dict[str, int]) -> PartitionState:
    return PartitionState(LedgerTable(), {}, totals)
