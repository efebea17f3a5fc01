"""Key partitions: a batch of new keys hashed together (``Partitioner.partition_many``, what
``Source.send_many`` does) against one key at a time (``Partitioner.partition``), per key.
Kafka-free; part of the ``fold`` section."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from broker.bench.figures import Figures
from broker.partitioning import get_partitioner

if TYPE_CHECKING:
    import numpy as np

BATCH = 256  # the bench source's batch
KEYS = [b"order-%012d" % i for i in range(BATCH)]  # 18 bytes, a key per record
PARTITIONS = 12


def _us_per_key(call: Callable[[], object], seconds: float) -> float:
    """The best of 5 rounds of ``call()`` repeated for ~``seconds``/5, in µs per key."""
    best = float("inf")
    for _ in range(5):
        n, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds / 5:
            call()
            n += 1
        best = min(best, elapsed / n)
    return best * 1e6 / BATCH


def _one_by_one(partition: Callable[[bytes, int], int]) -> list[int]:
    return [partition(k, PARTITIONS) for k in KEYS]


def measure(figures: Figures, *, quick: bool) -> None:
    seconds = 0.5 if quick else 2.0
    for name in ("kafka", "spark"):
        partitioner = get_partitioner(name)
        figures.set(f"keys.{name}_batch_us_per_key",
                    _us_per_key(functools.partial(partitioner.partition_many, KEYS, PARTITIONS), seconds),
                    batch=BATCH, key_bytes=len(KEYS[0]))
        figures.set(f"keys.{name}_one_us_per_key",
                    _us_per_key(functools.partial(_one_by_one, partitioner.partition), seconds),
                    key_bytes=len(KEYS[0]))
        figures.ratio(f"keys.{name}_one_vs_batch", f"keys.{name}_one_us_per_key", f"keys.{name}_batch_us_per_key")
    measure_skew(figures)


ZIPF_S = (0.0, 0.8, 1.1)  # uniform, mild, hot keys
ZIPF_KEYS = 10_000  # distinct keys
ZIPF_RECORDS = 200_000


def ledger_skew(partitions: int, s: float, seed: int = 7) -> float:
    """Records per ledger partition, the busiest against the mean, for ``ZIPF_RECORDS``
    records whose keys follow a Zipf law of exponent ``s`` over ``ZIPF_KEYS`` keys: every
    record of a key lives in the key's ledger partition (docs/design.md §6), so a hot key
    is a hot partition - and so a hot acker."""
    import numpy as np

    rng = np.random.default_rng(seed)
    counts = rng.multinomial(ZIPF_RECORDS, zipf_weights(ZIPF_KEYS, s))
    keys = [b"customer-%d" % i for i in range(ZIPF_KEYS)]
    lps = np.array(get_partitioner("kafka").partition_many(keys, partitions))
    per_partition = np.bincount(lps, weights=counts, minlength=partitions)
    return float(per_partition.max() / per_partition.mean())


def zipf_weights(keys: int, s: float) -> np.ndarray:
    """The probability of key rank 1..``keys`` under a Zipf law of exponent ``s`` (0: uniform)."""
    import numpy as np

    weights = 1.0 / np.arange(1, keys + 1) ** s
    return np.asarray(weights / weights.sum())


def zipf_indices(n: int, keys: int, s: float, seed: int = 7) -> np.ndarray:
    """``n`` key indices in [0, ``keys``) drawn from ``zipf_weights``: a source cycles through
    them, so a run's keys follow the law whatever its length (``bench.scale``)."""
    import numpy as np

    return np.random.default_rng(seed).choice(keys, size=n, p=zipf_weights(keys, s))


def spread(counts: Sequence[float]) -> dict[str, float | None]:
    """How evenly work is split: the busiest against the mean, and against the idlest
    (None when one got nothing: an idle partition or acker makes the ratio infinite)."""
    if not counts:
        return {"max_vs_mean": None, "max_vs_min": None}
    top, low, mean = max(counts), min(counts), sum(counts) / len(counts)
    return {"max_vs_mean": top / mean if mean > 0 else None, "max_vs_min": top / low if low > 0 else None}


def measure_skew(figures: Figures) -> None:
    for partitions in (16, 1000):
        for s in ZIPF_S:
            figures.set(f"keys.zipf{s:g}_p{partitions}_max_vs_mean", ledger_skew(partitions, s),
                        keys=ZIPF_KEYS, records=ZIPF_RECORDS)
