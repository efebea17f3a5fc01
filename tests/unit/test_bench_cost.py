"""The pure parts of the bench's cost figures: which topic a log belongs to, and the CPU of a
process's threads by group (the broker's JVM in the bench; this process here)."""

from __future__ import annotations

import os
import threading
import time

from broker.bench.cost import role_of, thread_cpu


def test_topics_are_named_by_their_role_in_the_namespace() -> None:
    ns = "bench-pipeline-1a2b3c4d"
    assert role_of(f"{ns}.persist", ns) == "persist"
    assert role_of(f"{ns}.acks", ns) == "acks"
    assert role_of(f"{ns}.ledger", ns) == "ledger"
    assert role_of(f"{ns}.data", ns) == "data"
    assert role_of(f"{ns}.data.replay", ns) == "replay"
    assert role_of("__consumer_offsets", ns) == "__consumer_offsets"
    assert role_of("bench-raw-1.data", None) == "data"


def test_thread_cpu_groups_threads_by_name_without_their_number() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    workers = [threading.Thread(target=spin, name=f"spinner-{i}") for i in range(2)]
    for w in workers:
        w.start()
    time.sleep(0.3)
    stop.set()
    for w in workers:
        w.join()
    groups = thread_cpu(os.getpid())
    assert groups, "no threads read from /proc"
    assert all(not any(ch.isdigit() for ch in name) or name.isdigit() for name in groups), groups
    assert sum(groups.values()) > 0
    assert thread_cpu(None) == {}
