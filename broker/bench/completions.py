"""Counting completions without reading them: a system's cumulative count, read at the edges
of a window.

A tail that reads every completion costs as much as a stage of the pipeline (both persist
records of every srid), so throughput is counted from what the systems count anyway:

- the pipeline: the acker's ``__counters__`` record of each ledger partition (``completed``,
  cumulative, committed in the same transaction as the tombstones it counts), read
  read_committed from each partition's end (``broker.status.latest_with_key``). Its
  ``updated_ms`` is when the acker built that commit, so the window is the acker's own;
- a bench worker (raw consumer, share consumer, the skeleton's acker): its count and the
  worker's clock in its latest ``progress`` event.

The rate between two marks is the completions between them over the mean of the
partitions' windows (the partitions commit together, a few ms apart).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.schemas import COUNTERS_KEY, LedgerCounters
from broker.settings import KafkaSettings
from broker.status import latest_with_key
from broker.topics import Namespace


@dataclass(frozen=True)
class Mark:
    """Cumulative completions per partition (one key for a process's own count) and when each
    count was taken (ms, the counting process's wall clock)."""

    counts: dict[int, int]
    at_ms: dict[int, float]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @classmethod
    def of_count(cls, count: int, at_s: float) -> Mark:
        return cls({0: count}, {0: at_s * 1000.0})


def ledger_mark(settings: KafkaSettings, namespace: str, partitions: int) -> Mark:
    """The acker's committed ``completed`` counters, one per ledger partition (0 before the
    partition's first commit)."""
    raw, _ = latest_with_key(settings, Namespace(namespace).ledger, partitions, COUNTERS_KEY)
    counts: dict[int, int] = {}
    at: dict[int, float] = {}
    for p in range(partitions):
        if p in raw:
            record = LedgerCounters.decode(raw[p])
            counts[p], at[p] = record.counters.get("completed", 0), float(record.updated_ms)
        else:
            counts[p], at[p] = 0, 0.0
    return Mark(counts, at)


def proc_mark(proc: Any) -> Mark:
    """A bench worker's latest ``progress`` count (``procs.Proc``)."""
    return Mark.of_count(proc.count, proc.count_at)


def window(start: Mark, end: Mark) -> tuple[int, float]:
    """(completions between the marks, seconds): the seconds are the mean over the partitions
    whose count was taken at both marks (a partition without a record at ``start`` has no
    time there; its completions still count)."""
    spans = [end.at_ms[p] - start.at_ms[p] for p in end.counts if start.at_ms.get(p, 0.0) > 0.0]
    seconds = sum(spans) / len(spans) / 1000.0 if spans else 0.0
    return end.total - start.total, seconds


def rate(start: Mark, end: Mark) -> float | None:
    """Completions per second between two marks, or None when no time passed between them."""
    n, seconds = window(start, end)
    return n / seconds if seconds > 0 else None
