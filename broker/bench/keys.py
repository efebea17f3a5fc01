"""Key partitions: a batch of new keys hashed together (``Partitioner.partition_many``, what
``Source.send_many`` does) against one key at a time (``Partitioner.partition``), per key.
Kafka-free; part of the ``fold`` section."""

from __future__ import annotations

import time

from broker.bench.figures import Figures
from broker.partitioning import get_partitioner

BATCH = 256  # the bench source's batch
KEYS = [b"order-%012d" % i for i in range(BATCH)]  # 18 bytes, a key per record
PARTITIONS = 12


def _us_per_key(call: object, seconds: float) -> float:
    """The best of 5 rounds of ``call()`` repeated for ~``seconds``/5, in µs per key."""
    best = float("inf")
    for _ in range(5):
        n, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds / 5:
            call()  # type: ignore[operator]
            n += 1
        best = min(best, elapsed / n)
    return best * 1e6 / BATCH


def measure(figures: Figures, *, quick: bool) -> None:
    seconds = 0.5 if quick else 2.0
    for name in ("kafka", "spark"):
        partitioner = get_partitioner(name)
        figures.set(f"keys.{name}_batch_us_per_key", _us_per_key(lambda p=partitioner: p.partition_many(KEYS, PARTITIONS), seconds),
                    batch=BATCH, key_bytes=len(KEYS[0]))
        figures.set(f"keys.{name}_one_us_per_key",
                    _us_per_key(lambda p=partitioner: [p.partition(k, PARTITIONS) for k in KEYS], seconds),
                    key_bytes=len(KEYS[0]))
        figures.ratio(f"keys.{name}_one_vs_batch", f"keys.{name}_one_us_per_key", f"keys.{name}_batch_us_per_key")
