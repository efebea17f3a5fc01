"""Acker fold microbenchmark: ``LedgerTable.fold`` against a plain Python dict fold.

For each size N the table holds N registered (pending) entries; batches of (srid, xor)
pairs for random pending srids are folded into it. The xors are random ids, so no tree
completes and the table stays at N entries: the figure is the steady-state fold rate at
that many pending entries, on one core (numpy runs these kernels single-threaded).

The baseline is the minimal dict loop a Python acker would write - srid -> [value, flags,
offset, deadline], ``get``, XOR, complete when registered and 0 - fed from the same numpy
batches (``tolist()`` included: an acker gets its pairs as arrays from ``XorBatch``).
``broker.ledger.reference.ReferenceLedger`` (dataclass entries) is slower than this loop,
so the loop is the stronger baseline.

Bytes per pending entry: ``LedgerTable.nbytes / len`` (the columns are all it holds). For the
dict: per-entry objects (key int, entry list, its ints) measured with ``tracemalloc`` on a
sample, plus the dict's own table (``sys.getsizeof``) at N, divided by N.
"""

from __future__ import annotations

import gc
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

from broker.bench.figures import FOLD_SIZES, Figures, size_label
from broker.ids import new_ids
from broker.ledger.table import REGISTERED, LedgerTable

BATCH = 10_000  # pairs per fold call: the order of what one acker poll brings per partition
DEADLINE = 1_000_000_000  # ticks: never due during the benchmark
ORPHAN_DEADLINE = 1_000_000
DICT_SAMPLE = 100_000


def _available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def _batches(rng: np.random.Generator, srids: np.ndarray, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(srids[rng.integers(0, srids.size, BATCH)], new_ids(BATCH)) for _ in range(count)]


def _timed_rate(fold: Callable[[np.ndarray, np.ndarray], Any], make: Callable[[int], list[tuple[np.ndarray, np.ndarray]]],
                seconds: float) -> float:
    """pairs/s: a short probe sizes the run to about ``seconds``."""
    probe = make(3)
    t0 = time.perf_counter()
    for s, x in probe:
        fold(s, x)
    per_batch = (time.perf_counter() - t0) / len(probe)
    count = int(min(max(seconds / max(per_batch, 1e-6), 5), 2000))
    batches = make(count)
    t0 = time.perf_counter()
    for s, x in batches:
        fold(s, x)
    elapsed = time.perf_counter() - t0
    return count * BATCH / elapsed


def dict_fold(d: dict[int, list[int]], srids: np.ndarray, xors: np.ndarray, orphan_deadline: int) -> list[int]:
    """The plain Python fold: one pair at a time."""
    done = []
    for s, x in zip(srids.tolist(), xors.tolist(), strict=True):
        e = d.get(s)
        if e is None:
            d[s] = [x, 0, -1, orphan_deadline]
            continue
        v = e[0] ^ x
        e[0] = v
        if v == 0 and e[1] & REGISTERED:
            del d[s]
            done.append(s)
    return done


def _dict_entry_bytes(srids: np.ndarray, values: np.ndarray) -> float:
    """Bytes of one entry's objects (key int, entry list, value/offset/deadline ints; the
    flags are a cached small int), measured with tracemalloc on a sample."""
    m = min(srids.size, DICT_SAMPLE)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        keys = srids[:m].tolist()
        vals = values[:m].tolist()
        offs = np.arange(10**6, 10**6 + m).tolist()  # distinct ints, as real offsets are
        dls = np.arange(DEADLINE, DEADLINE + m).tolist()
        entries = [[v, REGISTERED, o, dl] for v, o, dl in zip(vals, offs, dls, strict=True)]
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    holders = sum(sys.getsizeof(x) for x in (keys, vals, offs, dls, entries))  # not part of an entry
    return (after - before - holders) / m


def _table_rate(n: int, srids: np.ndarray, roots: np.ndarray, rng: np.random.Generator,
                seconds: float) -> tuple[float, float, LedgerTable]:
    """(fold pairs/s, register entries/s, the table) with ``n`` registered entries."""
    table = LedgerTable()
    t0 = time.perf_counter()
    for start in range(0, n, 1_000_000):
        stop = min(start + 1_000_000, n)
        table.register(srids[start:stop], roots[start:stop], np.arange(start, stop, dtype=np.int64),
                       np.full(stop - start, DEADLINE, np.int64))
    register_rate = n / (time.perf_counter() - t0)
    assert len(table) == n, "register lost entries"
    rate = _timed_rate(lambda s, x: table.fold(s, x, ORPHAN_DEADLINE), lambda c: _batches(rng, srids, c), seconds)
    assert len(table) == n, "random xors completed a tree"
    return rate, register_rate, table


def _dict_rate(n: int, srids: np.ndarray, roots: np.ndarray, rng: np.random.Generator,
               seconds: float) -> tuple[float, float]:
    """(fold pairs/s, bytes per entry) of the dict fold with ``n`` registered entries."""
    entry_bytes = _dict_entry_bytes(srids, roots)
    gc.disable()  # building millions of lists would trigger full collections
    try:
        d = {
            s: [v, REGISTERED, o, DEADLINE]
            for s, v, o in zip(srids.tolist(), roots.tolist(), range(n), strict=True)
        }
        dict_bytes = entry_bytes + sys.getsizeof(d) / n
        rate = _timed_rate(lambda s, x: dict_fold(d, s, x, ORPHAN_DEADLINE), lambda c: _batches(rng, srids, c),
                           seconds)
        assert len(d) == n
    finally:
        gc.enable()
    gc.collect()
    return rate, dict_bytes


def measure(figures: Figures, *, quick: bool, sizes: tuple[int, ...] = FOLD_SIZES,
            progress: Callable[[float, str], None] | None = None) -> dict[str, Any]:
    """Fill ``fold.*``; returns the raw series for the plot."""
    seconds = 0.4 if quick else 1.5
    rng = np.random.default_rng(7)
    series: dict[str, Any] = {"sizes": [], "table_rate": [], "dict_rate": [], "table_bytes": [], "dict_bytes": [],
                              "table_register_rate": []}
    for i, n in enumerate(sizes):
        label = size_label(n)
        keys = [f"fold.{label}.{k}" for k in ("table_pairs_per_s", "dict_pairs_per_s", "table_vs_dict",
                                             "table_bytes_per_entry", "dict_bytes_per_entry")]
        if progress:
            progress(i / len(sizes), f"N={label}")
        if quick and n > 1_000_000:
            figures.unavailable(keys, "skipped in --quick (10^7 entries: run without --quick)")
            continue
        need_table = n * 160
        if _available_bytes() < 2 * need_table:
            figures.unavailable(keys, f"not enough free memory for {label} entries (~{need_table >> 20} MiB needed)")
            continue
        srids = new_ids(n)
        roots = new_ids(n)
        rate, register_rate, table = _table_rate(n, srids, roots, rng, seconds)
        figures.set(f"fold.{label}.table_bytes_per_entry", table.bytes_per_entry,
                    capacity=table.capacity, load=round(n / table.capacity, 3))
        figures.set(f"fold.{label}.table_pairs_per_s", rate, batch=BATCH, register_rate=round(register_rate))
        series["sizes"].append(n)
        series["table_rate"].append(rate)
        series["table_bytes"].append(table.bytes_per_entry)
        series["table_register_rate"].append(register_rate)
        del table

        # the dict baseline, on the same entries
        need_dict = n * 400
        if _available_bytes() < 2 * need_dict:
            figures.unavailable(keys[1:3] + keys[4:], f"not enough free memory for a dict of {label} entries")
            series["dict_rate"].append(None)
            series["dict_bytes"].append(None)
            continue
        dict_rate, dict_bytes = _dict_rate(n, srids, roots, rng, seconds)
        figures.set(f"fold.{label}.dict_pairs_per_s", dict_rate, batch=BATCH)
        figures.set(f"fold.{label}.dict_bytes_per_entry", dict_bytes)
        figures.ratio(f"fold.{label}.table_vs_dict", f"fold.{label}.table_pairs_per_s", f"fold.{label}.dict_pairs_per_s")
        series["dict_rate"].append(dict_rate)
        series["dict_bytes"].append(dict_bytes)
    return series
