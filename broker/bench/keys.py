"""Key partitions: a batch of new keys hashed together (``Partitioner.partition_many``, what
``Source.send_many`` does) against one key at a time (``Partitioner.partition``), per key.
Kafka-free; part of the ``fold`` section."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from broker.bench.figures import Figures
from broker.partitioning import get_partitioner

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
