"""Changelog restore rate: how fast an acker rebuilds a partition's table on assignment.

A fresh namespace (one ledger partition) gets ``N`` ``LedgerEntry`` records written straight
to ``ns.ledger[0]`` - what an acker's commits leave for N pending registered entries - plus
the counters record. Then the acker's own restore path (read the partition to its end with
its read_committed restorer, decode, ``LedgerTable.restore``) is timed; constructing the
acker (transactional producer, consumers) is not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Producer

from broker import ids, topics
from broker.acker import Acker, AckerConfig, PartitionState
from broker.bench.figures import Figures
from broker.bench.hops import Env
from broker.ledger.table import REGISTERED
from broker.schemas import COUNTERS_KEY, LedgerEntry, encode_counters


def _fill(env: Env, ns: topics.Namespace, n: int, progress: Callable[[float], None] | None) -> None:
    producer = Producer(env.settings.producer_config(defaults={"linger.ms": 20, "batch.size": 1_000_000}))
    srids = ids.new_ids(n).tolist()
    values = ids.new_ids(n).tolist()
    deadline = int(time.time() * 1000) + 3_600_000
    for i, (srid, value) in enumerate(zip(srids, values, strict=True)):
        record = LedgerEntry(value, REGISTERED, i, deadline).encode()
        while True:
            try:
                producer.produce(ns.ledger, record, ids.encode_id(srid), partition=0)
                break
            except BufferError:
                producer.poll(0.05)
        if progress and i % 50_000 == 0:
            progress(i / n)
    producer.flush(120)
    producer.produce(ns.ledger, encode_counters({"registered": n}, int(time.time() * 1000)), COUNTERS_KEY,
                     partition=0)
    if producer.flush(120):
        raise RuntimeError("changelog records not delivered")


def _restore(acker: Acker, lp: int) -> PartitionState:
    """The acker's restore path: what it runs on assignment with no warm state."""
    state, _ = acker.changelog.load(lp, None, OFFSET_BEGINNING)
    return state


def measure_restore(env: Env, figures: Figures, *, entries: int,
                    progress: Callable[[float, str], None] | None = None) -> dict[str, Any]:
    ns = topics.Namespace(env.unique("restore"))
    topics.create(env.settings, ns, 1)
    env.created_topics += [*ns.ledger_topics, ns.dlq]
    _fill(env, ns, entries, (lambda f: progress(0.6 * f, f"writing {entries} changelog records")) if progress else None)
    if progress:
        progress(0.6, "restoring")
    acker = Acker(env.settings, ns, AckerConfig(instance_id=f"{ns.name}-restore"))
    quiet = logging.getLogger("broker.acker")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # its close() logs a stats line
    try:
        t0 = time.perf_counter()
        state = _restore(acker, 0)
        seconds = time.perf_counter() - t0
    finally:
        acker.close()
        quiet.setLevel(level)
    restored = len(state.table)
    if restored != entries:
        raise RuntimeError(f"restored {restored} entries, wrote {entries}")
    figures.set("restore.entries", float(restored))
    figures.set("restore.seconds", seconds)
    figures.set("restore.entries_per_s", restored / seconds)
    return {"entries": restored, "seconds": seconds, "bytes_per_entry": state.table.bytes_per_entry}
