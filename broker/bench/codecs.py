"""Codec microbenchmark: encode and decode of each record type as the hot paths make them.

``python -m broker.bench.codecs``: per case, the best of 15 rounds of ``timeit`` (CPU time) over a
record like the ones a run writes - an XorBatch of 100 events (an acker's ingest), one with a
fail mark and its retry-after, a LedgerEntry (the changelog; its column-wise encoder over
1 000 rows), LedgerCounters and a first attempt's PersistedRecord - in microseconds a record.
"""

from __future__ import annotations

import sys
import time
import timeit
from collections.abc import Callable

import numpy as np

from broker.schemas import (
    LedgerCounters,
    LedgerEntry,
    PersistedRecord,
    XorBatch,
    encode_ledger_entries,
)


def _best_us(fn: Callable[[], object], per: int = 1) -> float:
    # CPU time, the best of 15 rounds: the figure of a core of its own, whatever else runs.
    timer = timeit.Timer(fn, timer=time.process_time)
    n, _ = timer.autorange()
    return min(timer.repeat(15, n)) / n / per * 1e6


def cases() -> dict[str, Callable[[], object]]:
    rng = np.random.default_rng(1)
    ids = rng.integers(-(2**63), 2**63 - 1, 100, dtype=np.int64)
    batch = XorBatch(3, ids, ids[::-1].copy(), np.empty(0, np.int64), "task-1")
    failing = XorBatch(3, ids[:10], ids[10:20], ids[:1], "task-1", retry_after_ms=np.array([2_000], np.int64))
    entry = LedgerEntry(int(ids[0]), 1, 123_456, 1_700_000_030_000)
    counters = LedgerCounters({"completed": 10_000, "replayed": 3, "dlq": 1}, 1_700_000_000_000, 40, 12, 1_700_000_000_000, 9)
    record = PersistedRecord(int(ids[1]), int(ids[1]), 1, int(ids[2]), int(ids[2]), "ns.orders", 3, b"key-1", b"v" * 100,
                             1_700_000_000_000)
    cols = [rng.integers(0, 2**62, 1_000, dtype=np.int64) for _ in range(4)]
    blobs = {"batch": batch.encode(), "failing": failing.encode(), "entry": entry.encode(),
             "counters": counters.encode(), "record": record.encode()}
    return {
        "XorBatch(100).encode": batch.encode,
        "XorBatch(100).decode": lambda: XorBatch.decode(blobs["batch"]),
        "XorBatch(10, retry-after).decode": lambda: XorBatch.decode(blobs["failing"]),
        "LedgerEntry.encode": entry.encode,
        "LedgerEntry.decode": lambda: LedgerEntry.decode(blobs["entry"]),
        "encode_ledger_entries(1000) per row": lambda: encode_ledger_entries(cols[0], cols[1], cols[2], cols[3]),
        "LedgerCounters.decode": lambda: LedgerCounters.decode(blobs["counters"]),
        "PersistedRecord.encode": record.encode,
        "PersistedRecord.decode": lambda: PersistedRecord.decode(blobs["record"]),
    }


def main() -> int:
    for name, fn in cases().items():
        per = 1_000 if "(1000)" in name else 1
        sys.stdout.write(f"{name:40s} {_best_us(fn, per):8.2f} us\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
