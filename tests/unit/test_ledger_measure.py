"""A micro-measurement of the fold, printed, never asserted (timing targets live in broker/bench/).

Prints pairs/s for folding 1M (srid, xor) pairs into a table of 1M pending entries, the same
in smaller batches, the plain-dict reference on a sample, and bytes per pending entry.
Only correctness is asserted.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from broker.ids import new_ids
from broker.ledger.reference import ReferenceLedger
from broker.ledger.table import LedgerTable

N = 1_000_000
DEADLINE = 300
ORPHAN = 50


def _rate(pairs: int, seconds: float) -> str:
    return f"{pairs / seconds / 1e6:6.2f} M pairs/s"


def test_fold_rate_and_bytes_per_entry(capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    srids = new_ids(N)
    roots = new_ids(N)
    table = LedgerTable()
    t0 = time.perf_counter()
    completed, duplicates = table.register(srids, roots, np.arange(N), np.full(N, DEADLINE))
    t_register = time.perf_counter() - t0
    assert len(completed) == 0
    assert not duplicates.any()
    assert len(table) == N

    # 1M pairs, every srid once, shuffled, none completing (the XOR is a random child id)
    order = rng.permutation(N)
    batch_srids = srids[order]
    xors = new_ids(N)
    t0 = time.perf_counter()
    done = table.fold(batch_srids, xors, ORPHAN)
    t_fold = time.perf_counter() - t0
    assert len(done) == 0

    # the same pairs again in service-sized batches (they cancel: values are the roots again)
    batched = {}
    for size in (1_000, 10_000, 100_000):
        t0 = time.perf_counter()
        for start in range(0, N, size):
            table.fold(batch_srids[start : start + size], xors[start : start + size], ORPHAN)
        batched[size] = time.perf_counter() - t0
        assert table.get(int(srids[0])) is not None

    # 1M pairs with duplicates inside the batch (fan-out 4: 250k srids x 4 events)
    dup_srids = np.repeat(srids[:250_000], 4)[rng.permutation(N)]
    t0 = time.perf_counter()
    table.fold(dup_srids, new_ids(N), ORPHAN)
    t_dup = time.perf_counter() - t0

    # completing: one event per tree carrying its current value
    table2 = LedgerTable()
    table2.register(srids, roots, np.arange(N), np.full(N, DEADLINE))
    t0 = time.perf_counter()
    done = table2.fold(batch_srids, roots[order], ORPHAN)
    t_complete = time.perf_counter() - t0
    assert len(done) == N
    assert len(table2) == 0

    # plain dict baseline on a 200k sample
    sample = 200_000
    reference = ReferenceLedger()
    reference.register(srids[:sample], roots[:sample], np.arange(sample), np.full(sample, DEADLINE))
    sample_order = rng.permutation(sample)
    t0 = time.perf_counter()
    reference.fold(srids[sample_order], xors[:sample], ORPHAN)
    t_dict = time.perf_counter() - t0

    with capsys.disabled():
        print()
        print(f"ledger: {N:,} entries, capacity {table.capacity:,} slots")
        print(f"  register 1M persist records (from empty, growing): {_rate(N, t_register)}")
        print(f"  fold 1M pairs, one batch, into 1M entries:         {_rate(N, t_fold)}")
        for size, seconds in batched.items():
            print(f"  fold 1M pairs in batches of {size:>7,}:             {_rate(N, seconds)}")
        print(f"  fold 1M pairs, 4 per srid (reduceat path):         {_rate(N, t_dup)}")
        print(f"  fold 1M pairs that complete 1M trees:              {_rate(N, t_complete)}")
        print(f"  plain dict reference fold ({sample:,} pairs):        {_rate(sample, t_dict)}")
        print(
            f"  memory: {table.nbytes / 2**20:.1f} MiB, {table.bytes_per_entry:.1f} bytes/entry "
            f"(29 bytes/slot at load {len(table) / table.capacity:.3f})"
        )
