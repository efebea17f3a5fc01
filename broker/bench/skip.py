"""The cost of skipping superseded replays on a task's hot path (docs/design.md §6).

Per record, ``Task._handle_each`` (the handler a no-op, events kept in memory, no Kafka) with:
- ``off``: ``TaskConfig.skip_superseded=False`` (no markers);
- ``empty``: markers read, none there - what every task pays when nothing is superseded;
- ``100k``: 100 000 markers in memory.
Each on first attempts and on replays (attempt 2, not marked: the set is looked up). Per batch
a task also calls ``SupersededMarkers.poll`` (a ``consume(10000, 0)`` of what is fetched):
with ``--bootstrap`` (or ``KAFKA_BOOTSTRAP_SERVERS``) that is measured on a real, idle
marker topic too.

    python -m broker.bench.skip [--records 200000] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from typing import Any

from broker import ids
from broker.headers import tracking_headers
from broker.markers import SupersededMarkers
from broker.task import Task, TaskConfig, TaskCounters
from broker.task.acks import Events
from broker.task.superseded import SupersededSkip
from broker.topics import Namespace


class _Msg:
    __slots__ = ("_h",)

    def __init__(self, headers: Sequence[tuple[str, bytes | None]]) -> None:
        self._h = headers

    def headers(self) -> Sequence[tuple[str, bytes | None]]:
        return self._h

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 0

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"


def _markers(n: int) -> SupersededMarkers:
    m = SupersededMarkers.__new__(SupersededMarkers)
    m.srids = dict.fromkeys(ids.new_ids(n).tolist()) if n else {}
    m._consumer = None
    return m


def _task(markers: SupersededMarkers | None) -> Task:
    task = Task.__new__(Task)
    task.ns, task._ledger_partitions, task.name = Namespace("bench"), 8, "bench"
    task.config, task.counters = TaskConfig(), TaskCounters()
    task.handler = lambda _r, _c: None
    task._skip = None if markers is None else SupersededSkip(
        markers, task.counters, lambda: None, slow_batch_ms=task.config.slow_batch_ms,
        superseded_wait_ms=task.config.superseded_wait_ms,
    )
    return task


def per_record_ns(task: Task, msgs: list[Any], rounds: int = 3) -> float:
    best = float("inf")
    for _ in range(rounds):
        events, batch = Events(), list(msgs)  # _records empties its batch
        began = time.perf_counter()
        task._handle_each(task._records(batch, events, {}), events)
        best = min(best, time.perf_counter() - began)
    return best / len(msgs) * 1e9


def poll_us(bootstrap: str, polls: int = 2000) -> float:
    from broker.settings import KafkaSettings  # only with a broker
    from broker.topics import create

    settings = KafkaSettings.from_env(bootstrap)
    ns = Namespace(f"bench-skip-{os.getpid()}")
    create(settings, ns, 2)
    markers = SupersededMarkers(settings, ns)
    try:
        markers.poll(1.0)
        began = time.perf_counter()
        for _ in range(polls):
            markers.poll()
        return (time.perf_counter() - began) / polls * 1e6
    finally:
        markers.close()
        from broker.topics import delete

        delete(settings, [*ns.ledger_topics, ns.dlq, ns.superseded])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    args = parser.parse_args(argv)
    srids, rids = ids.new_ids(args.records), ids.new_ids(args.records)
    batches = {
        attempt: [_Msg(tracking_headers(int(s), int(r), int(s), attempt)) for s, r in zip(srids, rids, strict=True)]
        for attempt in (1, 2)
    }
    print(f"Task._handle_each per record ({args.records} records, handler a no-op, best of {args.rounds}):")
    configs = {"off": None, "empty": _markers(0), "100k": _markers(100_000)}
    best: dict[tuple[str, int], float] = {}
    for _ in range(args.rounds):  # interleaved: a loaded machine slows all of them alike
        for name, markers in configs.items():
            for attempt, msgs in batches.items():
                ns_ = per_record_ns(_task(markers), msgs, rounds=1)
                best[(name, attempt)] = min(best.get((name, attempt), float("inf")), ns_)
    for name in configs:
        row = "  ".join(f"attempt {attempt}: {best[(name, attempt)]:6.0f} ns" for attempt in batches)
        print(f"  markers {name:6s} {row}")
    if args.bootstrap:
        us = poll_us(args.bootstrap)
        print(f"SupersededMarkers.poll on an idle marker topic: {us:.1f} us per batch")


if __name__ == "__main__":
    main()
